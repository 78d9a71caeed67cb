//! Thread critical path: the bounded algorithm of Giraldeau & Dagenais
//! ("Wait analysis of distributed systems using kernel tracing"), with the
//! behaviour of Trace Compass' `OSCriticalPathAlgorithm`.
//!
//! Walk the thread's own horizontal edges. States that are not waiting on
//! another thread (running, preempted, interrupted, timer, block device, IPI,
//! user input, unknown) go on the path as they are. A BLOCKED or NETWORK
//! edge whose end has an incoming vertical (wake-up) edge is replaced by the
//! history of the waker, walked backwards from the wake-up to the start of
//! the blocked interval, recursively (the waker may itself have been
//! blocked), with a stack of alternative incoming edges to backtrack from
//! dead ends. Where the path enters another thread later than the blocked
//! interval starts, the gap is filled with UNKNOWN.
//!
//! The recursion is run on an explicit stack: chains of wake-ups inside one
//! blocked window (two threads ping-ponging for a second) are as deep as the
//! number of exchanges.

use std::sync::Arc;

use deepspan_model::Tid;

use crate::graph::{Direction, Edge, EdgeType, Graph, VertexId};
use rustc_hash::FxHashSet;

/// One piece of a critical path: a thread in a state over a time range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub start: u64,
    pub end: u64,
    /// The thread whose state this is (for a vertical piece, the thread the
    /// edge leads to).
    pub tid: Tid,
    pub state: EdgeType,
    /// Edge qualifier, e.g. the irq name of an unexplained BLOCKED state.
    pub qualifier: Option<Arc<str>>,
    /// When the path reached this thread through a vertical edge (a wake-up
    /// or fork link) right before this piece: the thread it came from.
    pub link_from: Option<Tid>,
    /// True when the piece is the duration of a vertical edge itself (time
    /// between the two ends of a link, e.g. a network message in flight).
    pub vertical: bool,
    /// True when events were lost (ring-buffer overrun) during the piece, so
    /// it may be wrong.
    pub lost: bool,
}

impl Piece {
    pub fn duration(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// A critical path: the path graph (same shape as the execution graph; see
/// [`Graph`]) and the same path as a flat, time-ordered list of pieces.
#[derive(Clone, Debug, Default)]
pub struct CriticalPath {
    pub graph: Graph,
    pub pieces: Vec<Piece>,
    /// True when the walk ran out of its step budget somewhere (only on
    /// pathological graphs); the blocked edges concerned were kept
    /// unexplained.
    pub truncated: bool,
}

/// Computes the bounded critical path of the thread owning `start`, from
/// `start` to the end of its row, exactly as Trace Compass does (this is what
/// its tests check).
///
/// `end_ts`: stop before the first edge that reaches `end_ts` or later
/// (Trace Compass' end-vertex rule); `None` follows the row to its end.
pub fn critical_path_of(graph: &Graph, start: VertexId, end_ts: Option<u64>) -> CriticalPath {
    compute(graph, start, Stop::TraceCompass(end_ts))
}

/// When the main walk stops.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Stop {
    /// Trace Compass: before the first edge ending at or after the bound.
    TraceCompass(Option<u64>),
    /// From `start` to after the last edge starting before `end`, so the
    /// path covers `[start, end]`; pieces are clipped to it by the caller, so
    /// a blocking that began before `start` is explained only from `start`
    /// on (the walk does not go back further than what is kept).
    Covering { start: u64, end: u64 },
}

pub(crate) fn compute(graph: &Graph, start: VertexId, stop: Stop) -> CriticalPath {
    let mut walk = Walk::new(graph);
    let mut path = Graph::new();
    let actor = start.worker;
    let path_actor = path.worker_like(graph, actor);
    path.add(path_actor, graph.ts(start));

    let mut current = start;
    let mut next = graph.edge(current, Direction::OutgoingHorizontal);
    while let Some(e) = next {
        let to_ts = graph.ts(e.to);
        match stop {
            Stop::TraceCompass(Some(end)) if to_ts >= end => break,
            Stop::Covering { end, .. } if graph.ts(e.from) >= end => break,
            _ => {}
        }
        match e.kind {
            EdgeType::Blocked | EdgeType::Network => {
                let lower = match stop {
                    Stop::Covering { start, .. } => start,
                    Stop::TraceCompass(_) => 0,
                };
                let links = walk.resolve_blocking(e, graph.ts(e.from).max(lower));
                links.reverse();
                append_component(&mut path, graph, current, links);
            }
            EdgeType::Eps | EdgeType::NoEdge => {}
            // Everything else is not waiting on another thread. (Trace
            // Compass refuses DEFAULT on a thread's own row; kept as is here
            // so no input makes the walk fail.)
            _ => {
                let q = graph.qualifier(e.qualifier).cloned();
                path.append(path_actor, to_ts, e.kind, q.as_deref());
            }
        }
        current = e.to;
        next = graph.edge(current, Direction::OutgoingHorizontal);
    }
    let pieces = pieces_of(&path, path_actor);
    CriticalPath {
        graph: path,
        pieces,
        truncated: walk.truncated,
    }
}

/// Reads a path graph as a flat list of pieces, starting at the head of
/// `worker`: follow the row; where it leaves through a vertical edge, follow
/// that edge to the other row.
pub fn pieces_of(path: &Graph, worker: u32) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let Some(mut v) = path.head(worker) else {
        return pieces;
    };
    let mut taken_vertical: FxHashSet<VertexId> = FxHashSet::default();
    let mut came_from: Option<Tid> = None;
    // Each step consumes an edge, and each edge is taken once.
    let budget = path.vertex_count() + path.vertical_count() + 1;
    for _ in 0..budget {
        if let Some(e) = path
            .edge(v, Direction::OutgoingVertical)
            .filter(|_| !taken_vertical.contains(&v))
        {
            taken_vertical.insert(v);
            let (from_ts, to_ts) = (path.ts(e.from), path.ts(e.to));
            let from_tid = path.tid(e.from.worker);
            if to_ts > from_ts {
                pieces.push(Piece {
                    start: from_ts,
                    end: to_ts,
                    tid: path.tid(e.to.worker),
                    state: e.kind,
                    qualifier: path.qualifier(e.qualifier).cloned(),
                    link_from: Some(from_tid),
                    vertical: true,
                    lost: false,
                });
            }
            came_from = Some(from_tid);
            v = e.to;
            continue;
        }
        let Some(e) = path.edge(v, Direction::OutgoingHorizontal) else {
            break;
        };
        pieces.push(Piece {
            start: path.ts(e.from),
            end: path.ts(e.to),
            tid: path.tid(v.worker),
            state: e.kind,
            qualifier: path.qualifier(e.qualifier).cloned(),
            link_from: came_from.take(),
            vertical: false,
            lost: false,
        });
        v = e.to;
    }
    pieces
}

/// Glues the sub-path that explains a blocking (chronological order) after
/// the path's current end on the blocked thread.
fn append_component(path: &mut Graph, graph: &Graph, current: VertexId, links: &[Edge]) {
    let actor = path.worker_like(graph, current.worker);
    let Some(first) = links.first() else {
        // Nothing explains the blocking: keep the blocked edge itself.
        if let Some(next) = graph.edge(current, Direction::OutgoingHorizontal) {
            let q = graph.qualifier(next.qualifier).cloned();
            path.append(actor, graph.ts(next.to), next.kind, q.as_deref());
        }
        return;
    };
    let b1 = match path.tail(actor) {
        Some(v) => v,
        None => path.add(actor, graph.ts(current)),
    };

    let mut anchor = if first.from.worker == current.worker {
        b1
    } else {
        let src = path.worker_like(graph, first.from.worker);
        let a = path.add(src, graph.ts(current));
        path.link(b1, a, EdgeType::Default, None);
        let first_ts = graph.ts(first.from);
        if first_ts > path.ts(a) {
            path.append(src, first_ts, EdgeType::Unknown, None)
        } else {
            a
        }
    };

    let mut prev: Option<&Edge> = None;
    for link in links {
        let q = graph.qualifier(link.qualifier).cloned();
        if let Some(p) = prev {
            if p.to != link.from {
                let ts = graph.ts(p.to).max(graph.ts(link.from));
                anchor = copy_link(
                    path,
                    graph,
                    anchor,
                    link.from,
                    ts,
                    EdgeType::Default,
                    q.as_deref(),
                );
            }
        }
        anchor = copy_link(
            path,
            graph,
            anchor,
            link.to,
            graph.ts(link.to),
            link.kind,
            q.as_deref(),
        );
        prev = Some(link);
    }
}

/// Copies one edge into the path: from `anchor` to the vertex at `ts` on the
/// row of `to`'s thread. Returns the new end of the path.
fn copy_link(
    path: &mut Graph,
    graph: &Graph,
    anchor: VertexId,
    to: VertexId,
    ts: u64,
    kind: EdgeType,
    qualifier: Option<&str>,
) -> VertexId {
    let worker = path.worker_like(graph, to.worker);
    if worker == anchor.worker && ts == path.ts(anchor) {
        return anchor;
    }
    if worker == anchor.worker {
        return path.append(worker, ts, kind, qualifier);
    }
    let target = match path.vertex_at(worker, ts) {
        Some(v) => v,
        None => path.add(worker, ts),
    };
    path.link(anchor, target, kind, qualifier);
    target
}

/// State of the backward walk that explains blockings.
struct Walk<'g> {
    graph: &'g Graph,
    /// The sub-path under construction; each frame owns a suffix of it.
    sub_path: Vec<Edge>,
    /// Backtracking candidates; each frame owns a suffix of it.
    candidates: Vec<VertexId>,
    budget: u64,
    truncated: bool,
}

/// One (formerly recursive) resolution of a blocked edge.
struct Frame {
    path_base: usize,
    candidates_base: usize,
    vertex_from: Option<VertexId>,
    bound: u64,
    /// The blocked edge a nested frame is resolving for this one.
    waiting_on: Option<Edge>,
}

impl<'g> Walk<'g> {
    fn new(graph: &'g Graph) -> Walk<'g> {
        // Backtracking can revisit vertices; a generous budget still bounds
        // pathological graphs.
        let budget = 64 * (graph.vertex_count() as u64 + graph.vertical_count() as u64) + 4096;
        Walk {
            graph,
            sub_path: Vec::new(),
            candidates: Vec::new(),
            budget,
            truncated: false,
        }
    }

    /// The vertex at `v`, or the first one after it reached through EPS
    /// edges, that has an incoming vertical edge.
    fn find_incoming(&self, mut v: VertexId) -> Option<VertexId> {
        loop {
            if self.graph.edge(v, Direction::IncomingVertical).is_some() {
                return Some(v);
            }
            let e = self.graph.edge(v, Direction::OutgoingHorizontal)?;
            if e.kind != EdgeType::Eps {
                return None;
            }
            v = e.to;
        }
    }

    fn open_frame(&mut self, blocking: Edge, bound: u64) -> Frame {
        let path_base = self.sub_path.len();
        let candidates_base = self.candidates.len();
        let bound = bound.max(self.graph.ts(blocking.from));
        let down = self
            .find_incoming(blocking.to)
            .and_then(|j| self.graph.edge(j, Direction::IncomingVertical));
        let vertex_from = down.map(|d| {
            self.sub_path.push(d);
            d.from
        });
        Frame {
            path_base,
            candidates_base,
            vertex_from,
            bound,
            waiting_on: None,
        }
    }

    /// The edges (newest first) that explain `blocking`, not reaching before
    /// `bound`; empty when no wake-up explains it. The buffer is the walk's,
    /// reused by the next call.
    fn resolve_blocking(&mut self, blocking: Edge, bound: u64) -> &mut Vec<Edge> {
        let g = self.graph;
        self.sub_path.clear();
        self.candidates.clear();
        let mut frames = vec![self.open_frame(blocking, bound)];

        while let Some(frame) = frames.last_mut() {
            if self.budget == 0 {
                self.truncated = true;
                self.sub_path.clear();
                return &mut self.sub_path;
            }
            self.budget -= 1;

            let Some(vf) = frame.vertex_from.filter(|&v| g.ts(v) > frame.bound) else {
                // This frame is done: hand its result to the parent.
                let done = frames.pop().expect("frame present");
                self.candidates.truncate(done.candidates_base);
                let Some(parent) = frames.last_mut() else {
                    break;
                };
                let Some(blocked) = parent.waiting_on.take() else {
                    continue;
                };
                if self.sub_path.len() == done.path_base && blocked.kind == EdgeType::Network {
                    // Unexplained network wait: keep it on the path.
                    self.sub_path.push(blocked);
                }
                parent.vertex_from = Some(blocked.from);
                continue;
            };

            let in_vertical = g.edge(vf, Direction::IncomingVertical);
            if let Some(iv) = in_vertical {
                // A link from before the window explains the rest directly.
                if g.ts(iv.from) <= frame.bound {
                    self.sub_path.push(iv);
                    frame.vertex_from = None;
                    continue;
                }
            }
            let incoming = g.edge(vf, Direction::IncomingHorizontal);
            let incoming_waits =
                incoming.is_some_and(|e| matches!(e.kind, EdgeType::Blocked | EdgeType::Network));
            if in_vertical.is_some() && !incoming_waits {
                // Another way back, tried if the row leads to a dead end.
                self.candidates.push(vf);
            }
            match incoming {
                Some(e) if incoming_waits => {
                    let bound = frame.bound;
                    frame.waiting_on = Some(e);
                    let child = self.open_frame(e, bound);
                    frames.push(child);
                }
                Some(e) => {
                    self.sub_path.push(e);
                    frame.vertex_from = Some(e.from);
                }
                None => {
                    frame.vertex_from = None;
                    if self.candidates.len() > frame.candidates_base {
                        let v = self.candidates.pop().expect("non-empty");
                        // Rewind the sub-path to where that vertex was left.
                        while self.sub_path.len() > frame.path_base
                            && self.sub_path.last().is_some_and(|e| e.from != v)
                        {
                            self.sub_path.pop();
                        }
                        if let Some(e) = g.edge(v, Direction::IncomingVertical) {
                            self.sub_path.push(e);
                            frame.vertex_from = Some(e.from);
                        }
                    }
                }
            }
        }
        &mut self.sub_path
    }
}
