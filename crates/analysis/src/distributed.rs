//! The execution graph of several hosts' traces: each host's graph under
//! its own host number, joined by NETWORK edges from where a message was
//! sent to the thread its arrival woke (Trace Compass' distributed
//! critical path, Giraldeau & Dagenais).

use crate::graph::{EdgeType, Graph, VertexId};
use crate::state::KernelModel;
use rustc_hash::FxHashMap;

/// One graph of `hosts` (host `i` is `hosts[i]`, its rows are
/// [`Graph::worker_on`]`(i, tid)`), with a NETWORK edge for every received
/// message whose key another host sent: from the send's vertex to the
/// woken thread's vertex, each send used once, in the order sent. Clocks
/// are taken as they are: synchronise them first (`deepspan-sync`).
pub fn distributed_graph(hosts: &[&KernelModel]) -> Graph {
    let mut graph = Graph::new();
    let mut offsets = Vec::with_capacity(hosts.len());
    for (host, model) in hosts.iter().enumerate() {
        let offset = graph
            .absorb(model.graph(), host as u32)
            .expect("each host's rows are added once, from a one-host graph");
        offsets.push(offset);
    }
    let moved = |host: usize, v: VertexId| VertexId {
        worker: v.worker + offsets[host],
        index: v.index,
    };
    let mut sent: FxHashMap<u64, Vec<(usize, VertexId)>> = FxHashMap::default();
    for (host, model) in hosts.iter().enumerate() {
        for &(key, v) in &model.network_ends().sent {
            sent.entry(key).or_default().push((host, moved(host, v)));
        }
    }
    for (host, model) in hosts.iter().enumerate() {
        for &(key, v) in &model.network_ends().received {
            let Some(senders) = sent.get_mut(&key) else {
                continue;
            };
            let Some(i) = senders.iter().position(|&(h, _)| h != host) else {
                continue;
            };
            let (_, from) = senders.remove(i);
            graph.link(from, moved(host, v), EdgeType::Network, None);
        }
    }
    graph
}
