//! The bounds of a pair's transform on hand-made message sets: the set of
//! lines that fit, checked against every line through two messages, and
//! the estimators' lines within it.

use deepspan_sync::{Bounds, ClockPair, Estimator, HostGraph, Quality, Transform};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A message as the pair plots it: x on the other host's clock, y on the
/// reference's.
#[derive(Clone, Copy, Debug)]
struct Point {
    x: i64,
    y: i64,
}

/// Messages to the reference (above every line that fits) and from it
/// (below).
struct Messages {
    to_reference: Vec<Point>,
    from_reference: Vec<Point>,
}

impl Messages {
    fn pair(&self) -> ClockPair {
        let mut pair = ClockPair::new();
        for p in &self.to_reference {
            pair.add_to_reference(p.x as u64, p.y as u64).unwrap();
        }
        for p in &self.from_reference {
            pair.add_from_reference(p.y as u64, p.x as u64).unwrap();
        }
        pair
    }

    /// Every line through two messages (of different x) that fits them all,
    /// as (slope, value at x = 0), found with exact integer arithmetic: the
    /// corners of the set of lines that fit are among them.
    fn fitting_lines_through_two(&self) -> Vec<(f64, f64)> {
        let all: Vec<Point> = self
            .to_reference
            .iter()
            .chain(&self.from_reference)
            .copied()
            .collect();
        // > 0 when r lies above the line p → q (p.x < q.x).
        let side = |p: Point, q: Point, r: Point| {
            (q.x - p.x) as i128 * (r.y - p.y) as i128 - (q.y - p.y) as i128 * (r.x - p.x) as i128
        };
        let mut lines = Vec::new();
        for &p in &all {
            for &q in all.iter().filter(|q| q.x > p.x) {
                let fits = self.to_reference.iter().all(|&r| side(p, q, r) >= 0)
                    && self.from_reference.iter().all(|&r| side(p, q, r) <= 0);
                if fits {
                    let slope = (q.y - p.y) as f64 / (q.x - p.x) as f64;
                    lines.push((slope, p.y as f64 - slope * p.x as f64));
                }
            }
        }
        lines
    }
}

/// `n` messages each way at random times of [0, 1 ms) of the other host's
/// clock, on the true line y = x·(1 + 300 ppm) + 50 µs, with delays of
/// 2 µs to 20 µs.
fn random_messages(seed: u64, n: usize) -> Messages {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let truth = |x: i64| x + x * 3 / 10_000 + 50_000;
    let mut message = |sign: i64| {
        let x = rng.random_range(0..1_000_000);
        Point {
            x,
            y: truth(x) + sign * rng.random_range(2_000..20_000),
        }
    };
    Messages {
        to_reference: (0..n).map(|_| message(1)).collect(),
        from_reference: (0..n).map(|_| message(-1)).collect(),
    }
}

#[test]
fn the_envelope_is_the_brute_force_one_at_every_time() {
    for seed in 0..30 {
        let messages = random_messages(seed, 3 + seed as usize % 10);
        let estimate = messages.pair().estimate(Estimator::MostRoom);
        assert_eq!(estimate.quality, Quality::Accurate, "seed {seed}");
        let envelope = estimate.bounds.envelope().expect("accurate is enclosed");
        let lines = messages.fitting_lines_through_two();
        let slopes = lines.iter().map(|l| l.0);
        let brute_slopes = (
            slopes.clone().fold(f64::INFINITY, f64::min),
            slopes.fold(f64::NEG_INFINITY, f64::max),
        );
        let (lo, hi) = envelope.slopes();
        assert!(
            (lo - brute_slopes.0).abs() < 1e-12 && (hi - brute_slopes.1).abs() < 1e-12,
            "seed {seed}: ({lo}, {hi}) vs {brute_slopes:?}"
        );
        // Before, within and after the messages.
        for t in [0, 250_000, 500_000, 999_999, 3_000_000u64] {
            let values = lines.iter().map(|(s, c)| s * t as f64 + c);
            let brute = (
                values.clone().fold(f64::INFINITY, f64::min),
                values.fold(f64::NEG_INFINITY, f64::max),
            );
            let identity = Transform::IDENTITY;
            let (low, high) = envelope.deviation_at(&identity, t);
            let (low, high) = (low + t as f64, high + t as f64);
            assert!(
                (low - brute.0).abs() < 1e-3 && (high - brute.1).abs() < 1e-3,
                "seed {seed}, t {t}: ({low}, {high}) vs {brute:?}"
            );
        }
    }
}

#[test]
fn both_estimators_lie_within_the_bounds() {
    for seed in 100..120 {
        let messages = random_messages(seed, 40);
        let pair = messages.pair();
        for estimator in [Estimator::MostRoom, Estimator::Bisector] {
            let estimate = pair.estimate(estimator);
            assert_eq!(estimate.quality, Quality::Accurate, "seed {seed}");
            let envelope = estimate.bounds.envelope().unwrap();
            for t in [0, 500_000, 1_000_000u64] {
                let (low, high) = envelope.deviation_at(&estimate.transform, t);
                assert!(
                    low <= 1e-6 && high >= -1e-6,
                    "seed {seed} {estimator:?} at {t}: {low}, {high}"
                );
            }
            // The true line too, and the error bound covers it.
            let truth = Transform {
                slope: 1.0003,
                offset_ns: 50_000.0,
            };
            let (low, high) = envelope.deviation_at(&estimate.transform, 1_000_000);
            let true_deviation = (truth.slope - estimate.transform.slope) * 1e6
                + (truth.offset_ns - estimate.transform.offset_ns);
            assert!(
                low <= true_deviation && true_deviation <= high,
                "seed {seed}"
            );
            let worst = envelope.max_error_ns(&estimate.transform, 0, 1_000_000);
            assert!(worst >= true_deviation.abs() && worst >= high.max(-low));
        }
    }
}

#[test]
fn the_bisector_is_trace_compass_line_on_the_reference_clock() {
    let messages = random_messages(7, 40);
    let estimate = messages.pair().estimate(Estimator::Bisector);
    let lines = messages.fitting_lines_through_two();
    let min = lines
        .iter()
        .copied()
        .reduce(|a, b| if b.0 < a.0 { b } else { a })
        .unwrap();
    let max = lines
        .iter()
        .copied()
        .reduce(|a, b| if b.0 > a.0 { b } else { a })
        .unwrap();
    // Trace Compass: each extreme line written as x against y, their
    // slopes and intercepts averaged, the mean written back as y against x.
    let backwards = |(s, c): (f64, f64)| (1.0 / s, -c / s);
    let ((a1, b1), (a2, b2)) = (backwards(min), backwards(max));
    let (slope, intercept) = backwards(((a1 + a2) / 2.0, (b1 + b2) / 2.0));
    let t = &estimate.transform;
    assert!((t.slope - slope).abs() < 1e-12, "{} vs {slope}", t.slope);
    for x in [0.0, 1e6] {
        let error = (t.slope * x + t.offset_ns) - (slope * x + intercept);
        assert!(error.abs() < 1e-3, "at {x}: {error} ns");
    }
}

#[test]
fn each_reference_gets_the_bisector_on_its_own_clock() {
    let messages = random_messages(8, 40);
    let mut graph = HostGraph::new();
    let [reference, other] = ["reference", "other"].map(|h| graph.host(h));
    for p in &messages.to_reference {
        graph
            .add_message(other, p.x as u64, reference, p.y as u64)
            .unwrap();
    }
    for p in &messages.from_reference {
        graph
            .add_message(reference, p.y as u64, other, p.x as u64)
            .unwrap();
    }
    let forward = graph.solve(reference, Estimator::Bisector).unwrap()[other].clone();
    let backward = graph.solve(other, Estimator::Bisector).unwrap()[reference].clone();
    let (lo, hi) = forward.bounds.envelope().unwrap().slopes();
    // On the reference's clock: the harmonic mean of the extreme slopes;
    // on the other's, the harmonic mean of their inverses.
    assert!((forward.transform.slope - 2.0 * lo * hi / (lo + hi)).abs() < 1e-12);
    assert!((backward.transform.slope - 2.0 / (lo + hi)).abs() < 1e-12);
    // The two lines differ, both within the bounds; the backward bounds
    // are the forward ones inverted.
    let (back_lo, back_hi) = backward.bounds.envelope().unwrap().slopes();
    assert!((back_lo - 1.0 / hi).abs() < 1e-12 && (back_hi - 1.0 / lo).abs() < 1e-12);
    // The pair's own estimate is the graph's edge.
    assert_eq!(
        graph.pair_estimate(reference, other, Estimator::Bisector),
        forward.edge
    );
}

#[test]
fn one_direction_only_is_unbounded_whatever_the_estimator() {
    let messages = random_messages(9, 20);
    let one_way = Messages {
        to_reference: messages.to_reference,
        from_reference: Vec::new(),
    };
    for estimator in [Estimator::MostRoom, Estimator::Bisector] {
        let estimate = one_way.pair().estimate(estimator);
        assert_eq!(estimate.quality, Quality::Incomplete);
        assert_eq!(estimate.bounds, Bounds::Unbounded);
        assert_eq!(estimate.bounds.envelope(), None);
    }
    // A host reached through an unbounded edge is unbounded too.
    let mut graph = HostGraph::new();
    let [a, b] = ["a", "b"].map(|h| graph.host(h));
    graph.add_message(b, 1_000, a, 5_000).unwrap();
    let hosts = graph.solve(a, Estimator::MostRoom).unwrap();
    assert_eq!(hosts[b].quality, Quality::Incomplete);
    assert_eq!(hosts[b].bounds, Bounds::Unbounded);
    let reference = hosts[a].bounds.envelope().expect("the reference is exact");
    assert_eq!(
        reference.deviation_at(&Transform::IDENTITY, 123),
        (0.0, 0.0)
    );
}

#[test]
fn degenerate_message_sets_get_a_clear_answer() {
    let at = |x, y| Point { x, y };
    let estimate = |to_reference: Vec<Point>, from_reference: Vec<Point>| {
        let messages = Messages {
            to_reference,
            from_reference,
        };
        messages.pair().estimate(Estimator::Bisector)
    };
    // Every message at one instant of the other host, 10 ns of room: any
    // slope fits.
    let instant = estimate(vec![at(100, 1_010)], vec![at(100, 1_000)]);
    assert_eq!(instant.quality, Quality::Approximate);
    assert_eq!(instant.bounds, Bounds::Unbounded);
    // The same, received before it was sent: nothing fits.
    let backwards = estimate(vec![at(100, 990)], vec![at(100, 1_000)]);
    assert_eq!(backwards.bounds, Bounds::Contradicted);
    // Directions that do not interleave: arbitrarily steep lines fit.
    let apart = estimate(
        vec![at(0, 100), at(10, 110)],
        vec![at(20, 100), at(30, 110)],
    );
    assert_eq!(apart.quality, Quality::Approximate);
    assert_eq!(apart.bounds, Bounds::Unbounded);
    // Delays longer than the messages' spread: lines that fall fit too, so
    // the slope range reaches below 0 and has no harmonic mean; the
    // bisector gives the most-room line.
    let (to, from) = (vec![at(5, 1_000)], vec![at(0, 0), at(10, 0)]);
    let sparse = estimate(to.clone(), from.clone());
    assert_eq!(sparse.quality, Quality::Accurate);
    let (lo, hi) = sparse.bounds.envelope().unwrap().slopes();
    assert!(lo < 0.0 && hi > 0.0, "{lo}, {hi}");
    let most_room = Messages {
        to_reference: to,
        from_reference: from,
    }
    .pair()
    .estimate(Estimator::MostRoom);
    assert_eq!(sparse.transform, most_room.transform);
    assert!(sparse.transform.slope.is_finite() && sparse.transform.offset_ns.is_finite());
}
