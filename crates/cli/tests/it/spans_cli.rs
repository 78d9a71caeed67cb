//! `deepspan import`, `deepspan spans critical-path` and `deepspan receive`,
//! run as a user runs them, checked against the shared test data and, for
//! `receive`, against a real OpenTelemetry Python program.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::{deepspan, run_ok, testdata};
use deepspan_spans::{import_file, read_run_spans, ExportTraceServiceRequest, Span, SpanId};
use prost::Message;
use serde_json::Value as J;

fn read_back(run: &Path) -> Vec<Span> {
    read_run_spans(run).unwrap().map(|s| s.unwrap()).collect()
}

#[test]
fn import_recognises_formats_and_stores_spans_unchanged() {
    let run = tempfile::tempdir().unwrap();
    let jaeger = testdata("spans/jaeger/tracecompass-opentracing/simple.json");
    let zipkin = testdata("spans/zipkin/yelp.json");
    let otlp = testdata("spans/otlp/otlp2jaeger/otlp2jaeger-in.json");
    let (stdout, _) = run_ok(
        deepspan()
            .args(["import", "-o"])
            .arg(run.path())
            .arg("--jaeger")
            .arg(&jaeger)
            .arg("--zipkin")
            .arg(&zipkin)
            .arg(&otlp),
    );
    let expected: Vec<Span> = [&jaeger, &zipkin, &otlp]
        .iter()
        .flat_map(|p| import_file(p).unwrap().spans)
        .collect();
    assert_eq!(read_back(run.path()), expected);
    assert!(
        stdout.contains("(Jaeger JSON)")
            && stdout.contains("(Zipkin v2 JSON)")
            && stdout.contains("(OTLP/JSON)"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("imported {} spans into", expected.len())),
        "{stdout}"
    );
    assert!(stdout.contains("spans/otlp-000.pb"), "{stdout}");

    // A second import adds a file; the first is kept.
    run_ok(
        deepspan()
            .args(["import", "-o"])
            .arg(run.path())
            .arg(&zipkin),
    );
    assert_eq!(
        read_back(run.path()).len(),
        expected.len() + import_file(&zipkin).unwrap().spans.len()
    );
}

#[test]
fn import_refuses_a_file_given_as_another_format_and_writes_nothing() {
    let run = tempfile::tempdir().unwrap();
    let out = deepspan()
        .args(["import", "-o"])
        .arg(run.path())
        .arg("--zipkin")
        .arg(testdata(
            "spans/jaeger/tracecompass-opentracing/simple.json",
        ))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("was given as --zipkin but is Jaeger JSON"),
        "{stderr}"
    );
    assert!(read_back(run.path()).is_empty());

    let bad = run.path().join("bad.json");
    std::fs::write(
        &bad,
        "{\"resourceSpans\": [{\"scopeSpans\": [{\"spans\": [{\"traceId\": \"zz\"}]}]}]}",
    )
    .unwrap();
    let out = deepspan()
        .args(["import", "-o"])
        .arg(run.path())
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("bad.json"),
        "the error names the file"
    );

    let out = deepspan()
        .args(["import", "-o"])
        .arg(run.path())
        .args(["--ctf", "somewhere"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot read the CTF trace somewhere"), "{err}");
}

/// (span name, section start µs, section end µs)
type Sections = Vec<(String, u64, u64)>;

/// jaeger-ui's cases use ids like "span-A": they become hex ids in a
/// temporary Jaeger file, and the map gives the names back.
fn jaeger_ui_case(i: usize, dir: &Path) -> (PathBuf, HashMap<String, String>, Sections) {
    let doc: J = serde_json::from_slice(
        &std::fs::read(testdata(&format!(
            "spans/jaeger-ui-critical-path/test{i}.json"
        )))
        .unwrap(),
    )
    .unwrap();
    let mut trace = doc["trace"].clone();
    let mut hex_of: HashMap<String, String> = HashMap::new();
    let mut fix = |v: &mut J| {
        let name = v.as_str().unwrap().to_string();
        let n = hex_of.len() + 0x100;
        let hex = if SpanId::from_hex(&name).is_some() {
            name.clone()
        } else {
            hex_of
                .get(&name)
                .cloned()
                .unwrap_or_else(|| format!("{n:x}"))
        };
        hex_of.insert(name, hex.clone());
        *v = J::String(hex);
    };
    fix(&mut trace["traceID"]);
    for s in trace["spans"].as_array_mut().unwrap() {
        fix(&mut s["spanID"]);
        for r in s["references"].as_array_mut().into_iter().flatten() {
            fix(&mut r["spanID"]);
        }
    }
    let file = dir.join(format!("test{i}.json"));
    std::fs::write(&file, serde_json::to_vec(&trace).unwrap()).unwrap();
    let name_of = hex_of
        .into_iter()
        .map(|(name, hex)| {
            (
                format!("{:016x}", u64::from_str_radix(&hex, 16).unwrap()),
                name,
            )
        })
        .collect();
    let expected = doc["expected_critical_path_sections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["spanID"].as_str().unwrap().to_string(),
                s["sectionStart"].as_u64().unwrap(),
                s["sectionEnd"].as_u64().unwrap(),
            )
        })
        .collect();
    (file, name_of, expected)
}

#[test]
fn critical_path_json_equals_jaeger_ui_on_its_test_cases() {
    let dir = tempfile::tempdir().unwrap();
    for i in 1..=9 {
        let (file, name_of, expected) = jaeger_ui_case(i, dir.path());
        for extra in [&["--jaeger-ui"][..], &[][..]] {
            let (stdout, _) = run_ok(
                deepspan()
                    .args(["spans", "critical-path"])
                    .arg(&file)
                    .args(["--format", "json"])
                    .args(extra),
            );
            let v: J = serde_json::from_str(&stdout).unwrap();
            assert_eq!(v["traces"].as_array().unwrap().len(), 1);
            let t = &v["traces"][0];
            assert_eq!(t["trace_id"].as_str().unwrap().len(), 32);
            let got: Vec<(String, u64, u64)> = t["sections"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    (
                        name_of[s["span_id"].as_str().unwrap()].clone(),
                        s["start_ns"].as_u64().unwrap() / 1000,
                        s["end_ns"].as_u64().unwrap() / 1000,
                    )
                })
                .collect();
            assert_eq!(got, expected, "test{i}.json {extra:?}");
            // Exclusive time adds up to the sections, per trace and in the aggregate.
            let on_path: u64 = t["sections"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["end_ns"].as_u64().unwrap() - s["start_ns"].as_u64().unwrap())
                .sum();
            let exclusive: u64 = t["exclusive_ns"]
                .as_object()
                .unwrap()
                .values()
                .map(|n| n.as_u64().unwrap())
                .sum();
            let aggregate: u64 = v["aggregate_exclusive_ns"]
                .as_object()
                .unwrap()
                .values()
                .map(|n| n.as_u64().unwrap())
                .sum();
            assert_eq!((exclusive, aggregate), (on_path, on_path));
        }
    }
}

#[test]
fn critical_path_text_is_a_table_by_exclusive_time() {
    let dir = tempfile::tempdir().unwrap();
    let (file, _, _) = jaeger_ui_case(1, dir.path());
    let (stdout, _) = run_ok(
        deepspan()
            .args(["spans", "critical-path"])
            .arg(&file)
            .args(["--format", "text"]),
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with("critical path of 1 traces"),
        "{stdout}"
    );
    assert!(
        lines[1].contains("[service] operation") && lines[1].contains("exclusive"),
        "{stdout}"
    );
    // test1: operation C 70 µs, D 20 µs, E 10 µs of a 100 µs path.
    assert!(
        lines[2].starts_with("[customers-service] operation C")
            && lines[2].contains("70.0 µs")
            && lines[2].contains("70.0 %"),
        "{stdout}"
    );
    assert!(
        lines[3].starts_with("[customers-service] operation D"),
        "{stdout}"
    );
    assert!(
        lines[4].starts_with("[customers-service] operation E"),
        "{stdout}"
    );

    // A run folder is read through its spans/.
    let run = dir.path().join("run");
    run_ok(deepspan().args(["import", "-o"]).arg(&run).arg(&file));
    let (from_run, _) = run_ok(deepspan().args(["spans", "critical-path"]).arg(&run));
    assert_eq!(
        from_run.lines().skip(1).collect::<Vec<_>>(),
        stdout.lines().skip(1).collect::<Vec<_>>()
    );
}

/// `deepspan receive` on free ports, with the addresses it printed.
struct Receiving {
    child: Child,
    grpc: SocketAddr,
    http: SocketAddr,
    stderr: std::sync::mpsc::Receiver<String>,
}

fn receive(run: &Path, extra: &[&str]) -> Receiving {
    let mut child = deepspan()
        .args(["receive", "-o"])
        .arg(run)
        .args(["--otlp-grpc-port", "0", "--otlp-http-port", "0"])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    // "deepspan: receiving OTLP/gRPC on A and OTLP/HTTP on B into RUN"
    let addr_after = |word: &str| -> SocketAddr {
        let rest = &first[first.find(word).unwrap_or_else(|| panic!("{first}")) + word.len()..];
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    let (grpc, http) = (addr_after("OTLP/gRPC on "), addr_after("OTLP/HTTP on "));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    Receiving {
        child,
        grpc,
        http,
        stderr: rx,
    }
}

impl Receiving {
    /// SIGINT, then the exit status and what it printed.
    fn stop(mut self) -> (bool, String) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait().unwrap();
        let text: Vec<String> = self.stderr.iter().collect();
        (status.success(), text.join("\n"))
    }
}

fn post_protobuf(addr: SocketAddr, req: &ExportTraceServiceRequest) -> u16 {
    let body = req.encode_to_vec();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "POST /v1/traces HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()).unwrap();
    s.write_all(&body).unwrap();
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply.split(' ').nth(1).unwrap().parse().unwrap()
}

#[test]
fn receive_writes_spans_and_a_manifest_until_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let r = receive(&run, &[]);
    let sent = deepspan_spans::request_from_spans(
        &import_file(&testdata("spans/zipkin/yelp.json"))
            .unwrap()
            .spans,
    );
    assert_eq!(post_protobuf(r.http, &sent), 200);
    let (grpc, http) = (r.grpc, r.http);
    std::thread::sleep(Duration::from_millis(1200)); // one periodic clock sample
    let (ok, stderr) = r.stop();
    assert!(ok, "{stderr}");
    let n = import_file(&testdata("spans/zipkin/yelp.json"))
        .unwrap()
        .spans
        .len();
    assert!(
        stderr.contains(&format!("{n} spans written from 1 requests")),
        "{stderr}"
    );
    assert_eq!(read_back(&run).len(), n);

    let m: J = serde_json::from_slice(&std::fs::read(run.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["format_version"], 1);
    assert_eq!(m["otlp"]["grpc_port"], grpc.port());
    assert_eq!(m["otlp"]["http_port"], http.port());
    assert_eq!(m["otlp"]["receiver"]["spans_written"], n as u64);
    assert_eq!(m["otlp"]["receiver"]["requests"], 1);
    let samples = m["clock_samples"].as_array().unwrap();
    assert!(samples.len() >= 3, "start, each second, end: {samples:?}");
    assert_eq!(samples[0][0], m["start"]["realtime_ns"]);
    assert_eq!(samples.last().unwrap()[1], m["end"]["mono_ns"]);
    // The clock mapping reads it.
    deepspan_spans::ClockMap::from_manifest(&run).unwrap();
}

#[test]
fn receive_into_a_recorded_run_patches_only_the_otlp_section() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let original = "{\n  \"format_version\": 1,\n  \"host\": \"h\",\n  \"zeta\": {\"b\": 1, \"a\": [1, 2]},\n  \"otlp\": {\"grpc_port\": 4317, \"http_port\": 4318},\n  \"alpha\": true\n}\n";
    std::fs::write(run.join("manifest.json"), original).unwrap();
    let r = receive(&run, &["--duration", "0.3"]);
    let (ok, stderr) = r.stop();
    assert!(ok, "{stderr}");
    let text = std::fs::read_to_string(run.join("manifest.json")).unwrap();
    let m: J = serde_json::from_str(&text).unwrap();
    let positions: Vec<usize> = ["format_version", "host", "zeta", "otlp", "alpha"]
        .iter()
        .map(|k| text.find(&format!("\"{k}\"")).unwrap())
        .collect();
    assert!(positions.is_sorted(), "key order kept: {text}");
    assert_eq!(m["zeta"], serde_json::json!({"b": 1, "a": [1, 2]}));
    assert_eq!(m["alpha"], true);
    assert_ne!(m["otlp"]["http_port"], 4318, "the ports used are recorded");
    assert_eq!(m["otlp"]["receiver"]["requests"], 0);
    assert!(m.get("clock_samples").is_none(), "nothing else added");
}

#[test]
fn receive_on_a_busy_port_says_which_and_how_to_change_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = deepspan()
        .args(["receive", "-o"])
        .arg(dir.path())
        .args(["--otlp-grpc-port", &port, "--duration", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("OTLP/gRPC port {port} is not available"))
            && stderr.contains("--otlp-grpc-port"),
        "{stderr}"
    );
}

/// Python with the deepspan SDK and the OTLP/HTTP exporter, or why not.
fn python_with_otel() -> Option<String> {
    let probe = Command::new("python3")
        .args(["-c", "import deepspan_otel, opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter"])
        .output();
    match probe {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(String::from_utf8_lossy(&o.stderr).trim().to_string()),
        Err(e) => Some(format!("python3: {e}")),
    }
}

const PYTHON_APP: &str = r#"
import sys, threading
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
import deepspan_otel

endpoint = sys.argv[1]
provider = TracerProvider(resource=Resource.create({"service.name": "py-app"}))
deepspan_otel.install(provider)
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, timeout=10), max_export_batch_size=64))
tracer = provider.get_tracer("e2e")

def request(i):
    with tracer.start_as_current_span(f"request-{i}"):
        with tracer.start_as_current_span("db"):
            pass

threads = [threading.Thread(target=lambda t=t: [request(t * 100 + i) for i in range(25)]) for t in range(4)]
for t in threads: t.start()
for t in threads: t.join()
provider.force_flush()
provider.shutdown()
print(len(threads) * 25 * 2)
"#;

/// Required when the environment is meant to be complete (CI), else skipped with the reason.
fn python_or_skip(test: &str) -> bool {
    let Some(reason) = python_with_otel() else {
        return true;
    };
    let required = std::env::var_os("DEEPSPAN_REQUIRE_PYTHON").is_some()
        || std::env::var_os("DEEPSPAN_REQUIRE_KERNEL").is_some();
    assert!(!required, "{test}: the Python OpenTelemetry SDK is required but missing (pip install -e 'sdk/python[test]'): {reason}");
    eprintln!("{test}: skipped: Python OpenTelemetry SDK unavailable: {reason}");
    false
}

#[test]
fn an_instrumented_python_program_lands_all_its_spans_with_deepspan_fields() {
    if !python_or_skip("an_instrumented_python_program_lands_all_its_spans_with_deepspan_fields") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let r = receive(&run, &[]);
    let out = Command::new("python3")
        .args(["-c", PYTHON_APP, &format!("http://{}/v1/traces", r.http)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected: usize = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let (ok, stderr) = r.stop();
    assert!(ok, "{stderr}");

    let spans = read_back(&run);
    assert_eq!(spans.len(), expected, "every span exported arrived once");
    let mut names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    names.sort();
    assert_eq!(names.iter().filter(|n| **n == "db").count(), expected / 2);
    for s in &spans {
        assert_eq!(s.service_name(), "py-app");
        let tid = s
            .sync
            .tid
            .unwrap_or_else(|| panic!("no deepspan.tid on {s:?}"));
        assert!(tid > 0);
        let (start, end) = (s.sync.mono_start_ns.unwrap(), s.sync.mono_end_ns.unwrap());
        assert!(0 < start && start <= end, "{s:?}");
        assert!(s.sync.problems.is_empty(), "{:?}", s.sync.problems);
        assert!(!s.sync.activations.is_empty(), "deepspan.on/off events");
    }
    // Children on their parent's thread, as the program ran them.
    let by_id: HashMap<SpanId, &Span> = spans.iter().map(|s| (s.span_id, s)).collect();
    for s in spans.iter().filter(|s| s.name == "db") {
        let parent = by_id[&s.parent_span_id.unwrap()];
        assert_eq!(parent.sync.tid, s.sync.tid);
    }
}

/// A Python program exporting through the OTLP environment `deepspan
/// record` gives its command (OTEL_EXPORTER_OTLP_ENDPOINT/PROTOCOL).
const PYTHON_APP_FROM_ENV: &str = r#"
import threading
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
import deepspan_otel

provider = TracerProvider(resource=Resource.create({"service.name": "recorded-app"}))
deepspan_otel.install(provider)
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
tracer = provider.get_tracer("record-e2e")

def work(k):
    for i in range(20):
        with tracer.start_as_current_span(f"request-{k}-{i}"):
            sum(range(20000))

threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
for t in threads: t.start()
for t in threads: t.join()
provider.shutdown()
print(60)
"#;

#[test]
#[ignore = "system: root and tracefs"]
fn record_receives_the_commands_spans_next_to_the_kernel_trace() {
    let test = "record_receives_the_commands_spans_next_to_the_kernel_trace";
    if !crate::common::kernel_or_skip(test) || !python_or_skip(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = deepspan()
        .args(["record", "-o"])
        .arg(&run)
        .args(["--otlp-grpc-port", "0", "--otlp-http-port", "0", "--"])
        .args(["python3", "-c", PYTHON_APP_FROM_ENV])
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let expected: usize = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();

    let spans = read_back(&run);
    assert_eq!(spans.len(), expected, "{stderr}");
    let m: J = serde_json::from_slice(&std::fs::read(run.join("manifest.json")).unwrap()).unwrap();
    assert_ne!(m["otlp"]["http_port"], 0, "the real port is recorded");
    assert_eq!(m["otlp"]["receiver"]["spans_written"], expected as u64);
    assert!(
        m["kernel_trace"].is_string(),
        "the recorder's manifest is kept"
    );
    // The spans fall inside the recording, in the kernel's clock.
    let (start, end) = (
        m["start"]["mono_ns"].as_u64().unwrap(),
        m["end"]["mono_ns"].as_u64().unwrap(),
    );
    for s in &spans {
        let (a, b) = (s.sync.mono_start_ns.unwrap(), s.sync.mono_end_ns.unwrap());
        assert!(
            start <= a && a <= b && b <= end,
            "{a}..{b} outside {start}..{end}"
        );
        assert!(s.sync.tid.is_some());
    }
    deepspan_spans::ClockMap::from_manifest(&run).unwrap();
    spans_sit_on_running_threads(&run, &spans);
}

/// Checks the spans against the kernel trace of the same run: the activity
/// map puts each span on its thread at its start, and the kernel says that
/// thread was RUNNING then (its last sched_switch before the start switched
/// it in). A span starts from Python code, so its thread must be on a CPU.
fn spans_sit_on_running_threads(run: &Path, spans: &[Span]) {
    use deepspan_model::EventKind;
    use deepspan_spans::{ActivityOptions, ThreadActivity};

    let activity = ThreadActivity::from_spans(spans, None, ActivityOptions::default());
    let trace = deepspan_ftrace::TraceDat::open(&run.join("kernel/trace.dat")).unwrap();
    let schema = trace.schema().clone();
    // Per tid: times it was switched in (true) or out (false), in order.
    let tids: std::collections::HashSet<i32> =
        spans.iter().map(|s| s.sync.tid.unwrap() as i32).collect();
    let mut switches: std::collections::HashMap<i32, Vec<(u64, bool)>> = Default::default();
    // Per tid: times of its own other events (it was on a CPU then).
    let mut own: std::collections::HashMap<i32, Vec<u64>> = Default::default();
    let mut switch_count = 0;
    for record in trace.records().unwrap() {
        let event = record.unwrap().to_event(&schema);
        switch_count += usize::from(matches!(event.kind, EventKind::SchedSwitch(_)));
        if !matches!(event.kind, EventKind::SchedSwitch(_)) && tids.contains(&event.tid) {
            own.entry(event.tid).or_default().push(event.ts);
        }
        if let EventKind::SchedSwitch(sw) = event.kind {
            if tids.contains(&sw.prev_tid) {
                switches
                    .entry(sw.prev_tid)
                    .or_default()
                    .push((event.ts, false));
            }
            if tids.contains(&sw.next_tid) {
                switches
                    .entry(sw.next_tid)
                    .or_default()
                    .push((event.ts, true));
            }
        }
    }
    // The switches out of the idle task that ftrace lost, as the recorder's
    // eBPF capture saw them (the analysis takes them the same way).
    let captured = deepspan_run::Run::new(run).idle_switches();
    if captured.is_file() {
        for s in deepspan_record::read_idle_switches(&captured).unwrap() {
            if tids.contains(&s.tid) {
                switches.entry(s.tid).or_default().push((s.mono_ns, true));
            }
        }
        for history in switches.values_mut() {
            history.sort_by_key(|&(ts, into)| (ts, into));
        }
    }
    let manifest: J =
        serde_json::from_slice(&std::fs::read(run.join("manifest.json")).unwrap()).unwrap();
    let lost = manifest["lost_events"].as_u64().unwrap();
    let (mut running, mut unseen, mut inferred) = (0, 0, 0);
    for span in spans {
        let tid = span.sync.tid.unwrap();
        let start = span.sync.mono_start_ns.unwrap();
        // Held from its start; active from the moment it became current.
        let held = activity.held_at(tid, start + 1);
        assert!(
            held.iter().any(|r| r.span_id == span.span_id),
            "span not held by its thread at {start}"
        );
        let first_on = span
            .sync
            .activations
            .iter()
            .find(|a| a.on)
            .expect("an activation");
        assert_eq!(first_on.tid, tid);
        let active = activity
            .active_at(tid, first_on.mono_ns + 1)
            .expect("span active once current");
        assert_eq!(
            active.span_id, span.span_id,
            "the activity map names another span"
        );
        let last = switches
            .get(&(tid as i32))
            .and_then(|h| h.iter().rev().find(|(ts, _)| *ts <= start));
        // This VM's ftrace loses most switch-ins out of the idle task; the
        // recorder's capture has them (above), and where a trace has no
        // capture the thread's own events show it ran again, which is how
        // the analysis infers the switch then.
        let ran_after = |after: u64| {
            own.get(&(tid as i32))
                .is_some_and(|t| t.iter().any(|&e| e >= after && e <= start))
        };
        match last {
            Some(&(_, true)) => running += 1,
            Some(&(ts, false)) if ran_after(ts + 1) => inferred += 1,
            // Its only switch-in so far was such a missing one.
            None if ran_after(0) => inferred += 1,
            Some(&(ts, false)) => panic!(
                "thread {tid} was switched out at {ts} and not back in before span {} started at {start} ({lost} lost events; {:?})",
                span.span_id, switches.get(&(tid as i32))
            ),
            None => unseen += 1,
        }
    }
    // A thread's first switch-in can only be missing if the ring buffer
    // overran (overwrite mode drops the oldest pages), which the run counts.
    assert!(
        unseen == 0 || lost > 0,
        "{unseen} spans on threads never switched in, with no lost events"
    );
    // Every span was checked, on a recorded switch-in or on one the
    // analysis infers; how many of each depends on how many switches this
    // kernel dropped, so no share is asked for. That the reader lost none
    // of the switches the kernel did record is checked against trace-cmd.
    assert_eq!(running + inferred + unseen, spans.len());
    assert_eq!(
        switch_count,
        trace_cmd_sched_switches(&run.join("kernel/trace.dat")),
        "sched_switch events read, against trace-cmd report ({running} spans on recorded switch-ins, {inferred} on inferred ones)"
    );
}

/// sched_switch lines of `trace-cmd report`, the oracle for trace.dat.
fn trace_cmd_sched_switches(path: &Path) -> usize {
    let out = std::process::Command::new("trace-cmd")
        .arg("report")
        .arg(path)
        .output()
        .expect("run trace-cmd report");
    assert!(
        out.status.success(),
        "trace-cmd report {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(" sched_switch:"))
        .count()
}

#[test]
fn record_on_a_busy_otlp_port_names_it_and_the_flags() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = deepspan()
        .args(["record", "-o"])
        .arg(&run)
        .args([
            "--otlp-grpc-port",
            "0",
            "--otlp-http-port",
            &port,
            "--duration",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("OTLP/HTTP port {port} is not available"))
            && stderr.contains("--otlp-http-port")
            && stderr.contains("--no-otlp"),
        "{stderr}"
    );
    assert!(!run.exists(), "nothing left behind");
}
