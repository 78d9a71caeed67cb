//! The detector's running median and ordinary-tail quantile against the
//! obvious ones (sort the windows) over random streams, keys, window sizes
//! and quantiles.

use std::collections::{HashMap, VecDeque};

use deepspan_agent::detect::{Detector, DetectorConfig, Verdict};
use proptest::prelude::*;

/// What the rule says, computed the slow way.
struct Naive {
    config: DetectorConfig,
    windows: HashMap<(u8, u8), VecDeque<u64>>,
    /// The durations not judged anomalous, per key.
    ordinary: HashMap<(u8, u8), VecDeque<u64>>,
}

fn sorted_copy(window: &VecDeque<u64>) -> Vec<u64> {
    let mut sorted: Vec<u64> = window.iter().copied().collect();
    sorted.sort_unstable();
    sorted
}

impl Naive {
    fn observe(&mut self, key: (u8, u8), duration: u64) -> Verdict {
        let window = self.windows.entry(key).or_default();
        let sorted = sorted_copy(window);
        let n = sorted.len();
        let median = (n > 0).then(|| {
            if n % 2 == 1 {
                sorted[n / 2]
            } else {
                let (a, b) = (sorted[n / 2 - 1] as u128, sorted[n / 2] as u128);
                ((a + b) / 2) as u64
            }
        });
        let baseline_ns = median.filter(|_| n >= self.config.min_count);
        let ordinary = self.ordinary.entry(key).or_default();
        // The nearest rank: the ⌈q·n⌉-th smallest.
        let tail_ns = self
            .config
            .tail_quantile
            .filter(|_| baseline_ns.is_some())
            .map(|q| {
                let sorted = sorted_copy(ordinary);
                let rank = (q * sorted.len() as f64).ceil() as usize;
                sorted[rank.clamp(1, sorted.len()) - 1]
            });
        let over_median = baseline_ns.is_some_and(|m| {
            self.config.floor_ns.is_none_or(|f| duration >= f)
                && duration as f64 > m as f64 * self.config.threshold
        });
        let anomalous = over_median && tail_ns.is_none_or(|t| duration > t);
        for (w, enters) in [(window, true), (ordinary, !anomalous)] {
            if enters {
                w.push_back(duration);
                if w.len() > self.config.window {
                    w.pop_front();
                }
            }
        }
        Verdict {
            anomalous,
            baseline_ns,
            tail_ns,
            within_tail: over_median && !anomalous,
            count: n,
        }
    }
}

fn durations() -> impl Strategy<Value = u64> {
    // Many repeats (ties), a wide range, and the extremes.
    prop_oneof![
        0u64..20,
        1_000u64..5_000,
        any::<u64>(),
        Just(u64::MAX),
        Just(0),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn matches_the_sorted_window(
        window in 1usize..40,
        min_count_part in 0.0f64..1.0,
        threshold in prop_oneof![Just(3.0), 0.5f64..5.0],
        tail_quantile in proptest::option::of(prop_oneof![Just(0.99), Just(1.0), 0.001f64..1.0]),
        floor_ns in proptest::option::of(0u64..3_000),
        stream in proptest::collection::vec(((0u8..3, 0u8..2), durations()), 0..400),
    ) {
        let min_count = 1 + ((window - 1) as f64 * min_count_part) as usize;
        let config = DetectorConfig { window, threshold, tail_quantile, min_count, floor_ns, max_keys: 6 };
        let mut fast = Detector::new(config.clone()).unwrap();
        let mut naive = Naive { config, windows: HashMap::new(), ordinary: HashMap::new() };
        for (i, ((s, o), d)) in stream.into_iter().enumerate() {
            let expected = naive.observe((s, o), d);
            let got = fast.observe(&format!("svc{s}"), &format!("op{o}"), d);
            prop_assert_eq!(got, expected, "span {} of key ({}, {})", i, s, o);
        }
    }
}
