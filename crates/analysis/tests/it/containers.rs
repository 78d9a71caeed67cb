//! Which container each process ran in: the scan's, the trace's cgroup
//! moves, and the forks for processes neither names (`Containers`).

use std::collections::HashMap;

use deepspan_analysis::{Containers, ScannedProcess};
use deepspan_model::container::Container;
use deepspan_model::{EventKind, Tid};

use crate::common::script::{comm, Script};

const A: &str = "4f2a3c9d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f";
const B: &str = "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0";
const POD: &str = "0c2b4e6a-1d3f-4a5b-9c8d-7e6f5a4b3c2d";

fn scanned(pid: Tid, container: Option<Container>) -> ScannedProcess {
    ScannedProcess {
        pid,
        comm: format!("t{pid}"),
        container,
        ..ScannedProcess::default()
    }
}

fn fork(s: &mut Script, ts: u64, parent: Tid, child: Tid) {
    s.ev_by(
        ts,
        0,
        parent,
        EventKind::SchedProcessFork {
            parent_tid: parent,
            parent_comm: comm(parent),
            child_tid: child,
            child_comm: comm(child),
        },
    );
}

fn moved(s: &mut Script, ts: u64, tid: Tid, root: i32, path: &str) {
    s.ev_by(
        ts,
        0,
        tid,
        EventKind::CgroupAttachTask {
            tid,
            dst_root: root,
            dst_path: path.into(),
        },
    );
}

#[test]
fn scan_moves_and_forks_name_each_process_container_or_none() {
    let named_a = Container {
        id: Some(A.into()),
        runtime: Some("containerd".into()),
        name: Some("shop-hog".into()),
        pod_uid: Some(POD.into()),
        pod_name: Some("checkout-7d9f".into()),
        pod_namespace: Some("shop".into()),
    };
    let scan = [scanned(100, Some(named_a.clone())), scanned(200, None)];
    let mut s = Script::new();
    // Forked from a process in a container, twice over: in it too.
    fork(&mut s, 10, 100, 101);
    fork(&mut s, 20, 101, 102);
    // Forked from a process scanned outside any: none.
    fork(&mut s, 30, 200, 201);
    // Forked from a process nothing names: none.
    fork(&mut s, 40, 300, 301);
    // Forked outside, then moved into A's cgroup (the v1 cpu hierarchy,
    // 3): A, with the names the scan found for A; its child too.
    fork(&mut s, 50, 200, 401);
    moved(
        &mut s,
        60,
        401,
        3,
        &format!("/kubepods/burstable/pod{POD}/{A}"),
    );
    fork(&mut s, 70, 401, 402);
    // Moved into B (hierarchy 2, docker's cgroupfs layout) and then out
    // of it, while hierarchy 5 still names B: B, with ids only.
    moved(&mut s, 80, 500, 2, &format!("/docker/{B}"));
    moved(&mut s, 85, 500, 5, &format!("/docker/{B}"));
    moved(&mut s, 90, 500, 2, "/");
    // In A by its parent, then moved in one hierarchy to a cgroup that
    // names nothing (the others still say A): A, and its child too.
    fork(&mut s, 95, 100, 600);
    moved(&mut s, 96, 600, 3, "/system.slice/cron.service");
    fork(&mut s, 97, 600, 601);
    let model = s.model();
    let pids: HashMap<Tid, Tid> = HashMap::new();
    let containers = Containers::new(&model, &scan, |t| pids.get(&t).copied());

    let of = |pid: Tid| containers.of(pid).map(|c| (**c).clone());
    assert_eq!(of(100), Some(named_a.clone()));
    assert_eq!(of(101), Some(named_a.clone()));
    assert_eq!(of(102), Some(named_a.clone()));
    assert_eq!(of(200), None);
    assert_eq!(of(201), None);
    assert_eq!(of(300), None);
    assert_eq!(of(301), None);
    assert_eq!(of(401), Some(named_a.clone()));
    assert_eq!(of(402), Some(named_a));
    let b = of(500).expect("500 moved into B");
    assert_eq!(
        (b.id.as_deref(), b.runtime.as_deref(), b.name, b.pod_uid),
        (Some(B), Some("docker"), None, None)
    );
    assert_eq!(of(600).and_then(|c| c.name).as_deref(), Some("shop-hog"));
    assert_eq!(of(601).and_then(|c| c.name).as_deref(), Some("shop-hog"));
}
