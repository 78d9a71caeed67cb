//! The cost of clock sync against the number of matched message pairs.
//!
//! Each size feeds a `ClockPair` a seeded stream of messages in both
//! directions (a known offset and 40 ppm drift, 20 µs minimum delay plus an
//! exponential 30 µs), then takes the estimate (the default estimator's,
//! with its bounds). The baseline, measured in the same run, is sorting the
//! same messages (shuffled) by send time: what matching them from two
//! traces costs at least. `bench/sync_bench.py` prints the ratio of the
//! two.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use deepspan_sync::{ClockPair, Estimator};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SIZES: [usize; 4] = [1_000, 10_000, 100_000, 1_000_000];

/// (send ns, receive ns, toward the reference?) on each side's own clock.
fn messages(n: usize) -> Vec<(u64, u64, bool)> {
    let mut rng = ChaCha8Rng::seed_from_u64(n as u64);
    let offset_ns = 3_000_000_000i128;
    let drift_ppm = 40i128;
    // reference = other + other·drift + offset
    let to_reference = |other: i128| other + other * drift_ppm / 1_000_000 + offset_ns;
    let span_ns = 10_000_000_000i128;
    (0..n)
        .map(|i| {
            // `t` on the other host's clock.
            let t = 1_000_000_000 + span_ns * i as i128 / n as i128;
            let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
            let delay = (20_000.0 - 30_000.0 * u.ln()) as i128;
            if i % 2 == 0 {
                (t as u64, (to_reference(t) + delay) as u64, true)
            } else {
                (to_reference(t) as u64, (t + delay) as u64, false)
            }
        })
        .collect()
}

fn sync_cost(c: &mut Criterion) {
    let mut group = c.benchmark_group("sync_cost");
    group.sample_size(10);
    for n in SIZES {
        let input = messages(n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("convex_hull", n), &input, |b, input| {
            b.iter(|| {
                let mut pair = ClockPair::new();
                for &(send, receive, toward) in input {
                    let added = if toward {
                        pair.add_to_reference(send, receive)
                    } else {
                        pair.add_from_reference(send, receive)
                    };
                    added.expect("messages within the pair's range");
                }
                pair.estimate(Estimator::MostRoom)
            })
        });
        let mut shuffled = input.clone();
        shuffled.shuffle(&mut ChaCha8Rng::seed_from_u64(7));
        group.bench_with_input(
            BenchmarkId::new("baseline_sort", n),
            &shuffled,
            |b, shuffled| {
                b.iter(|| {
                    let mut sorted = shuffled.clone();
                    sorted.sort_unstable_by_key(|m| m.0);
                    sorted
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, sync_cost);
criterion_main!(benches);
