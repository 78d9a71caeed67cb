//! `deploy/` as users deploy the agent: the Kubernetes DaemonSet decoded
//! strictly into k8s.io/api's types and held to what the agent needs
//! (deploy/check), the systemd unit through `systemd-analyze verify`, and
//! the container image (deploy/agent/image.sh: the binary in an empty
//! image) run by podman, first without what the agent needs of the host,
//! then as the DaemonSet runs it, forwarding what it receives to Jaeger.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use deepspan_jaeger_test::{free_fixed_port, go_program, Jaeger};

use crate::common::podman::{agent_container, agent_image, podman, podman_or_skip};
use crate::common::{kernel_or_skip, one_at_a_time, repo};

/// Whether a tool a system test needs is here; it must be when
/// `DEEPSPAN_REQUIRE_KERNEL` is set (`make test`, whose set-up installs it).
fn have(tool: &str, installed_by: &str) -> bool {
    let here = Command::new(tool).arg("--version").output().is_ok();
    assert!(
        here || std::env::var_os("DEEPSPAN_REQUIRE_KERNEL").is_none(),
        "{tool} is not installed ({installed_by} installs it)"
    );
    here
}

fn manifest_check(files: &[PathBuf]) -> Output {
    Command::new(go_program("deploy/check", "manifest-check"))
        .args(files)
        .output()
        .expect("run the manifest check")
}

#[test]
#[ignore = "system: Go and the module cache"]
fn the_daemonset_decodes_strictly_and_gives_the_agent_what_it_needs() {
    if !have("go", "the toolchain") {
        return;
    }
    let daemonset = repo().join("deploy/agent/daemonset.yaml");
    let out = manifest_check(std::slice::from_ref(&daemonset));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The check can fail: a misspelt field, and a DaemonSet without the
    // host's PID namespace or a capability.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&daemonset).unwrap();
    let cases = [
        (
            "misspelt.yaml",
            text.replace("hostPID:", "hostPid:"),
            r#"unknown field "spec.template.spec.hostPid""#,
        ),
        (
            "no-perfmon.yaml",
            text.replace(r#"add: ["BPF", "PERFMON"]"#, r#"add: ["BPF"]"#),
            "capability PERFMON is not added",
        ),
        (
            "no-tracefs.yaml",
            text.replace("mountPath: /sys/kernel/tracing", "mountPath: /mnt/tracing"),
            "the host's /sys/kernel/tracing must be mounted",
        ),
    ];
    for (name, broken, said) in cases {
        assert_ne!(broken, text, "{name}: the replacement did not apply");
        let path = dir.path().join(name);
        std::fs::write(&path, broken).unwrap();
        let out = manifest_check(&[path]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} passed the check");
        assert!(stderr.contains(said), "{name}: {stderr}");
    }
}

#[test]
#[ignore = "system: systemd-analyze"]
fn the_systemd_unit_verifies_without_a_warning() {
    if !have("systemd-analyze", "Debian's systemd") {
        return;
    }
    // verify checks that the program exists: the unit as installed, with
    // this build's binary where the unit expects /usr/local/bin/deepspan.
    let dir = tempfile::tempdir().unwrap();
    let unit = std::fs::read_to_string(repo().join("deploy/agent/deepspan-agent.service"))
        .unwrap()
        .replace("/usr/local/bin/deepspan", env!("CARGO_BIN_EXE_deepspan"));
    let path = dir.path().join("deepspan-agent.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Unknown keys are warnings, with the exit status 0.
    assert!(
        out.status.success() && !stderr.contains("deepspan-agent.service"),
        "{stderr}"
    );
}

/// One OTLP/JSON request of one server span to `port` on loopback.
fn post_span(port: u16, trace_id: &str) -> u16 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let body = format!(
        r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"in-a-container"}}}}]}},"scopeSpans":[{{"spans":[{{"traceId":"{trace_id}","spanId":"00f067aa0ba902b7","name":"GET /","kind":2,"startTimeUnixNano":"{}","endTimeUnixNano":"{now}"}}]}}]}}]}}"#,
        now - 5_000_000
    );
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

#[test]
#[ignore = "system: root, tracefs, podman"]
fn the_agent_image_runs_as_the_daemonset_runs_it() {
    if !kernel_or_skip("the_agent_image_runs_as_the_daemonset_runs_it") || !podman_or_skip() {
        return;
    }
    let _one = one_at_a_time();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let tag = agent_image();

    // Without the host's PID namespace, tracefs or the capabilities: it
    // says which, and how to give each.
    let bare = podman()
        .args(["run", "--rm", "--network", "host", tag])
        .args(["--forward", "http://127.0.0.1:9", "--duration", "1"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&bare.stderr);
    assert!(!bare.status.success(), "the agent started bare: {said}");
    for needed in [
        "-v /sys/kernel/tracing:/sys/kernel/tracing",
        "--pid host",
        "--cap-add BPF,PERFMON",
    ] {
        assert!(said.contains(needed), "no {needed:?} in: {said}");
    }

    // As the DaemonSet runs it: a span sent to it reaches Jaeger, and it
    // records without leaving anything out.
    let jaeger = Jaeger::start();
    let (grpc, http) = (free_fixed_port(), free_fixed_port());
    let snapshots = dir.path().join("snapshots");
    std::fs::create_dir(&snapshots).unwrap();
    let name = format!("deepspan-agent-test-{}", std::process::id());
    let mut agent = agent_container(&name, &snapshots)
        .arg(format!("--forward=http://127.0.0.1:{}", jaeger.otlp_http))
        .arg(format!("--snapshots={}", snapshots.display()))
        .arg("--no-metrics")
        .arg(format!("--otlp-grpc-port={grpc}"))
        .arg(format!("--otlp-http-port={http}"))
        .args(["--duration", "8"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", http)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(60) && agent.try_wait().unwrap().is_none(),
            "the agent in its container did not listen on {http}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    assert_eq!(post_span(http, trace_id), 200);
    let done = agent.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "{log}");
    assert!(
        !log.contains("warning"),
        "it records without something: {log}"
    );
    // Jaeger answers before it stores.
    let waited = Instant::now();
    let trace = loop {
        if let Some(trace) = jaeger.find_trace(trace_id) {
            break trace;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "the span is not in Jaeger: {log}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(trace["spans"][0]["operationName"], "GET /", "{trace}");
}
