//! The /proc scan names the container and pod of a process from its cgroup
//! (`ProcessEntry::container`): a process moved into CPU cgroups named as
//! docker's systemd driver and the kubelet's cgroupfs layout name them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use deepspan_record::ProcessScan;

/// A `sleep` in a CPU cgroup (v1) made for it, both gone when dropped.
struct Moved {
    child: Child,
    top: PathBuf,
    leaf: PathBuf,
}

impl Moved {
    /// `path` is below a folder of this test's own under the cpu
    /// hierarchy's root.
    fn into(name: &str, path: &str) -> Moved {
        let top = Path::new("/sys/fs/cgroup/cpu")
            .join(format!("deepspan-test-{name}-{}", std::process::id()));
        let leaf = top.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(&leaf).expect("make the cgroup");
        let child = Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("start sleep");
        let moved = Moved { child, top, leaf };
        std::fs::write(
            moved.leaf.join("cgroup.procs"),
            moved.child.id().to_string(),
        )
        .expect("move the child into the cgroup");
        moved
    }
}

impl Drop for Moved {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut dir = self.leaf.as_path();
        while dir.starts_with(&self.top) {
            let _ = std::fs::remove_dir(dir);
            dir = dir.parent().unwrap();
        }
    }
}

#[test]
#[ignore = "system: root and a v1 CPU cgroup"]
fn a_scan_names_the_container_and_pod_of_a_process_in_their_cgroup() {
    if !Path::new("/sys/fs/cgroup/cpu/cgroup.procs").exists() {
        assert!(
            std::env::var_os("DEEPSPAN_REQUIRE_KERNEL").is_none(),
            "no v1 CPU cgroup hierarchy at /sys/fs/cgroup/cpu"
        );
        return;
    }
    let id = "c0ffee".repeat(10) + "c0ff";
    let uid = "0c2b4e6a-1d3f-4a5b-9c8d-7e6f5a4b3c2d";
    let docker = Moved::into("scan-docker", &format!("system.slice/docker-{id}.scope"));
    let pod = Moved::into("scan-pod", &format!("kubepods/besteffort/pod{uid}/{id}"));
    let outside = Moved::into("scan-none", "system.slice/cron.service");
    let mut scan = ProcessScan::default();
    scan.scan();
    let entry = |m: &Moved| scan.processes[&(m.child.id() as i32)].container.clone();

    let c = entry(&docker).expect("docker's container");
    assert_eq!(
        (c.id.as_deref(), c.runtime.as_deref(), c.pod_uid.as_deref()),
        (Some(id.as_str()), Some("docker"), None)
    );
    let c = entry(&pod).expect("the pod's container");
    assert_eq!(
        (c.id.as_deref(), c.runtime, c.pod_uid.as_deref()),
        (Some(id.as_str()), None, Some(uid))
    );
    assert_eq!(entry(&outside), None);
}
