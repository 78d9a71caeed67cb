//! How far a transform can be off: the set of lines that fit the messages,
//! kept by its corner lines.
//!
//! The lines `y = s·x + c` that fit a pair's messages are a convex polygon
//! of points (s, c) (see [`crate::pair`] for its corners). At a time t of
//! the source clock a line is worth s·t + c, a linear function of (s, c),
//! so over the polygon its least and greatest values are at corners: the
//! true time of t lies between the lowest and the highest corner line at t.
//! Likewise |line(t) − estimate(t)| is convex in t, so over a time range
//! its largest value is at one of the range's ends.
//!
//! A transform composed along a path of hosts is a line of one set applied
//! after a line of the next. At t the inner lines' values fill an interval
//! whose ends are corner lines' values, and an outer line, linear, is
//! extreme at an end of that interval; so the composed set's lowest and
//! highest values at t are among the corners composed pairwise, whatever
//! the signs of the slopes. The composed corners are pruned to the convex
//! hull of their (slope, offset) points: a time's extremes are at hull
//! vertices, and pruning keeps a path of many hops from multiplying the
//! corners at every hop.

use crate::Transform;

/// What the messages say about the lines that fit them (the transforms the
/// clocks can truly have, if they are linear).
#[derive(Clone, Debug, PartialEq)]
pub enum Bounds {
    /// The lines that fit form a bounded set: every one lies between the
    /// envelope's lowest and highest lines at every time.
    Enclosed(Envelope),
    /// The messages set no finite bound: one direction only, directions
    /// that do not interleave in time (nothing bounds the slope on one
    /// side), or no message at all.
    Unbounded,
    /// No line fits every message (the hulls cross: a clock stepped, or a
    /// message was matched wrongly), so nothing bounds a linear transform.
    Contradicted,
}

impl Bounds {
    /// The bounds of the composed transform `self` after `inner` (as
    /// [`Transform::after`] composes the transforms): enclosed when both
    /// are, contradicted when either is.
    pub(crate) fn after(&self, inner: &Bounds) -> Bounds {
        match (self, inner) {
            (Bounds::Enclosed(outer), Bounds::Enclosed(inner)) => {
                Bounds::Enclosed(outer.after(inner))
            }
            (Bounds::Contradicted, _) | (_, Bounds::Contradicted) => Bounds::Contradicted,
            _ => Bounds::Unbounded,
        }
    }

    /// The envelope, when the set is bounded.
    pub fn envelope(&self) -> Option<&Envelope> {
        match self {
            Bounds::Enclosed(envelope) => Some(envelope),
            Bounds::Unbounded | Bounds::Contradicted => None,
        }
    }

    /// The lowercase name `deepspan sync` prints (`enclosed`, `unbounded`,
    /// `contradicted`).
    pub fn name(&self) -> &'static str {
        match self {
            Bounds::Enclosed(_) => "enclosed",
            Bounds::Unbounded => "unbounded",
            Bounds::Contradicted => "contradicted",
        }
    }
}

/// A bounded set of lines, by its corner lines: at every time, the lowest
/// and highest of them are the lowest and highest of the whole set.
#[derive(Clone, Debug, PartialEq)]
pub struct Envelope {
    /// The corners: the vertices of the convex hull of the lines' (slope,
    /// offset) points, by increasing slope (never empty).
    lines: Vec<Transform>,
}

impl Envelope {
    /// The set of one line: a clock known exactly (the reference's own).
    pub(crate) fn exact(line: Transform) -> Envelope {
        Envelope { lines: vec![line] }
    }

    /// The set spanned by `corners` (at least one line); lines inside their
    /// hull are dropped.
    pub(crate) fn spanned_by(corners: Vec<Transform>) -> Envelope {
        assert!(!corners.is_empty(), "an envelope has a line");
        Envelope {
            lines: hull_vertices(corners),
        }
    }

    /// The least and greatest slope of the lines that fit: the extreme
    /// relative rates of the two clocks.
    pub fn slopes(&self) -> (f64, f64) {
        (self.lines[0].slope, self.lines[self.lines.len() - 1].slope)
    }

    /// How far the lines that fit are from `transform` at time `t_ns` of the
    /// source clock: the lowest and the highest of line(t) − transform(t),
    /// in ns. The true time of t, mapped by `transform`, is off by an amount
    /// in that range. Computed as differences of slopes and offsets, which
    /// keeps ns at times near the Unix epoch.
    pub fn deviation_at(&self, transform: &Transform, t_ns: u64) -> (f64, f64) {
        let t = t_ns as f64;
        self.lines
            .iter()
            .map(|line| (line.slope - transform.slope) * t + (line.offset_ns - transform.offset_ns))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), d| {
                (lo.min(d), hi.max(d))
            })
    }

    /// The largest error, in ns, of a time in [first_ns, last_ns] mapped by
    /// `transform`, if the clocks are linear: the largest |line(t) −
    /// transform(t)| over the lines that fit, at one of the range's ends.
    pub fn max_error_ns(&self, transform: &Transform, first_ns: u64, last_ns: u64) -> f64 {
        [first_ns, last_ns]
            .into_iter()
            .map(|t| {
                let (lo, hi) = self.deviation_at(transform, t);
                lo.abs().max(hi.abs())
            })
            .fold(0.0, f64::max)
    }

    /// The set of `self`'s lines applied after `inner`'s (see the module's
    /// doc).
    fn after(&self, inner: &Envelope) -> Envelope {
        let composed = self
            .lines
            .iter()
            .flat_map(|outer| inner.lines.iter().map(move |line| outer.after(line)))
            .collect();
        Envelope::spanned_by(composed)
    }
}

/// The vertices of the convex hull of the lines' (slope, offset) points, by
/// increasing slope (Andrew's monotone chain: the lower chain, then the
/// upper one). Points on the hull's edges are dropped: a line between two
/// others of the set is never beyond both. The turns are judged in f64, so
/// a corner within rounding of the segment between its neighbours may go
/// too: its line is then beyond theirs by no more than that rounding, a few
/// ns for times near the Unix epoch and slopes a few thousand ppm apart.
fn hull_vertices(mut lines: Vec<Transform>) -> Vec<Transform> {
    lines.sort_by(|a, b| {
        a.slope
            .total_cmp(&b.slope)
            .then(a.offset_ns.total_cmp(&b.offset_ns))
    });
    lines.dedup();
    if lines.len() <= 2 {
        return lines;
    }
    let mut lower = convex_chain(lines.iter());
    let upper = convex_chain(lines.iter().rev());
    // Each chain ends where the other starts.
    lower.pop();
    lower.extend(&upper[..upper.len() - 1]);
    lower.sort_by(|a, b| a.slope.total_cmp(&b.slope));
    lower
}

/// The points, in their order, that keep every turn counterclockwise: the
/// lower chain of points by increasing slope, the upper chain of points by
/// decreasing slope.
fn convex_chain<'a>(points: impl Iterator<Item = &'a Transform>) -> Vec<Transform> {
    // > 0 when c is to the left of a → b.
    let turn = |a: &Transform, b: &Transform, c: &Transform| {
        (b.slope - a.slope) * (c.offset_ns - a.offset_ns)
            - (b.offset_ns - a.offset_ns) * (c.slope - a.slope)
    };
    let mut chain: Vec<Transform> = Vec::new();
    for &p in points {
        while chain.len() >= 2 && turn(&chain[chain.len() - 2], &chain[chain.len() - 1], &p) <= 0.0
        {
            chain.pop();
        }
        chain.push(p);
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(slope: f64, offset_ns: f64) -> Transform {
        Transform { slope, offset_ns }
    }

    #[test]
    fn lines_inside_the_hull_are_dropped() {
        let square = [
            line(1.0, 0.0),
            line(1.0, 10.0),
            line(1.5, 5.0), // inside
            line(2.0, 0.0),
            line(2.0, 10.0),
            line(1.5, 0.0), // on an edge
        ];
        let envelope = Envelope::spanned_by(square.to_vec());
        assert_eq!(envelope.lines.len(), 4, "{:?}", envelope.lines);
        assert_eq!(envelope.slopes(), (1.0, 2.0));
        // Pruning keeps every time's extremes.
        for t in [0u64, 1, 7, 100] {
            let all = Envelope {
                lines: square.to_vec(),
            };
            let identity = Transform::IDENTITY;
            assert_eq!(
                envelope.deviation_at(&identity, t),
                all.deviation_at(&identity, t)
            );
        }
    }

    #[test]
    fn composition_takes_the_extremes_of_every_pair() {
        // Inner: slopes 1 and 2 through the origin; outer: a shift by 0 or 10.
        let inner = Envelope::spanned_by(vec![line(1.0, 0.0), line(2.0, 0.0)]);
        let outer = Envelope::spanned_by(vec![line(1.0, 0.0), line(1.0, 10.0)]);
        let composed = outer.after(&inner);
        assert_eq!(composed.slopes(), (1.0, 2.0));
        // At t = 5 the inner lines give 5..10, the outer add 0..10.
        let at_five = composed.deviation_at(&Transform::IDENTITY, 5);
        assert_eq!(at_five, (0.0, 15.0));
        assert_eq!(composed.max_error_ns(&Transform::IDENTITY, 0, 5), 15.0);
        // A decreasing outer line swaps the inner extremes: still exact.
        let falling = Envelope::exact(line(-1.0, 0.0));
        assert_eq!(
            falling.after(&inner).deviation_at(&line(0.0, 0.0), 5),
            (-10.0, -5.0)
        );
    }

    #[test]
    fn composed_bounds_keep_the_worst_case() {
        let enclosed = Bounds::Enclosed(Envelope::exact(Transform::IDENTITY));
        assert_eq!(enclosed.after(&enclosed), enclosed);
        assert_eq!(enclosed.after(&Bounds::Unbounded), Bounds::Unbounded);
        assert_eq!(
            Bounds::Unbounded.after(&Bounds::Contradicted),
            Bounds::Contradicted
        );
        assert_eq!(Bounds::Contradicted.after(&enclosed), Bounds::Contradicted);
        assert_eq!(Bounds::Unbounded.envelope(), None);
    }
}
