//! One side of a convex hull of message points, kept incrementally.
//!
//! The points of one message direction all lie on the same side of the
//! line that relates the two clocks, so only the side of their hull facing
//! that line can ever constrain it: the lower hull of points that must lie
//! above the line, the upper hull of points that must lie below it. Points
//! inside are dropped as they arrive, so memory follows the hull, not the
//! message count.

/// A message as a point: x on the other host's clock, y on the reference
/// host's clock, both in ns relative to the pair's first message (so that
/// the exact integer arithmetic below cannot overflow).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Point {
    pub x: i64,
    pub y: i64,
}

/// Which side of its points a hull bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// The points lie above the clock line; the hull is their lower chain.
    Lower,
    /// The points lie below the clock line; the hull is their upper chain.
    Upper,
}

/// Twice the signed area of the triangle a, b, c: positive when c lies to
/// the left of the directed line a → b. Exact: coordinates are below 2^61
/// in magnitude, so every product fits in an i128.
fn cross(a: Point, b: Point, c: Point) -> i128 {
    let (abx, aby) = (b.x as i128 - a.x as i128, b.y as i128 - a.y as i128);
    let (acx, acy) = (c.x as i128 - a.x as i128, c.y as i128 - a.y as i128);
    abx * acy - aby * acx
}

#[derive(Clone, Debug)]
pub(crate) struct Hull {
    side: Side,
    /// Hull vertices by strictly increasing x; collinear points are not kept.
    vertices: Vec<Point>,
    /// Every point ever inserted (hull or not), for the mean below.
    points: u64,
    sum_x: i128,
}

impl Hull {
    pub fn new(side: Side) -> Hull {
        Hull {
            side,
            vertices: Vec::new(),
            points: 0,
            sum_x: 0,
        }
    }

    pub fn vertices(&self) -> &[Point] {
        &self.vertices
    }

    pub fn points(&self) -> u64 {
        self.points
    }

    pub fn is_empty(&self) -> bool {
        self.points == 0
    }

    /// True when b is a strict corner of the chain a → b → c (a, b, c by
    /// increasing x): the chain turns away from the side the line is on.
    fn corner(&self, a: Point, b: Point, c: Point) -> bool {
        match self.side {
            Side::Lower => cross(a, b, c) > 0,
            Side::Upper => cross(a, b, c) < 0,
        }
    }

    /// True when p, at the same x as q, is further from the points' side
    /// than q (so it replaces q as the hull vertex there).
    fn tighter(&self, p: Point, q: Point) -> bool {
        match self.side {
            Side::Lower => p.y < q.y,
            Side::Upper => p.y > q.y,
        }
    }

    /// Adds a point. In time order (x non-decreasing) this is amortised
    /// O(1): the point is appended and the vertices it hides are popped.
    /// Out of order it costs O(hull size), which stays small because
    /// random delays leave few points on a hull.
    pub fn insert(&mut self, p: Point) {
        self.points += 1;
        self.sum_x += p.x as i128;
        let v = &self.vertices;
        let mut i = v.partition_point(|q| q.x < p.x);
        if i < v.len() && v[i].x == p.x {
            if !self.tighter(p, v[i]) {
                return;
            }
            // v[i] was a corner and p is beyond it, so p is outside too.
            self.vertices.remove(i);
        } else if i > 0 && i < v.len() && !self.corner(v[i - 1], p, v[i]) {
            return;
        }
        self.vertices.insert(i, p);
        while i >= 2 && !self.corner(self.vertices[i - 2], self.vertices[i - 1], self.vertices[i]) {
            self.vertices.remove(i - 1);
            i -= 1;
        }
        while i + 2 < self.vertices.len()
            && !self.corner(self.vertices[i], self.vertices[i + 1], self.vertices[i + 2])
        {
            self.vertices.remove(i + 1);
        }
    }

    /// The intercept of the tightest line of slope `s` on the line's side
    /// of every point: min(y − s·x) for a lower hull, max for an upper one.
    pub fn support(&self, s: f64) -> f64 {
        let values = self.vertices.iter().map(|p| p.y as f64 - s * p.x as f64);
        match self.side {
            Side::Lower => values.fold(f64::INFINITY, f64::min),
            Side::Upper => values.fold(f64::NEG_INFINITY, f64::max),
        }
    }

    /// Slope of the hull edge above (or below) the mean x of all points:
    /// the supporting line there minimises the summed distance from the
    /// points to a line on their side (the one-way estimator of Moon,
    /// Skelly and Towsley, 1999). None with fewer than two vertices.
    pub fn slope_at_mean(&self) -> Option<f64> {
        let v = &self.vertices;
        if v.len() < 2 {
            return None;
        }
        let mean = self.sum_x as f64 / self.points as f64;
        let k = v
            .partition_point(|q| (q.x as f64) <= mean)
            .clamp(1, v.len() - 1);
        Some(slope(v[k - 1], v[k]))
    }
}

pub(crate) fn slope(a: Point, b: Point) -> f64 {
    (b.y as f64 - a.y as f64) / (b.x as f64 - a.x as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(x: i64, y: i64) -> Point {
        Point { x, y }
    }

    /// The lower hull by brute force: a point is a vertex when no segment
    /// between two other points passes through or below it.
    fn brute_lower(points: &[Point]) -> Vec<Point> {
        let mut best: Vec<Point> = Vec::new();
        for &p in points {
            if points.iter().any(|q| q.x == p.x && q.y < p.y) || best.contains(&p) {
                continue;
            }
            let hidden = points.iter().any(|&a| {
                points
                    .iter()
                    .any(|&b| a.x < p.x && p.x < b.x && cross(a, b, p) >= 0)
            });
            if !hidden {
                best.push(p);
            }
        }
        best.sort_by_key(|p| p.x);
        best
    }

    #[test]
    fn any_insertion_order_gives_the_brute_force_lower_hull() {
        let points: Vec<Point> = (0..40i64)
            .map(|i| pt((i * 7919) % 53, ((i * i * 31) % 97) - 40))
            .collect();
        let mut hull = Hull::new(Side::Lower);
        for &p in &points {
            hull.insert(p);
        }
        assert_eq!(hull.vertices(), brute_lower(&points).as_slice());
        assert_eq!(hull.points(), 40);
    }

    #[test]
    fn upper_hull_is_the_mirror_of_the_lower_one() {
        let points: Vec<Point> = (0..30i64)
            .map(|i| pt((i * 13) % 29, (i * 17) % 23))
            .collect();
        let mut upper = Hull::new(Side::Upper);
        let mut lower_of_mirror = Hull::new(Side::Lower);
        for &p in &points {
            upper.insert(p);
            lower_of_mirror.insert(pt(p.x, -p.y));
        }
        let mirrored: Vec<Point> = lower_of_mirror
            .vertices()
            .iter()
            .map(|p| pt(p.x, -p.y))
            .collect();
        assert_eq!(upper.vertices(), mirrored.as_slice());
    }

    #[test]
    fn collinear_and_repeated_points_are_not_vertices() {
        let mut hull = Hull::new(Side::Lower);
        for p in [pt(0, 0), pt(1, 1), pt(2, 2), pt(2, 5), pt(3, 3)] {
            hull.insert(p);
        }
        assert_eq!(hull.vertices(), &[pt(0, 0), pt(3, 3)]);
        hull.insert(pt(2, 1));
        assert_eq!(hull.vertices(), &[pt(0, 0), pt(2, 1), pt(3, 3)]);
    }
}
