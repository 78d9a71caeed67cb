//! A small /proc scan: each process's pid, comm, command line and listening
//! TCP ports, so that spans without deepspan fields can be matched to a
//! process by service name or port; the container and pod it runs in, so
//! that results name them; and for a process in a PID namespace of its own,
//! each thread's id there and on the host, so that the SDK's ids from
//! inside a container can be put into the kernel's (`RUN/processes.json`).
//!
//! [`crate::record`] scans when it starts, then every second for 10 s, then
//! at 16, 32, 64 … s, and once more when it ends, each scan adding to what
//! the earlier ones found (so services the traced command starts, late
//! ones too, are seen). It also scans in the seconds after a container
//! runtime's files change ([`ProcessScan::runtimes_changed`]): a container
//! started late and gone before the next scan is named too, since its name
//! is readable only while it exists. [`crate::FlightRecorder::snapshot`]
//! scans once, as it writes its window.
//!
//! A later scan reads only what can have changed: the cgroup and PID
//! namespace of every process, the rest of a process it has not seen. The
//! listening sockets' owners are found by reading every descriptor of a
//! process (the socket inodes they point to), the dearest part of a scan:
//! it is done for new processes, and for all of them only when a
//! listening socket no earlier scan found appears (a service that binds
//! late). A known process handed a known listener's descriptor later is
//! not seen holding it: a forked worker is a new process, and is.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use deepspan_model::container::{Container, ContainerRef};
use serde::{Deserialize, Serialize};

/// One process as the scan saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessEntry {
    pub pid: i32,
    pub comm: String,
    /// Arguments joined by spaces.
    pub cmdline: String,
    /// TCP ports (IPv4 and IPv6) it held a listening socket on.
    #[serde(default)]
    pub listening_ports: Vec<u16>,
    /// The container and pod its cgroup names, as the latest scan saw it
    /// (none when the cgroup names no container).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerEntry>,
    /// The inode of its PID namespace, when not the host's first one (a
    /// container's own): deepspan's SDKs then report thread ids of that
    /// namespace (with `deepspan.pid_ns`), not the kernel's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_ns: Option<u64>,
    /// In that namespace: each thread's id there → its host id, for every
    /// thread a scan saw (the latest scan's, for an id used twice).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub namespaced_tids: BTreeMap<u32, u32>,
}

/// A process's container and pod: the ids its cgroup path holds
/// ([`ContainerRef`]), and the names the host's runtimes and kubelet give
/// them, where their files are readable.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerEntry {
    /// The runtime's container id, 64 hex digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `docker`, `podman`, `containerd` or `cri-o`, when the cgroup's name
    /// says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The Kubernetes pod's uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
}

/// Processes seen by one or more scans, by pid (a later scan adds ports and
/// processes; a pid reused by another command keeps its first entry).
#[derive(Clone, Debug, Default)]
pub struct ProcessScan {
    pub processes: BTreeMap<i32, ProcessEntry>,
    runtimes: RuntimeWatch,
    /// Listening sockets' inodes some scan has looked for already.
    listeners_looked_for: HashSet<u64>,
    /// Processes whose descriptors were read, in scans that looked for
    /// all of those.
    descriptors_read: HashSet<i32>,
}

impl ProcessScan {
    /// Whether a container runtime's or the kubelet's files changed since
    /// the last call (a container or pod made or removed), or did in one
    /// of the two calls before: a runtime writes its file before the
    /// container's first process starts. One `stat` per file; the first
    /// call only takes note.
    pub fn runtimes_changed(&mut self) -> bool {
        self.runtimes.changed()
    }

    /// Scans /proc now and merges what it finds.
    pub fn scan(&mut self) {
        let listening = listening_inodes();
        let new_listener = listening
            .keys()
            .any(|inode| !self.listeners_looked_for.contains(inode));
        let mut names = RuntimeNames::default();
        let Ok(procs) = fs::read_dir("/proc") else {
            return;
        };
        for entry in procs.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let dir = entry.path();
            if let std::collections::btree_map::Entry::Vacant(slot) = self.processes.entry(pid) {
                // Gone meanwhile: no entry.
                let Ok(comm) = fs::read_to_string(dir.join("comm")) else {
                    continue;
                };
                let cmdline = fs::read(dir.join("cmdline")).unwrap_or_default();
                let cmdline = cmdline
                    .split(|&b| b == 0)
                    .filter(|a| !a.is_empty())
                    .map(String::from_utf8_lossy)
                    .collect::<Vec<_>>();
                slot.insert(ProcessEntry {
                    pid,
                    comm: comm.trim_end_matches('\n').to_string(),
                    cmdline: cmdline.join(" "),
                    ..ProcessEntry::default()
                });
            }
            let mut ports: Vec<u16> = Vec::new();
            if !listening.is_empty() && (new_listener || self.descriptors_read.insert(pid)) {
                self.descriptors_read.insert(pid);
                for fd in fs::read_dir(dir.join("fd")).into_iter().flatten().flatten() {
                    let Ok(target) = fs::read_link(fd.path()) else {
                        continue;
                    };
                    let target = target.to_string_lossy();
                    let inode = target
                        .strip_prefix("socket:[")
                        .and_then(|t| t.strip_suffix(']'));
                    if let Some(port) = inode
                        .and_then(|i| i.parse::<u64>().ok())
                        .and_then(|i| listening.get(&i))
                    {
                        ports.push(*port);
                    }
                }
            }
            ports.sort_unstable();
            ports.dedup();
            let container = fs::read_to_string(dir.join("cgroup"))
                .ok()
                .and_then(|text| ContainerRef::from_proc_cgroup(&text))
                .map(|c| names.entry(c));
            let e = self.processes.get_mut(&pid).expect("inserted above");
            if let Some(ns) = pid_namespace(&dir).filter(|&ns| ns != INITIAL_PID_NS) {
                e.pid_ns = Some(ns);
                e.namespaced_tids.extend(namespaced_tids(&dir));
            }
            // A process moved into a container after an earlier scan is
            // named by its container from then on.
            if container.is_some() {
                e.container = container;
            }
            for p in ports {
                if !e.listening_ports.contains(&p) {
                    e.listening_ports.push(p);
                }
            }
        }
        self.listeners_looked_for.extend(listening.keys());
    }

    /// The scan as `processes.json` holds it.
    pub fn to_json(&self) -> Vec<u8> {
        let list: Vec<&ProcessEntry> = self.processes.values().collect();
        serde_json::to_vec_pretty(&list).unwrap_or_default()
    }
}

impl From<ContainerEntry> for Container {
    fn from(c: ContainerEntry) -> Container {
        Container {
            id: c.id,
            runtime: c.runtime,
            name: c.name,
            pod_uid: c.pod_uid,
            pod_name: c.pod_name,
            pod_namespace: c.pod_namespace,
        }
    }
}

/// The names the host's container runtimes and kubelet give container ids
/// and pod uids, read from their files once per scan, where readable:
/// - a running container's OCI bundle, whose annotations hold the names
///   Kubernetes gave it (containerd's CRI plugin, CRI-O) or nerdctl's:
///   `/run/containerd/io.containerd.runtime.v2.task/NAMESPACE/ID/config.json`
///   and `/run/containers/storage/overlay-containers/ID/userdata/config.json`;
/// - podman and CRI-O (containers/storage):
///   `/var/lib/containers/storage/overlay-containers/containers.json`;
/// - docker: `/var/lib/docker/containers/ID/config.v2.json`;
/// - the kubelet: its pod log folders, `/var/log/pods/NAMESPACE_NAME_UID`.
///
/// containerd keeps the names of containers made by other clients (`ctr`)
/// in a database of its own: those get their id only.
#[derive(Default)]
struct RuntimeNames {
    storage: Option<HashMap<String, String>>,
    pods: Option<HashMap<String, (String, String)>>,
}

impl RuntimeNames {
    const STORAGE: &'static str = "/var/lib/containers/storage/overlay-containers/containers.json";
    const DOCKER: &'static str = "/var/lib/docker/containers";
    const POD_LOGS: &'static str = "/var/log/pods";
    /// containerd's task bundles, one folder per containerd namespace.
    const CONTAINERD_TASKS: &'static str = "/run/containerd/io.containerd.runtime.v2.task";
    /// CRI-O's (containers/storage's) run-time folders, `ID/userdata/`.
    const STORAGE_RUN: &'static str = "/run/containers/storage/overlay-containers";

    fn entry(&mut self, c: ContainerRef) -> ContainerEntry {
        let bundle = c.id.as_deref().and_then(|id| {
            bundle_names(
                Path::new(Self::CONTAINERD_TASKS),
                Path::new(Self::STORAGE_RUN),
                id,
            )
        });
        let bundle = bundle.unwrap_or_default();
        // Kubernetes' container name before the runtime's own (CRI-O's in
        // containers/storage is `k8s_NAME_POD_NAMESPACE_UID_ATTEMPT`).
        let name = bundle
            .container
            .or_else(|| c.id.as_deref().and_then(|id| self.container_name(id)));
        let pod = c
            .pod_uid
            .as_deref()
            .and_then(|uid| self.pod(uid))
            .or(bundle.pod_namespace.zip(bundle.pod_name));
        ContainerEntry {
            name,
            runtime: c.runtime.map(str::to_string),
            pod_name: pod.as_ref().map(|p| p.1.clone()),
            pod_namespace: pod.map(|p| p.0),
            id: c.id,
            pod_uid: c.pod_uid,
        }
    }

    fn container_name(&mut self, id: &str) -> Option<String> {
        let storage = self
            .storage
            .get_or_insert_with(|| storage_names(Path::new(Self::STORAGE)));
        storage
            .get(id)
            .cloned()
            .or_else(|| docker_name(&Path::new(Self::DOCKER).join(id).join("config.v2.json")))
    }

    /// (namespace, name) of a pod.
    fn pod(&mut self, uid: &str) -> Option<(String, String)> {
        self.pods
            .get_or_insert_with(|| pod_log_names(Path::new(Self::POD_LOGS)))
            .get(uid)
            .cloned()
    }
}

/// The inode of the host's first PID namespace: the kernel gives the
/// initial namespaces fixed inode numbers (`PROC_PID_INIT_INO`).
pub(crate) const INITIAL_PID_NS: u64 = 0xEFFF_FFFC;

/// The inode of the PID namespace of process `dir` (`/proc/PID`), from
/// its `ns/pid` link (`pid:[4026531836]`).
pub(crate) fn pid_namespace(dir: &Path) -> Option<u64> {
    let link = fs::read_link(dir.join("ns/pid")).ok()?;
    link.to_str()?
        .strip_prefix("pid:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// Each thread of process `dir`: (its id in the innermost PID namespace,
/// its host id), from the `NSpid` line of its status (outermost first).
fn namespaced_tids(dir: &Path) -> Vec<(u32, u32)> {
    let tasks = fs::read_dir(dir.join("task"))
        .into_iter()
        .flatten()
        .flatten();
    tasks
        .filter_map(|task| {
            let status = fs::read_to_string(task.path().join("status")).ok()?;
            nspid(&status)
        })
        .collect()
}

/// (innermost id, host id) of a status file's `NSpid:` line.
fn nspid(status: &str) -> Option<(u32, u32)> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let ids: Vec<u32> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    Some((*ids.last()?, *ids.first()?))
}

/// The names a container's OCI bundle annotates.
#[derive(Debug, Default, PartialEq)]
struct BundleNames {
    container: Option<String>,
    pod_name: Option<String>,
    pod_namespace: Option<String>,
}

/// The names in the `config.json` of container `id`'s bundle: under
/// `containerd_tasks/NAMESPACE/ID/` or `storage_run/ID/userdata/`. None
/// when neither is there or readable, or `id` is no plain id.
fn bundle_names(containerd_tasks: &Path, storage_run: &Path, id: &str) -> Option<BundleNames> {
    #[derive(Deserialize)]
    struct Spec {
        #[serde(default)]
        annotations: HashMap<String, String>,
    }
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    let containerd = fs::read_dir(containerd_tasks)
        .into_iter()
        .flatten()
        .flatten()
        .map(|ns| ns.path().join(id).join("config.json"));
    let crio = std::iter::once(storage_run.join(id).join("userdata/config.json"));
    let spec: Spec = containerd
        .chain(crio)
        .find_map(|path| serde_json::from_slice(&fs::read(path).ok()?).ok())?;
    let first = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| spec.annotations.get(*k))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    Some(BundleNames {
        container: first(&[
            "io.kubernetes.cri.container-name",
            "io.kubernetes.container.name",
            "nerdctl/name",
        ]),
        pod_name: first(&["io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"]),
        pod_namespace: first(&[
            "io.kubernetes.cri.sandbox-namespace",
            "io.kubernetes.pod.namespace",
        ]),
    })
}

/// The modification times of the files [`RuntimeNames`] reads.
#[derive(Clone, Debug)]
struct RuntimeWatch {
    paths: Vec<PathBuf>,
    seen: Option<Vec<Option<SystemTime>>>,
    /// Calls left that answer "changed" after the latest change.
    pending: u8,
}

impl Default for RuntimeWatch {
    fn default() -> RuntimeWatch {
        RuntimeWatch::new(
            [
                RuntimeNames::STORAGE,
                RuntimeNames::DOCKER,
                RuntimeNames::POD_LOGS,
                RuntimeNames::STORAGE_RUN,
                // containerd's namespaces of Kubernetes, docker and nerdctl.
                "/run/containerd/io.containerd.runtime.v2.task/k8s.io",
                "/run/containerd/io.containerd.runtime.v2.task/moby",
                "/run/containerd/io.containerd.runtime.v2.task/default",
            ]
            .map(PathBuf::from)
            .to_vec(),
        )
    }
}

impl RuntimeWatch {
    /// Calls that answer "changed" after a change: the change's and two more.
    const CALLS_AFTER_CHANGE: u8 = 3;

    fn new(paths: Vec<PathBuf>) -> RuntimeWatch {
        RuntimeWatch {
            paths,
            seen: None,
            pending: 0,
        }
    }

    fn changed(&mut self) -> bool {
        let now: Vec<Option<SystemTime>> = self
            .paths
            .iter()
            .map(|p| fs::metadata(p).and_then(|m| m.modified()).ok())
            .collect();
        if self.seen.as_ref().is_some_and(|seen| *seen != now) {
            self.pending = Self::CALLS_AFTER_CHANGE;
        }
        self.seen = Some(now);
        if self.pending == 0 {
            return false;
        }
        self.pending -= 1;
        true
    }
}

/// Container id → first name, from containers/storage's `containers.json`
/// (`[{"id": …, "names": [NAME, …]}, …]`).
fn storage_names(path: &Path) -> HashMap<String, String> {
    #[derive(Deserialize)]
    struct Stored {
        id: String,
        #[serde(default)]
        names: Vec<String>,
    }
    let Ok(text) = fs::read(path) else {
        return HashMap::new();
    };
    serde_json::from_slice::<Vec<Stored>>(&text)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|c| Some((c.id, c.names.into_iter().next()?)))
        .collect()
}

/// The name in docker's `config.v2.json` (`"Name": "/NAME"`).
fn docker_name(path: &Path) -> Option<String> {
    #[derive(Deserialize)]
    struct Config {
        #[serde(rename = "Name")]
        name: String,
    }
    let config: Config = serde_json::from_slice(&fs::read(path).ok()?).ok()?;
    let name = config.name.trim_start_matches('/');
    (!name.is_empty()).then(|| name.to_string())
}

/// Pod uid → (namespace, name), from the kubelet's pod log folders
/// (`NAMESPACE_NAME_UID`: namespaces and pod names hold no `_`).
fn pod_log_names(dir: &Path) -> HashMap<String, (String, String)> {
    let Ok(entries) = fs::read_dir(dir) else {
        return HashMap::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let folder = e.file_name().into_string().ok()?;
            let mut parts = folder.splitn(3, '_');
            let (namespace, name, uid) = (parts.next()?, parts.next()?, parts.next()?);
            Some((uid.to_string(), (namespace.to_string(), name.to_string())))
        })
        .collect()
}

/// Socket inode → port of the listening TCP sockets, IPv4 and IPv6, of
/// this network namespace. From the kernel's socket diagnostics (netlink
/// `SOCK_DIAG_BY_FAMILY`, as `ss -lt` asks), which walk only the listening
/// sockets; else, on a kernel without them, from /proc/net/tcp and tcp6,
/// whose text lists every TCP socket: on a busy server tens of thousands in
/// TIME_WAIT, 120 ms of kernel time per read with 32 000 of them, for a scan
/// each second while a recording starts.
fn listening_inodes() -> HashMap<u64, u16> {
    sock_diag::listening_tcp().unwrap_or_else(|_| proc_net_listening())
}

/// [`listening_inodes`] from /proc/net/tcp and tcp6.
fn proc_net_listening() -> HashMap<u64, u16> {
    let mut out = HashMap::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(file) else {
            continue;
        };
        out.extend(text.lines().skip(1).filter_map(parse_listening));
    }
    out
}

/// The listening TCP sockets of one address family from the kernel's
/// socket diagnostics (sock_diag(7), inet_diag): one dump request for
/// state LISTEN, the replies read until `NLMSG_DONE`.
mod sock_diag {
    use std::collections::HashMap;
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    /// `SOCK_DIAG_BY_FAMILY` of linux/sock_diag.h: the request's and the
    /// replies' message type.
    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    /// `TCP_LISTEN` of the kernel's TCP states; requests select states by
    /// bit.
    const TCP_LISTEN: u32 = 10;
    /// `struct nlmsghdr`.
    const HEADER: usize = 16;
    /// `struct inet_diag_req_v2`: family, protocol, extensions, padding,
    /// the states (u32), then a socket id (48 bytes) left zero.
    const REQUEST: usize = 56;
    /// `struct inet_diag_msg`: the socket id starts at 4 with the source
    /// port (big-endian); the inode is the u32 at 68.
    const REPLY: usize = 72;
    const REPLY_PORT: usize = 4;
    const REPLY_INODE: usize = 68;

    /// Socket inode → port of the listening TCP sockets, IPv4 and IPv6.
    pub(super) fn listening_tcp() -> io::Result<HashMap<u64, u16>> {
        let mut found = listening(libc::AF_INET)?;
        found.extend(listening(libc::AF_INET6)?);
        Ok(found)
    }

    /// Socket inode → port of the listening TCP sockets of `family`
    /// (`AF_INET` or `AF_INET6`).
    fn listening(family: i32) -> io::Result<HashMap<u64, u16>> {
        // SAFETY: socket(2) with constant arguments; the fd is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                libc::NETLINK_SOCK_DIAG,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut request = [0u8; HEADER + REQUEST];
        let len = request.len() as u32;
        let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
        request[0..4].copy_from_slice(&len.to_ne_bytes());
        request[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        request[6..8].copy_from_slice(&flags.to_ne_bytes());
        request[8..12].copy_from_slice(&1u32.to_ne_bytes());
        request[HEADER] = family as u8;
        request[HEADER + 1] = libc::IPPROTO_TCP as u8;
        request[HEADER + 4..HEADER + 8].copy_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
        // SAFETY: a zeroed sockaddr_nl is valid; nl_pid 0 is the kernel.
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: the buffer and the address outlive the call; their
        // lengths are theirs.
        let sent = unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                request.as_ptr().cast(),
                request.len(),
                0,
                (&kernel as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut found = HashMap::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            // SAFETY: recv(2) into a buffer of the length given.
            let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::Error::other("the dump ended without NLMSG_DONE"));
            }
            if parse_replies(&buf[..n as usize], &mut found)? {
                return Ok(found);
            }
        }
    }

    /// Adds the sockets of one datagram of replies to `found`; true at the
    /// dump's end.
    fn parse_replies(mut data: &[u8], found: &mut HashMap<u64, u16>) -> io::Result<bool> {
        let u32_at = |b: &[u8], at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().unwrap());
        while data.len() >= HEADER {
            let len = u32_at(data, 0) as usize;
            let kind = u16::from_ne_bytes([data[4], data[5]]);
            if len < HEADER || len > data.len() {
                return Err(io::Error::other(format!(
                    "netlink message of {len} bytes in {} left",
                    data.len()
                )));
            }
            match i32::from(kind) {
                libc::NLMSG_DONE => return Ok(true),
                libc::NLMSG_ERROR if len >= HEADER + 4 => {
                    let errno = -(u32_at(data, HEADER) as i32);
                    if errno != 0 {
                        return Err(io::Error::from_raw_os_error(errno));
                    }
                }
                _ if kind == SOCK_DIAG_BY_FAMILY && len >= HEADER + REPLY => {
                    let reply = &data[HEADER..len];
                    let port = u16::from_be_bytes([reply[REPLY_PORT], reply[REPLY_PORT + 1]]);
                    found.insert(u64::from(u32_at(reply, REPLY_INODE)), port);
                }
                _ => {}
            }
            // Messages are 4-byte aligned (NLMSG_ALIGN).
            data = &data[((len + 3) & !3).min(data.len())..];
        }
        Ok(false)
    }
}

/// `(inode, port)` of one /proc/net/tcp line in state LISTEN (0A).
fn parse_listening(line: &str) -> Option<(u64, u16)> {
    let f: Vec<&str> = line.split_whitespace().collect();
    // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
    if f.get(3) != Some(&"0A") {
        return None;
    }
    let port = u16::from_str_radix(f.get(1)?.rsplit_once(':')?.1, 16).ok()?;
    Some((f.get(9)?.parse().ok()?, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_lines_give_inode_and_port() {
        let listen = "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41234 1 0000000000000000 100 0 0 10 0";
        assert_eq!(parse_listening(listen), Some((41234, 8080)));
        let established =
            "   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 41235 1";
        assert_eq!(parse_listening(established), None);
    }

    #[test]
    fn socket_diagnostics_list_the_listeners_that_proc_net_tcp_lists() {
        let v4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let v6 = std::net::TcpListener::bind("[::1]:0").ok();
        let from_proc = proc_net_listening();
        let from_diag = sock_diag::listening_tcp().unwrap();
        for listener in std::iter::once(&v4).chain(v6.as_ref()) {
            let port = listener.local_addr().unwrap().port();
            let inode = from_proc
                .iter()
                .find(|(_, &p)| p == port)
                .map(|(&i, _)| i)
                .unwrap_or_else(|| panic!("/proc/net/tcp lists no listener on {port}"));
            assert_eq!(from_diag.get(&inode), Some(&port), "{from_diag:?}");
        }
        // Connected sockets are no listeners.
        let client = std::net::TcpStream::connect(v4.local_addr().unwrap()).unwrap();
        let (_server, _) = v4.accept().unwrap();
        let again = sock_diag::listening_tcp().unwrap();
        let client_port = client.local_addr().unwrap().port();
        assert!(again.values().all(|&p| p != client_port), "{again:?}");
        assert_eq!(
            again
                .values()
                .filter(|&&p| p == v4.local_addr().unwrap().port())
                .count(),
            1
        );
    }

    #[test]
    fn runtime_files_give_container_and_pod_names() {
        let dir = tempfile::tempdir().unwrap();
        let id = "a".repeat(64);
        let storage = dir.path().join("containers.json");
        fs::write(
            &storage,
            format!(r#"[{{"id":"{id}","names":["shop-hog","alias"],"image":""}},{{"id":"b","names":[]}}]"#),
        )
        .unwrap();
        let names = storage_names(&storage);
        assert_eq!(names.get(&id).map(String::as_str), Some("shop-hog"));
        assert_eq!(names.len(), 1);
        assert!(storage_names(&dir.path().join("missing.json")).is_empty());
        fs::write(&storage, "not json").unwrap();
        assert!(storage_names(&storage).is_empty());

        let docker = dir.path().join("config.v2.json");
        fs::write(&docker, r#"{"ID":"x","Name":"/pricing","State":{}}"#).unwrap();
        assert_eq!(docker_name(&docker).as_deref(), Some("pricing"));

        let pods = dir.path().join("pods");
        let uid = "0c2b4e6a-1d3f-4a5b-9c8d-7e6f5a4b3c2d";
        fs::create_dir_all(pods.join(format!("shop_checkout-7d9f_{uid}"))).unwrap();
        let found = pod_log_names(&pods);
        assert_eq!(
            found.get(uid),
            Some(&("shop".to_string(), "checkout-7d9f".to_string()))
        );
    }

    #[test]
    fn oci_bundles_give_the_names_kubernetes_and_nerdctl_gave() {
        let dir = tempfile::tempdir().unwrap();
        let (tasks, storage_run) = (dir.path().join("tasks"), dir.path().join("storage"));
        let bundle = |path: PathBuf, annotations: &str| {
            fs::create_dir_all(&path).unwrap();
            fs::write(
                path.join("config.json"),
                format!(r#"{{"ociVersion":"1.1.0","process":{{"args":["/pause"]}},"annotations":{{{annotations}}}}}"#),
            )
            .unwrap();
        };
        let (cri, crio, nerdctl, bare) = (
            "a".repeat(64),
            "b".repeat(64),
            "c".repeat(64),
            "d".repeat(64),
        );
        bundle(
            tasks.join("k8s.io").join(&cri),
            r#""io.kubernetes.cri.container-type":"container","io.kubernetes.cri.container-name":"pricing",
               "io.kubernetes.cri.sandbox-name":"shop-7d9f","io.kubernetes.cri.sandbox-namespace":"prod""#,
        );
        bundle(
            storage_run.join(&crio).join("userdata"),
            r#""io.kubernetes.container.name":"encoder","io.kubernetes.pod.name":"batch-1",
               "io.kubernetes.pod.namespace":"jobs""#,
        );
        bundle(
            tasks.join("default").join(&nerdctl),
            r#""nerdctl/name":"web""#,
        );
        fs::create_dir_all(tasks.join("moby").join(&bare)).unwrap();
        fs::write(
            tasks.join("moby").join(&bare).join("config.json"),
            r#"{"ociVersion":"1.1.0"}"#,
        )
        .unwrap();
        let names = |id: &str| bundle_names(&tasks, &storage_run, id);
        let named = |c: &str, pod: Option<(&str, &str)>| BundleNames {
            container: Some(c.into()),
            pod_namespace: pod.map(|p| p.0.into()),
            pod_name: pod.map(|p| p.1.into()),
        };
        assert_eq!(
            names(&cri),
            Some(named("pricing", Some(("prod", "shop-7d9f"))))
        );
        assert_eq!(
            names(&crio),
            Some(named("encoder", Some(("jobs", "batch-1"))))
        );
        assert_eq!(names(&nerdctl), Some(named("web", None)));
        assert_eq!(names(&bare), Some(BundleNames::default()));
        assert_eq!(names(&"e".repeat(64)), None);
        assert_eq!(names("../k8s.io"), None, "an id is never a path");
    }

    #[test]
    fn status_lines_give_a_threads_id_in_its_namespace_and_the_hosts() {
        let status = "Name:\tpython3\nTgid:\t1273\nNSpid:\t1275\t7\nNSsid:\t1\n";
        assert_eq!(nspid(status), Some((7, 1275)));
        assert_eq!(
            nspid("NSpid:\t42\n"),
            Some((42, 42)),
            "the host's namespace"
        );
        assert_eq!(
            nspid("NSpid:\t5\t3\t1\n"),
            Some((1, 5)),
            "nested: the innermost"
        );
        assert_eq!(nspid("Name:\tx\n"), None);
        assert_eq!(nspid("NSpid:\tx\t1\n"), None);
        let me = Path::new("/proc/self");
        assert_eq!(
            pid_namespace(me),
            Some(INITIAL_PID_NS),
            "tests run in the host's"
        );
    }

    #[test]
    fn a_runtime_file_changing_calls_for_scans_in_three_ticks() {
        let dir = tempfile::tempdir().unwrap();
        let storage = dir.path().join("containers.json");
        let mut watch = RuntimeWatch::new(vec![storage.clone(), dir.path().join("pods")]);
        assert!(!watch.changed(), "the first call only takes note");
        assert!(!watch.changed());
        fs::write(&storage, "[]").unwrap();
        assert_eq!([(); 4].map(|_| watch.changed()), [true, true, true, false]);
        // A file's mtime can be set back: any difference is a change.
        let earlier = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1);
        fs::File::options()
            .write(true)
            .open(&storage)
            .unwrap()
            .set_modified(earlier)
            .unwrap();
        assert!(watch.changed());
        fs::create_dir(dir.path().join("pods")).unwrap();
        assert_eq!([(); 4].map(|_| watch.changed()), [true, true, true, false]);
        fs::remove_file(&storage).unwrap();
        assert!(watch.changed(), "a removed file is a change");
    }

    #[test]
    fn a_scan_finds_this_process_and_its_listening_port() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut scan = ProcessScan::default();
        scan.scan();
        let me = &scan.processes[&(std::process::id() as i32)];
        assert!(me.listening_ports.contains(&port), "{me:?}");
        assert!(!me.cmdline.is_empty());
        // A listener bound after the first scan, by a process that scan
        // saw: the next scan reads the descriptors again and finds it.
        let late = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let late_port = late.local_addr().unwrap().port();
        scan.scan();
        let me = &scan.processes[&(std::process::id() as i32)];
        assert!(
            me.listening_ports.contains(&late_port) && me.listening_ports.contains(&port),
            "{me:?}"
        );
    }
}
