//! Records a real LTTng-UST trace of the `jaeger_ust` provider (the C
//! program in tests/ust/) and checks our decode against babeltrace2 and
//! against the values the program emitted.
//!
//! Needs lttng-tools, liblttng-ust-dev and a C compiler. When LTTng cannot
//! work on the machine the test is skipped with the reason printed, unless
//! DEEPSPAN_REQUIRE_LTTNG is set (then it fails).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::common::*;
use deepspan_ctf::{CtfTrace, SpanSync};
use deepspan_model::EventKind;

const ITERATIONS: u64 = 3;

/// Skips (or fails, when DEEPSPAN_REQUIRE_LTTNG is set) for a reason.
fn unavailable(reason: String) {
    if std::env::var_os("DEEPSPAN_REQUIRE_LTTNG").is_some() {
        panic!("LTTng is required (DEEPSPAN_REQUIRE_LTTNG) but cannot work here: {reason}");
    }
    eprintln!("SKIPPED: LTTng cannot work on this machine: {reason}");
}

fn run(cmd: &str, args: &[&str]) -> Result<Output, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `{cmd}`: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "`{cmd} {}` failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn alive(pid: &str) -> bool {
    Path::new("/proc").join(pid.trim()).exists()
}

fn sessiond_pidfiles() -> Vec<PathBuf> {
    let mut v = vec![PathBuf::from("/var/run/lttng/lttng-sessiond.pid")];
    if let Some(home) = std::env::var_os("HOME") {
        v.push(Path::new(&home).join(".lttng/lttng-sessiond.pid"));
    }
    v
}

fn running_sessiond() -> Option<String> {
    sessiond_pidfiles()
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .find(|pid| alive(pid))
}

/// A session daemon this test started, stopped when dropped.
struct OwnSessiond(Option<String>);

impl Drop for OwnSessiond {
    fn drop(&mut self) {
        if let Some(pid) = &self.0 {
            let _ = Command::new("kill").arg(pid.trim()).status();
        }
    }
}

/// Destroys the tracing session when dropped (also on panic).
struct Session(String);

impl Drop for Session {
    fn drop(&mut self) {
        let _ = Command::new("lttng").args(["destroy", &self.0]).output();
    }
}

/// Builds the C program; None (after reporting) when that is impossible.
fn build_program(dir: &Path) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ust");
    let exe = dir.join("jaeger_ust");
    let args = [
        "-O2".to_string(),
        format!("-I{}", src.display()),
        "-o".into(),
        exe.display().to_string(),
        src.join("jaeger_ust.c").display().to_string(),
        "-llttng-ust".into(),
        "-ldl".into(),
        "-lpthread".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match run("cc", &args) {
        Ok(_) => Some(exe),
        Err(e) => {
            unavailable(format!(
                "cannot build the tracepoint program (is liblttng-ust-dev installed?): {e}"
            ));
            None
        }
    }
}

/// Records the program's events; returns the trace folder, the program's
/// pid and its thread ids.
fn record(dir: &Path, exe: &Path) -> Result<(PathBuf, u32, HashMap<u64, i32>), String> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let name = format!("deepspan-ctf-test-{}-{nanos}", std::process::id());
    let out = dir.join("trace");
    let out_s = out.display().to_string();
    run("lttng", &["create", &name, &format!("--output={out_s}")])?;
    let session = Session(name.clone());
    run(
        "lttng",
        &["enable-event", "-u", "-s", &name, "jaeger_ust:*"],
    )?;
    run(
        "lttng",
        &["add-context", "-u", "-s", &name, "-t", "vtid", "-t", "vpid"],
    )?;
    run("lttng", &["start", &name])?;
    let child = Command::new(exe)
        .arg(ITERATIONS.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run the program: {e}"))?;
    let pid = child.id();
    let output = child.wait_with_output().map_err(|e| e.to_string())?;
    if !output.status.success() {
        return Err(format!("program failed: {:?}", output.status));
    }
    run("lttng", &["stop", &name])?;
    run("lttng", &["destroy", &name])?;
    std::mem::forget(session); // destroyed already
    let mut tids = HashMap::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        // "thread T tid X"
        let w: Vec<&str> = line.split_whitespace().collect();
        if let [_, t, _, tid] = w[..] {
            tids.insert(
                t.parse().map_err(|_| line.to_string())?,
                tid.parse().map_err(|_| line.to_string())?,
            );
        }
    }
    Ok((out, pid, tids))
}

#[test]
#[ignore = "system: LTTng (lttng-tools, liblttng-ust-dev, a C compiler)"]
fn jaeger_ust_spans_decode_like_babeltrace2_and_as_emitted() {
    if Command::new("lttng").arg("--version").output().is_err() {
        return unavailable(
            "`lttng` not found (Debian: apt-get install lttng-tools liblttng-ust-dev)".into(),
        );
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(exe) = build_program(tmp.path()) else {
        return;
    };

    let _own = if running_sessiond().is_none() {
        if let Err(e) = run("lttng-sessiond", &["--daemonize"]) {
            return unavailable(e);
        }
        OwnSessiond(running_sessiond())
    } else {
        OwnSessiond(None)
    };

    let (dir, pid, tids) = match record(tmp.path(), &exe) {
        Ok(r) => r,
        Err(e) => return unavailable(e),
    };
    assert_eq!(tids.len(), 2, "program output");

    let trace = CtfTrace::open(&dir).unwrap();
    assert_eq!(trace.traces().len(), 1);
    let info = &trace.traces()[0];
    assert_eq!(info.domain(), Some("ust"));
    assert!(!info.tid_inferred());
    let offset = info.clock_offset_ns();

    let events: Vec<_> = trace.events().map(|e| e.unwrap()).collect();
    assert_eq!(events.len() as u64, 2 * ITERATIONS * 6);

    // Every value as the program emitted it.
    let mut starts = HashMap::new();
    let mut ends = HashMap::new();
    for e in &events {
        assert_eq!(e.ts() as i128 - e.monotonic_ns() as i128, offset);
        let ev = e.to_event();
        assert_eq!(
            ev.kind,
            EventKind::Other {
                name: e.shared_name().clone()
            }
        );
        assert_eq!(ev.ts, e.ts());
        match e.span_sync().expect("jaeger_ust event") {
            SpanSync::Start {
                trace_id,
                span_id,
                parent_span_id,
                op_name,
                start_time,
                vtid,
                vpid,
                ts,
            } => {
                let t = (trace_id as u64) - 0x2222;
                assert_eq!(trace_id >> 64, 0x1111);
                assert_eq!(vtid, Some(tids[&t]));
                assert_eq!(vpid, Some(pid as i32));
                assert_eq!(ev.tid, tids[&t]);
                assert_eq!(ts, e.ts());
                let d = span_id % 10;
                assert_eq!(span_id / 1000, t + 1);
                assert_eq!(parent_span_id, if d == 0 { 0 } else { span_id - 1 });
                assert_eq!(op_name, format!("op-{t}-{d}"));
                assert_eq!(start_time, 1_600_000_000_000_000 + span_id);
                assert!(starts.insert(span_id, ts).is_none());
            }
            SpanSync::End {
                trace_id,
                span_id,
                duration,
                vtid,
                vpid,
                ts,
            } => {
                let t = (trace_id as u64) - 0x2222;
                assert_eq!(vtid, Some(tids[&t]));
                assert_eq!(vpid, Some(pid as i32));
                assert_eq!(duration, 100 + span_id);
                assert!(ends.insert(span_id, ts).is_none());
            }
        }
    }
    assert_eq!(starts.len() as u64, 2 * ITERATIONS * 3);
    for (id, start) in &starts {
        let end = ends[id];
        assert!(*start <= end, "span {id} ends before it starts");
        // Nesting: a child starts after and ends before its parent.
        if id % 10 > 0 {
            assert!(
                starts[&(id - 1)] <= *start && end <= ends[&(id - 1)],
                "span {id} not nested"
            );
        }
    }

    if tool_available("babeltrace2") {
        let ours: Vec<BtEvent> = events.iter().map(our_event).collect();
        assert_same_events(&ours, &babeltrace_events(&dir), "jaeger_ust");
    }
}
