//! Collecting what a trace.dat needs besides the pages: event formats,
//! symbols, task names.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use deepspan_ftrace::TraceDatMeta;

use crate::events::EventId;
use crate::tracefs::{read_file, CpuStats, Tracefs};
use crate::{sys, Error};

/// The parts of the trace.dat header that do not change during a recording.
/// Collected before tracing starts, so reading them is not traced.
pub(crate) fn static_meta(
    tracefs: &Tracefs,
    events: &[EventId],
    page_size: u32,
) -> Result<TraceDatMeta, Error> {
    let header_page = tracefs.read("events/header_page")?;
    let header_event = tracefs.read("events/header_event")?;

    // All ftrace-internal formats, as trace-cmd does: trace_marker writes
    // into the instance show up as ftrace:print.
    let ftrace_dir = tracefs.path("events/ftrace");
    let mut ftrace_formats = Vec::new();
    if let Ok(entries) = fs::read_dir(&ftrace_dir) {
        let mut names: Vec<_> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        names.sort();
        for name in names {
            let path = ftrace_dir.join(&name).join("format");
            if let Ok(format) = read_file(&path) {
                ftrace_formats.push(format);
            }
        }
    }

    let mut by_system: BTreeMap<&str, Vec<Vec<u8>>> = BTreeMap::new();
    for id in events {
        let format = tracefs.read(&format!("events/{}/{}/format", id.system, id.name))?;
        by_system.entry(&id.system).or_default().push(format);
    }
    let event_formats = by_system
        .into_iter()
        .map(|(s, f)| (s.to_string(), f))
        .collect();

    // Symbols are an aid for printing, not required: a kernel that hides
    // them (kptr_restrict) still gives a valid trace.
    let kallsyms = read_file(Path::new("/proc/kallsyms")).unwrap_or_default();
    let printk_formats = tracefs.read("printk_formats").unwrap_or_default();
    let u = sys::uname();
    Ok(TraceDatMeta {
        page_size,
        long_size: std::mem::size_of::<libc::c_long>() as u8,
        header_page,
        header_event,
        ftrace_formats,
        event_formats,
        kallsyms,
        printk_formats,
        cmdlines: Vec::new(),
        trace_clock: "mono".to_string(),
        uname: Some(format!("{} {} {} {}", u[0], u[1], u[2], u[3])),
        cpu_stats: Vec::new(),
    })
}

/// Task names and thread-group ids seen by the recorder.
///
/// The kernel's saved_cmdlines keeps only a few hundred entries (a global
/// setting we must not change), so names are also taken from /proc at the
/// start and end of the recording; the kernel's entries win, as they are
/// the names at event time.
#[derive(Default)]
pub(crate) struct Tasks {
    comms: BTreeMap<i32, String>,
    tgids: BTreeMap<i32, i32>,
}

impl Tasks {
    /// Adds every thread currently in /proc.
    pub fn scan_proc(&mut self) {
        let Ok(procs) = fs::read_dir("/proc") else {
            return;
        };
        for proc_entry in procs.flatten() {
            let Some(tgid) = proc_entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(tasks) = fs::read_dir(proc_entry.path().join("task")) else {
                continue;
            };
            for task in tasks.flatten() {
                let Some(tid) = task
                    .file_name()
                    .to_str()
                    .and_then(|s| s.parse::<i32>().ok())
                else {
                    continue;
                };
                if let Ok(comm) = fs::read_to_string(task.path().join("comm")) {
                    self.comms
                        .insert(tid, comm.trim_end_matches('\n').to_string());
                    self.tgids.insert(tid, tgid);
                }
            }
        }
    }

    /// Adds the kernel's saved_cmdlines and saved_tgids.
    pub fn add_kernel(&mut self, tracefs: &Tracefs) {
        if let Ok(text) = tracefs.read("saved_cmdlines") {
            for line in String::from_utf8_lossy(&text).lines() {
                if let Some((pid, comm)) = line.split_once(' ') {
                    if let Ok(pid) = pid.trim().parse() {
                        self.comms.insert(pid, comm.to_string());
                    }
                }
            }
        }
        if let Ok(text) = tracefs.read("saved_tgids") {
            for line in String::from_utf8_lossy(&text).lines() {
                let mut it = line.split_whitespace();
                if let (Some(Ok(pid)), Some(Ok(tgid))) =
                    (it.next().map(str::parse), it.next().map(str::parse))
                {
                    self.tgids.insert(pid, tgid);
                }
            }
        }
    }

    /// Adds `tid tgid comm` lines (see [`Tasks::lines`]); malformed ones are
    /// skipped.
    pub fn add_lines(&mut self, text: &str) {
        for line in text.lines() {
            let mut it = line.splitn(3, ' ');
            let (Some(Ok(tid)), Some(Ok(tgid)), Some(comm)) = (
                it.next().map(str::parse),
                it.next().map(str::parse),
                it.next(),
            ) else {
                continue;
            };
            self.comms.entry(tid).or_insert_with(|| comm.to_string());
            self.tgids.entry(tid).or_insert(tgid);
        }
    }

    /// `tid tgid comm` lines of the threads whose process is known.
    pub fn lines(&self) -> Vec<u8> {
        let mut out = String::new();
        for (tid, tgid) in &self.tgids {
            if let Some(comm) = self.comms.get(tid) {
                out.push_str(&format!("{tid} {tgid} {comm}\n"));
            }
        }
        out.into_bytes()
    }

    /// `pid comm` lines as in saved_cmdlines.
    pub fn cmdlines(&self) -> Vec<u8> {
        let mut out = String::new();
        for (pid, comm) in &self.comms {
            out.push_str(&format!("{pid} {comm}\n"));
        }
        out.into_bytes()
    }

    /// `pid tgid` lines as in saved_tgids.
    pub fn tgids(&self) -> Vec<u8> {
        let mut out = String::new();
        for (pid, tgid) in &self.tgids {
            out.push_str(&format!("{pid} {tgid}\n"));
        }
        out.into_bytes()
    }
}

/// Reads `per_cpu/cpuN/stats` of every CPU of an instance.
pub(crate) fn read_stats(instance_dir: &Path, cpus: usize) -> Vec<(String, CpuStats)> {
    (0..cpus)
        .map(|cpu| {
            let bytes = read_file(&instance_dir.join(format!("per_cpu/cpu{cpu}/stats")))
                .unwrap_or_default();
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let stats = CpuStats::parse(&text);
            (text, stats)
        })
        .collect()
}

/// Number of CPUs of an instance: the highest `per_cpu/cpuN` plus one.
pub(crate) fn instance_cpus(instance_dir: &Path) -> Result<usize, Error> {
    let dir = instance_dir.join("per_cpu");
    let entries = fs::read_dir(&dir).map_err(|e| Error::tracefs("list", &dir, e))?;
    let max = entries
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("cpu"))
                .and_then(|n| n.parse::<usize>().ok())
        })
        .max();
    match max {
        Some(m) => Ok(m + 1),
        None => Err(Error::io(
            "find CPUs in",
            &dir,
            std::io::Error::other("no cpuN directories"),
        )),
    }
}
