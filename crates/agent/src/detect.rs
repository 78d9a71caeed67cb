//! Anomaly detection per (service, operation): Protractor's rule (Carosi
//! 2018, §5.2.3) with a guard against the operation's ordinary tail.
//!
//! Carosi's rule: a span is anomalous when its duration exceeds the median
//! of a sliding window of that key's last durations times a threshold
//! (defaults: window 500, threshold 3, as the thesis found to work).
//!
//! The tail guard: the span must also be longer than a high quantile
//! (default 0.99) of the key's last `window` *ordinary* durations, those
//! not judged anomalous. Carosi's rule alone fires on an operation's
//! ordinary tail whenever that tail reaches past 3 × the median: a
//! log-normal latency of σ = 1 has 14 % of its spans there, each one a
//! snapshot trigger the agent pays for. With the guard, on a workload
//! whose durations do not change over time, a new span is above the k-th
//! largest of n earlier ones with probability k/(n + 1) whatever their
//! distribution (the new one is equally likely to hold any rank):
//! with n = 500 and q = 0.99 (k = 6), about 1.2 % of spans at most, and
//! only those also over 3 × the median. Anomalous spans stay out of the
//! ordinary window, so a fault that lasts keeps being flagged for as long
//! as Carosi's rule alone would flag it (until the median has moved, about
//! half a window), instead of becoming the tail after k spans. Setting no
//! quantile gives Carosi's rule alone (the seed's).
//!
//! Choices the thesis leaves open, and why:
//! - The span is judged against the window *before* it enters it (the
//!   thesis's Fig. 5.3 does this too: the span is classified "as it enters
//!   the window"), so one outlier cannot raise the median it is compared
//!   with. It enters the window afterwards whatever the verdict, as in the
//!   thesis: a lasting slow-down becomes the new norm after about half a
//!   window instead of flagging every span for ever.
//! - The median of an even count is the mean of the two middle values
//!   (rounded down). The quantile is the nearest rank: the ⌈q·n⌉-th
//!   smallest of n.
//! - Nothing is judged before [`DetectorConfig::min_count`] durations are in
//!   the key's window (default 20): the median of fewer samples of a skewed
//!   latency distribution moves a lot from one span to the next, and the
//!   first requests of a service (cold caches, connection set-up, JIT) are
//!   the slow ones; 20 spans is a fraction of a second at the rates where
//!   the agent matters. The first `min_count` spans are never anomalous, so
//!   the ordinary window holds at least as many once spans are judged.
//! - An optional floor: a span shorter than it is never anomalous (3× of a
//!   50 µs health check is not worth a kernel snapshot).
//! - Keys are bounded: past [`DetectorConfig::max_keys`] the least recently
//!   seen key is forgotten (counted in [`DetectorStats::evicted_keys`]), so
//!   a service that puts ids in its span names cannot grow memory without
//!   bound, and the keys that keep coming stay.
//!
//! Cost per span: O(log window). Each window is a ring of (duration,
//! sequence) pairs, in arrival order, plus the same pairs split into two
//! ordered sets at the rank it answers (the median's, or the quantile's),
//! kept at that split as entries come and go, so the answer is the lower
//! set's largest element (for an even median, the mean with the upper
//! set's smallest). The sequence number makes equal durations distinct, so
//! the oldest can be removed exactly. Memory: about 50 bytes per duration
//! held (ring 16 B plus a B-tree entry 16 B and its share of nodes), two
//! windows a key, so at most `max_keys × 2 × window × ~50 B` (1024 keys ×
//! 500 ≈ 50 MB).

use std::collections::{BTreeSet, VecDeque};
use std::hash::{Hash, Hasher};

use hashbrown::{Equivalent, HashMap};

/// How anomalies are judged.
#[derive(Clone, Debug, PartialEq)]
pub struct DetectorConfig {
    /// Durations kept per key (the sliding window).
    pub window: usize,
    /// A span is anomalous when its duration is strictly greater than the
    /// window's median times this.
    pub threshold: f64,
    /// And strictly greater than this quantile of the key's last `window`
    /// ordinary (not anomalous) durations; `None`: the median rule alone.
    pub tail_quantile: Option<f64>,
    /// Durations a key's window must hold before its spans are judged.
    pub min_count: usize,
    /// Spans shorter than this are never anomalous. Without one, a key
    /// whose median is 0 (durations under the clock's resolution) finds
    /// every longer span anomalous.
    pub floor_ns: Option<u64>,
    /// Most (service, operation) keys remembered; the least recently seen
    /// goes first.
    pub max_keys: usize,
}

impl Default for DetectorConfig {
    /// Carosi 2018's window and threshold, the tail guard at 0.99; see the
    /// module doc for the rest.
    fn default() -> DetectorConfig {
        DetectorConfig {
            window: 500,
            threshold: 3.0,
            tail_quantile: Some(0.99),
            min_count: 20,
            floor_ns: None,
            max_keys: 1024,
        }
    }
}

/// A configuration that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("the anomaly window must hold at least one span")]
    EmptyWindow,
    #[error("the anomaly threshold must be a positive number (got {0})")]
    Threshold(f64),
    #[error("the tail quantile must be a number in (0, 1] (got {0})")]
    TailQuantile(f64),
    #[error("the minimum count before judging ({min_count}) must be between 1 and the window ({window})")]
    MinCount { min_count: usize, window: usize },
    #[error("the detector must be allowed at least one (service, operation) key")]
    NoKeys,
}

impl DetectorConfig {
    /// Checks the values; [`Detector::new`] calls it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.window == 0 {
            return Err(ConfigError::EmptyWindow);
        }
        if !(self.threshold.is_finite() && self.threshold > 0.0) {
            return Err(ConfigError::Threshold(self.threshold));
        }
        if let Some(q) = self.tail_quantile {
            if !(q > 0.0 && q <= 1.0) {
                return Err(ConfigError::TailQuantile(q));
            }
        }
        if self.min_count == 0 || self.min_count > self.window {
            return Err(ConfigError::MinCount {
                min_count: self.min_count,
                window: self.window,
            });
        }
        if self.max_keys == 0 {
            return Err(ConfigError::NoKeys);
        }
        Ok(())
    }
}

/// What [`Detector::observe`] made of a span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Strictly longer than `baseline_ns × threshold` and than `tail_ns`,
    /// not under the floor, and judged at all (`baseline_ns` is set).
    pub anomalous: bool,
    /// The median the span was judged against; `None` while the key's
    /// window held fewer than `min_count` durations.
    pub baseline_ns: Option<u64>,
    /// The ordinary tail's quantile it was judged against; `None` when not
    /// judged or with no tail guard.
    pub tail_ns: Option<u64>,
    /// Over the median rule's threshold, but not over `tail_ns`: left
    /// alone as the operation's ordinary tail.
    pub within_tail: bool,
    /// Durations in the key's window when the span was judged (before it
    /// entered).
    pub count: usize,
}

/// Counters of a [`Detector`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DetectorStats {
    pub observed: u64,
    /// Spans judged (their key had `min_count` durations).
    pub judged: u64,
    pub anomalies: u64,
    /// Spans over the median rule's threshold that the tail guard kept
    /// from being anomalous: within their operation's ordinary tail.
    pub within_tail: u64,
    /// Keys held now.
    pub keys: usize,
    /// Keys forgotten to stay within `max_keys`.
    pub evicted_keys: u64,
}

/// Per-key sliding-window medians; see the module doc.
pub struct Detector {
    config: DetectorConfig,
    /// Key → slot in `slots`.
    index: HashMap<Key, usize>,
    slots: Vec<Slot>,
    /// Most recently seen slot, and least recently seen (the LRU list runs
    /// through `Slot::newer`/`older`).
    newest: Option<usize>,
    oldest: Option<usize>,
    stats: DetectorStats,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    service: String,
    operation: String,
}

/// A key looked up without allocating; hashes as [`Key`] does (field by
/// field, `str` hashes as `String`).
struct KeyRef<'a> {
    service: &'a str,
    operation: &'a str,
}

impl Hash for KeyRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.service.hash(state);
        self.operation.hash(state);
    }
}

impl Equivalent<Key> for KeyRef<'_> {
    fn equivalent(&self, key: &Key) -> bool {
        self.service == key.service && self.operation == key.operation
    }
}

struct Slot {
    key: Key,
    /// Every recent duration: the median.
    window: RankWindow,
    /// The recent durations not judged anomalous: the ordinary tail.
    ordinary: RankWindow,
    newer: Option<usize>,
    older: Option<usize>,
}

impl Detector {
    pub fn new(config: DetectorConfig) -> Result<Detector, ConfigError> {
        config.validate()?;
        Ok(Detector {
            config,
            index: HashMap::new(),
            slots: Vec::new(),
            newest: None,
            oldest: None,
            stats: DetectorStats::default(),
        })
    }

    pub fn config(&self) -> &DetectorConfig {
        &self.config
    }

    pub fn stats(&self) -> DetectorStats {
        DetectorStats {
            keys: self.index.len(),
            ..self.stats
        }
    }

    /// Judges a span of `service`/`operation` lasting `duration_ns` against
    /// that key's window, then adds it to the window.
    pub fn observe(&mut self, service: &str, operation: &str, duration_ns: u64) -> Verdict {
        let slot = self.slot_for(service, operation);
        let config = &self.config;
        let Slot {
            window, ordinary, ..
        } = &mut self.slots[slot];
        let count = window.len();
        let judged = count >= config.min_count;
        let baseline_ns = judged.then(|| window.value()).flatten();
        let tail_ns = judged.then(|| ordinary.value()).flatten();
        let over_median = baseline_ns.is_some_and(|median| {
            config.floor_ns.is_none_or(|floor| duration_ns >= floor)
                && duration_ns as f64 > median as f64 * config.threshold
        });
        let anomalous = over_median && tail_ns.is_none_or(|tail| duration_ns > tail);
        window.push(duration_ns, config.window);
        if !anomalous {
            ordinary.push(duration_ns, config.window);
        }
        self.stats.observed += 1;
        self.stats.judged += u64::from(baseline_ns.is_some());
        self.stats.anomalies += u64::from(anomalous);
        self.stats.within_tail += u64::from(over_median && !anomalous);
        Verdict {
            anomalous,
            baseline_ns,
            tail_ns,
            within_tail: over_median && !anomalous,
            count,
        }
    }

    /// The median of a key's window now, if it holds any duration.
    pub fn baseline(&self, service: &str, operation: &str) -> Option<u64> {
        let slot = *self.index.get(&KeyRef { service, operation })?;
        self.slots[slot].window.value()
    }

    /// The key's slot, made most recently seen; a new key takes a free
    /// slot, or the least recently seen key's when the table is full.
    fn slot_for(&mut self, service: &str, operation: &str) -> usize {
        if let Some(&slot) = self.index.get(&KeyRef { service, operation }) {
            self.unlink(slot);
            self.link_newest(slot);
            return slot;
        }
        let key = Key {
            service: service.to_string(),
            operation: operation.to_string(),
        };
        let slot = if self.slots.len() < self.config.max_keys {
            self.slots.push(Slot {
                key: key.clone(),
                window: RankWindow::median(),
                ordinary: self
                    .config
                    .tail_quantile
                    .map_or_else(RankWindow::off, RankWindow::quantile),
                newer: None,
                older: None,
            });
            self.slots.len() - 1
        } else {
            let victim = self.oldest.expect("a full table has an oldest key");
            self.unlink(victim);
            let old = std::mem::replace(&mut self.slots[victim].key, key.clone());
            self.index.remove(&old);
            self.slots[victim].window.clear();
            self.slots[victim].ordinary.clear();
            self.stats.evicted_keys += 1;
            victim
        };
        self.index.insert(key, slot);
        self.link_newest(slot);
        slot
    }

    fn unlink(&mut self, slot: usize) {
        let (newer, older) = (self.slots[slot].newer, self.slots[slot].older);
        match newer {
            Some(n) => self.slots[n].older = older,
            None => self.newest = older,
        }
        match older {
            Some(o) => self.slots[o].newer = newer,
            None => self.oldest = newer,
        }
        self.slots[slot].newer = None;
        self.slots[slot].older = None;
    }

    fn link_newest(&mut self, slot: usize) {
        self.slots[slot].older = self.newest;
        self.slots[slot].newer = None;
        if let Some(n) = self.newest {
            self.slots[n].newer = Some(slot);
        }
        self.newest = Some(slot);
        if self.oldest.is_none() {
            self.oldest = Some(slot);
        }
    }
}

/// Which rank of its durations a [`RankWindow`] answers.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Rank {
    /// The middle value, or the mean of the two middle values.
    Median,
    /// The ⌈q·n⌉-th smallest of n (nearest rank).
    Quantile(f64),
    /// Nothing: the window is not kept.
    Off,
}

/// The last durations of one key with a running order statistic, O(log n)
/// per change: `ring` in arrival order; `lower` and `upper` the same
/// entries split at the rank answered ([`RankWindow::lower_len`]), every
/// entry of `lower` ≤ every entry of `upper`.
pub struct RankWindow {
    rank: Rank,
    ring: VecDeque<(u64, u64)>,
    lower: BTreeSet<(u64, u64)>,
    upper: BTreeSet<(u64, u64)>,
    next_seq: u64,
}

impl RankWindow {
    fn with_rank(rank: Rank) -> RankWindow {
        RankWindow {
            rank,
            ring: VecDeque::new(),
            lower: BTreeSet::new(),
            upper: BTreeSet::new(),
            next_seq: 0,
        }
    }

    /// A window answering its median.
    pub fn median() -> RankWindow {
        RankWindow::with_rank(Rank::Median)
    }

    /// A window answering its `q` quantile, 0 < q ≤ 1.
    pub fn quantile(q: f64) -> RankWindow {
        RankWindow::with_rank(Rank::Quantile(q))
    }

    /// A window that holds nothing and answers nothing.
    fn off() -> RankWindow {
        RankWindow::with_rank(Rank::Off)
    }

    pub fn len(&self) -> usize {
        self.ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// The median (the mean of the two middle values, rounded down, when
    /// the count is even) or the quantile; None when empty.
    pub fn value(&self) -> Option<u64> {
        let low = self.lower.last()?.0;
        if self.rank != Rank::Median || self.lower.len() > self.upper.len() {
            return Some(low);
        }
        let high = self.upper.first().map_or(low, |e| e.0);
        // (low + high) / 2 without overflow.
        Some(low / 2 + high / 2 + (low & high & 1))
    }

    /// How many of `n` entries belong in `lower`.
    fn lower_len(&self, n: usize) -> usize {
        match self.rank {
            Rank::Median => n.div_ceil(2),
            Rank::Quantile(q) => ((q * n as f64).ceil() as usize).clamp(n.min(1), n),
            Rank::Off => 0,
        }
    }

    /// Adds a duration, first dropping the oldest when `capacity` are held.
    pub fn push(&mut self, duration_ns: u64, capacity: usize) {
        if self.rank == Rank::Off {
            return;
        }
        while self.ring.len() >= capacity.max(1) {
            let oldest = self.ring.pop_front().expect("not empty");
            if !self.lower.remove(&oldest) {
                self.upper.remove(&oldest);
            }
        }
        let entry = (duration_ns, self.next_seq);
        self.next_seq += 1;
        self.ring.push_back(entry);
        // Either side keeps the order when the entry falls between them;
        // `lower` may be empty while `upper` is not (the oldest just left).
        match self.upper.first() {
            Some(&bottom) if entry > bottom => self.upper.insert(entry),
            _ => self.lower.insert(entry),
        };
        self.rebalance();
    }

    fn clear(&mut self) {
        self.ring.clear();
        self.lower.clear();
        self.upper.clear();
    }

    fn rebalance(&mut self) {
        let want = self.lower_len(self.ring.len());
        while self.lower.len() > want {
            let moved = self.lower.pop_last().expect("not empty");
            self.upper.insert(moved);
        }
        while self.lower.len() < want {
            let moved = self.upper.pop_first().expect("not empty");
            self.lower.insert(moved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detector(window: usize, threshold: f64, min_count: usize) -> Detector {
        Detector::new(DetectorConfig {
            window,
            threshold,
            tail_quantile: None,
            min_count,
            floor_ns: None,
            max_keys: 16,
        })
        .unwrap()
    }

    #[test]
    fn the_seeds_figure() {
        // Carosi 2018, Fig. 5.3: window 5, threshold 3; the window holds
        // 62 (oldest) and four others with median 12; 43 > 36 is anomalous,
        // enters and pushes 62 out.
        let mut d = detector(5, 3.0, 1);
        for v in [62, 10, 12, 9, 14] {
            d.observe("s", "op", v);
        }
        let v = d.observe("s", "op", 43);
        assert_eq!(
            v,
            Verdict {
                anomalous: true,
                baseline_ns: Some(12),
                tail_ns: None,
                within_tail: false,
                count: 5
            }
        );
        // Now 10, 12, 9, 14, 43: median 12.
        assert_eq!(d.baseline("s", "op"), Some(12));
    }

    #[test]
    fn nothing_is_judged_before_min_count() {
        let mut d = detector(100, 3.0, 4);
        for v in [10, 10, 10, 10] {
            let verdict = d.observe("s", "op", 1000 * v);
            assert_eq!(verdict.baseline_ns, None);
            assert!(!verdict.anomalous);
        }
        // A huge one before min_count would not have been flagged; now it is.
        let v = d.observe("s", "op", 1_000_000);
        assert_eq!(v.count, 4);
        assert_eq!(v.baseline_ns, Some(10_000));
        assert!(v.anomalous);
        let early = detector(100, 3.0, 4).observe("s", "op", u64::MAX);
        assert!(!early.anomalous);
    }

    #[test]
    fn the_threshold_is_strictly_greater() {
        let mut d = detector(10, 3.0, 1);
        d.observe("s", "op", 12);
        assert!(!d.observe("s", "op", 36).anomalous, "36 = 3 × 12");
        // The window is now {12, 36}: median 24.
        assert!(!d.observe("s", "op", 72).anomalous, "72 = 3 × 24");
        // {12, 36, 72}: median 36.
        assert!(d.observe("s", "op", 109).anomalous, "109 > 3 × 36");
        let after_ten = |v| {
            let mut d = detector(10, 1.5, 1);
            d.observe("s", "op", 10);
            d.observe("s", "op", v).anomalous
        };
        assert!(!after_ten(15));
        assert!(after_ten(16));
    }

    #[test]
    fn spans_under_the_floor_are_never_anomalous() {
        let mut d = Detector::new(DetectorConfig {
            window: 10,
            threshold: 3.0,
            tail_quantile: None,
            min_count: 1,
            floor_ns: Some(1_000),
            max_keys: 4,
        })
        .unwrap();
        d.observe("s", "op", 10);
        let v = d.observe("s", "op", 999);
        assert_eq!(v.baseline_ns, Some(10));
        assert!(!v.anomalous, "under the floor");
        d.observe("s", "op", 10);
        // {10, 999, 10}: median 10; a span at the floor is judged.
        assert!(d.observe("s", "op", 1_000).anomalous);
    }

    #[test]
    fn the_window_forgets_the_oldest() {
        let mut d = detector(3, 3.0, 3);
        for v in [1000, 1000, 1000] {
            d.observe("s", "op", v);
        }
        assert_eq!(d.baseline("s", "op"), Some(1000));
        for v in [10, 10] {
            d.observe("s", "op", v);
        }
        // {1000, 10, 10}: median 10, so 100 is anomalous; after it and one
        // more 10 the last 1000 is gone as well.
        assert!(d.observe("s", "op", 100).anomalous);
        d.observe("s", "op", 10);
        assert_eq!(d.baseline("s", "op"), Some(10));
        assert_eq!(d.observe("s", "op", 5).count, 3);
    }

    #[test]
    fn keys_are_separate_and_bounded() {
        let mut d = Detector::new(DetectorConfig {
            window: 10,
            threshold: 3.0,
            tail_quantile: None,
            min_count: 1,
            floor_ns: None,
            max_keys: 2,
        })
        .unwrap();
        d.observe("a", "x", 100);
        d.observe("b", "x", 1);
        // Same operation name, other service: its own window.
        assert!(!d.observe("a", "x", 250).anomalous);
        assert!(d.observe("b", "x", 250).anomalous);
        // "a" was seen before "b": a third key evicts "a".
        d.observe("c", "y", 7);
        assert_eq!(d.stats().keys, 2);
        assert_eq!(d.stats().evicted_keys, 1);
        assert_eq!(d.baseline("a", "x"), None);
        assert!(d.baseline("b", "x").is_some());
        // "b" used again, so "c" is the oldest now.
        d.observe("b", "x", 1);
        let fresh = d.observe("a", "x", 100);
        assert_eq!(fresh.count, 0, "a forgotten key starts empty");
        assert_eq!(d.baseline("c", "y"), None);
        assert!(d.baseline("b", "x").is_some());
        // A flood of one-off keys never holds more than max_keys.
        for i in 0..1000 {
            d.observe("ids", &format!("GET /item/{i}"), 5);
        }
        assert_eq!(d.stats().keys, 2);
        assert_eq!(d.stats().evicted_keys, 1 + 1 + 1000);
    }

    #[test]
    fn bad_configurations_are_refused() {
        let base = DetectorConfig::default();
        let with = |f: fn(&mut DetectorConfig)| {
            let mut c = base.clone();
            f(&mut c);
            Detector::new(c).err()
        };
        assert_eq!(with(|c| c.window = 0), Some(ConfigError::EmptyWindow));
        assert!(matches!(
            with(|c| c.threshold = f64::NAN),
            Some(ConfigError::Threshold(_))
        ));
        assert!(matches!(
            with(|c| c.threshold = 0.0),
            Some(ConfigError::Threshold(_))
        ));
        assert!(matches!(
            with(|c| c.min_count = 501),
            Some(ConfigError::MinCount { .. })
        ));
        assert_eq!(with(|c| c.max_keys = 0), Some(ConfigError::NoKeys));
        for q in [0.0, -0.5, 1.01, f64::NAN] {
            let mut c = base.clone();
            c.tail_quantile = Some(q);
            assert!(matches!(
                Detector::new(c).err(),
                Some(ConfigError::TailQuantile(_))
            ));
        }
        assert!(Detector::new(base).is_ok());
    }

    #[test]
    fn medians_of_extreme_values_do_not_overflow() {
        let mut w = RankWindow::median();
        w.push(u64::MAX, 2);
        w.push(u64::MAX - 2, 2);
        assert_eq!(w.value(), Some(u64::MAX - 1));
    }

    fn guarded(window: usize, q: f64) -> Detector {
        Detector::new(DetectorConfig {
            window,
            tail_quantile: Some(q),
            min_count: 10,
            ..DetectorConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn the_ordinary_tail_is_not_anomalous() {
        // An operation of 10 ms with one span in ten at 50 ms: its tail
        // reaches past 3 × the median, which the median rule alone flags
        // every time; the guard at 0.95 knows 50 ms as ordinary.
        let stream = (0..200).map(|i| if i % 10 == 9 { 50 } else { 10 });
        let mut seed = detector(50, 3.0, 10);
        let mut tail = guarded(50, 0.95);
        let (mut flagged_seed, mut flagged_tail) = (0, 0);
        for d in stream {
            flagged_seed += u32::from(seed.observe("s", "op", d).anomalous);
            flagged_tail += u32::from(tail.observe("s", "op", d).anomalous);
        }
        assert_eq!(flagged_seed, 19, "every 50 after the first ten spans");
        assert_eq!(flagged_tail, 0);
        assert_eq!(tail.stats().within_tail, 19);
        // Beyond the tail it is anomalous, judged against the 0.95 quantile.
        let v = tail.observe("s", "op", 51);
        assert!(v.anomalous);
        assert_eq!((v.baseline_ns, v.tail_ns), (Some(10), Some(50)));
    }

    #[test]
    fn a_lasting_fault_stays_anomalous_until_the_median_moves() {
        // A window of 20 at 10 ms, then a fault at 100 ms: anomalous spans
        // stay out of the ordinary window, so the fault does not become its
        // tail after two spans; it stops being flagged when the median has
        // moved (11 of 20 slow), as with the median rule alone.
        let mut d = guarded(20, 0.9);
        for _ in 0..20 {
            d.observe("s", "op", 10);
        }
        let flagged: Vec<bool> = (0..20)
            .map(|_| d.observe("s", "op", 100).anomalous)
            .collect();
        let mut seed = detector(20, 3.0, 10);
        for _ in 0..20 {
            seed.observe("s", "op", 10);
        }
        let flagged_seed: Vec<bool> = (0..20)
            .map(|_| seed.observe("s", "op", 100).anomalous)
            .collect();
        assert_eq!(flagged, flagged_seed);
        assert_eq!(flagged.iter().filter(|&&a| a).count(), 10);
        // The ten unflagged ones entered the ordinary window: 100 ms is
        // the norm now, its tail included.
        let v = d.observe("s", "op", 100);
        assert_eq!(
            (v.anomalous, v.baseline_ns, v.tail_ns),
            (false, Some(100), Some(100))
        );
    }

    #[test]
    fn quantiles_are_the_nearest_rank() {
        let mut w = RankWindow::quantile(0.99);
        for d in 1..=500 {
            w.push(d, 500);
        }
        assert_eq!(w.value(), Some(495), "the 495th smallest of 500");
        let mut top = RankWindow::quantile(1.0);
        let mut low = RankWindow::quantile(0.001);
        for d in [7, 3, 9, 1] {
            top.push(d, 3);
            low.push(d, 3);
        }
        // Held: 3, 9, 1.
        assert_eq!(top.value(), Some(9));
        assert_eq!(low.value(), Some(1));
    }
}
