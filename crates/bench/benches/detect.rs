//! ns per `Detector::observe` for windows of 50, 500 and 5000 durations (one
//! key, full window, a mix of durations so both halves change): the cost
//! should grow with log(window), not with the window.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use deepspan_agent::detect::{Detector, DetectorConfig};

fn observe(c: &mut Criterion) {
    let mut group = c.benchmark_group("observe");
    for window in [50usize, 500, 5000] {
        let mut detector = Detector::new(DetectorConfig {
            window,
            ..DetectorConfig::default()
        })
        .unwrap();
        // A cheap deterministic spread of durations (xorshift), 1-2 ms.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1_000_000 + x % 1_000_000
        };
        for _ in 0..window * 2 {
            detector.observe("checkout", "POST /cart", next());
        }
        group.bench_with_input(BenchmarkId::from_parameter(window), &window, |b, _| {
            b.iter(|| black_box(detector.observe("checkout", "POST /cart", next())))
        });
    }
    group.finish();
}

criterion_group!(benches, observe);
criterion_main!(benches);
