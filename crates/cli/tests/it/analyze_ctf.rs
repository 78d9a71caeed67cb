//! `deepspan import --ctf` + `deepspan analyze` on real LTTng kernel traces
//! of the corpus: the thread-state table must follow every context switch
//! the trace holds, exactly as for trace.dat runs.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::common::{deepspan, testdata};
use deepspan_store::table::{read_rows, Cell};
use serde_json::Value;

fn corpus(name: &str) -> PathBuf {
    testdata("kernel/ctf").join(name)
}

fn ok(cmd: &mut std::process::Command) -> std::process::Output {
    let out = cmd.output().expect("run deepspan");
    assert!(
        out.status.success(),
        "{:?} failed: {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// (ts, tid, state) of every thread-state row.
fn state_starts(run: &Path) -> HashSet<(u64, i64, String)> {
    let rows = read_rows(&run.join("analysis/thread_states.parquet"), |_| true).unwrap();
    rows.into_iter()
        .map(|row| {
            let get = |k: &str| {
                row.iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, c)| c.clone())
                    .unwrap()
            };
            let int = |c: Cell| c.as_i64().or_else(|| c.as_u64().map(|v| v as i64)).unwrap();
            let Cell::Str(state) = get("state") else {
                panic!("state is not a string")
            };
            (int(get("start_ns")) as u64, int(get("tid")), state)
        })
        .collect()
}

#[test]
fn ctf_kernel_trace_gives_thread_states_at_every_switch() {
    for name in ["bug446190", "lttng-tracefile-rotation"] {
        let dir = corpus(name);
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        ok(deepspan()
            .arg("import")
            .arg("-o")
            .arg(&run)
            .arg("--ctf")
            .arg(&dir));
        // Importing twice into one run is refused: one kernel trace per run.
        let again = deepspan()
            .arg("import")
            .arg("-o")
            .arg(&run)
            .arg("--ctf")
            .arg(&dir)
            .output()
            .unwrap();
        assert!(!again.status.success());
        assert!(String::from_utf8_lossy(&again.stderr).contains("already has a kernel trace"));

        ok(deepspan().arg("analyze").arg(&run));
        let states = state_starts(&run);
        let decoded = ok(deepspan()
            .arg("decode")
            .arg(&dir)
            .arg("--format")
            .arg("jsonl"));
        let mut switches = 0;
        // A thread's switch out after its exit ends it: no state follows.
        let mut exited = HashSet::new();
        for line in String::from_utf8(decoded.stdout).unwrap().lines() {
            let e: Value = serde_json::from_str(line).unwrap();
            if e["name"] == "sched_process_exit" {
                exited.insert(e["fields"]["tid"].as_i64().unwrap());
            }
            if e["name"] != "sched_switch" {
                continue;
            }
            let ts = e["ts"].as_u64().unwrap();
            let f = &e["fields"];
            let (prev, next) = (
                f["prev_tid"].as_i64().unwrap(),
                f["next_tid"].as_i64().unwrap(),
            );
            if next != 0 {
                assert!(
                    states.contains(&(ts, next, "RUNNING".to_string())),
                    "{name}: no RUNNING state of {next} from the switch at {ts}"
                );
            }
            if prev != 0 && !exited.contains(&prev) {
                // Runnable: waiting for a CPU. Blocked: a waiting state, or
                // WAIT_CPU when its wake-up came in just before the switch.
                let runnable = f["prev_state"].as_i64().unwrap() & 0xff == 0;
                let after: Vec<&String> = states
                    .iter()
                    .filter(|(t, tid, _)| *t == ts && *tid == prev)
                    .map(|(_, _, s)| s)
                    .collect();
                let fits = |s: &&String| {
                    if runnable {
                        ["PREEMPTED", "WAIT_CPU"].contains(&s.as_str())
                    } else {
                        s.as_str() != "RUNNING"
                    }
                };
                assert!(
                    after.iter().any(fits),
                    "{name}: {prev} switched out at {ts} (prev_state {}) has states {after:?} from then",
                    f["prev_state"]
                );
            }
            switches += 1;
        }
        assert!(switches > 100, "{name}: only {switches} switches");
    }
}

#[test]
fn ctf_import_errors_are_clear() {
    let tmp = tempfile::tempdir().unwrap();
    let out = deepspan()
        .arg("import")
        .arg("-o")
        .arg(tmp.path().join("run"))
        .arg("--ctf")
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot read the CTF trace"), "{err}");
    assert!(
        !tmp.path().join("run").join("kernel").exists(),
        "nothing is left behind"
    );
}
