//! `deepspan decode` on the public trace.dat files of ../shared/testdata,
//! against the counts trace-cmd gives for them.

use std::path::{Path, PathBuf};

use crate::common::{deepspan, testdata};
use serde_json::Value as Json;

fn ftrace(name: &str) -> PathBuf {
    testdata("kernel/ftrace").join(name)
}

fn expected_counts(name: &str) -> Json {
    let path = ftrace(&format!("{name}.counts.json"));
    serde_json::from_slice(
        &std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap()
}

#[test]
fn summary_matches_trace_cmd_counts() {
    for name in ["sched_load", "example_rtapp"] {
        let out = deepspan()
            .arg("decode")
            .arg(ftrace(&format!("{name}.dat")))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary: Json = serde_json::from_slice(&out.stdout).unwrap();
        let expected = expected_counts(name);
        assert_eq!(summary["format"], "trace.dat v6", "{name}");
        assert_eq!(summary["events"], expected["event_count"], "{name}");
        assert_eq!(summary["by_name"], expected["events_per_name"], "{name}");
        assert_eq!(summary["lost_events"], 0, "{name}");
    }
}

#[test]
fn jsonl_is_time_ordered_and_limited() {
    let out = deepspan()
        .arg("decode")
        .arg(ftrace("sched_load.dat"))
        .args(["--format", "jsonl", "--limit", "500"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events: Vec<Json> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 500);
    let expected = expected_counts("sched_load");
    assert_eq!(events[0]["ts"], expected["first_event_ts_ns"]);
    assert!(events
        .windows(2)
        .all(|w| w[0]["ts"].as_u64() <= w[1]["ts"].as_u64()));
    let switch = events
        .iter()
        .find(|e| e["name"] == "sched_switch")
        .expect("a sched_switch");
    for key in [
        "prev_comm",
        "prev_pid",
        "prev_state",
        "next_comm",
        "next_pid",
    ] {
        assert!(
            switch["fields"].get(key).is_some(),
            "sched_switch lacks {key}: {switch}"
        );
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope.dat");
    let out = deepspan().arg("decode").arg(&missing).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));

    let garbage = tmp.path().join("garbage.dat");
    std::fs::write(&garbage, b"this is not a trace").unwrap();
    let out = deepspan().arg("decode").arg(&garbage).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("garbage.dat") && err.contains("offset"),
        "{err}"
    );

    // Cut in its ring-buffer data (the last 200 KB): what is left
    // decodes, with a warning saying what is lost, on stderr and in the
    // summary; a trace cut short is not an error.
    let truncated = tmp.path().join("truncated.dat");
    let full = std::fs::read(ftrace("sched_load.dat")).unwrap();
    std::fs::write(&truncated, &full[..full.len() - 100_000]).unwrap();
    let out = deepspan().arg("decode").arg(&truncated).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("deepspan: warning: trace.dat is cut short"),
        "{err}"
    );
    let summary: Json = serde_json::from_slice(&out.stdout).unwrap();
    let expected = expected_counts("sched_load");
    let events = summary["events"].as_u64().unwrap();
    assert!(
        events > 0 && events < expected["event_count"].as_u64().unwrap(),
        "{summary}"
    );
    assert!(
        summary["warnings"][0]
            .as_str()
            .unwrap()
            .contains("bytes missing"),
        "{summary}"
    );
    // Cut inside the event formats: nothing can be decoded, and it says so.
    std::fs::write(&truncated, &full[..3000]).unwrap();
    let out = deepspan().arg("decode").arg(&truncated).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("cut short at byte 3000 inside the") && !err.contains("panicked"),
        "{err}"
    );
}

/// A CTF stream file cut short decodes its whole packets, with a warning
/// naming the file.
#[test]
fn cut_ctf_stream_decodes_with_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let src = testdata("kernel/ctf/bug446190/trace");
    for name in ["metadata", "channel0_0", "channel0_1"] {
        std::fs::copy(src.join(name), tmp.path().join(name)).unwrap();
    }
    let whole = deepspan().arg("decode").arg(tmp.path()).output().unwrap();
    assert!(
        whole.status.success() && whole.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&whole.stderr)
    );
    let whole: Json = serde_json::from_slice(&whole.stdout).unwrap();
    assert!(whole.get("warnings").is_none());
    let cut = tmp.path().join("channel0_1");
    let bytes = std::fs::read(&cut).unwrap();
    // Inside its second packet (bytes 262144..290816).
    std::fs::write(&cut, &bytes[..263_144]).unwrap();
    for threads in ["1", "2"] {
        let out = deepspan()
            .arg("decode")
            .arg(tmp.path())
            .args(["--threads", threads])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(
            err.contains("channel0_1 is cut short at byte")
                && err.contains("27672 of 290816 bytes are missing"),
            "{err}"
        );
        let summary: Json = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            summary["events"].as_u64() < whole["events"].as_u64(),
            "{summary}"
        );
        assert_eq!(
            summary["warnings"].as_array().map(Vec::len),
            Some(1),
            "{summary}"
        );
    }
}

/// Every CTF trace of the corpus: counts by name equal what babeltrace2
/// gave (the corpus's expected.json), and JSON lines come out in time order.
/// A folder of several traces (`trace_dirs`: multi-domains' kernel and UST,
/// synctraces' two machines) has babeltrace2's counts per trace under
/// `observed.<dir>`, and for the folder read as one under `observed.both`.
#[test]
fn ctf_summary_matches_babeltrace2_counts() {
    let root = testdata("kernel/ctf");
    let mut checked = 0;
    for entry in std::fs::read_dir(&root).unwrap() {
        let folder = entry.unwrap().path();
        let expected: Json =
            serde_json::from_slice(&std::fs::read(folder.join("expected.json")).unwrap()).unwrap();
        let observed = &expected["observed"];
        let mut traces: Vec<(PathBuf, &Json)> = Vec::new();
        match expected["trace_dirs"].as_array() {
            Some(dirs) => {
                for d in dirs {
                    let d = d.as_str().expect("trace_dirs holds folder names");
                    traces.push((folder.join(d), &observed[d]));
                }
                if let Some(both) = observed.get("both") {
                    traces.push((folder.clone(), both));
                }
            }
            None => traces.push((folder.clone(), observed)),
        }
        for (dir, observed) in traces {
            assert_summary_matches(&dir, observed);
            checked += 1;
        }
    }
    assert_eq!(
        checked, 9,
        "the corpus has nine CTF traces: four folders of one, multi-domains' \
         kernel, UST and both, synctraces' two machines"
    );
}

fn assert_summary_matches(dir: &Path, observed: &Json) {
    let out = deepspan().arg("decode").arg(dir).output().unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["format"], "CTF 1.8");
    assert!(
        observed["event_count"].is_u64(),
        "{}: no event_count in expected.json",
        dir.display()
    );
    assert_eq!(
        summary["events"],
        observed["event_count"],
        "{}",
        dir.display()
    );
    if let Some(by_name) = observed.get("events_per_name") {
        assert_eq!(&summary["by_name"], by_name, "{}", dir.display());
    }

    let out = deepspan()
        .arg("decode")
        .arg(dir)
        .args(["--format", "jsonl", "--limit", "300"])
        .output()
        .unwrap();
    let events: Vec<Json> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        events[0]["ts"],
        observed["first_event_ts_ns"],
        "{}",
        dir.display()
    );
    assert!(events
        .windows(2)
        .all(|w| w[0]["ts"].as_u64() <= w[1]["ts"].as_u64()));
}

/// The summary counts streams (CPUs) on several threads without merging
/// them; it must say exactly what one thread reading in time order says.
#[test]
fn summary_is_the_same_on_any_number_of_threads() {
    let ctf = testdata("kernel/ctf");
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(&ctf)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    inputs.extend(["sched_load.dat", "example_rtapp.dat"].map(ftrace));
    for input in inputs {
        let summary = |threads: &str| {
            let out = deepspan()
                .arg("decode")
                .arg(&input)
                .args(["--threads", threads])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                input.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        };
        let merged = summary("1");
        for threads in ["2", "3", "16"] {
            assert_eq!(
                summary(threads),
                merged,
                "{} with {threads} threads",
                input.display()
            );
        }
    }
}

/// `analyze` takes a trace cut short too, and says in its notes what was
/// lost.
#[test]
fn analyze_notes_a_cut_trace() {
    let tmp = tempfile::tempdir().unwrap();
    let kernel = tmp.path().join("run/kernel");
    std::fs::create_dir_all(&kernel).unwrap();
    let full = std::fs::read(ftrace("sched_load.dat")).unwrap();
    std::fs::write(kernel.join("trace.dat"), &full[..full.len() - 100_000]).unwrap();
    let out = deepspan()
        .arg("analyze")
        .arg(tmp.path().join("run"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("deepspan: note: trace.dat is cut short") && err.contains("bytes missing"),
        "{err}"
    );
    assert_eq!(err.matches("is cut short").count(), 1, "said once: {err}");
}
