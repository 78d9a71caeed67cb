//! Which container and which Kubernetes pod a process runs in, read from
//! its cgroup paths (`/proc/PID/cgroup`), as Coroot and DeepFlow read
//! them: container runtimes and the kubelet name the cgroups they make
//! after the container id and the pod uid.
//!
//! The layouts recognised, cgroup v1 and v2 alike (only the path counts):
//! - docker: `/docker/ID` (cgroupfs driver), `…/docker-ID.scope` (systemd);
//! - podman: `/libpod_parent/libpod-ID` (cgroupfs), `…/libpod-ID.scope`
//!   (systemd), each possibly followed by the container's own
//!   sub-cgroups (`/container`, `/ctr`);
//! - containerd under Kubernetes: `…/pod<UID>/ID` (cgroupfs),
//!   `…/cri-containerd-ID.scope` (systemd);
//! - CRI-O: `…/crio-ID` and `…/crio-ID.scope`;
//! - the kubelet's pod cgroups: `/kubepods[/QOS]/pod<UID>` (cgroupfs, the
//!   uid with dashes) and `kubepods[-QOS]-pod<UID>.slice` (systemd, the
//!   uid with underscores).
//!
//! ID is the runtime's 64 hex digits. A path that matches none of these
//! names no container: a process there gets none, never a guess. The
//! conmon monitors of CRI-O and podman (`crio-conmon-ID`, `libpod-conmon-ID`)
//! are not in their container, so they get none either.

/// What a process's cgroup says about its container and pod.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ContainerRef {
    /// The runtime's container id, 64 lowercase hex digits.
    pub id: Option<String>,
    /// The runtime, when the layout names it: `docker`, `podman`,
    /// `containerd`, `cri-o`.
    pub runtime: Option<&'static str>,
    /// The Kubernetes pod's uid, with dashes.
    pub pod_uid: Option<String>,
}

impl ContainerRef {
    /// What one cgroup path names, if anything.
    pub fn from_cgroup_path(path: &str) -> Option<ContainerRef> {
        let mut found = ContainerRef::default();
        let mut parent = "";
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if let Some(uid) = pod_uid(part) {
                found.pod_uid = Some(uid);
            } else if let Some((runtime, id)) = container_id(part) {
                // The innermost container id counts: a container's own
                // sub-cgroups come after it and name none. A bare id
                // (docker's cgroupfs driver, containerd's) says its runtime
                // only by its parent.
                found.id = Some(id.to_ascii_lowercase());
                found.runtime = runtime.or((parent == "docker").then_some("docker"));
            }
            parent = part;
        }
        (found.id.is_some() || found.pod_uid.is_some()).then_some(found)
    }

    /// What a process's `/proc/PID/cgroup` names: the first hierarchy
    /// (line) whose path names a container, else the first that names a
    /// pod. One line per hierarchy (`ID:CONTROLLERS:PATH`; cgroup v2 has
    /// the one line `0::PATH`).
    pub fn from_proc_cgroup(text: &str) -> Option<ContainerRef> {
        let named: Vec<ContainerRef> = cgroup_paths(text)
            .filter_map(ContainerRef::from_cgroup_path)
            .collect();
        let with_id = named.iter().position(|c| c.id.is_some());
        with_id
            .or((!named.is_empty()).then_some(0))
            .map(|i| named[i].clone())
    }

    /// The id's first 12 digits, as `docker ps` and `podman ps` show it.
    pub fn short_id(&self) -> Option<&str> {
        self.id.as_deref().map(|id| &id[..id.len().min(12)])
    }
}

/// A process's container and pod: their ids ([`ContainerRef`]) and the
/// names the host's runtime and kubelet gave them, where the recorder could
/// read them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Container {
    pub id: Option<String>,
    pub runtime: Option<String>,
    pub name: Option<String>,
    pub pod_uid: Option<String>,
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
}

impl Container {
    /// How results name it: `container shop-hog, pod shop/checkout-7d9f`;
    /// an id stands for a name the host did not give (12 digits of a
    /// container's, 8 of a pod's).
    pub fn label(&self) -> String {
        let container = self
            .name
            .clone()
            .or_else(|| {
                self.id
                    .as_deref()
                    .map(|id| id[..id.len().min(12)].to_string())
            })
            .map(|c| format!("container {c}"));
        let pod = match (&self.pod_namespace, &self.pod_name, &self.pod_uid) {
            (Some(ns), Some(name), _) => Some(format!("pod {ns}/{name}")),
            (None, Some(name), _) => Some(format!("pod {name}")),
            (_, None, Some(uid)) => Some(format!("pod {}", &uid[..uid.len().min(8)])),
            _ => None,
        };
        container
            .into_iter()
            .chain(pod)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The distinct paths of a `/proc/PID/cgroup` text, in its order.
pub fn cgroup_paths(text: &str) -> impl Iterator<Item = &str> {
    let mut seen: Vec<&str> = Vec::new();
    text.lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .filter(move |path| {
            let new = !seen.contains(path);
            if new {
                seen.push(path);
            }
            new
        })
}

/// The pod uid a kubelet cgroup name holds: `pod<UID>` (cgroupfs) or
/// `kubepods[-QOS]-pod<UID_WITH_UNDERSCORES>.slice` (systemd).
fn pod_uid(part: &str) -> Option<String> {
    let uid = if let Some(slice) = part.strip_suffix(".slice") {
        if !slice.starts_with("kubepods") {
            return None;
        }
        slice.rsplit_once("-pod")?.1.replace('_', "-")
    } else {
        part.strip_prefix("pod")?.to_string()
    };
    is_uid(&uid).then(|| uid.to_ascii_lowercase())
}

/// A runtime's container cgroup name: the runtime (when the name says it)
/// and the 64-digit id.
fn container_id(part: &str) -> Option<(Option<&'static str>, &str)> {
    let name = part.strip_suffix(".scope").unwrap_or(part);
    const PREFIXES: [(&str, &str); 4] = [
        ("docker-", "docker"),
        ("libpod-", "podman"),
        ("cri-containerd-", "containerd"),
        ("crio-", "cri-o"),
    ];
    for (prefix, runtime) in PREFIXES {
        if let Some(id) = name.strip_prefix(prefix) {
            return is_id(id).then_some((Some(runtime), id));
        }
    }
    is_id(name).then_some((None, name))
}

fn is_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// 8-4-4-4-12 hex digits.
fn is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f2a3c9d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f";
    const UID: &str = "0c2b4e6a-1d3f-4a5b-9c8d-7e6f5a4b3c2d";

    fn named(path: &str) -> Option<ContainerRef> {
        ContainerRef::from_cgroup_path(path)
    }

    #[test]
    fn runtime_layouts_give_the_container_id() {
        let cases = [
            (format!("/docker/{ID}"), Some("docker")),
            (format!("/system.slice/docker-{ID}.scope"), Some("docker")),
            (format!("/libpod_parent/libpod-{ID}"), Some("podman")),
            (format!("/libpod_parent/libpod-{ID}/ctr"), Some("podman")),
            (
                format!("/machine.slice/libpod-{ID}.scope/container"),
                Some("podman"),
            ),
            (format!("/system.slice/crio-{ID}.scope"), Some("cri-o")),
        ];
        for (path, runtime) in cases {
            let c = named(&path).unwrap_or_else(|| panic!("{path} names no container"));
            assert_eq!(c.id.as_deref(), Some(ID), "{path}");
            assert_eq!(c.runtime, runtime, "{path}");
            assert_eq!(c.pod_uid, None, "{path}");
        }
    }

    #[test]
    fn kubelet_layouts_give_pod_uid_and_container_id() {
        let systemd_uid = UID.replace('-', "_");
        let cases = [
            (format!("/kubepods/burstable/pod{UID}/{ID}"), None),
            (format!("/kubepods/pod{UID}/{ID}"), None),
            (format!("/kubepods/besteffort/pod{UID}/crio-{ID}"), Some("cri-o")),
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd_uid}.slice/cri-containerd-{ID}.scope"
                ),
                Some("containerd"),
            ),
            (
                format!("/kubepods.slice/kubepods-pod{systemd_uid}.slice/docker-{ID}.scope"),
                Some("docker"),
            ),
        ];
        for (path, runtime) in cases {
            let c = named(&path).unwrap_or_else(|| panic!("{path} names nothing"));
            assert_eq!(c.id.as_deref(), Some(ID), "{path}");
            assert_eq!(c.pod_uid.as_deref(), Some(UID), "{path}");
            assert_eq!(c.runtime, runtime, "{path}");
        }
        // The pod's own cgroup: a pod, no container.
        let pod = named(&format!("/kubepods/burstable/pod{UID}")).unwrap();
        assert_eq!((pod.id, pod.pod_uid.as_deref()), (None, Some(UID)));
    }

    #[test]
    fn other_cgroups_name_nothing() {
        for path in [
            "/",
            "/user.slice/user-0.slice/session-1.scope",
            "/system.slice/postgresql@15-main.service",
            "/deepspan-demo-hog",
            &format!("/system.slice/crio-conmon-{ID}.scope"),
            &format!("/machine.slice/libpod-conmon-{ID}.scope"),
            // One digit short, one not hex.
            &format!("/docker/{}", &ID[1..]),
            &format!("/docker/{}g", &ID[1..]),
            "/kubepods/burstable/podnot-a-uid",
            "/kubepods.slice/kubepods-burstable.slice",
        ] {
            assert_eq!(named(path), None, "{path}");
        }
    }

    /// The label's examples, shared with the web UI: a culprit's fields
    /// as `culprits_json` holds them, and the label.
    #[test]
    fn labels_follow_the_shared_vectors() {
        let text = include_str!("../../../docs/format-vectors.json");
        let vectors: serde_json::Value = serde_json::from_str(text).unwrap();
        for v in vectors["containers"].as_array().unwrap() {
            let field = |name: &str| v[0][name].as_str().map(str::to_string);
            let c = Container {
                id: field("container_id"),
                runtime: None,
                name: field("container_name"),
                pod_uid: field("pod_uid"),
                pod_name: field("pod_name"),
                pod_namespace: field("pod_namespace"),
            };
            assert_eq!(c.label(), v[1], "{v}");
        }
    }

    #[test]
    fn proc_cgroup_takes_the_hierarchy_that_names_a_container() {
        // cgroup v1: a process moved into a container's cpu cgroup only.
        let v1 = format!(
            "12:memory:/\n11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{ID}\n10:pids:/user.slice\n1:name=systemd:/user.slice/session-1.scope\n"
        );
        let c = ContainerRef::from_proc_cgroup(&v1).unwrap();
        assert_eq!(c.id.as_deref(), Some(ID));
        assert_eq!(c.pod_uid.as_deref(), Some(UID));
        assert_eq!(c.short_id(), Some(&ID[..12]));
        let v2 = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(
            ContainerRef::from_proc_cgroup(&v2).unwrap().runtime,
            Some("docker")
        );
        assert_eq!(ContainerRef::from_proc_cgroup("0::/\n"), None);
        assert_eq!(ContainerRef::from_proc_cgroup(""), None);
        assert_eq!(
            cgroup_paths("2:cpu:/a\n3:memory:/\n4:pids:/a\n").collect::<Vec<_>>(),
            ["/a", "/"]
        );
    }
}
