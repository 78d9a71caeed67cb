//! What the recorder needs of the host, checked before the live agent's
//! flight recorder starts, so that an agent run in a container without a
//! mount, a namespace or a capability says which, and how to give it,
//! instead of recording less than it should:
//! - tracefs mounted (the host's, at /sys/kernel/tracing in a container;
//!   mounting one needs CAP_SYS_ADMIN, which a container rarely has);
//! - the kernel's BTF (/sys/kernel/btf/vmlinux), which the eBPF captures'
//!   BTF-typed tracepoints are loaded against;
//! - the host's PID namespace: the trace names threads by their host ids,
//!   and the /proc scan, the containers and the spans' thread ids must
//!   name the same threads;
//! - CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN, which covers both on older
//!   kernels) to load and attach the eBPF captures, and a bpf() system call
//!   that no seccomp filter refuses (found by creating a one-entry map).
//!
//! `deepspan record` keeps going without the eBPF captures (each says so
//! as it fails); the agent, meant to run unattended, refuses to start.

use std::fs;
use std::path::Path;

/// Where a container must mount the host's BTF.
const BTF: &str = "/sys/kernel/btf/vmlinux";

/// Capability numbers (linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Each thing the recorder lacks, as a sentence saying how to give it;
/// empty when nothing is missing.
pub fn missing() -> Vec<String> {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
    // A build without the eBPF programs (no clang) needs neither BTF nor
    // the capabilities to load them.
    let ebpf = cfg!(deepspan_bpf).then(|| Path::new(BTF).exists());
    let host_pid_ns = crate::procscan::pid_namespace(Path::new("/proc/self"))
        .is_none_or(|ns| ns == crate::procscan::INITIAL_PID_NS);
    let mut out = missing_from(&status, &mounts, ebpf, host_pid_ns);
    // With the capabilities, a refused bpf() is a seccomp filter's doing
    // (podman's and docker's default profiles allow it with CAP_SYS_ADMIN
    // only): the captures would fail to create their maps.
    if ebpf.is_some() && out.iter().all(|m| !m.contains("CAP_BPF")) {
        if let Err(e) = bpf_map_create() {
            out.push(format!(
                "the bpf() system call is refused ({e}), so the eBPF captures cannot load: in a \
                 container, allow it in the seccomp profile (podman/docker: --security-opt \
                 seccomp=unconfined; Kubernetes: securityContext.seccompProfile.type: Unconfined)"
            ));
        }
    }
    out
}

/// Creates and closes a one-entry BPF array map: whether bpf() works here.
fn bpf_map_create() -> std::io::Result<()> {
    // union bpf_attr's map-creation members: map_type (BPF_MAP_TYPE_ARRAY),
    // key_size, value_size, max_entries; the rest zero.
    let mut attr = [0u32; 32];
    attr[..4].copy_from_slice(&[2, 4, 4, 1]);
    // SAFETY: BPF_MAP_CREATE (0) reads `size` bytes of `attr`, which lives
    // across the call; the fd it returns is closed here.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            0,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor this function owns.
    unsafe { libc::close(fd as i32) };
    Ok(())
}

/// `ebpf`: whether the kernel's BTF is there, or `None` when this build
/// has no eBPF captures. `host_pid_ns`: whether this process is in the
/// host's PID namespace.
fn missing_from(status: &str, mounts: &str, ebpf: Option<bool>, host_pid_ns: bool) -> Vec<String> {
    let mut out = Vec::new();
    let tracefs = mounts
        .lines()
        .any(|line| line.split_whitespace().nth(2) == Some("tracefs"));
    let effective = field(status, "CapEff:").and_then(|hex| u64::from_str_radix(hex, 16).ok());
    let has = |cap: u32| effective.is_some_and(|caps| caps >> cap & 1 == 1);
    if !tracefs && !has(CAP_SYS_ADMIN) {
        out.push(
            "no tracefs is mounted, and mounting one needs CAP_SYS_ADMIN: mount the host's at \
             /sys/kernel/tracing (podman/docker: -v /sys/kernel/tracing:/sys/kernel/tracing; \
             Kubernetes: a hostPath volume, as deploy/agent/daemonset.yaml has)"
                .to_string(),
        );
    }
    if ebpf == Some(false) {
        out.push(format!(
            "no kernel BTF at {BTF}, which the eBPF captures load against: mount the host's \
             /sys/kernel/btf read-only (podman/docker: -v /sys/kernel/btf:/sys/kernel/btf:ro)"
        ));
    }
    if !host_pid_ns {
        out.push(
            "not in the host's PID namespace, so the threads the trace names are not the ones \
             /proc and the spans name: run with the host's (podman/docker: --pid host; \
             Kubernetes: hostPID: true)"
                .to_string(),
        );
    }
    let lacking: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|&(cap, _)| !has(cap) && !has(CAP_SYS_ADMIN))
        .map(|(_, name)| name)
        .collect();
    if ebpf.is_some() && effective.is_some() && !lacking.is_empty() {
        out.push(format!(
            "without {}, the eBPF captures cannot load: add {} (podman/docker: --cap-add {}; \
             Kubernetes: securityContext.capabilities.add)",
            lacking.join(" and "),
            if lacking.len() == 1 { "it" } else { "them" },
            lacking
                .iter()
                .map(|c| c.trim_start_matches("CAP_"))
                .collect::<Vec<_>>()
                .join(",")
        ));
    }
    out
}

/// The value of a `Name:\tvalue` line of /proc/self/status.
fn field<'s>(status: &'s str, name: &str) -> Option<&'s str> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(name))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "proc /proc proc rw 0 0\ntracefs /sys/kernel/tracing tracefs rw 0 0\n";
    /// Root on the host: every capability.
    const HOST: &str = "Name:\tdeepspan\nCapEff:\t000001ffffffffff\n";
    /// podman's defaults: no CAP_SYS_ADMIN, CAP_BPF or CAP_PERFMON.
    const CONTAINER: &str = "Name:\tdeepspan\nCapEff:\t00000000a80425fb\n";

    #[test]
    fn root_on_the_host_lacks_nothing() {
        assert!(missing_from(HOST, MOUNTS, Some(true), true).is_empty());
        // It may mount tracefs itself.
        assert!(missing_from(HOST, "proc /proc proc rw 0 0\n", Some(true), true).is_empty());
    }

    #[test]
    fn a_bare_container_is_told_each_mount_namespace_and_capability() {
        let told = missing_from(CONTAINER, "proc /proc proc rw 0 0\n", Some(false), false);
        assert_eq!(told.len(), 4, "{told:#?}");
        assert!(told[0].contains("-v /sys/kernel/tracing:/sys/kernel/tracing"));
        assert!(told[1].contains("/sys/kernel/btf"));
        assert!(told[2].contains("--pid host"));
        assert!(told[3].contains("CAP_BPF and CAP_PERFMON"), "{}", told[3]);
        assert!(told[3].contains("--cap-add BPF,PERFMON"), "{}", told[3]);
    }

    #[test]
    fn a_container_run_as_the_daemonset_lacks_nothing() {
        // CAP_BPF and CAP_PERFMON added, host PID namespace, mounts.
        let status = "CapEff:\t000000c0a80425fb\n";
        assert!(missing_from(status, MOUNTS, Some(true), true).is_empty());
        // One capability short.
        let status = "CapEff:\t00000080a80425fb\n";
        let told = missing_from(status, MOUNTS, Some(true), true);
        assert_eq!(told.len(), 1);
        assert!(told[0].starts_with("without CAP_PERFMON,"), "{}", told[0]);
        // A build without eBPF captures needs neither BTF nor them.
        let told = missing_from(status, MOUNTS, None, true);
        assert!(told.is_empty(), "{told:?}");
    }
}
