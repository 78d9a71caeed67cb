//! `record --profile` and `deepspan profile` on real programs: a request
//! that spends its CPU time in one hot function and sleeps once, in native
//! code (`deepspan-workload hot`) and in Java (JIT-compiled code, named
//! through the JVM's perf map). The oracle is the program itself: it names
//! its hot function and its request's span; nothing here depends on how many
//! samples load leaves. The native request's flame graph from `deepspan ui`
//! adds up the same way.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{ahead_of_other_load, deepspan, kernel_or_skip, ok, one_at_a_time, workload};
use deepspan_profile::pprof::{Profile, Sample};
use prost::Message;

/// Iterations of the hot loop per half of the request: a few hundred ms of
/// CPU, a few dozen samples at 99 Hz whatever else the machine runs.
const ROUNDS: &str = "150000000";

#[test]
#[ignore = "system: root, tracefs, Go toolchain (go tool pprof)"]
fn a_requests_cpu_time_is_in_its_hot_function_and_its_wall_time_adds_up() {
    if !kernel_or_skip("profile_real") {
        return;
    }
    // Hundreds of ms of CPU in a hot loop (a JVM too): the others' noise.
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let spans = dir.path().join("spans.json");
    let mut program = Command::new(workload());
    program.args(["hot", ROUNDS]).arg(&spans);
    let recorded = record_request(dir.path(), &program, &spans);
    let hot = recorded.told["hot_function"].as_str().unwrap();

    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(recorded.run.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["profile"]["hz"], 99, "{}", manifest["profile"]);
    assert_hot(&recorded.profile, hot);
    // The sleep is an off-CPU frame.
    let profile = &recorded.profile;
    assert!(profile
        .function
        .iter()
        .any(|f| profile.string_table[f.name as usize].starts_with("[off-CPU: TIMER")));

    // On- plus off-CPU wall time is the request's duration.
    let report: serde_json::Value = serde_json::from_str(&ok(deepspan()
        .arg("report")
        .arg(&recorded.run)
        .args(["--request", &recorded.span_id, "--format", "json"])))
    .unwrap();
    let duration = report["request"]["end_ns"].as_u64().unwrap()
        - report["request"]["start_ns"].as_u64().unwrap();
    let wall: i64 = profile.sample.iter().map(|s| s.value[1]).sum();
    assert!(
        (wall as f64 - duration as f64).abs() <= duration as f64 * 0.01,
        "profile wall time {wall} ns against a {duration} ns request"
    );

    // Go's own reader takes it.
    let top = Command::new("go")
        .args(["tool", "pprof", "-top"])
        .arg(&recorded.pprof)
        .output()
        .expect("go tool pprof");
    assert!(
        top.status.success(),
        "go tool pprof: {}",
        String::from_utf8_lossy(&top.stderr)
    );
    assert!(String::from_utf8_lossy(&top.stdout).contains(hot));

    let on_cpu = profile.sample.iter().filter(|s| s.value[0] == 1).count();
    // The UI's flame graph of the same request: the same stacks as a tree.
    let ui = Ui::serve(&recorded.run);
    let flame = ui.json(&format!("/api/requests/{}/profile", recorded.span_id));
    let tree = &flame["tree"];
    assert_eq!(
        tree["name"],
        format!(
            "[{}] {}",
            report["request"]["service"].as_str().unwrap(),
            report["request"]["operation"].as_str().unwrap()
        )
    );
    let total = tree["value_ns"].as_u64().unwrap();
    assert!(
        (total as f64 - duration as f64).abs() <= duration as f64 * 0.01,
        "flame graph total {total} ns against a {duration} ns request"
    );
    assert_eq!(
        total,
        flame["on_cpu_ns"].as_u64().unwrap() + flame["off_cpu_ns"].as_u64().unwrap(),
        "{flame}"
    );
    assert_eq!(tree["on_cpu_ns"], flame["on_cpu_ns"]);
    assert_eq!(
        tree["samples"].as_u64().unwrap() as usize,
        on_cpu,
        "the pprof file's samples, in the tree"
    );
    let mut nodes = Vec::new();
    walk(tree, &mut nodes);
    // The hot function: on the CPU, with ≥ 80 % of the request's samples.
    let hot_samples: u64 = nodes
        .iter()
        .filter(|n| n["name"].as_str().unwrap().ends_with(hot))
        .map(|n| n["samples"].as_u64().unwrap())
        .max()
        .unwrap_or(0);
    assert!(
        hot_samples * 100 >= on_cpu as u64 * 80,
        "{hot} has {hot_samples} of {} samples in the tree",
        on_cpu
    );
    assert!(nodes
        .iter()
        .filter(|n| n["name"].as_str().unwrap().ends_with(hot))
        .all(|n| n["on_cpu"] == true));
    let sleep = nodes
        .iter()
        .find(|n| n["name"].as_str().unwrap().starts_with("[off-CPU: TIMER"))
        .expect("the sleep's frame");
    assert_eq!(sleep["on_cpu"], false);
    assert_eq!(sleep["on_cpu_ns"], 0);
    assert!(sleep["value_ns"].as_u64().unwrap() > 0);
}

fn walk<'a>(node: &'a serde_json::Value, out: &mut Vec<&'a serde_json::Value>) {
    out.push(node);
    for c in node["children"].as_array().unwrap() {
        walk(c, out);
    }
}

/// `deepspan ui RUN` on a free port, stopped when dropped.
struct Ui {
    child: std::process::Child,
    addr: String,
}

impl Ui {
    fn serve(run: &std::path::Path) -> Ui {
        use std::io::BufRead;
        let mut child = deepspan()
            .arg("ui")
            .arg(run)
            .args(["--port", "0"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start deepspan ui");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        Ui { child, addr }
    }

    /// GET over HTTP/1.0: the body ends with the connection, unchunked.
    fn json(&self, path: &str) -> serde_json::Value {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(&self.addr).unwrap();
        write!(c, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).unwrap();
        let mut text = String::new();
        c.read_to_string(&mut text).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        assert!(
            head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
            "GET {path}: {head}\n{body}"
        );
        serde_json::from_str(body).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e})"))
    }
}

impl Drop for Ui {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// JIT-compiled code has no symbols in any file: the JVM writes its perf map
/// (`/tmp/perf-PID.map`) at exit, and keeps frame pointers when asked.
#[test]
#[ignore = "system: root, tracefs, JDK"]
fn a_java_requests_hot_method_is_named_through_the_jits_perf_map() {
    if !kernel_or_skip("profile_real java") {
        return;
    }
    // Hundreds of ms of CPU in a hot loop (a JVM too): the others' noise.
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workloads/java/HotRequest.java");
    let javac = Command::new("javac")
        .arg("-d")
        .arg(dir.path())
        .arg(&source)
        .output()
        .expect("javac (OpenJDK)");
    assert!(
        javac.status.success(),
        "javac: {}",
        String::from_utf8_lossy(&javac.stderr)
    );
    let spans = dir.path().join("spans.json");
    let mut program = Command::new("java");
    program
        .args([
            "-XX:+PreserveFramePointer",
            "-XX:+UnlockDiagnosticVMOptions",
            "-XX:+DumpPerfMapAtExit",
            "-cp",
        ])
        .arg(dir.path())
        .args(["HotRequest", "300000000"])
        .arg(&spans);
    let recorded = record_request(dir.path(), &program, &spans);
    assert!(
        std::fs::read_dir(recorded.run.join("profile"))
            .unwrap()
            .any(|e| e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("perf-")),
        "the JVM's perf map was not kept with the run"
    );
    assert_hot(
        &recorded.profile,
        recorded.told["hot_function"].as_str().unwrap(),
    );
}

struct Recorded {
    run: PathBuf,
    /// The program's own line about itself.
    told: serde_json::Value,
    span_id: String,
    pprof: PathBuf,
    profile: Profile,
}

/// Records `program` with `--profile`, imports the span it wrote to
/// `spans`, analyses, and profiles that request.
fn record_request(dir: &Path, program: &Command, spans: &Path) -> Recorded {
    let run = dir.join("run");
    let mut record = deepspan();
    record
        .arg("record")
        .arg("-o")
        .arg(&run)
        .args(["--profile", "--no-otlp", "--"]);
    record.arg(program.get_program()).args(program.get_args());
    let out = ahead_of_other_load(&mut record).output().unwrap();
    assert!(
        out.status.success(),
        "record: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let told: serde_json::Value = serde_json::from_slice(
        out.stdout
            .split(|&b| b == b'\n')
            .find(|l| l.starts_with(b"{\"workload\""))
            .expect("the program's line"),
    )
    .unwrap();
    let span_id = told["span_id"].as_str().unwrap().to_string();
    ok(deepspan()
        .arg("import")
        .arg("-o")
        .arg(&run)
        .arg("--otlp")
        .arg(spans));
    ok(deepspan().arg("analyze").arg(&run));
    let pprof = dir.join("request.pb.gz");
    ok(deepspan()
        .arg("profile")
        .arg(&run)
        .args(["--request", &span_id, "-o"])
        .arg(&pprof));
    let profile = decode(&std::fs::read(&pprof).unwrap());
    Recorded {
        run,
        told,
        span_id,
        pprof,
        profile,
    }
}

/// The hot function is on the stack of ≥ 80 % of the request's CPU samples.
fn assert_hot(profile: &Profile, hot: &str) {
    let name = |loc: u64| {
        let f =
            &profile.function[profile.location[loc as usize - 1].line[0].function_id as usize - 1];
        profile.string_table[f.name as usize].as_str()
    };
    let on_cpu: Vec<&Sample> = profile.sample.iter().filter(|s| s.value[0] == 1).collect();
    let in_hot = on_cpu
        .iter()
        .filter(|s| s.location_id.iter().any(|&l| name(l).contains(hot)))
        .count();
    assert!(
        on_cpu.len() >= 5,
        "only {} CPU samples on the request's RUNNING pieces",
        on_cpu.len()
    );
    assert!(
        in_hot * 100 >= on_cpu.len() * 80,
        "{hot} is in {in_hot} of the request's {} RUNNING samples",
        on_cpu.len()
    );
}

fn decode(gz: &[u8]) -> Profile {
    use std::io::Read;
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut bytes)
        .unwrap();
    Profile::decode(&bytes[..]).unwrap()
}
