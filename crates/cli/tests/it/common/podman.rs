//! podman as this VM runs it, and the agent's image (deploy/agent) built
//! for one test binary and removed when it ends.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::repo;

/// Whether podman is here; it must be when `DEEPSPAN_REQUIRE_KERNEL` is set
/// (`make test`, whose set-up installs it).
pub fn podman_or_skip() -> bool {
    let here = Command::new("podman").arg("--version").output().is_ok();
    assert!(
        here || std::env::var_os("DEEPSPAN_REQUIRE_KERNEL").is_none(),
        "podman is not installed (scripts/setup.sh test installs it)"
    );
    here
}

/// `podman --runtime runc` with this VM's containers.conf: runc, since crun
/// refuses its hybrid cgroup layout; no rlimits raised, since it has no
/// CAP_SYS_RESOURCE.
pub fn podman() -> Command {
    let mut c = Command::new("podman");
    c.env("CONTAINERS_CONF", containers_conf())
        .args(["--runtime", "runc"]);
    c
}

fn containers_conf() -> &'static Path {
    static CONF: OnceLock<PathBuf> = OnceLock::new();
    CONF.get_or_init(|| {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("containers.conf");
        std::fs::write(&path, "[containers]\ndefault_ulimits = []\n").unwrap();
        path
    })
}

/// The agent's image (`deploy/agent/image.sh` of this build's binary),
/// built on first use, tagged with this test process's id, and removed
/// when the process exits.
pub fn agent_image() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let tag = format!("localhost/deepspan-agent-test:{}", std::process::id());
        let built = Command::new(repo().join("deploy/agent/image.sh"))
            .args([env!("CARGO_BIN_EXE_deepspan"), &tag])
            .env("CONTAINERS_CONF", containers_conf())
            .output()
            .unwrap();
        assert!(
            built.status.success(),
            "deploy/agent/image.sh: {}",
            String::from_utf8_lossy(&built.stderr)
        );
        extern "C" fn remove_image() {
            if let Some(tag) = TAG.get() {
                let _ = podman().args(["rmi", "-f", tag]).output();
            }
        }
        // SAFETY: registers a plain function, run once at exit.
        unsafe { libc::atexit(remove_image) };
        tag
    })
}

/// `podman run` of the agent's image as deploy/agent/daemonset.yaml runs
/// it: the host's PID namespace and network, tracefs and BTF mounted,
/// CAP_BPF and CAP_PERFMON only, seccomp letting bpf() through, a
/// read-only root; `snapshots` mounted at the same path. The arguments
/// after it go to `deepspan agent`.
pub fn agent_container(name: &str, snapshots: &Path) -> Command {
    let mut c = podman();
    c.args([
        "run",
        "--rm",
        "--name",
        name,
        "--network",
        "host",
        "--pid",
        "host",
    ])
    .args([
        "--read-only",
        "--cap-drop",
        "ALL",
        "--cap-add",
        "BPF,PERFMON",
    ])
    .args(["--security-opt", "seccomp=unconfined"])
    .args(["-v", "/sys/kernel/tracing:/sys/kernel/tracing"])
    .args(["-v", "/sys/kernel/btf:/sys/kernel/btf:ro"])
    .arg("-v")
    .arg(format!("{0}:{0}", snapshots.display()))
    .arg(agent_image());
    c
}
