//! Merge of critical paths into one graph (Gelle et al. 2021, §3.3,
//! Alg. 2 and Figs. 6 and 7).
//!
//! Several threads of interest often wait on the same thing at the same
//! time (two threads blocked on a mutex held by a third have the holder's
//! RUNNING state in both paths). In the merged graph such a shared state is
//! one node, with one incoming and one outgoing edge per path that goes
//! through it, so a later traversal (per-request critical paths, Gelle et
//! al. 2021, §3.4) sees the contention.
//!
//! Where paths overlap only partly, states are split at every boundary any
//! path has for that (thread, state): each node is then either wholly shared
//! or not, and every path is still the exact concatenation of its nodes.
//! Instead of splitting nodes as paths are added (the paper's incremental
//! version), the boundaries are computed first and nodes made once; the
//! result is the same graph.

use std::collections::HashMap;
use std::sync::Arc;

use deepspan_model::Tid;

use crate::critical::Piece;
use crate::graph::EdgeType;

/// One state of the merged graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergedNode {
    /// The thread the state belongs to.
    pub tid: Tid,
    pub state: EdgeType,
    pub qualifier: Option<Arc<str>>,
    /// True for the time a vertical edge spans (e.g. a message in flight).
    pub vertical: bool,
    pub start: u64,
    pub end: u64,
    /// True when any piece covering it overlapped lost events.
    pub lost: bool,
    /// The paths that go through this node, ascending.
    pub paths: Vec<u32>,
    /// `(path, previous node)` for each path entering this node.
    pub incoming: Vec<(u32, u32)>,
    /// `(path, next node)` for each path leaving this node.
    pub outgoing: Vec<(u32, u32)>,
}

impl MergedNode {
    pub fn duration(&self) -> u64 {
        self.end - self.start
    }
}

/// Critical paths merged so that shared states are shared nodes.
#[derive(Clone, Debug, Default)]
pub struct MergedGraph {
    nodes: Vec<MergedNode>,
    /// First node of each path (`None` for an empty path).
    heads: Vec<Option<u32>>,
    /// Number of nodes of each path.
    lengths: Vec<usize>,
}

/// Key of the states that can be shared.
#[derive(Clone, PartialEq, Eq, Hash)]
struct StateKey {
    tid: Tid,
    state: EdgeType,
    qualifier: Option<Arc<str>>,
    vertical: bool,
}

/// Merges critical paths (each a time-ordered list of pieces). Path `i` of
/// the result is the `i`-th input.
///
/// A path is read as a function of time: empty pieces are skipped and a
/// piece starting before the previous piece ends is clipped to start there.
pub fn merge_paths<'a>(paths: impl IntoIterator<Item = &'a [Piece]>) -> MergedGraph {
    let paths: Vec<Vec<Piece>> = paths.into_iter().map(normalize).collect();

    // Boundaries of every (thread, state), over all paths.
    let mut keys: HashMap<StateKey, u32> = HashMap::new();
    let mut bounds: Vec<Vec<u64>> = Vec::new();
    let mut piece_keys: Vec<Vec<u32>> = Vec::with_capacity(paths.len());
    for path in &paths {
        let mut ks = Vec::with_capacity(path.len());
        for p in path {
            let key = StateKey {
                tid: p.tid,
                state: p.state,
                qualifier: p.qualifier.clone(),
                vertical: p.vertical,
            };
            let k = *keys.entry(key).or_insert_with(|| {
                bounds.push(Vec::new());
                bounds.len() as u32 - 1
            });
            bounds[k as usize].extend([p.start, p.end]);
            ks.push(k);
        }
        piece_keys.push(ks);
    }
    for b in &mut bounds {
        b.sort_unstable();
        b.dedup();
    }

    // One node per covered elementary segment of each (thread, state).
    let mut node_of: HashMap<(u32, u32), u32> = HashMap::new();
    let mut graph = MergedGraph {
        nodes: Vec::new(),
        heads: Vec::with_capacity(paths.len()),
        lengths: Vec::new(),
    };
    for (pi, path) in paths.iter().enumerate() {
        let mut prev: Option<u32> = None;
        let mut length = 0;
        graph.heads.push(None);
        for (p, &k) in path.iter().zip(&piece_keys[pi]) {
            let b = &bounds[k as usize];
            let first = b.partition_point(|&x| x < p.start);
            let last = b.partition_point(|&x| x < p.end);
            for seg in first..last {
                let node = *node_of.entry((k, seg as u32)).or_insert_with(|| {
                    graph.nodes.push(MergedNode {
                        tid: p.tid,
                        state: p.state,
                        qualifier: p.qualifier.clone(),
                        vertical: p.vertical,
                        start: b[seg],
                        end: b[seg + 1],
                        lost: false,
                        paths: Vec::new(),
                        incoming: Vec::new(),
                        outgoing: Vec::new(),
                    });
                    graph.nodes.len() as u32 - 1
                });
                let n = &mut graph.nodes[node as usize];
                n.lost |= p.lost;
                n.paths.push(pi as u32);
                match prev {
                    Some(a) => {
                        graph.nodes[a as usize].outgoing.push((pi as u32, node));
                        graph.nodes[node as usize].incoming.push((pi as u32, a));
                    }
                    None => graph.heads[pi] = Some(node),
                }
                prev = Some(node);
                length += 1;
            }
        }
        graph.lengths.push(length);
    }
    graph
}

fn normalize(path: &[Piece]) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::with_capacity(path.len());
    let mut t = 0u64;
    for p in path {
        let start = p.start.max(t);
        if p.end > start {
            out.push(Piece { start, ..p.clone() });
            t = p.end;
        }
    }
    out
}

impl MergedGraph {
    pub fn nodes(&self) -> &[MergedNode] {
        &self.nodes
    }

    /// Number of merged paths.
    pub fn path_count(&self) -> usize {
        self.heads.len()
    }

    /// First node of each path.
    pub fn heads(&self) -> &[Option<u32>] {
        &self.heads
    }

    /// Number of nodes of one path.
    pub fn path_len(&self, path: u32) -> usize {
        self.lengths.get(path as usize).copied().unwrap_or(0)
    }

    /// The nodes of one path, in order, found by following its edges.
    pub fn path_nodes(&self, path: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let Some(mut n) = self.heads.get(path as usize).copied().flatten() else {
            return out;
        };
        let limit = self.lengths.get(path as usize).copied().unwrap_or(0);
        out.push(n);
        while out.len() < limit {
            match self.nodes[n as usize].outgoing.iter().find(|e| e.0 == path) {
                Some(&(_, next)) => {
                    out.push(next);
                    n = next;
                }
                None => break,
            }
        }
        out
    }

    /// One path read back from the graph, adjacent nodes of the same
    /// thread and state joined: equal to the input path with its adjacent
    /// same-state pieces joined. `link_from` is not kept by the merge.
    pub fn recover(&self, path: u32) -> Vec<Piece> {
        let mut out: Vec<Piece> = Vec::new();
        for n in self.path_nodes(path) {
            let node = &self.nodes[n as usize];
            if let Some(last) = out.last_mut() {
                if last.end == node.start
                    && last.tid == node.tid
                    && last.state == node.state
                    && last.qualifier == node.qualifier
                    && last.vertical == node.vertical
                {
                    last.end = node.end;
                    last.lost |= node.lost;
                    continue;
                }
            }
            out.push(Piece {
                start: node.start,
                end: node.end,
                tid: node.tid,
                state: node.state,
                qualifier: node.qualifier.clone(),
                link_from: None,
                vertical: node.vertical,
                lost: node.lost,
            });
        }
        out
    }

    /// Nodes on more than one path: the contended states.
    pub fn shared_nodes(&self) -> impl Iterator<Item = (u32, &MergedNode)> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.paths.len() > 1)
            .map(|(i, n)| (i as u32, n))
    }
}

/// Joins adjacent pieces of the same thread and state (what
/// [`MergedGraph::recover`] returns for an input path), after the same
/// clipping the merge applies.
pub fn join_adjacent(path: &[Piece]) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::with_capacity(path.len());
    // The clipping of `normalize`, on the fly.
    let mut t = 0u64;
    for p in path {
        let start = p.start.max(t);
        if p.end <= start {
            continue;
        }
        t = p.end;
        if let Some(last) = out.last_mut() {
            if last.end == start
                && last.tid == p.tid
                && last.state == p.state
                && last.qualifier == p.qualifier
                && last.vertical == p.vertical
            {
                last.end = p.end;
                last.lost |= p.lost;
                continue;
            }
        }
        out.push(Piece {
            start,
            link_from: None,
            ..p.clone()
        });
    }
    out
}
