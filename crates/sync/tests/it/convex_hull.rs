//! Synthetic messages from a known clock transform: the convex hull
//! estimate must recover it, bound it, and say how good it is.

use deepspan_sync::{Bounds, ClockPair, Estimator, HostGraph, Quality, SyncError, Transform};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SECOND: u64 = 1_000_000_000;

/// The true clock relation: reference = other + other·drift + offset, with
/// the drift in parts per billion so that it is exact in integers.
#[derive(Clone, Copy)]
struct Truth {
    drift_ppb: i128,
    offset_ns: i128,
}

impl Truth {
    fn reference(&self, other_ns: u64) -> i128 {
        other_ns as i128 + other_ns as i128 * self.drift_ppb / 1_000_000_000 + self.offset_ns
    }

    fn other(&self, reference_ns: i128) -> u64 {
        // Inverse of `reference`, to within a ns (enough for delays of µs).
        let mut o = (reference_ns - self.offset_ns) as f64 / (1.0 + self.drift_ppb as f64 * 1e-9);
        for _ in 0..3 {
            let err = self.reference(o as u64) - reference_ns;
            o -= err as f64;
        }
        o as u64
    }
}

/// A one-way delay: at least `min_ns`, plus an exponential of mean `mean_ns`.
fn delay(rng: &mut ChaCha8Rng, min_ns: f64, mean_ns: f64) -> u64 {
    let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
    (min_ns - mean_ns * u.ln()) as u64
}

#[derive(Clone, Copy, Debug)]
enum Message {
    /// (send on other, receive on reference)
    ToReference(u64, u64),
    /// (send on reference, receive on other)
    FromReference(u64, u64),
}

struct Scenario {
    truth: Truth,
    start_ns: u64,
    length_ns: u64,
    min_delay_ns: f64,
    mean_extra_ns: f64,
}

impl Scenario {
    fn typical(start_ns: u64, drift_ppb: i128, offset_ns: i128) -> Scenario {
        Scenario {
            truth: Truth {
                drift_ppb,
                offset_ns,
            },
            start_ns,
            length_ns: 10 * SECOND,
            min_delay_ns: 20_000.0,
            mean_extra_ns: 50_000.0,
        }
    }

    /// `n` messages each way at random times of the other host's clock
    /// within [from, to) of the scenario's length.
    fn messages(&self, seed: u64, n: usize, to: (f64, f64), from: (f64, f64)) -> Vec<Message> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut out = Vec::new();
        let at = |rng: &mut ChaCha8Rng, (a, b): (f64, f64)| {
            self.start_ns + (self.length_ns as f64 * rng.random_range(a..b)) as u64
        };
        for _ in 0..n {
            let send = at(&mut rng, to);
            let receive = self.truth.reference(send)
                + delay(&mut rng, self.min_delay_ns, self.mean_extra_ns) as i128;
            out.push(Message::ToReference(send, receive as u64));
        }
        for _ in 0..n {
            let receive = at(&mut rng, from);
            let send = self.truth.reference(receive)
                - delay(&mut rng, self.min_delay_ns, self.mean_extra_ns) as i128;
            out.push(Message::FromReference(send as u64, receive));
        }
        out.sort_by_key(|m| match *m {
            Message::ToReference(s, _) => s,
            Message::FromReference(_, r) => r,
        });
        out
    }

    /// Largest |estimate − truth| over the scenario's length, sampled every 100 ms.
    fn worst_error_ns(&self, t: &Transform) -> i128 {
        (0..=100)
            .map(|i| {
                let o = self.start_ns + self.length_ns / 100 * i;
                (t.map_ns(o) - self.truth.reference(o)).abs()
            })
            .max()
            .unwrap()
    }
}

fn feed(messages: &[Message]) -> ClockPair {
    let mut pair = ClockPair::new();
    for m in messages {
        match *m {
            Message::ToReference(s, r) => pair.add_to_reference(s, r).unwrap(),
            Message::FromReference(s, r) => pair.add_from_reference(s, r).unwrap(),
        }
    }
    pair
}

#[test]
fn recovers_a_known_transform_within_a_microsecond_over_ten_seconds() {
    // Monotonic-clock times (hours of uptime), offset of seconds, drift of
    // tens of ppm, both signs.
    for (seed, drift_ppb, offset_ns) in [
        (1, 37_000, 2_500_000_000),
        (2, -41_000, -7_300_000_000),
        (3, 12_500, 950_000_000),
    ] {
        let scenario = Scenario::typical(3_600 * SECOND, drift_ppb, offset_ns);
        let messages = scenario.messages(seed, 400, (0.0, 1.0), (0.0, 1.0));
        let estimate = feed(&messages).estimate(Estimator::MostRoom);
        assert_eq!(estimate.quality, Quality::Accurate, "seed {seed}");
        assert_eq!(estimate.matched, 800);
        let worst = scenario.worst_error_ns(&estimate.transform);
        assert!(worst < 1_000, "seed {seed}: off by {worst} ns");
        let true_slope = 1.0 + drift_ppb as f64 * 1e-9;
        let (lo, hi) = estimate.bounds.envelope().expect("accurate").slopes();
        assert!(
            lo < true_slope && true_slope < hi,
            "{lo} < {true_slope} < {hi}"
        );
        // The room between the hulls is about the two smallest delays.
        let gap = estimate.gap_ns.unwrap();
        assert!((40_000.0..41_000.0).contains(&gap), "gap {gap}");
    }
}

#[test]
fn the_bounds_contain_the_true_transform_over_the_whole_trace() {
    for (seed, drift_ppb, offset_ns) in [(81, 37_000, 2_500_000_000), (82, -41_000, -7_300_000_000)]
    {
        let scenario = Scenario::typical(3_600 * SECOND, drift_ppb, offset_ns);
        // The trace runs a second either side of its messages.
        let messages = scenario.messages(seed, 400, (0.1, 0.9), (0.1, 0.9));
        let (first, last) = (scenario.start_ns, scenario.start_ns + scenario.length_ns);
        for estimator in [Estimator::MostRoom, Estimator::Bisector] {
            let estimate = feed(&messages).estimate(estimator);
            let envelope = estimate.bounds.envelope().expect("accurate");
            let transform = &estimate.transform;
            for i in 0..=100 {
                let t = first + scenario.length_ns / 100 * i;
                let (lo, hi) = envelope.deviation_at(transform, t);
                // map_ns rounds to the ns.
                let off = (scenario.truth.reference(t) - transform.map_ns(t)) as f64;
                assert!(
                    lo - 1.0 <= off && off <= hi + 1.0,
                    "seed {seed}, {estimator:?}, at {i}%: {off} ns not in [{lo}, {hi}]"
                );
            }
            let worst = scenario.worst_error_ns(transform) as f64;
            let bound = envelope.max_error_ns(transform, first, last);
            assert!(
                worst <= bound + 1.0,
                "seed {seed}: off by {worst} ns, bound {bound}"
            );
            // Messages over 8 of the 10 s bound it within tens of µs.
            assert!(
                bound < 50_000.0,
                "seed {seed}, {estimator:?}: bound {bound} ns"
            );
        }
    }
}

#[test]
fn epoch_scale_times_keep_their_precision() {
    // CTF absolute times are ns since 1970, beyond f64's integer range.
    let scenario = Scenario::typical(1_764_000_000 * SECOND, 23_000, -3_100_000_000);
    let messages = scenario.messages(7, 400, (0.0, 1.0), (0.0, 1.0));
    let estimate = feed(&messages).estimate(Estimator::MostRoom);
    assert_eq!(estimate.quality, Quality::Accurate);
    let worst = scenario.worst_error_ns(&estimate.transform);
    assert!(worst < 1_000, "off by {worst} ns");
}

/// The slope bounds by brute force: every pair of a message from the
/// reference (x = receive on other, y = send on reference) and one to it
/// (x = send on other, y = receive on reference) bounds the slope.
fn brute_force_slope_bounds(messages: &[Message]) -> (f64, f64) {
    let to: Vec<(f64, f64)> = messages
        .iter()
        .filter_map(|m| match *m {
            Message::ToReference(s, r) => Some((s as f64, r as f64)),
            _ => None,
        })
        .collect();
    let from: Vec<(f64, f64)> = messages
        .iter()
        .filter_map(|m| match *m {
            Message::FromReference(s, r) => Some((r as f64, s as f64)),
            _ => None,
        })
        .collect();
    let (mut lo, mut hi) = (f64::NEG_INFINITY, f64::INFINITY);
    for a in &to {
        for b in &from {
            let s = (b.1 - a.1) / (b.0 - a.0);
            if a.0 < b.0 {
                lo = lo.max(s);
            } else if b.0 < a.0 {
                hi = hi.min(s);
            }
        }
    }
    (lo, hi)
}

#[test]
fn slope_bounds_equal_the_brute_force_ones() {
    // Small times so that the brute force in f64 is exact enough.
    for seed in 10..20 {
        let scenario = Scenario::typical(SECOND, 30_000, 1_000_000);
        let messages = scenario.messages(seed, 60, (0.0, 1.0), (0.0, 1.0));
        let estimate = feed(&messages).estimate(Estimator::MostRoom);
        let (lo, hi) = estimate.bounds.envelope().expect("accurate").slopes();
        let (blo, bhi) = brute_force_slope_bounds(&messages);
        assert!(
            (lo - blo).abs() < 1e-12 && (hi - bhi).abs() < 1e-12,
            "seed {seed}: ({lo}, {hi}) vs ({blo}, {bhi})"
        );
    }
}

#[test]
fn arrival_order_does_not_change_the_estimate() {
    let scenario = Scenario::typical(3_600 * SECOND, -18_000, 400_000_000);
    let mut messages = scenario.messages(21, 300, (0.0, 1.0), (0.0, 1.0));
    let in_order = feed(&messages).estimate(Estimator::MostRoom);
    messages.shuffle(&mut ChaCha8Rng::seed_from_u64(22));
    let shuffled = feed(&messages).estimate(Estimator::MostRoom);
    assert_eq!(shuffled.quality, Quality::Accurate);
    for o in [
        scenario.start_ns,
        scenario.start_ns + 5 * SECOND,
        scenario.start_ns + 10 * SECOND,
    ] {
        let d = (in_order.transform.map_ns(o) - shuffled.transform.map_ns(o)).abs();
        assert!(d <= 1, "{d} ns apart at {o}");
    }
}

#[test]
fn crossing_hulls_are_approximate_and_still_fitted() {
    let scenario = Scenario::typical(3_600 * SECOND, 30_000, 2_000_000_000);
    let mut messages = scenario.messages(31, 300, (0.0, 1.0), (0.0, 1.0));
    // Two messages that arrive 100 µs before they were sent, under any
    // reading of the clocks (a clock step, or a wrong match).
    for at in [3 * SECOND, 7 * SECOND] {
        let send = scenario.start_ns + at;
        let receive = scenario.truth.reference(send) - 100_000;
        messages.push(Message::ToReference(send, receive as u64));
    }
    let estimate = feed(&messages).estimate(Estimator::MostRoom);
    assert_eq!(estimate.quality, Quality::Approximate);
    assert_eq!(estimate.bounds, Bounds::Contradicted);
    let gap = estimate.gap_ns.unwrap();
    // 100 µs early, less the 20 µs that messages the other way take at least.
    assert!(
        (-100_000.0..-75_000.0).contains(&gap),
        "contradiction of {gap} ns"
    );
    // The fit splits the contradiction: within about half of it.
    let worst = scenario.worst_error_ns(&estimate.transform);
    assert!(worst < 70_000, "off by {worst} ns");
}

#[test]
fn directions_that_do_not_interleave_are_approximate() {
    let scenario = Scenario::typical(3_600 * SECOND, 30_000, 2_000_000_000);
    let messages = scenario.messages(41, 300, (0.0, 0.5), (0.5, 1.0));
    let estimate = feed(&messages).estimate(Estimator::MostRoom);
    assert_eq!(estimate.quality, Quality::Approximate);
    assert_eq!(estimate.bounds, Bounds::Unbounded);
    let worst = scenario.worst_error_ns(&estimate.transform);
    assert!(worst < 5_000, "off by {worst} ns");
}

#[test]
fn one_direction_is_incomplete_and_off_by_the_smallest_delay() {
    let scenario = Scenario::typical(3_600 * SECOND, 30_000, 2_000_000_000);
    let messages: Vec<Message> = scenario
        .messages(51, 400, (0.0, 1.0), (0.0, 1.0))
        .into_iter()
        .filter(|m| matches!(m, Message::ToReference(..)))
        .collect();
    let estimate = feed(&messages).estimate(Estimator::MostRoom);
    assert_eq!(estimate.quality, Quality::Incomplete);
    assert_eq!(estimate.bounds, Bounds::Unbounded);
    assert_eq!(estimate.matched, 400);
    for i in 0..=10 {
        let o = scenario.start_ns + i * SECOND;
        let error = estimate.transform.map_ns(o) - scenario.truth.reference(o);
        assert!((19_000..22_000).contains(&error), "at {i} s: {error} ns");
    }
    // A single message: slope 1 through it.
    let single = feed(&messages[..1]).estimate(Estimator::MostRoom);
    assert_eq!(single.quality, Quality::Incomplete);
    assert_eq!(single.transform.slope, 1.0);
}

#[test]
fn no_message_fails_with_the_identity() {
    let estimate = ClockPair::new().estimate(Estimator::MostRoom);
    assert_eq!(estimate.quality, Quality::Fail);
    assert_eq!(estimate.transform, Transform::IDENTITY);
    assert_eq!(estimate.bounds, Bounds::Unbounded);
    assert_eq!(estimate.matched, 0);
}

/// Feeds host pair (`reference` side first) from a scenario into a graph.
fn feed_graph(graph: &mut HostGraph, reference: usize, other: usize, messages: &[Message]) {
    for m in messages {
        match *m {
            Message::ToReference(s, r) => graph.add_message(other, s, reference, r).unwrap(),
            Message::FromReference(s, r) => graph.add_message(reference, s, other, r).unwrap(),
        }
    }
}

#[test]
fn three_hosts_are_combined_through_the_spanning_tree() {
    // alpha ←→ beta ←→ gamma; delta exchanged nothing.
    let alpha_beta = Scenario::typical(3_600 * SECOND, 25_000, 1_500_000_000);
    let beta_gamma = Scenario::typical(
        alpha_beta
            .truth
            .other(alpha_beta.truth.reference(3_600 * SECOND))
            - 400 * SECOND,
        -31_000,
        400 * SECOND as i128,
    );
    let mut graph = HostGraph::new();
    let [alpha, beta, gamma, delta] = ["alpha", "beta", "gamma", "delta"].map(|h| graph.host(h));
    feed_graph(
        &mut graph,
        alpha,
        beta,
        &alpha_beta.messages(61, 300, (0.0, 1.0), (0.0, 1.0)),
    );
    feed_graph(
        &mut graph,
        beta,
        gamma,
        &beta_gamma.messages(62, 300, (0.0, 1.0), (0.0, 1.0)),
    );
    let hosts = graph.solve(alpha, Estimator::MostRoom).unwrap();
    assert_eq!(hosts[delta].bounds, Bounds::Unbounded);
    assert_eq!(
        hosts.iter().map(|h| h.quality).collect::<Vec<_>>(),
        [
            Quality::Accurate,
            Quality::Accurate,
            Quality::Accurate,
            Quality::Fail
        ]
    );
    assert_eq!(hosts[gamma].parent.as_deref(), Some("beta"));
    assert_eq!(hosts[delta].transform, Transform::IDENTITY);
    assert_eq!(hosts[delta].matched, 0);
    assert_eq!(hosts[gamma].matched, 600);
    // gamma's times over its 10 s, through beta, onto alpha's clock.
    for i in 0..=10 {
        let g = beta_gamma.start_ns + i * SECOND;
        let b = beta_gamma.truth.reference(g);
        let a = alpha_beta.truth.reference(b as u64);
        let error = hosts[gamma].transform.map_ns(g) - a;
        assert!(error.abs() < 2_000, "at {i} s: {error} ns");
        // The bounds composed through beta hold the truth.
        let envelope = hosts[gamma].bounds.envelope().expect("both edges accurate");
        let (lo, hi) = envelope.deviation_at(&hosts[gamma].transform, g);
        let off = -error as f64;
        assert!(
            lo - 1.0 <= off && off <= hi + 1.0,
            "at {i} s: {off} not in [{lo}, {hi}]"
        );
    }
    // The other way round: gamma as the reference, alpha through beta.
    let from_gamma = graph.solve(gamma, Estimator::MostRoom).unwrap();
    assert_eq!(from_gamma[alpha].parent.as_deref(), Some("beta"));
    let back = from_gamma[alpha].transform.after(&hosts[gamma].transform);
    let g = beta_gamma.start_ns + 5 * SECOND;
    assert!(
        (back.map_ns(g) - g as i128).abs() < 2,
        "round trip: {}",
        back.map_ns(g) - g as i128
    );
}

#[test]
fn the_tree_prefers_the_better_edge_at_equal_depth() {
    // b reaches the reference directly only one way (incomplete), and c
    // reaches the reference both ways: b should hang from the reference
    // anyway (breadth first), but a host seen from two parents at the same
    // depth takes the accurate edge.
    let good = Scenario::typical(3_600 * SECOND, 10_000, SECOND as i128);
    let mut graph = HostGraph::new();
    let [r, x, y, z] = ["r", "x", "y", "z"].map(|h| graph.host(h));
    feed_graph(
        &mut graph,
        r,
        x,
        &good.messages(71, 100, (0.0, 1.0), (0.0, 1.0)),
    );
    feed_graph(
        &mut graph,
        r,
        y,
        &good.messages(72, 100, (0.0, 1.0), (0.0, 1.0)),
    );
    let one_way: Vec<Message> = good
        .messages(73, 100, (0.0, 1.0), (0.0, 1.0))
        .into_iter()
        .filter(|m| matches!(m, Message::ToReference(..)))
        .collect();
    feed_graph(&mut graph, x, z, &one_way);
    feed_graph(
        &mut graph,
        y,
        z,
        &good.messages(74, 100, (0.0, 1.0), (0.0, 1.0)),
    );
    let hosts = graph.solve(r, Estimator::MostRoom).unwrap();
    assert_eq!(hosts[z].parent.as_deref(), Some("y"));
    assert_eq!(hosts[z].quality, Quality::Accurate);
}

#[test]
fn bad_messages_are_errors() {
    let mut pair = ClockPair::new();
    pair.add_to_reference(10, 20).unwrap();
    let err = pair.add_to_reference(10 + (1 << 62), 20).unwrap_err();
    assert!(matches!(err, SyncError::TooFarApart { .. }), "{err}");
    assert!(err.to_string().contains("2^61"));
    let mut graph = HostGraph::new();
    let a = graph.host("a");
    assert_eq!(
        graph.add_message(a, 1, a, 2).unwrap_err(),
        SyncError::SameHost { host: "a".into() }
    );
    assert!(matches!(
        graph.add_message(a, 1, 5, 2),
        Err(SyncError::UnknownHost { index: 5, .. })
    ));
    assert!(graph.solve(3, Estimator::MostRoom).is_err());
}
