//! The container and Kubernetes pod of each process, for naming culprits.
//!
//! The rules, in order:
//! 1. A process the trace shows moved into a cgroup
//!    (`cgroup:cgroup_attach_task`: a runtime placing a container's first
//!    process, a write to `cgroup.procs`) runs in what its latest moves
//!    name, when they name a container or pod. A move to a cgroup that
//!    names neither changes nothing (cgroup v1 moves one hierarchy at a
//!    time; the others still say where the process was).
//! 2. Else the recorder's /proc scan says it, for every process the scan
//!    saw ([`ScannedProcess::container`], read from its cgroup).
//! 3. A process that neither names (forked during the recording, between
//!    scans) started in its parent's cgroup: it takes the container of its
//!    nearest ancestor that rule 1 or 2 names, through the forks the trace
//!    holds. An ancestor known to run outside any container ends the
//!    search: that process gets none, as does one whose ancestry the trace
//!    does not reach. Never a guess.
//!
//! A container known only from a move has the names the scan found for the
//! same id or pod uid, else ids only.

use std::sync::Arc;

use deepspan_model::container::{Container, ContainerRef};
use deepspan_model::Tid;
use rustc_hash::FxHashMap;

use crate::placement::ScannedProcess;
use crate::state::KernelModel;

/// Forks followed upwards at most: a reused thread id can make the chain
/// of parents a cycle.
const MAX_ANCESTORS: usize = 64;

/// Process id → its container, for the processes that have one.
#[derive(Clone, Debug, Default)]
pub struct Containers {
    by_pid: FxHashMap<Tid, Arc<Container>>,
}

impl Containers {
    /// From the scan and the trace's cgroup moves, and the model's forks
    /// for processes neither says. `pid_of` maps a thread to its process
    /// where the model does not.
    pub fn new(
        model: &KernelModel,
        scanned: &[ScannedProcess],
        pid_of: impl Fn(Tid) -> Option<Tid>,
    ) -> Containers {
        let process = |tid: Tid| {
            model
                .thread(tid)
                .and_then(|t| t.pid)
                .or_else(|| pid_of(tid))
                .unwrap_or(tid)
        };
        // What each process is known to run in: the scan's, then its moves
        // where they name a container.
        let mut known: FxHashMap<Tid, Option<Arc<Container>>> = scanned
            .iter()
            .map(|p| (p.pid, p.container.clone().map(Arc::new)))
            .collect();
        let named = Names::of(known.values().flatten());
        for (pid, c) in latest_moves(model, process) {
            known.insert(pid, Some(named.complete(c)));
        }
        let mut by_pid: FxHashMap<Tid, Arc<Container>> = known
            .iter()
            .filter_map(|(&pid, c)| Some((pid, c.clone()?)))
            .collect();
        for th in model.threads() {
            let pid = process(th.tid);
            if known.contains_key(&pid) || by_pid.contains_key(&pid) {
                continue;
            }
            let mut parent = th.parent;
            for _ in 0..MAX_ANCESTORS {
                let Some(p) = parent else { break };
                if let Some(found) = known.get(&process(p)) {
                    if let Some(c) = found {
                        by_pid.insert(pid, c.clone());
                    }
                    break;
                }
                // Not known: go on from that thread's own parent.
                parent = model.thread(p).and_then(|t| t.parent);
            }
        }
        Containers { by_pid }
    }

    /// Each process that ran in a container, by pid.
    pub fn iter(&self) -> impl Iterator<Item = (Tid, &Arc<Container>)> {
        let mut all: Vec<(Tid, &Arc<Container>)> =
            self.by_pid.iter().map(|(&pid, c)| (pid, c)).collect();
        all.sort_unstable_by_key(|(pid, _)| *pid);
        all.into_iter()
    }

    /// The container of process `pid`, if it ran in one.
    pub fn of(&self, pid: Tid) -> Option<&Arc<Container>> {
        self.by_pid.get(&pid)
    }

    pub fn is_empty(&self) -> bool {
        self.by_pid.is_empty()
    }
}

/// Each moved process's container after its last moves: of its latest
/// move in each hierarchy, the first (by hierarchy) whose path names a
/// container, else the first that names a pod, as a process's
/// `/proc/PID/cgroup` is read. A process whose moves name neither is left
/// out: a move in one hierarchy leaves the others where they were, so it
/// says nothing of them.
fn latest_moves(model: &KernelModel, process: impl Fn(Tid) -> Tid) -> FxHashMap<Tid, ContainerRef> {
    // (process, hierarchy) → the latest move's container; moves are in
    // time order.
    let mut latest: FxHashMap<(Tid, i32), Option<&ContainerRef>> = FxHashMap::default();
    for m in model.cgroup_moves() {
        latest.insert((process(m.tid), m.root), m.container.as_ref());
    }
    let mut by_root: Vec<(&(Tid, i32), &Option<&ContainerRef>)> = latest.iter().collect();
    by_root.sort_unstable_by_key(|(key, _)| **key);
    let mut out: FxHashMap<Tid, ContainerRef> = FxHashMap::default();
    for (&(pid, _), c) in by_root {
        let Some(c) = c else { continue };
        let better = out
            .get(&pid)
            .is_none_or(|have| have.id.is_none() && c.id.is_some());
        if better {
            out.insert(pid, (*c).clone());
        }
    }
    out
}

/// The names the scan found, by container id and pod uid, for containers
/// known only from a cgroup move.
struct Names {
    by_id: FxHashMap<String, Arc<Container>>,
    pods: FxHashMap<String, (Option<String>, Option<String>)>,
}

impl Names {
    fn of<'c>(scanned: impl Iterator<Item = &'c Arc<Container>>) -> Names {
        let mut names = Names {
            by_id: FxHashMap::default(),
            pods: FxHashMap::default(),
        };
        for c in scanned {
            if let Some(id) = &c.id {
                names.by_id.entry(id.clone()).or_insert_with(|| c.clone());
            }
            if let Some(uid) = &c.pod_uid {
                names
                    .pods
                    .entry(uid.clone())
                    .or_insert_with(|| (c.pod_name.clone(), c.pod_namespace.clone()));
            }
        }
        names
    }

    fn complete(&self, c: ContainerRef) -> Arc<Container> {
        if let Some(known) = c.id.as_ref().and_then(|id| self.by_id.get(id)) {
            return known.clone();
        }
        let (pod_name, pod_namespace) = c
            .pod_uid
            .as_ref()
            .and_then(|uid| self.pods.get(uid))
            .cloned()
            .unwrap_or_default();
        Arc::new(Container {
            id: c.id,
            runtime: c.runtime.map(str::to_string),
            name: None,
            pod_uid: c.pod_uid,
            pod_name,
            pod_namespace,
        })
    }
}
