//! Finishing a run whose recorder died: its journal (see `journal.rs`) and
//! per-CPU page files become `kernel/trace.dat` and `manifest.json`, as the
//! recorder would have written them, with notes on what could not be known.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use deepspan_ftrace::write_trace_dat;

use crate::capture::drain_cpu;
use crate::journal::{self, JournalContents};
use crate::meta::{read_stats, Tasks};
use crate::session::cpu_manifest;
use crate::tracefs::{CpuStats, Tracefs};
use crate::Error;
use deepspan_run::{layout, ClockPoint, Manifest, Run};

/// Commit word of a ring-buffer page: the low bits are the bytes of event
/// data, the high ones flags (as in the kernel's ring_buffer.c).
const COMMIT_MASK: u64 = (1 << 27) - 1;

/// What [`recover`] did.
#[derive(Clone, Debug)]
pub struct Recovery {
    pub run_dir: PathBuf,
    pub manifest: Manifest,
    /// Per CPU: bytes of whole pages kept in the trace.
    pub kept_bytes: Vec<u64>,
    /// Per CPU: bytes left out (a page cut short by the crash, or pages
    /// after the last one whose header is sound).
    pub dropped_bytes: Vec<u64>,
    /// What the recovered run lacks or where it came from, also in the
    /// manifest's warnings.
    pub notes: Vec<String>,
}

/// True if `run_dir` is a recording that never finished: it has the journal
/// a recorder keeps while it runs, and no manifest with a kernel trace.
pub fn needs_recovery(run_dir: &Path) -> bool {
    if !journal::exists(run_dir) {
        return false;
    }
    match Manifest::load(run_dir) {
        Ok(m) => m.kernel_trace.is_none_or(|t| !run_dir.join(t).is_file()),
        Err(_) => true,
    }
}

/// Turns the run folder of a recorder that died into an ordinary run:
/// `kernel/trace.dat` from the pages it had written (the last page of each
/// CPU is lost if the crash cut it short), and a manifest with what the
/// journal knows: the options, the clock samples taken until the crash, and
/// the lost-event counts if the dead recorder's tracing instance is still
/// there. A flight-mode recording had nothing on disk but its snapshots:
/// its ring buffer is taken from the instance, when it is still there.
///
/// Refuses while the recorder is alive, and on a run that needs no recovery.
pub fn recover(run_dir: &Path) -> Result<Recovery, Error> {
    recover_with(run_dir, Machine::Live)
}

/// [`recover`] from the run folder's files alone: the dead recorder's
/// instance, the kernel's task names and /proc are not looked at. For
/// recovering a run copied from another machine, and for fuzzing.
pub fn recover_from_files(run_dir: &Path) -> Result<Recovery, Error> {
    recover_with(run_dir, Machine::Elsewhere)
}

/// Whether the run was recorded on this machine, in this boot, so that what
/// the dead recorder left in the kernel is worth looking at.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Machine {
    Live,
    Elsewhere,
}

/// Most CPUs a Linux kernel supports (NR_CPUS at its largest).
const MAX_CPUS: usize = 8192;

fn recover_with(run_dir: &Path, machine: Machine) -> Result<Recovery, Error> {
    let not = |reason: String| Error::NotRecoverable {
        run: run_dir.to_path_buf(),
        reason,
    };
    if !journal::exists(run_dir) {
        return Err(not(if Run::new(run_dir).manifest().is_file() {
            "it was recorded to the end (it has a manifest and no recording journal)".into()
        } else {
            "it holds no recording journal (kernel/journal/recording.json): it is not a deepspan recording, \
             or one made by a deepspan older than crash-safe runs"
                .into()
        }));
    }
    if !needs_recovery(run_dir) {
        return Err(not("it already has a manifest and a kernel trace".into()));
    }
    let journal = journal::read(run_dir)?;
    validate(&journal).map_err(|reason| Error::Journal {
        path: journal.dir.clone(),
        reason,
    })?;
    let recorder = journal.state.owner.recorder;
    if recorder.alive() {
        return Err(not(format!(
            "its recorder (pid {}) is still running; stop it with SIGINT or SIGTERM and it finishes the run itself",
            recorder.pid
        )));
    }
    let mut notes = vec![format!(
        "recovered after the recorder (pid {}) died without finishing the run: the command's exit status, \
         and the clock after the last sample, are unknown",
        recorder.pid
    )];
    notes.extend(journal.notes.iter().cloned());
    if journal.skipped_lines > 0 {
        notes.push(format!(
            "{} torn line(s) of the journal skipped",
            journal.skipped_lines
        ));
    }
    let manifest = journal.state.manifest.clone();
    let run = Run::new(run_dir);
    let instance = match machine {
        Machine::Live => LeftInstance::find(&journal),
        Machine::Elsewhere => LeftInstance {
            dir: None,
            tracefs: None,
            stats: None,
        },
    };
    if manifest.mode == crate::Mode::Flight.as_str() {
        flight_pages(&journal, &instance, &run, &mut notes)?;
    }

    let page_size = u64::from(journal.meta.page_size);
    let mut raw_files = Vec::with_capacity(manifest.cpus);
    let (mut kept_bytes, mut dropped_bytes) = (Vec::new(), Vec::new());
    let mut last_page_ts = 0u64;
    for cpu in 0..manifest.cpus {
        let path = run.raw_pages(cpu);
        let kept = keep_whole_pages(&path, page_size, &mut last_page_ts)?;
        if kept.dropped > 0 {
            notes.push(format!(
                "CPU {cpu}: {} bytes after its last whole page left out (the page the crash cut short)",
                kept.dropped
            ));
        }
        kept_bytes.push(kept.bytes);
        dropped_bytes.push(kept.dropped);
        raw_files.push(path);
    }

    let stats = instance.stats.clone();
    let mut meta = journal.meta.clone();
    let mut tasks = Tasks::default();
    tasks.add_lines(&journal.tasks);
    if let Some(tracefs) = &instance.tracefs {
        tasks.add_kernel(tracefs);
    }
    if machine == Machine::Live {
        tasks.scan_proc();
    }
    meta.cmdlines = tasks.cmdlines();
    meta.cpu_stats = stats
        .as_ref()
        .map(|s| s.iter().map(|(text, _)| text.clone()).collect())
        .unwrap_or_default();
    let trace_path = run.trace_dat();
    write_trace_dat(&trace_path, &meta, &raw_files)?;

    let mut manifest = finish_manifest(
        manifest,
        &journal,
        &kept_bytes,
        stats.as_deref(),
        last_page_ts,
        &mut notes,
    );
    let tgids_path = run.saved_tgids();
    match fs::write(&tgids_path, tasks.tgids()) {
        Ok(()) => manifest.tgids = Some(layout::SAVED_TGIDS.into()),
        Err(e) => notes.push(format!("cannot write {}: {e}", tgids_path.display())),
    }
    manifest.kernel_trace = Some(layout::TRACE_DAT.into());
    manifest.warnings.extend(notes.iter().cloned());
    manifest.save(run_dir)?;
    for file in &raw_files {
        let _ = fs::remove_file(file);
    }
    let _ = fs::remove_dir_all(&journal.dir);
    Ok(Recovery {
        run_dir: run_dir.to_path_buf(),
        manifest,
        kept_bytes,
        dropped_bytes,
        notes,
    })
}

/// The dead recorder's tracing instance, if `cleanup` has not removed it.
struct LeftInstance {
    dir: Option<PathBuf>,
    tracefs: Option<Tracefs>,
    stats: Option<Vec<(String, CpuStats)>>,
}

impl LeftInstance {
    /// Looks for the instance by its name under this machine's tracefs
    /// (never by a path from the journal, which could point anywhere).
    fn find(journal: &JournalContents) -> LeftInstance {
        let tracefs = Tracefs::open().ok();
        let dir = tracefs
            .as_ref()
            .map(|t| t.path("instances").join(&journal.state.owner.instance))
            .filter(|d| d.join("per_cpu").is_dir());
        let stats = dir
            .as_ref()
            .map(|d| read_stats(d, journal.state.manifest.cpus));
        LeftInstance {
            dir,
            tracefs,
            stats,
        }
    }
}

/// What the rest of recovery takes for granted of a journal, which after a
/// crash (or in the wrong hands) may hold anything.
fn validate(journal: &JournalContents) -> Result<(), String> {
    let manifest = &journal.state.manifest;
    if manifest.cpus == 0 || manifest.cpus > MAX_CPUS {
        return Err(format!(
            "{} CPUs is not a machine's CPU count (1 to {MAX_CPUS})",
            manifest.cpus
        ));
    }
    let page_size = journal.meta.page_size;
    if !page_size.is_power_of_two() || !(64..=1 << 24).contains(&page_size) {
        return Err(format!(
            "ring-buffer page size {page_size} is not a power of two from 64 B to 16 MiB"
        ));
    }
    let instance = &journal.state.owner.instance;
    if !instance.starts_with(crate::tracefs::INSTANCE_PREFIX)
        || instance.contains(['/', '\0'])
        || instance.len() > 255
    {
        return Err(format!(
            "{instance:?} is not the name of a deepspan tracing instance"
        ));
    }
    Ok(())
}

/// Flight mode keeps its history in the ring buffer, which died with the
/// recorder unless its instance is still there: then the buffer is read
/// out (tracing stopped first, so the read ends).
fn flight_pages(
    journal: &JournalContents,
    instance: &LeftInstance,
    run: &Run,
    notes: &mut Vec<String>,
) -> Result<(), Error> {
    let kernel_dir = run.kernel_dir();
    let Some(dir) = &instance.dir else {
        notes.push(
            "flight mode: the ring buffer died with its tracing instance (removed by cleanup or a reboot), \
             so only the snapshots taken before the crash remain"
                .into(),
        );
        return Ok(());
    };
    let _ = crate::tracefs::write_control(&dir.join("tracing_on"), "0");
    fs::create_dir_all(&kernel_dir)
        .map_err(|e| Error::output("create", &kernel_dir, &kernel_dir, e))?;
    for cpu in 0..journal.state.manifest.cpus {
        let raw = dir.join(format!("per_cpu/cpu{cpu}/trace_pipe_raw"));
        let out = run.raw_pages(cpu);
        drain_cpu(
            &raw,
            &out,
            &kernel_dir,
            journal.meta.page_size as usize,
            None,
        )?;
    }
    notes.push(format!(
        "flight mode: the ring buffer was read from the dead recorder's instance {}; it holds the last events \
         before this recovery, which may be later than the crash",
        journal.state.owner.instance
    ));
    Ok(())
}

struct KeptPages {
    bytes: u64,
    dropped: u64,
}

/// Cuts a CPU's page file to its whole pages, and drops trailing pages whose
/// header cannot be right (a page the kernel never finished handing over).
/// A missing file is a CPU without events. Tracks the latest page start.
fn keep_whole_pages(
    path: &Path,
    page_size: u64,
    last_page_ts: &mut u64,
) -> Result<KeptPages, Error> {
    let mut file = match fs::OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::File::create(path).map_err(|e| Error::io("create", path, e))?;
            return Ok(KeptPages {
                bytes: 0,
                dropped: 0,
            });
        }
        Err(e) => return Err(Error::io("open", path, e)),
    };
    let size = file
        .metadata()
        .map_err(|e| Error::io("read the size of", path, e))?
        .len();
    let mut whole = size / page_size * page_size;
    let mut header = [0u8; 16];
    while whole > 0 {
        file.seek(SeekFrom::Start(whole - page_size))
            .map_err(|e| Error::io("seek in", path, e))?;
        file.read_exact(&mut header)
            .map_err(|e| Error::io("read", path, e))?;
        let ts = u64::from_ne_bytes(header[..8].try_into().expect("8 bytes"));
        let commit = u64::from_ne_bytes(header[8..].try_into().expect("8 bytes")) & COMMIT_MASK;
        if commit > 0 && commit <= page_size - 16 {
            *last_page_ts = (*last_page_ts).max(ts);
            break;
        }
        whole -= page_size;
    }
    if whole < size {
        file.set_len(whole)
            .map_err(|e| Error::io("cut the torn page off", path, e))?;
    }
    Ok(KeptPages {
        bytes: whole,
        dropped: size - whole,
    })
}

/// The manifest as the recorder would have ended it, from what is known.
fn finish_manifest(
    mut manifest: Manifest,
    journal: &JournalContents,
    kept_bytes: &[u64],
    stats: Option<&[(String, CpuStats)]>,
    last_page_ts: u64,
    notes: &mut Vec<String>,
) -> Manifest {
    let mut samples = vec![[manifest.start.realtime_ns, manifest.start.mono_ns]];
    samples.extend(
        journal
            .clock_samples
            .iter()
            .filter(|s| s[1] > manifest.start.mono_ns),
    );
    let last = *samples.last().expect("the start sample");
    // The end is the last moment known to be recorded: the later of the last
    // clock sample and the start of the last page kept, whose wall time is
    // carried from the last sample.
    let end_mono = last[1].max(last_page_ts);
    manifest.end = ClockPoint {
        realtime_ns: last[0].saturating_add(end_mono - last[1]),
        mono_ns: end_mono,
    };
    manifest.clock_samples = samples;
    if manifest.boot_id.is_none() {
        manifest.boot_id = journal.boot_id.clone();
    }
    manifest.snapshots = journal.snapshots.clone();
    manifest.exit_code = None;
    manifest.per_cpu = (0..manifest.cpus)
        .map(|cpu| {
            let s = stats
                .and_then(|s| s.get(cpu))
                .map(|(_, s)| s.clone())
                .unwrap_or_default();
            cpu_manifest(cpu, &s, kept_bytes.get(cpu).copied().unwrap_or(0))
        })
        .collect();
    match stats {
        // Overruns are left out: the instance kept tracing after the crash
        // with nobody reading, so its ring overwrote itself since. Those
        // during the recording are marked in the pages, where the analysis
        // finds them.
        Some(stats) => {
            manifest.lost_events = stats.iter().map(|(_, s)| s.commit_overrun + s.dropped_events).sum();
            notes.push(
                "lost-event counts from the dead recorder's instance leave out ring overruns (it kept tracing \
                 after the crash); overruns during the recording are marked in the trace where they happened"
                    .into(),
            );
        }
        None => notes.push(
            "lost-event counts are unknown: the dead recorder's tracing instance is gone; the trace itself \
             still marks pages where events were lost"
                .into(),
        ),
    }
    manifest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{InstanceOwner, Journal, ProcessId};
    use deepspan_ftrace::TraceDatMeta;
    use deepspan_run::{OtlpPorts, FORMAT_VERSION};

    const PAGE: usize = 4096;

    fn manifest(cpus: usize, mode: &str) -> Manifest {
        let start = ClockPoint {
            realtime_ns: 1_000_000_000_000,
            mono_ns: 5_000,
        };
        Manifest {
            format_version: FORMAT_VERSION,
            host: "h".into(),
            kernel_release: "6.1".into(),
            cpus,
            page_size: PAGE as u32,
            trace_clock: "mono".into(),
            events: vec!["sched:sched_switch".into()],
            mode: mode.into(),
            buffer_kb_per_cpu: 1024,
            pids: vec![],
            start,
            end: start,
            clock_samples: vec![[start.realtime_ns, start.mono_ns]],
            per_cpu: vec![],
            lost_events: 0,
            kernel_trace: None,
            snapshots: vec![],
            otlp: OtlpPorts {
                grpc_port: 4317,
                http_port: 4318,
                receiver: None,
            },
            command: vec!["true".into()],
            exit_code: None,
            tgids: None,
            processes: None,
            recorder_tids: Vec::new(),
            profile: None,
            warnings: vec![],
            // As a journal written before manifests had it: the trace
            // header's copy fills it in.
            boot_id: None,
            tcp_keys: None,
            cfs_throttle: None,
            blocked_syscalls: None,
            socket_calls: None,
            idle_switches: None,
            hosts: None,
        }
    }

    fn meta() -> TraceDatMeta {
        TraceDatMeta {
            page_size: PAGE as u32,
            long_size: 8,
            header_page: b"\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n".to_vec(),
            header_event: b"# compressed entry header\n".to_vec(),
            trace_clock: "mono".into(),
            ..TraceDatMeta::default()
        }
    }

    /// A page whose header says it holds `commit` bytes of events, from `ts`.
    fn page(ts: u64, commit: u64) -> Vec<u8> {
        let mut p = vec![0u8; PAGE];
        p[..8].copy_from_slice(&ts.to_ne_bytes());
        p[8..16].copy_from_slice(&commit.to_ne_bytes());
        p
    }

    /// A run folder as a recorder that died leaves it: the journal and the
    /// page files. The recorder is a pid that cannot exist.
    fn dead_run(dir: &Path, cpus: usize, mode: &str, instance: &str) {
        assert!(instance.starts_with("deepspan-") && !instance.contains('/'));
        let owner = InstanceOwner {
            instance: instance.into(),
            run_dir: dir.to_path_buf(),
            recorder: ProcessId {
                pid: i32::MAX,
                start_ticks: None,
            },
            traced: vec![],
        };
        let mut warnings = Vec::new();
        let mut journal = Journal::create(
            dir,
            owner,
            manifest(cpus, mode),
            &meta(),
            b"7 7 init\n",
            &mut warnings,
        )
        .unwrap();
        journal.clock_sample(ClockPoint {
            realtime_ns: 1_000_001_000_000,
            mono_ns: 1_000_005_000,
        });
        std::fs::write(dir.join("kernel/journal/clock_samples"), {
            let mut text = std::fs::read(dir.join("kernel/journal/clock_samples")).unwrap();
            text.extend_from_slice(b"1000002000000 20"); // torn by the crash
            text
        })
        .unwrap();
    }

    #[test]
    fn whole_pages_are_kept_and_a_torn_one_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        dead_run(dir.path(), 2, "standard", "deepspan-2147483647-1");
        let mut cpu0 = page(2_000_000_000, 32);
        cpu0.extend(page(3_000_000_000, 64));
        cpu0.extend(&page(4_000_000_000, 64)[..100]); // the crash cut this one
        std::fs::write(dir.path().join("kernel/cpu0.raw"), &cpu0).unwrap();
        // CPU 1 has no file at all: a CPU without events.

        assert!(needs_recovery(dir.path()));
        let recovery = recover_from_files(dir.path()).unwrap();
        assert_eq!(recovery.kept_bytes, vec![2 * PAGE as u64, 0]);
        assert_eq!(recovery.dropped_bytes, vec![100, 0]);
        let m = Manifest::load(dir.path()).unwrap();
        assert_eq!(m.kernel_trace.as_deref(), Some("kernel/trace.dat"));
        assert_eq!(
            m.clock_samples,
            vec![
                [1_000_000_000_000, 5_000],
                [1_000_001_000_000, 1_000_005_000]
            ]
        );
        // The end is the start of the last page kept, later than the last sample.
        assert_eq!(
            m.end,
            ClockPoint {
                realtime_ns: 1_000_001_000_000 + 1_999_995_000,
                mono_ns: 3_000_000_000
            }
        );
        assert_eq!(
            m.per_cpu.iter().map(|c| c.bytes).collect::<Vec<_>>(),
            vec![2 * PAGE as u64, 0]
        );
        // The journal's manifest had none; its trace header kept this boot's.
        assert_eq!(m.boot_id, crate::journal::boot_id());
        assert!(
            m.warnings.iter().any(|w| w.contains("1 torn line")),
            "{:?}",
            m.warnings
        );
        assert!(
            m.warnings.iter().any(|w| w.contains("CPU 0: 100 bytes")),
            "{:?}",
            m.warnings
        );
        assert!(
            m.warnings
                .iter()
                .any(|w| w.contains("lost-event counts are unknown")),
            "{:?}",
            m.warnings
        );
        let tgids = std::fs::read_to_string(dir.path().join("kernel/saved_tgids")).unwrap();
        assert_eq!(tgids, "7 7\n");
        let trace = deepspan_ftrace::TraceDat::open(&dir.path().join("kernel/trace.dat")).unwrap();
        assert_eq!(trace.cpu_data_bytes_of(0), 2 * PAGE as u64);
        assert!(!dir.path().join("kernel/journal").exists());
        assert!(!dir.path().join("kernel/cpu0.raw").exists());
        assert!(!needs_recovery(dir.path()));
        let again = recover_from_files(dir.path()).unwrap_err().to_string();
        assert!(again.contains("recorded to the end"), "{again}");
    }

    #[test]
    fn the_blocked_syscall_lines_written_before_the_crash_survive() {
        let dir = tempfile::tempdir().unwrap();
        dead_run(dir.path(), 1, "standard", "deepspan-2147483647-1");
        std::fs::write(dir.path().join("kernel/cpu0.raw"), page(2_000_000_000, 32)).unwrap();
        // As the capture's writer left it: the header, a whole line, and
        // one the crash cut short.
        let path = Run::new(dir.path()).blocked_syscalls();
        let text = "# deepspan blocked syscalls v2: mono_ns cpu tid tgid nr arg0 arg1 arg2 rchar\n\
                    2000000100 0 42 42 0 0x3 0x7f0000001000 0x40 8192\n\
                    2000000200 0 4";
        std::fs::write(&path, text).unwrap();
        recover_from_files(dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        let sleeps = crate::read_blocked_syscalls(&path).unwrap();
        assert_eq!(
            sleeps
                .iter()
                .map(|s| (s.tid, s.args[0]))
                .collect::<Vec<_>>(),
            vec![(42, 3)]
        );
    }

    #[test]
    fn the_socket_call_lines_written_before_the_crash_survive() {
        let dir = tempfile::tempdir().unwrap();
        dead_run(dir.path(), 1, "standard", "deepspan-2147483647-1");
        std::fs::write(dir.path().join("kernel/cpu0.raw"), page(2_000_000_000, 32)).unwrap();
        // As the capture's writer left it: the header, whole lines, and
        // one the crash cut short.
        let path = Run::new(dir.path()).socket_calls();
        let text = "# deepspan socket calls v1: mono_ns cpu tid tgid dir bytes\n\
                    2000000100 0 42 42 recv 100\n\
                    2000000150 0 42 42 send 1500\n\
                    2000000200 0 4";
        std::fs::write(&path, text).unwrap();
        recover_from_files(dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        let calls = crate::read_socket_calls(&path).unwrap();
        assert_eq!(
            calls
                .iter()
                .map(|c| (c.tid, c.sent, c.bytes))
                .collect::<Vec<_>>(),
            vec![(42, false, 100), (42, true, 1500)]
        );
    }

    #[test]
    fn trailing_pages_without_events_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        dead_run(dir.path(), 1, "standard", "deepspan-2147483647-1");
        let mut cpu0 = page(2_000_000_000, 32);
        cpu0.extend(page(0, 0));
        cpu0.extend(page(0, PAGE as u64)); // more data than a page holds
        std::fs::write(dir.path().join("kernel/cpu0.raw"), &cpu0).unwrap();
        let recovery = recover_from_files(dir.path()).unwrap();
        assert_eq!(recovery.kept_bytes, vec![PAGE as u64]);
        assert_eq!(recovery.dropped_bytes, vec![2 * PAGE as u64]);
    }

    #[test]
    fn a_journal_that_cannot_be_right_is_refused_with_its_reason() {
        for (cpus, instance, expected) in [
            (0, "deepspan-1-1", "0 CPUs"),
            (1_000_000, "deepspan-1-1", "1000000 CPUs"),
            (1, "../../..", "not the name of a deepspan tracing instance"),
            (
                1,
                "deepspan-1/../../x",
                "not the name of a deepspan tracing instance",
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            dead_run(dir.path(), cpus, "standard", "deepspan-2147483647-1");
            // As a damaged journal would name it (the recorder never does).
            let state = dir.path().join("kernel/journal/recording.json");
            let mut json: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
            json["owner"]["instance"] = instance.into();
            std::fs::write(&state, serde_json::to_vec(&json).unwrap()).unwrap();
            let err = recover_from_files(dir.path()).unwrap_err().to_string();
            assert!(err.contains(expected), "{cpus} {instance}: {err}");
            assert!(!deepspan_run::Run::new(dir.path()).manifest().exists());
        }
    }

    #[test]
    fn a_folder_without_a_journal_is_not_taken_for_a_recording() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!needs_recovery(dir.path()));
        let err = recover_from_files(dir.path()).unwrap_err().to_string();
        assert!(err.contains("no recording journal"), "{err}");
    }
}
