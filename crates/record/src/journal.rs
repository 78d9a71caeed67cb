//! The journal of a recording in progress: what a recorder writes before it
//! traces anything, and adds to while it runs, so that a run whose recorder
//! died (SIGKILL, the OOM killer, a power cut of the process) can still be
//! turned into an ordinary run by [`crate::recover`].
//!
//! ```text
//! RUN/kernel/journal/recording.json   who records (pid + start time), the instance, the traced
//!                                      processes, and the manifest as known at the start
//! RUN/kernel/journal/trace_meta.json  event formats and the rest of what trace.dat needs besides pages
//! RUN/kernel/journal/clock_samples    `realtime_ns mono_ns` lines, one per second
//! RUN/kernel/journal/snapshots        `file realtime_ns mono_ns bytes` lines (flight mode)
//! RUN/kernel/journal/tasks            `tid tgid comm` lines of the threads alive at the start
//! ```
//!
//! Line files are appended one `write(2)` per line, so a crash leaves at
//! most a torn last line, which readers skip. A finished recording removes
//! its journal: a run folder with one was never finished.
//!
//! Each instance also gets an owner file in [`owners_dir`] (a tmpfs), so
//! that `cleanup_stale_instances` knows, for an instance of a dead recorder,
//! which traced processes may still need it.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use deepspan_ftrace::TraceDatMeta;
use serde::{Deserialize, Serialize};

use crate::Error;
use deepspan_run::{ClockPoint, Manifest, Run, Snapshot};

use deepspan_run::journal::{CLOCK_SAMPLES, RECORDING, SNAPSHOTS, TASKS, TRACE_META};

/// A process, told apart from a later one that reuses its pid by its start
/// time (`/proc/PID/stat` field 22, clock ticks since boot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessId {
    pub pid: i32,
    pub start_ticks: Option<u64>,
}

impl ProcessId {
    /// The live process `pid` as it is now.
    pub fn of(pid: i32) -> ProcessId {
        ProcessId {
            pid,
            start_ticks: start_ticks(pid),
        }
    }

    /// True while this very process exists (a zombie counts as gone: it
    /// traces nothing any more).
    pub fn alive(&self) -> bool {
        if !crate::sys::pid_alive(self.pid) || is_zombie(self.pid) {
            return false;
        }
        match (self.start_ticks, start_ticks(self.pid)) {
            (Some(then), Some(now)) => then == now,
            _ => true,
        }
    }

    /// The process's name (`comm`), if it still exists.
    pub fn comm(&self) -> Option<String> {
        fs::read_to_string(format!("/proc/{}/comm", self.pid))
            .ok()
            .map(|c| c.trim_end().to_string())
    }
}

/// Fields of `/proc/PID/stat` after the command name, which may itself hold
/// spaces and parentheses.
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    Some(after_comm.split_whitespace().map(str::to_string).collect())
}

fn start_ticks(pid: i32) -> Option<u64> {
    // Field 22 of stat; the fields after the comm start at field 3.
    stat_fields(pid)?.get(22 - 3)?.parse().ok()
}

/// `/proc/sys/kernel/random/boot_id`: the same until the machine restarts.
pub(crate) fn boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|id| id.trim().to_string())
}

fn is_zombie(pid: i32) -> bool {
    stat_fields(pid).is_some_and(|f| f.first().is_some_and(|state| state == "Z" || state == "X"))
}

/// Who owns a tracing instance: written when the instance is made, read by
/// `cleanup_stale_instances` and by recovery.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceOwner {
    /// The instance's name under `instances/`.
    pub instance: String,
    pub run_dir: PathBuf,
    pub recorder: ProcessId,
    /// The processes whose events the instance exists for: the recorded
    /// command and the `--pid` processes. A system-wide recording without a
    /// command has none besides the recorder.
    pub traced: Vec<ProcessId>,
}

/// `recording.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RecordingState {
    pub owner: InstanceOwner,
    /// The manifest as known when tracing started: no end, no per-CPU
    /// figures, no kernel trace yet.
    pub manifest: Manifest,
}

/// The parts of a trace.dat header that a recording collects before it
/// starts (see [`TraceDatMeta`]). Every one of them is text in tracefs and
/// /proc, so they are kept as JSON strings; `cmdlines` and `cpu_stats` are
/// only known at the end and are not kept. Neither is kallsyms (5 MB here,
/// more than the rest of a short run): recovery reads it again in the same
/// boot ([`StoredMeta::boot_id`]), as the symbols are the same until a reboot.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct StoredMeta {
    page_size: u32,
    long_size: u8,
    header_page: String,
    header_event: String,
    ftrace_formats: Vec<String>,
    event_formats: Vec<(String, Vec<String>)>,
    printk_formats: String,
    trace_clock: String,
    uname: Option<String>,
    /// `/proc/sys/kernel/random/boot_id` when recording started.
    pub boot_id: Option<String>,
}

impl StoredMeta {
    fn from_meta(meta: &TraceDatMeta) -> Result<StoredMeta, String> {
        let text = |what: &str, bytes: &[u8]| {
            String::from_utf8(bytes.to_vec()).map_err(|e| format!("{what} is not UTF-8 text ({e})"))
        };
        let texts = |what: &str, list: &[Vec<u8>]| {
            list.iter()
                .map(|b| text(what, b))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(StoredMeta {
            page_size: meta.page_size,
            long_size: meta.long_size,
            header_page: text("events/header_page", &meta.header_page)?,
            header_event: text("events/header_event", &meta.header_event)?,
            ftrace_formats: texts("an ftrace event format", &meta.ftrace_formats)?,
            event_formats: meta
                .event_formats
                .iter()
                .map(|(system, formats)| Ok((system.clone(), texts("an event format", formats)?)))
                .collect::<Result<_, String>>()?,
            printk_formats: text("printk_formats", &meta.printk_formats)?,
            trace_clock: meta.trace_clock.clone(),
            uname: meta.uname.clone(),
            boot_id: boot_id(),
        })
    }

    /// The trace.dat header again, with kallsyms read from this boot's
    /// /proc when the recording was made in it (else none, and a note).
    pub fn into_meta(self, notes: &mut Vec<String>) -> TraceDatMeta {
        let kallsyms = if self.boot_id.is_some() && self.boot_id == boot_id() {
            fs::read("/proc/kallsyms").unwrap_or_default()
        } else {
            notes.push(
                "kernel symbols left out: the machine was restarted since the recording".into(),
            );
            Vec::new()
        };
        TraceDatMeta {
            page_size: self.page_size,
            long_size: self.long_size,
            header_page: self.header_page.into_bytes(),
            header_event: self.header_event.into_bytes(),
            ftrace_formats: self
                .ftrace_formats
                .into_iter()
                .map(String::into_bytes)
                .collect(),
            event_formats: self
                .event_formats
                .into_iter()
                .map(|(system, formats)| {
                    (
                        system,
                        formats.into_iter().map(String::into_bytes).collect(),
                    )
                })
                .collect(),
            kallsyms,
            printk_formats: self.printk_formats.into_bytes(),
            cmdlines: Vec::new(),
            trace_clock: self.trace_clock,
            uname: self.uname,
            cpu_stats: Vec::new(),
        }
    }
}

/// The journal of a recording, open for writing.
pub(crate) struct Journal {
    dir: PathBuf,
    state: RecordingState,
    owner_file: Option<PathBuf>,
    clock: fs::File,
}

impl Journal {
    /// Writes the journal of a recording about to start, and the owner file
    /// of its instance. Nothing of it may be missing once tracing is on, or
    /// a crash would leave pages nobody can decode: any failure here is an
    /// error, except the owner file (only cleanup needs it).
    pub fn create(
        run_dir: &Path,
        owner: InstanceOwner,
        manifest: Manifest,
        meta: &TraceDatMeta,
        tasks: &[u8],
        warnings: &mut Vec<String>,
    ) -> Result<Journal, Error> {
        let dir = Run::new(run_dir).journal_dir();
        fs::create_dir_all(&dir).map_err(|e| Error::output("create", &dir, run_dir, e))?;
        let stored = StoredMeta::from_meta(meta).map_err(|reason| {
            Error::io(
                "keep the trace header in",
                &dir,
                std::io::Error::other(reason),
            )
        })?;
        write_json(&dir.join(TRACE_META), &stored, run_dir)?;
        let tasks_path = dir.join(TASKS);
        fs::write(&tasks_path, tasks)
            .map_err(|e| Error::output("write", &tasks_path, run_dir, e))?;
        let clock_path = dir.join(CLOCK_SAMPLES);
        let clock = append_file(&clock_path, run_dir)?;
        let owner_file = match write_owner(&owner) {
            Ok(path) => Some(path),
            Err(e) => {
                warnings.push(format!(
                    "the instance's owner file was not written ({e}); if this recorder dies, \
                     `deepspan record --cleanup` cannot tell which traced processes still need it"
                ));
                None
            }
        };
        let journal = Journal {
            dir,
            state: RecordingState { owner, manifest },
            owner_file,
            clock,
        };
        journal.save_state(run_dir)?;
        Ok(journal)
    }

    fn save_state(&self, run_dir: &Path) -> Result<(), Error> {
        write_json(&self.dir.join(RECORDING), &self.state, run_dir)
    }

    /// Adds a process to those the instance exists for (the command, once
    /// started).
    pub fn add_traced(&mut self, pid: i32, run_dir: &Path) -> Result<(), Error> {
        self.state.owner.traced.push(ProcessId::of(pid));
        if let Some(path) = &self.owner_file {
            let _ = write_json(path, &self.state.owner, run_dir);
        }
        self.save_state(run_dir)
    }

    /// Appends a clock sample; a failure only costs precision after a crash.
    pub fn clock_sample(&mut self, point: ClockPoint) {
        let _ = self
            .clock
            .write_all(format!("{} {}\n", point.realtime_ns, point.mono_ns).as_bytes());
    }

    /// Appends a flight-mode snapshot; as for clock samples, best effort.
    pub fn snapshot(&self, snapshot: &Snapshot, run_dir: &Path) {
        let path = self.dir.join(SNAPSHOTS);
        if let Ok(mut file) = append_file(&path, run_dir) {
            let line = format!(
                "{} {} {} {}\n",
                snapshot.file, snapshot.realtime_ns, snapshot.mono_ns, snapshot.bytes
            );
            let _ = file.write_all(line.as_bytes());
        }
    }

    /// The recording finished and its manifest is saved: the journal goes.
    /// (The owner file goes when the journal is dropped.)
    pub fn finish(self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Journal {
    /// The recorder is ending without a crash, so it removes its instance
    /// itself: nobody needs the owner file. A journal not finished stays, so
    /// that recovery can retry what failed.
    fn drop(&mut self) {
        if let Some(path) = &self.owner_file {
            let _ = fs::remove_file(path);
        }
    }
}

/// What the journal of a dead recording holds.
pub(crate) struct JournalContents {
    pub dir: PathBuf,
    pub state: RecordingState,
    pub meta: TraceDatMeta,
    /// What the journal could not give back as it was.
    pub notes: Vec<String>,
    pub clock_samples: Vec<[u64; 2]>,
    pub snapshots: Vec<Snapshot>,
    /// `tid tgid comm` lines.
    pub tasks: String,
    /// The boot the recording was made in, as the journal's trace header
    /// keeps it (journals older than the manifest's `boot_id` have it there
    /// only).
    pub boot_id: Option<String>,
    /// Lines that could not be read (a torn last line after a crash).
    pub skipped_lines: usize,
}

/// True if `run_dir` holds the journal of a recording.
pub(crate) fn exists(run_dir: &Path) -> bool {
    Run::new(run_dir).journal_dir().join(RECORDING).is_file()
}

pub(crate) fn read(run_dir: &Path) -> Result<JournalContents, Error> {
    let dir = Run::new(run_dir).journal_dir();
    let state: RecordingState = read_json(&dir.join(RECORDING))?;
    let meta: StoredMeta = read_json(&dir.join(TRACE_META))?;
    let mut skipped_lines = 0;
    let clock_samples = read_lines(&dir.join(CLOCK_SAMPLES), &mut skipped_lines, |fields| {
        let [realtime, mono] = fields else {
            return None;
        };
        Some([realtime.parse().ok()?, mono.parse().ok()?])
    });
    let snapshots = read_lines(&dir.join(SNAPSHOTS), &mut skipped_lines, |fields| {
        let [file, realtime, mono, bytes] = fields else {
            return None;
        };
        Some(Snapshot {
            file: file.to_string(),
            realtime_ns: realtime.parse().ok()?,
            mono_ns: mono.parse().ok()?,
            bytes: bytes.parse().ok()?,
        })
    });
    let tasks = fs::read_to_string(dir.join(TASKS)).unwrap_or_default();
    let mut notes = Vec::new();
    let boot_id = meta.boot_id.clone();
    let meta = meta.into_meta(&mut notes);
    Ok(JournalContents {
        dir,
        state,
        meta,
        notes,
        clock_samples,
        snapshots,
        tasks,
        boot_id,
        skipped_lines,
    })
}

/// Reads whitespace-separated line records, counting the lines `parse`
/// rejects (only a torn last line is expected).
fn read_lines<T>(path: &Path, skipped: &mut usize, parse: impl Fn(&[&str]) -> Option<T>) -> Vec<T> {
    let Ok(text) = fs::read_to_string(path) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.split_inclusive('\n') {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match line.ends_with('\n').then(|| parse(&fields)).flatten() {
            Some(value) => out.push(value),
            None => *skipped += 1,
        }
    }
    out
}

/// Where owner files of instances live: a tmpfs, so that they disappear
/// with the instances at reboot.
pub fn owners_dir() -> PathBuf {
    PathBuf::from("/run/deepspan/instances")
}

fn owner_path(instance: &str) -> PathBuf {
    owners_dir().join(format!("{instance}.json"))
}

fn write_owner(owner: &InstanceOwner) -> Result<PathBuf, Error> {
    let dir = owners_dir();
    fs::create_dir_all(&dir).map_err(|e| Error::io("create", &dir, e))?;
    let path = owner_path(&owner.instance);
    write_json(&path, owner, &dir)?;
    Ok(path)
}

/// The owner file of an instance, if one was written and is readable.
pub(crate) fn read_owner(instance: &str) -> Option<InstanceOwner> {
    read_json(&owner_path(instance)).ok()
}

pub(crate) fn remove_owner(instance: &str) {
    let _ = fs::remove_file(owner_path(instance));
}

fn append_file(path: &Path, kept: &Path) -> Result<fs::File, Error> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::output("create", path, kept, e))
}

/// Writes JSON through a temporary file and a rename, so a crash never
/// leaves half of it.
fn write_json(path: &Path, value: &impl Serialize, kept: &Path) -> Result<(), Error> {
    let text = serde_json::to_vec_pretty(value)
        .map_err(|e| Error::io("encode", path, std::io::Error::other(e)))?;
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".partial");
    let tmp = path.with_file_name(tmp_name);
    fs::write(&tmp, text).map_err(|e| Error::output("write", &tmp, kept, e))?;
    fs::rename(&tmp, path).map_err(|e| Error::output("write", path, kept, e))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, Error> {
    let bytes = fs::read(path).map_err(|e| Error::Journal {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| Error::Journal {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_files_skip_a_torn_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("clock_samples");
        fs::write(&path, "1 2\n3 4\n5 6\n7").unwrap();
        let mut skipped = 0;
        let samples = read_lines(&path, &mut skipped, |f| {
            let [a, b] = f else { return None };
            Some([a.parse::<u64>().ok()?, b.parse::<u64>().ok()?])
        });
        assert_eq!(samples, vec![[1, 2], [3, 4], [5, 6]]);
        assert_eq!(skipped, 1);
    }

    #[test]
    fn a_live_process_is_told_from_a_pid_reused_later() {
        let me = ProcessId::of(std::process::id() as i32);
        assert!(me.alive());
        assert!(me.start_ticks.is_some());
        let reused = ProcessId {
            start_ticks: me.start_ticks.map(|t| t + 1),
            ..me
        };
        assert!(!reused.alive());
    }

    #[test]
    fn trace_meta_survives_the_journal() {
        let meta = TraceDatMeta {
            page_size: 4096,
            long_size: 8,
            header_page: b"field: u64 timestamp;".to_vec(),
            header_event: b"type_len : 5 bits".to_vec(),
            ftrace_formats: vec![b"name: print".to_vec()],
            event_formats: vec![("sched".into(), vec![b"name: sched_switch".to_vec()])],
            kallsyms: b"ffffffff81000000 T _stext\n".to_vec(),
            printk_formats: Vec::new(),
            cmdlines: Vec::new(),
            trace_clock: "mono".into(),
            uname: Some("Linux h 6.1".into()),
            cpu_stats: Vec::new(),
        };
        let mut notes = Vec::new();
        let back = StoredMeta::from_meta(&meta).unwrap().into_meta(&mut notes);
        assert!(notes.is_empty(), "{notes:?}");
        // Symbols come from this boot's /proc, not from the journal. Those
        // of eBPF programs and ftrace trampolines come and go as other
        // processes trace (CI failed once when a test beside this one loaded
        // its programs between the two reads): the kernel's own are compared.
        let kernel_own = |text: &[u8]| -> Vec<Vec<u8>> {
            text.split(|&b| b == b'\n')
                .filter(|l| !l.ends_with(b"\t[bpf]") && !l.ends_with(b"\t[__builtin__ftrace]"))
                .map(<[u8]>::to_vec)
                .collect()
        };
        assert_eq!(
            kernel_own(&back.kallsyms),
            kernel_own(&fs::read("/proc/kallsyms").unwrap())
        );
        let back = TraceDatMeta {
            kallsyms: meta.kallsyms.clone(),
            ..back
        };
        assert_eq!(format!("{back:?}"), format!("{meta:?}"));
        let binary = TraceDatMeta {
            printk_formats: vec![0xff, 0xfe],
            ..meta
        };
        assert!(StoredMeta::from_meta(&binary)
            .unwrap_err()
            .contains("printk_formats"));
    }
}
