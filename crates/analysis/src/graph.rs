//! The execution graph: one row of time-ordered vertices per thread
//! ("worker"), horizontal edges carrying the thread's state between two
//! consecutive vertices, and vertical edges between threads (wake-ups, forks,
//! network messages).
//!
//! The same type holds the kernel execution graph and the critical paths
//! computed on it, as in Trace Compass, so a critical path can be compared
//! with (and printed like) any other graph.
//!
//! Semantics follow Trace Compass' graph: a worker never has two vertices
//! with the same timestamp (adding one at the timestamp of the worker's last
//! vertex returns that vertex), a vertex has at most one edge in each of its
//! four slots, and a missing horizontal edge between two consecutive vertices
//! is a gap.

use std::fmt;
use std::sync::Arc;

use deepspan_model::Tid;

use rustc_hash::FxHashMap;

/// What an edge means: the state of the thread along a horizontal edge, or
/// the kind of dependency along a vertical one (Trace Compass'
/// `OSEdgeContextState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EdgeType {
    Unknown,
    /// A link created without an explicit state (wake-up and fork links).
    Default,
    Running,
    Blocked,
    Interrupted,
    Preempted,
    Timer,
    Network,
    UserInput,
    BlockDevice,
    Ipi,
    /// Zero-duration connector.
    Eps,
    NoEdge,
}

impl EdgeType {
    /// Every type, in declaration order.
    pub const ALL: [EdgeType; 13] = [
        EdgeType::Unknown,
        EdgeType::Default,
        EdgeType::Running,
        EdgeType::Blocked,
        EdgeType::Interrupted,
        EdgeType::Preempted,
        EdgeType::Timer,
        EdgeType::Network,
        EdgeType::UserInput,
        EdgeType::BlockDevice,
        EdgeType::Ipi,
        EdgeType::Eps,
        EdgeType::NoEdge,
    ];

    /// The upper-case name Trace Compass uses (`RUNNING`, `BLOCK_DEVICE`, …).
    pub fn name(self) -> &'static str {
        match self {
            EdgeType::Unknown => "UNKNOWN",
            EdgeType::Default => "DEFAULT",
            EdgeType::Running => "RUNNING",
            EdgeType::Blocked => "BLOCKED",
            EdgeType::Interrupted => "INTERRUPTED",
            EdgeType::Preempted => "PREEMPTED",
            EdgeType::Timer => "TIMER",
            EdgeType::Network => "NETWORK",
            EdgeType::UserInput => "USER_INPUT",
            EdgeType::BlockDevice => "BLOCK_DEVICE",
            EdgeType::Ipi => "IPI",
            EdgeType::Eps => "EPS",
            EdgeType::NoEdge => "NO_EDGE",
        }
    }

    /// The inverse of [`EdgeType::name`].
    pub fn from_name(name: &str) -> Option<EdgeType> {
        EdgeType::ALL.into_iter().find(|t| t.name() == name)
    }
}

impl fmt::Display for EdgeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A vertex: its worker (row) and its position in that row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VertexId {
    pub worker: u32,
    pub index: u32,
}

/// Which of a vertex's four edge slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    OutgoingHorizontal,
    IncomingHorizontal,
    OutgoingVertical,
    IncomingVertical,
}

/// An edge as returned by queries; the qualifier is read with
/// [`Graph::qualifier`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edge {
    pub from: VertexId,
    pub to: VertexId,
    pub kind: EdgeType,
    /// Interned qualifier, 0 = none.
    pub qualifier: u32,
    pub vertical: bool,
}

const NONE: u32 = u32::MAX;

/// The two vertical edge slots of a vertex in [`Graph::links`].
const IN: usize = 0;
const OUT: usize = 1;

/// 16 bytes: an execution graph has millions of vertices, most of them
/// without a vertical edge, so those slots live in a side table.
#[derive(Clone, Debug)]
struct Vertex {
    ts: u64,
    /// Index of the vertex's `[incoming, outgoing]` vertical edge slots in
    /// [`Graph::links`], [`NONE`] while it has neither.
    links: u32,
    /// Interned qualifier of the horizontal edge to the next vertex.
    h_qualifier: Qualifier,
    /// Type of the horizontal edge to the next vertex of the row
    /// (`NoEdge` = gap or last vertex).
    h_out: EdgeType,
}

/// An interned qualifier (irq and softirq names: a handful per trace);
/// 0 is "none".
type Qualifier = u16;

#[derive(Clone, Debug)]
struct VerticalEdge {
    from: VertexId,
    to: VertexId,
    kind: EdgeType,
    qualifier: Qualifier,
}

/// One row of the graph: a thread and its vertices in time order.
#[derive(Clone, Debug)]
pub struct Worker {
    tid: Tid,
    /// The host of the thread in a graph of several hosts' traces
    /// ([`Graph::absorb`]); 0 in a one-host graph.
    host: u32,
    vertices: Vec<Vertex>,
}

impl Worker {
    /// The thread this row belongs to.
    pub fn tid(&self) -> Tid {
        self.tid
    }

    /// The host of the thread (0 unless the graph joins several hosts).
    pub fn host(&self) -> u32 {
        self.host
    }

    /// Number of vertices in the row.
    pub fn len(&self) -> usize {
        self.vertices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.vertices.is_empty()
    }

    /// Timestamps of the row's vertices, in order.
    pub fn timestamps(&self) -> impl Iterator<Item = u64> + '_ {
        self.vertices.iter().map(|v| v.ts)
    }
}

/// Counters of requests the graph refused rather than corrupt itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphAnomalies {
    /// Vertices asked for before the row's last vertex (clamped to it).
    pub out_of_order: u64,
    /// Vertical edges refused because a slot was already taken or both ends
    /// were the same vertex.
    pub refused_links: u64,
}

/// An execution graph (or a critical path, which has the same shape).
#[derive(Clone, Debug, Default)]
pub struct Graph {
    workers: Vec<Worker>,
    by_tid: FxHashMap<(u32, Tid), u32>,
    vertical: Vec<VerticalEdge>,
    /// `[incoming, outgoing]` vertical edge ids of the vertices that have
    /// one ([`NONE`] for an empty slot).
    links: Vec<[u32; 2]>,
    /// Interned qualifiers; index 0 is "none".
    qualifiers: Vec<Arc<str>>,
    qualifier_ids: FxHashMap<Arc<str>, Qualifier>,
    anomalies: GraphAnomalies,
}

impl Graph {
    pub fn new() -> Graph {
        Graph {
            qualifiers: vec![Arc::from("")],
            ..Graph::default()
        }
    }

    /// The row of `tid`, created (empty) if needed.
    pub fn worker(&mut self, tid: Tid) -> u32 {
        self.worker_on(0, tid)
    }

    /// The row of `tid` on `host`, created (empty) if needed.
    pub fn worker_on(&mut self, host: u32, tid: Tid) -> u32 {
        if let Some(&w) = self.by_tid.get(&(host, tid)) {
            return w;
        }
        let w = self.workers.len() as u32;
        self.workers.push(Worker {
            tid,
            host,
            vertices: Vec::new(),
        });
        self.by_tid.insert((host, tid), w);
        w
    }

    /// The row in this graph of the thread of row `worker` of `source`
    /// (same host and tid), created if needed.
    pub fn worker_like(&mut self, source: &Graph, worker: u32) -> u32 {
        self.worker_on(source.host(worker), source.tid(worker))
    }

    /// The row of `tid`, if it has one.
    pub fn worker_of(&self, tid: Tid) -> Option<u32> {
        self.worker_of_on(0, tid)
    }

    /// The row of `tid` on `host`, if it has one.
    pub fn worker_of_on(&self, host: u32, tid: Tid) -> Option<u32> {
        self.by_tid.get(&(host, tid)).copied()
    }

    /// The host of a row (0 for a row that does not exist).
    pub fn host(&self, worker: u32) -> u32 {
        self.workers.get(worker as usize).map_or(0, |w| w.host)
    }

    /// Copies every row and edge of `other` (a one-host graph) into this
    /// graph as the rows of `host`, for the execution graph of several
    /// hosts' traces. Returns the row offset: row `w` of `other` is row
    /// `offset + w` here, with the same vertex indices. None, and nothing
    /// copied, when this graph already has rows of `host`.
    pub fn absorb(&mut self, other: &Graph, host: u32) -> Option<u32> {
        if self.workers.iter().any(|w| w.host == host) || other.workers.iter().any(|w| w.host != 0)
        {
            return None;
        }
        let offset = self.workers.len() as u32;
        for w in &other.workers {
            let row = self.worker_on(host, w.tid);
            for v in &w.vertices {
                let q = other.qualifier(v.h_qualifier.into()).cloned();
                let q = self.intern(q.as_deref());
                let vertices = &mut self.workers[row as usize].vertices;
                vertices.push(Vertex {
                    ts: v.ts,
                    links: NONE,
                    h_qualifier: q,
                    h_out: v.h_out,
                });
            }
        }
        let moved = |v: VertexId| VertexId {
            worker: v.worker + offset,
            index: v.index,
        };
        for e in &other.vertical {
            let q = other.qualifier(e.qualifier.into()).cloned();
            self.link(moved(e.from), moved(e.to), e.kind, q.as_deref());
        }
        Some(offset)
    }

    /// All rows, in creation order.
    pub fn workers(&self) -> &[Worker] {
        &self.workers
    }

    /// The thread of a row (0 for a row that does not exist).
    pub fn tid(&self, worker: u32) -> Tid {
        self.workers.get(worker as usize).map_or(0, |w| w.tid)
    }

    /// Timestamp of a vertex (0 for a vertex that does not exist).
    pub fn ts(&self, v: VertexId) -> u64 {
        self.vertex(v).map_or(0, |x| x.ts)
    }

    /// Number of vertices over all rows.
    pub fn vertex_count(&self) -> usize {
        self.workers.iter().map(|w| w.vertices.len()).sum()
    }

    /// Number of vertical edges.
    pub fn vertical_count(&self) -> usize {
        self.vertical.len()
    }

    /// What the graph refused to do; see [`GraphAnomalies`].
    pub fn anomalies(&self) -> GraphAnomalies {
        self.anomalies
    }

    /// The first vertex of a row.
    pub fn head(&self, worker: u32) -> Option<VertexId> {
        let w = self.workers.get(worker as usize)?;
        (!w.vertices.is_empty()).then_some(VertexId { worker, index: 0 })
    }

    /// The last vertex of a row.
    pub fn tail(&self, worker: u32) -> Option<VertexId> {
        let w = self.workers.get(worker as usize)?;
        let n = w.vertices.len();
        (n > 0).then(|| VertexId {
            worker,
            index: n as u32 - 1,
        })
    }

    /// The last vertex of a row at or before `ts`.
    pub fn vertex_at_or_before(&self, worker: u32, ts: u64) -> Option<VertexId> {
        let w = self.workers.get(worker as usize)?;
        let n = w.vertices.partition_point(|v| v.ts <= ts);
        (n > 0).then(|| VertexId {
            worker,
            index: n as u32 - 1,
        })
    }

    /// The vertex of a row with exactly this timestamp.
    pub fn vertex_at(&self, worker: u32, ts: u64) -> Option<VertexId> {
        self.vertex_at_or_before(worker, ts)
            .filter(|&v| self.ts(v) == ts)
    }

    /// Adds a vertex at `ts` at the end of a row without a horizontal edge
    /// from the previous vertex (a gap). Returns the row's last vertex
    /// unchanged when it already has this timestamp (or a later one).
    pub fn add(&mut self, worker: u32, ts: u64) -> VertexId {
        self.push_vertex(worker, ts, EdgeType::NoEdge, 0)
    }

    /// Adds a vertex at `ts` at the end of a row, joined to the previous
    /// vertex by a horizontal edge of type `kind`. As with [`Graph::add`],
    /// asking for the timestamp of the last vertex returns that vertex and
    /// adds no edge.
    pub fn append(
        &mut self,
        worker: u32,
        ts: u64,
        kind: EdgeType,
        qualifier: Option<&str>,
    ) -> VertexId {
        let q = self.intern(qualifier);
        self.push_vertex(worker, ts, kind, q)
    }

    /// Makes `v` the last vertex of its row again, dropping the vertices
    /// after it and its outgoing horizontal edge: a row rewritten while it
    /// is built, when what followed `v` turned out to be part of the edge
    /// that will leave `v`. Refused (false) when one of the dropped
    /// vertices has a vertical edge, which would be left dangling.
    pub fn truncate_after(&mut self, v: VertexId) -> bool {
        let Some(row) = self.workers.get_mut(v.worker as usize) else {
            return false;
        };
        let keep = v.index as usize + 1;
        if keep > row.vertices.len() || row.vertices[keep..].iter().any(|x| x.links != NONE) {
            return false;
        }
        row.vertices.truncate(keep);
        let last = &mut row.vertices[keep - 1];
        last.h_out = EdgeType::NoEdge;
        last.h_qualifier = 0;
        true
    }

    /// Adds a vertical edge. Refused (false) when `from == to` or when one
    /// of the two slots is already taken, so each vertex keeps at most one
    /// incoming and one outgoing vertical edge.
    pub fn link(
        &mut self,
        from: VertexId,
        to: VertexId,
        kind: EdgeType,
        qualifier: Option<&str>,
    ) -> bool {
        if from == to || self.vertex(from).is_none() || self.vertex(to).is_none() {
            self.anomalies.refused_links += 1;
            return false;
        }
        if self.slot(from, OUT) != NONE || self.slot(to, IN) != NONE {
            self.anomalies.refused_links += 1;
            return false;
        }
        let q = self.intern(qualifier);
        let id = self.vertical.len() as u32;
        self.vertical.push(VerticalEdge {
            from,
            to,
            kind,
            qualifier: q,
        });
        self.set_slot(from, OUT, id);
        self.set_slot(to, IN, id);
        true
    }

    /// A vertical edge slot of a vertex ([`IN`] or [`OUT`]): the edge id,
    /// or [`NONE`].
    #[inline]
    fn slot(&self, v: VertexId, which: usize) -> u32 {
        match self.vertex(v) {
            Some(x) if x.links != NONE => self.links[x.links as usize][which],
            _ => NONE,
        }
    }

    fn set_slot(&mut self, v: VertexId, which: usize, id: u32) {
        let next = self.links.len() as u32;
        let Some(x) = self.vertex_mut(v) else {
            return;
        };
        if x.links == NONE {
            x.links = next;
        }
        let i = x.links as usize;
        if i == self.links.len() {
            self.links.push([NONE, NONE]);
        }
        self.links[i][which] = id;
    }

    /// The edge in one slot of a vertex.
    #[inline]
    pub fn edge(&self, v: VertexId, dir: Direction) -> Option<Edge> {
        let row = &self.workers.get(v.worker as usize)?.vertices;
        let i = v.index as usize;
        let x = row.get(i)?;
        match dir {
            Direction::OutgoingHorizontal => (x.h_out != EdgeType::NoEdge && i + 1 < row.len())
                .then(|| Edge {
                    from: v,
                    to: VertexId {
                        worker: v.worker,
                        index: v.index + 1,
                    },
                    kind: x.h_out,
                    qualifier: x.h_qualifier.into(),
                    vertical: false,
                }),
            Direction::IncomingHorizontal => {
                let p = row.get(i.checked_sub(1)?)?;
                (p.h_out != EdgeType::NoEdge).then(|| Edge {
                    from: VertexId {
                        worker: v.worker,
                        index: v.index - 1,
                    },
                    to: v,
                    kind: p.h_out,
                    qualifier: p.h_qualifier.into(),
                    vertical: false,
                })
            }
            Direction::OutgoingVertical if x.links != NONE => {
                self.vertical_edge(self.links[x.links as usize][OUT])
            }
            Direction::IncomingVertical if x.links != NONE => {
                self.vertical_edge(self.links[x.links as usize][IN])
            }
            Direction::OutgoingVertical | Direction::IncomingVertical => None,
        }
    }

    /// All vertical edges, in creation order.
    pub fn vertical_edges(&self) -> impl Iterator<Item = Edge> + '_ {
        (0..self.vertical.len() as u32).filter_map(|i| self.vertical_edge(i))
    }

    /// All horizontal edges, row by row.
    pub fn horizontal_edges(&self) -> impl Iterator<Item = Edge> + '_ {
        self.workers.iter().enumerate().flat_map(move |(w, row)| {
            (0..row.vertices.len() as u32).filter_map(move |i| {
                self.edge(
                    VertexId {
                        worker: w as u32,
                        index: i,
                    },
                    Direction::OutgoingHorizontal,
                )
            })
        })
    }

    /// The text of an interned qualifier (`None` for 0, the "no qualifier").
    pub fn qualifier(&self, q: u32) -> Option<&Arc<str>> {
        if q == 0 {
            return None;
        }
        self.qualifiers.get(q as usize)
    }

    /// Duration of an edge: `to.ts - from.ts` (0 if negative).
    pub fn duration(&self, e: &Edge) -> u64 {
        self.ts(e.to).saturating_sub(self.ts(e.from))
    }

    fn vertical_edge(&self, id: u32) -> Option<Edge> {
        let e = self.vertical.get(id as usize)?;
        Some(Edge {
            from: e.from,
            to: e.to,
            kind: e.kind,
            qualifier: e.qualifier.into(),
            vertical: true,
        })
    }

    fn vertex(&self, v: VertexId) -> Option<&Vertex> {
        self.workers
            .get(v.worker as usize)?
            .vertices
            .get(v.index as usize)
    }

    fn vertex_mut(&mut self, v: VertexId) -> Option<&mut Vertex> {
        self.workers
            .get_mut(v.worker as usize)?
            .vertices
            .get_mut(v.index as usize)
    }

    #[inline]
    fn intern(&mut self, qualifier: Option<&str>) -> Qualifier {
        match qualifier {
            Some(s) if !s.is_empty() => self.intern_text(s),
            _ => 0,
        }
    }

    fn intern_text(&mut self, s: &str) -> Qualifier {
        if let Some(&q) = self.qualifier_ids.get(s) {
            return q;
        }
        let Ok(q) = Qualifier::try_from(self.qualifiers.len()) else {
            // Past 65 535 distinct qualifiers (no trace has that many
            // interrupt names): none.
            return 0;
        };
        let s: Arc<str> = Arc::from(s);
        self.qualifiers.push(s.clone());
        self.qualifier_ids.insert(s, q);
        q
    }

    fn push_vertex(
        &mut self,
        worker: u32,
        ts: u64,
        kind: EdgeType,
        qualifier: Qualifier,
    ) -> VertexId {
        let Some(row) = self.workers.get_mut(worker as usize) else {
            // Only reachable through a made-up worker id; give back a vertex
            // id that every query treats as absent.
            return VertexId {
                worker,
                index: NONE,
            };
        };
        let index = row.vertices.len().saturating_sub(1) as u32;
        if let Some(last) = row.vertices.last_mut() {
            if ts <= last.ts {
                if ts < last.ts {
                    self.anomalies.out_of_order += 1;
                }
                return VertexId { worker, index };
            }
            last.h_out = kind;
            last.h_qualifier = if kind == EdgeType::NoEdge {
                0
            } else {
                qualifier
            };
        }
        row.vertices.push(Vertex {
            ts,
            links: NONE,
            h_qualifier: 0,
            h_out: EdgeType::NoEdge,
        });
        VertexId {
            worker,
            index: row.vertices.len() as u32 - 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_timestamp_returns_last_vertex_without_edge() {
        let mut g = Graph::new();
        let w = g.worker(7);
        let a = g.add(w, 10);
        let b = g.append(w, 10, EdgeType::Running, None);
        assert_eq!(a, b);
        assert!(g.edge(a, Direction::OutgoingHorizontal).is_none());
        let c = g.append(w, 20, EdgeType::Running, Some("q"));
        let e = g.edge(a, Direction::OutgoingHorizontal).unwrap();
        assert_eq!((e.to, e.kind), (c, EdgeType::Running));
        assert_eq!(g.qualifier(e.qualifier).map(|s| &**s), Some("q"));
        assert_eq!(g.edge(c, Direction::IncomingHorizontal), Some(e));
        // Going back in time never reorders a row.
        assert_eq!(g.append(w, 5, EdgeType::Blocked, None), c);
        assert_eq!(g.anomalies().out_of_order, 1);
    }

    #[test]
    fn vertical_slots_hold_one_edge_each() {
        let mut g = Graph::new();
        let (a, b) = (g.worker(1), g.worker(2));
        let va = g.add(a, 1);
        let vb = g.add(b, 2);
        let vb2 = g.add(b, 3);
        assert!(g.link(va, vb, EdgeType::Default, None));
        assert!(!g.link(va, vb2, EdgeType::Default, None));
        assert!(!g.link(vb, vb, EdgeType::Default, None));
        assert_eq!(g.edge(vb, Direction::IncomingVertical).unwrap().from, va);
        assert!(
            g.edge(vb, Direction::IncomingHorizontal).is_none(),
            "add leaves a gap"
        );
        assert_eq!(
            EdgeType::from_name("BLOCK_DEVICE"),
            Some(EdgeType::BlockDevice)
        );
    }
}
