//! Finding (or mounting) tracefs, and the private tracing instance the
//! recorder works in.
//!
//! The recorder never changes a top-level tracing setting: everything it
//! configures lives in `instances/deepspan-<pid>-<unique>`, which is removed
//! when the [`Instance`] guard drops, on success, error or panic alike.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{sys, Error};

/// Prefix of every instance the recorder creates; the owner's pid follows.
pub(crate) const INSTANCE_PREFIX: &str = "deepspan-";

const DEFAULT_MOUNT: &str = "/sys/kernel/tracing";

/// A mounted tracefs.
#[derive(Clone, Debug)]
pub struct Tracefs {
    root: PathBuf,
}

impl Tracefs {
    /// Finds the mounted tracefs, mounting it at /sys/kernel/tracing when it
    /// is not mounted yet (as root may do).
    pub fn open() -> Result<Tracefs, Error> {
        if let Some(root) = mounted_tracefs() {
            return Tracefs::at(root);
        }
        let target = Path::new(DEFAULT_MOUNT);
        if !target.is_dir() {
            return Err(Error::TracefsUnavailable(format!(
                "no tracefs is mounted and {DEFAULT_MOUNT} does not exist: the kernel was built without \
                 tracing (CONFIG_FTRACE) or sysfs is not mounted"
            )));
        }
        sys::mount_tracefs(target).map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => Error::NeedRoot {
                action: "mount tracefs on",
                path: target.into(),
                source: e,
            },
            Some(libc::ENODEV) => Error::TracefsUnavailable(format!(
                "the kernel does not support tracefs (mounting it on {DEFAULT_MOUNT} failed: {e})"
            )),
            _ => Error::TracefsUnavailable(format!(
                "no tracefs is mounted and mounting it on {DEFAULT_MOUNT} failed: {e}"
            )),
        })?;
        Tracefs::at(target.to_path_buf())
    }

    /// Uses the tracefs mounted at `root`; checks that it looks like one and
    /// that we may use it.
    pub fn at(root: PathBuf) -> Result<Tracefs, Error> {
        let probe = root.join("available_events");
        match fs::metadata(&probe) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::TracefsUnavailable(format!(
                    "{} is not a tracefs (no available_events)",
                    root.display()
                )))
            }
            Err(e) => return Err(Error::tracefs("read", &probe, e)),
        }
        // Read access is the least we need; fail early with the root hint.
        fs::File::open(&probe).map_err(|e| Error::tracefs("read", &probe, e))?;
        Ok(Tracefs { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub(crate) fn read(&self, rel: &str) -> Result<Vec<u8>, Error> {
        let path = self.path(rel);
        read_file(&path).map_err(|e| Error::tracefs("read", &path, e))
    }

    /// Names of the instances under `instances/`.
    pub fn instances(&self) -> Result<Vec<String>, Error> {
        let dir = self.path("instances");
        let entries = fs::read_dir(&dir).map_err(|e| Error::tracefs("list", &dir, e))?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::tracefs("list", &dir, e))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }
}

/// The tracefs mount point from /proc/mounts, preferring the standard one.
fn mounted_tracefs() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/mounts").ok()?;
    let mut found: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_dev, dir, fstype) = (fields.next()?, fields.next()?, fields.next()?);
            // Mount points with spaces are octal-escaped; tracefs never is in practice.
            (fstype == "tracefs").then(|| PathBuf::from(dir))
        })
        .collect();
    found.sort_by_key(|p| p != Path::new(DEFAULT_MOUNT));
    found.into_iter().next()
}

/// Reads a tracefs file with large read()s. Some tracefs files
/// (events/header_page, header_event) answer only the first read() and then
/// report end of file, so a small first read (as std::fs::read does to probe
/// files that claim size 0) would truncate them.
pub(crate) fn read_file(path: &Path) -> io::Result<Vec<u8>> {
    let mut file = fs::File::open(path)?;
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        match io::Read::read(&mut file, &mut chunk) {
            Ok(0) => return Ok(out),
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Writes a tracefs control file in one write(2), as the kernel parses each
/// write separately.
pub(crate) fn write_control(path: &Path, value: &str) -> Result<(), Error> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .map_err(|e| Error::tracefs("open", path, e))?;
    file.write_all(value.as_bytes())
        .map_err(|e| Error::tracefs("write", path, e))
}

/// A private tracing instance, removed on drop.
pub(crate) struct Instance {
    dir: PathBuf,
    removed: bool,
}

impl Instance {
    /// Creates `instances/<name>`; refuses to reuse an existing one, which
    /// belongs to someone else.
    pub fn create(tracefs: &Tracefs, name: &str) -> Result<Instance, Error> {
        let dir = tracefs.path("instances").join(name);
        match fs::create_dir(&dir) {
            Ok(()) => Ok(Instance {
                dir,
                removed: false,
            }),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(Error::InstanceExists(dir)),
            Err(e) => Err(Error::tracefs("create tracing instance", &dir, e)),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// Its name under `instances/`.
    pub fn name(&self) -> String {
        self.dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    pub fn write(&self, rel: &str, value: &str) -> Result<(), Error> {
        write_control(&self.path(rel), value)
    }

    pub fn read_to_string(&self, rel: &str) -> Result<String, Error> {
        let path = self.path(rel);
        let bytes = read_file(&path).map_err(|e| Error::tracefs("read", &path, e))?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Stops tracing and removes the instance, reporting failure.
    /// All files of the instance must be closed by then.
    pub fn remove(&mut self) -> Result<(), Error> {
        self.removed = true;
        remove_instance_dir(&self.dir)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if !self.removed {
            let _ = remove_instance_dir(&self.dir);
        }
    }
}

/// Disables tracing in an instance and removes it. rmdir fails with EBUSY
/// while any of its files is open (a reader thread just exiting, a `cat`),
/// so it is retried for a while.
pub(crate) fn remove_instance_dir(dir: &Path) -> Result<(), Error> {
    let _ = write_control(&dir.join("tracing_on"), "0");
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(Error::tracefs("remove tracing instance", dir, e)),
        }
    }
}

/// The pid encoded in an instance name `deepspan-<pid>-<unique>`.
pub(crate) fn instance_owner(name: &str) -> Option<i32> {
    let rest = name.strip_prefix(INSTANCE_PREFIX)?;
    let pid = rest.split('-').next()?;
    pid.parse().ok()
}

/// Per-CPU statistics of a ring buffer (`per_cpu/cpuN/stats`).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct CpuStats {
    pub entries: u64,
    pub overrun: u64,
    pub commit_overrun: u64,
    pub bytes: u64,
    pub dropped_events: u64,
    pub read_events: u64,
}

impl CpuStats {
    pub fn parse(text: &str) -> CpuStats {
        let mut s = CpuStats::default();
        for line in text.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let Ok(value) = value.trim().parse::<u64>() else {
                continue;
            };
            match key.trim() {
                "entries" => s.entries = value,
                "overrun" => s.overrun = value,
                "commit overrun" => s.commit_overrun = value,
                "bytes" => s.bytes = value,
                "dropped events" => s.dropped_events = value,
                "read events" => s.read_events = value,
                _ => {}
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_is_parsed_from_the_name() {
        assert_eq!(instance_owner("deepspan-1234-99887766"), Some(1234));
        assert_eq!(instance_owner("deepspan-999999999-x"), Some(999999999));
        assert_eq!(instance_owner("deepspan-abc-1"), None);
        assert_eq!(instance_owner("other-1234-1"), None);
    }

    #[test]
    fn stats_are_parsed() {
        let text = "entries: 62\noverrun: 3\ncommit overrun: 1\nbytes: 4216\noldest event ts:   297.453855\n\
                    now ts:   298.000000\ndropped events: 7\nread events: 12\n";
        let s = CpuStats::parse(text);
        assert_eq!(
            s,
            CpuStats {
                entries: 62,
                overrun: 3,
                commit_overrun: 1,
                bytes: 4216,
                dropped_events: 7,
                read_events: 12
            }
        );
    }
}
