//! Level of detail: a lane of time-ordered, non-overlapping intervals cut
//! down to what a screen can show. Intervals at least one resolution step
//! long are kept as they are; runs of shorter ones that start in the same
//! step-aligned bucket become one interval of the bucket's dominant
//! category (the one covering the most time). Buckets are aligned to
//! multiples of the resolution, not to the window, so panning does not
//! make the picture flicker. A summary of several intervals (a state
//! history block shorter than a pixel) joins its bucket with its own
//! weights, as the intervals it stands for would.

/// One interval of a lane: `[start, end)` in ns and a category (a state,
/// a thread…) that decides its colour.
pub trait Interval {
    fn start(&self) -> i64;
    fn end(&self) -> i64;
    fn category(&self) -> u32;
    /// The recorded intervals it stands for: more than one for a summary
    /// of several (a state history block read at a coarse resolution).
    fn intervals(&self) -> u32 {
        1
    }
    /// Time its category covered, ns.
    fn category_ns(&self) -> i64 {
        self.end() - self.start()
    }
    /// Time covered by any interval, ns.
    fn covered_ns(&self) -> i64 {
        self.end() - self.start()
    }
}

/// A lane of borrowed intervals (a request's pieces grouped by thread)
/// reduces as the intervals themselves, without copying them.
impl<T: Interval> Interval for &T {
    fn start(&self) -> i64 {
        (*self).start()
    }
    fn end(&self) -> i64 {
        (*self).end()
    }
    fn category(&self) -> u32 {
        (*self).category()
    }
    fn intervals(&self) -> u32 {
        (*self).intervals()
    }
    fn category_ns(&self) -> i64 {
        (*self).category_ns()
    }
    fn covered_ns(&self) -> i64 {
        (*self).covered_ns()
    }
}

/// An interval to draw.
#[derive(Clone, Debug, PartialEq)]
pub struct Drawn {
    pub start: i64,
    pub end: i64,
    pub category: u32,
    /// Intervals merged into this one (1: an original interval).
    pub merged: u32,
    /// Index, in the lane, of the original interval (for 1) or of the
    /// longest interval of the dominant category (for merged ones).
    pub index: usize,
    /// Share of `[start, end)` covered by intervals (a merged bucket may
    /// hold gaps).
    pub coverage: f32,
}

struct Bucket {
    id: i64,
    start: i64,
    end: i64,
    merged: u32,
    covered: i64,
    /// (category, ns, longest interval index, its length)
    weights: Vec<(u32, i64, usize, i64)>,
}

impl Bucket {
    fn add(&mut self, i: usize, iv: &impl Interval) {
        let d = iv.category_ns();
        self.end = self.end.max(iv.end());
        self.merged += iv.intervals();
        self.covered += iv.covered_ns();
        match self.weights.iter_mut().find(|w| w.0 == iv.category()) {
            Some(w) => {
                w.1 += d;
                if d > w.3 {
                    w.2 = i;
                    w.3 = d;
                }
            }
            None => self.weights.push((iv.category(), d, i, d)),
        }
    }

    fn drawn(self) -> Drawn {
        let dominant = self
            .weights
            .iter()
            .max_by_key(|w| w.1)
            .copied()
            .expect("a bucket holds at least one interval");
        let span = (self.end - self.start).max(1);
        Drawn {
            start: self.start,
            end: self.end,
            category: dominant.0,
            merged: self.merged,
            index: dominant.2,
            coverage: (self.covered as f64 / span as f64).min(1.0) as f32,
        }
    }
}

/// The intervals of `lane` (sorted by start, not overlapping) that overlap
/// `[from, to)`, reduced for drawing at `resolution` ns per pixel
/// (resolution ≤ 1 keeps everything). `limit` bounds the output; the
/// second value says whether it was reached.
pub fn reduce<T: Interval>(
    lane: &[T],
    from: i64,
    to: i64,
    resolution: i64,
    limit: usize,
) -> (Vec<Drawn>, bool) {
    let first = lane.partition_point(|iv| iv.end() <= from);
    let mut out = Vec::new();
    let mut bucket: Option<Bucket> = None;
    for (i, iv) in lane.iter().enumerate().skip(first) {
        if iv.start() >= to {
            break;
        }
        if out.len() >= limit {
            return (out, true);
        }
        let d = iv.end() - iv.start();
        if iv.intervals() == 1 && (resolution <= 1 || d >= resolution) {
            if let Some(b) = bucket.take() {
                out.push(b.drawn());
            }
            out.push(Drawn {
                start: iv.start(),
                end: iv.end(),
                category: iv.category(),
                merged: 1,
                index: i,
                coverage: 1.0,
            });
            continue;
        }
        let id = iv.start().div_euclid(resolution);
        match bucket.as_mut() {
            Some(b) if b.id == id => b.add(i, iv),
            _ => {
                if let Some(b) = bucket.take() {
                    out.push(b.drawn());
                }
                let mut b = Bucket {
                    id,
                    start: iv.start(),
                    end: iv.end(),
                    merged: 0,
                    covered: 0,
                    weights: Vec::with_capacity(4),
                };
                b.add(i, iv);
                bucket = Some(b);
            }
        }
    }
    if let Some(b) = bucket.take() {
        out.push(b.drawn());
    }
    let truncated = out.len() > limit;
    out.truncate(limit);
    (out, truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug)]
    struct Iv(i64, i64, u32);

    impl Interval for Iv {
        fn start(&self) -> i64 {
            self.0
        }
        fn end(&self) -> i64 {
            self.1
        }
        fn category(&self) -> u32 {
            self.2
        }
    }

    #[test]
    fn long_intervals_are_kept_and_short_ones_merge_per_bucket() {
        let lane = [
            Iv(0, 100, 0),
            Iv(100, 103, 1),
            Iv(103, 104, 2),
            Iv(104, 108, 1),
            Iv(110, 115, 2),
            Iv(115, 300, 0),
        ];
        let (out, truncated) = reduce(&lane, 0, 1000, 10, usize::MAX);
        assert!(!truncated);
        assert_eq!(out.len(), 4);
        assert_eq!((out[0].start, out[0].end, out[0].merged), (0, 100, 1));
        // Bucket 10 (ns 100..110): state 1 has 7 ns, state 2 has 1 ns.
        assert_eq!(
            (out[1].start, out[1].end, out[1].category, out[1].merged),
            (100, 108, 1, 3)
        );
        assert_eq!(
            out[1].index, 3,
            "the longest interval of the dominant state"
        );
        assert!((out[1].coverage - 1.0).abs() < 1e-6);
        // Bucket 11 holds one short interval.
        assert_eq!(
            (out[2].start, out[2].end, out[2].category, out[2].merged),
            (110, 115, 2, 1)
        );
        assert_eq!((out[3].start, out[3].end), (115, 300));
    }

    #[test]
    fn window_and_resolution_one_keep_everything_overlapping() {
        let lane: Vec<Iv> = (0..1000)
            .map(|i| Iv(i * 2, i * 2 + 1, (i % 3) as u32))
            .collect();
        let (out, _) = reduce(&lane, 101, 201, 1, usize::MAX);
        assert_eq!(out.first().unwrap().start, 102);
        assert_eq!(out.last().unwrap().start, 200);
        assert_eq!(out.len(), 50);
        let (out, _) = reduce(&lane, 101, 201, 0, usize::MAX);
        assert_eq!(out.len(), 50);
    }

    #[test]
    fn many_short_intervals_reduce_to_about_one_per_pixel() {
        let lane: Vec<Iv> = (0..200_000)
            .map(|i| Iv(i * 10, i * 10 + 7, (i % 5 == 0) as u32))
            .collect();
        let res = 2_000_000 / 1000; // 1000 pixels
        let (out, _) = reduce(&lane, 0, 2_000_000, res, usize::MAX);
        assert!(out.len() <= 1001, "{} intervals", out.len());
        assert!(
            out.iter().all(|d| d.category == 0),
            "category 0 dominates every bucket"
        );
        assert!(out.iter().all(|d| (d.coverage - 0.7).abs() < 0.01));
        let merged: u32 = out.iter().map(|d| d.merged).sum();
        assert_eq!(merged, 200_000, "every interval is accounted for");
    }

    /// Intervals standing for several, with their own weights.
    #[derive(Clone, Copy, Debug)]
    struct Summary(Iv, u32, i64, i64);

    impl Interval for Summary {
        fn start(&self) -> i64 {
            self.0 .0
        }
        fn end(&self) -> i64 {
            self.0 .1
        }
        fn category(&self) -> u32 {
            self.0 .2
        }
        fn intervals(&self) -> u32 {
            self.1
        }
        fn category_ns(&self) -> i64 {
            self.2
        }
        fn covered_ns(&self) -> i64 {
            self.3
        }
    }

    #[test]
    fn a_summary_weighs_as_the_intervals_it_stands_for() {
        let lane = [
            // 256 intervals over 0..50 ns, category 1 for 20 ns of 40.
            Summary(Iv(0, 50, 1), 256, 20, 40),
            // One interval of category 2, longer than category 1's share.
            Summary(Iv(50, 80, 2), 1, 30, 30),
            // A summary is never drawn as one interval, even when long.
            Summary(Iv(100, 400, 3), 9, 200, 250),
        ];
        let (out, _) = reduce(&lane, 0, 1000, 100, usize::MAX);
        assert_eq!(out.len(), 2);
        assert_eq!((out[0].start, out[0].end, out[0].category), (0, 80, 2));
        assert_eq!(out[0].merged, 257);
        assert!((out[0].coverage - 70.0 / 80.0).abs() < 1e-6);
        assert_eq!((out[1].category, out[1].merged), (3, 9));
        assert!((out[1].coverage - 250.0 / 300.0).abs() < 1e-6);
    }

    #[test]
    fn limit_truncates_and_says_so() {
        let lane: Vec<Iv> = (0..100).map(|i| Iv(i * 10, i * 10 + 10, 0)).collect();
        let (out, truncated) = reduce(&lane, 0, 1000, 1, 10);
        assert_eq!(out.len(), 10);
        assert!(truncated);
    }

    #[test]
    fn buckets_do_not_depend_on_the_window() {
        let lane: Vec<Iv> = (0..1000)
            .map(|i| Iv(i * 3, i * 3 + 2, (i % 2) as u32))
            .collect();
        let (a, _) = reduce(&lane, 0, 3000, 50, usize::MAX);
        let (b, _) = reduce(&lane, 1000, 3000, 50, usize::MAX);
        let tail: Vec<&Drawn> = a.iter().filter(|d| d.start >= 1050).collect();
        let tail_b: Vec<&Drawn> = b.iter().filter(|d| d.start >= 1050).collect();
        assert_eq!(tail, tail_b);
    }
}
