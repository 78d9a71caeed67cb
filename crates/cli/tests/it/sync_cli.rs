//! `deepspan sync`, run as a user runs it: runs whose client/server spans
//! were made from a known clock transform, and the corpus' CTF traces.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::{deepspan, testdata};
use serde_json::{json, Value as J};

const SECOND: u64 = 1_000_000_000;

/// Deterministic pseudo-random numbers (splitmix64) for the synthetic spans.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// A network delay: 30 µs plus an exponential of mean 40 µs.
    fn delay(&mut self) -> u64 {
        30_000 + (-40_000.0 * self.unit().ln()) as u64
    }
}

/// beta's clock from alpha's: +31 ppm, 2.75 s ahead.
fn beta_of_alpha(alpha_ns: u64) -> u64 {
    alpha_ns + alpha_ns * 31 / 1_000_000 + 2_750_000_000
}

const ALPHA_START: u64 = 5_000 * SECOND;

fn span(trace: u64, id: u64, parent: Option<u64>, kind: u32, start: u64, end: u64) -> J {
    let mut span = json!({
        "traceId": format!("{trace:032x}"),
        "spanId": format!("{id:016x}"),
        "name": if kind == 3 { "GET /item" } else { "handle /item" },
        "kind": kind,
        // Wall times a day off, so that only the deepspan fields place them.
        "startTimeUnixNano": (start + 86_400 * SECOND).to_string(),
        "endTimeUnixNano": (end + 86_400 * SECOND).to_string(),
        "attributes": [
            {"key": "deepspan.mono_start_ns", "value": {"intValue": start.to_string()}},
            {"key": "deepspan.mono_end_ns", "value": {"intValue": end.to_string()}},
        ],
    });
    if let Some(p) = parent {
        span["parentSpanId"] = json!(format!("{p:016x}"));
    }
    span
}

fn otlp(service: &str, spans: Vec<J>) -> J {
    json!({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
        "scopeSpans": [{"scope": {"name": "test"}, "spans": spans}],
    }]})
}

/// A run folder holding `doc`'s spans and a manifest naming `host`.
fn make_run(dir: &Path, host: &str, doc: &J) -> PathBuf {
    let run = dir.join(host);
    let file = dir.join(format!("{host}.json"));
    std::fs::write(&file, doc.to_string()).unwrap();
    let out = deepspan()
        .args(["import", "-o"])
        .arg(&run)
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(run.join("manifest.json"), json!({"host": host}).to_string()).unwrap();
    run
}

/// alpha calls beta 300 times over 10 s; gamma only calls itself.
fn three_runs(dir: &Path) -> [PathBuf; 3] {
    let mut random = Random(19);
    let (mut clients, mut servers, mut local) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..300u64 {
        let client_start = ALPHA_START + (10.0 * SECOND as f64 * random.unit()) as u64;
        let server_start = client_start + random.delay();
        let server_end = server_start + 200_000 + random.next() % 500_000;
        let client_end = server_end + random.delay();
        let (trace, client, server) = (1000 + i, 2 * i + 1, 2 * i + 2);
        clients.push(span(trace, client, None, 3, client_start, client_end));
        servers.push(span(
            trace,
            server,
            Some(client),
            2,
            beta_of_alpha(server_start),
            beta_of_alpha(server_end),
        ));
        local.push(span(
            trace + 1_000_000,
            client,
            None,
            3,
            client_start,
            client_end,
        ));
        local.push(span(
            trace + 1_000_000,
            server,
            Some(client),
            2,
            server_start,
            server_end,
        ));
    }
    [
        make_run(dir, "alpha", &otlp("front", clients)),
        make_run(dir, "beta", &otlp("items", servers)),
        make_run(dir, "gamma", &otlp("batch", local)),
    ]
}

fn sync(args: &[&Path], extra: &[&str]) -> Output {
    deepspan()
        .arg("sync")
        .args(args)
        .args(extra)
        .output()
        .unwrap()
}

fn ok_stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn span_pairs_recover_the_clock_of_the_other_run() {
    let dir = tempfile::tempdir().unwrap();
    let [alpha, beta, gamma] = three_runs(dir.path());
    let out = sync(&[&alpha, &beta, &gamma], &["--format", "json"]);
    let stdout = ok_stdout(&out);
    let doc: J = serde_json::from_str(&stdout).unwrap();
    assert_eq!(doc["reference"], "alpha");
    let hosts = doc["hosts"].as_array().unwrap();
    // The keys in the issue's order (serde_json's Value would sort them).
    let order = [
        "\"host\"",
        "\"input\"",
        "\"slope\"",
        "\"offset_ns\"",
        "\"quality\"",
        "\"matched\"",
    ];
    for object in stdout.split('{').skip(2) {
        let at: Vec<usize> = order
            .iter()
            .map(|k| object.find(k).expect(object))
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{object}");
    }
    assert!(stdout.find("\"reference\"").unwrap() < stdout.find("\"hosts\"").unwrap());
    let summary: Vec<(&str, &str, u64)> = hosts
        .iter()
        .map(|h| {
            (
                h["host"].as_str().unwrap(),
                h["quality"].as_str().unwrap(),
                h["matched"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("alpha", "accurate", 0),
            ("beta", "accurate", 600),
            ("gamma", "fail", 0)
        ]
    );
    assert_eq!(hosts[1]["input"], beta.display().to_string());
    // beta's times over the 10 s, mapped back onto alpha's clock.
    let (slope, offset) = (
        hosts[1]["slope"].as_f64().unwrap(),
        hosts[1]["offset_ns"].as_f64().unwrap(),
    );
    for i in 0..=10 {
        let a = ALPHA_START + i * SECOND;
        let b = beta_of_alpha(a);
        let mapped = b as i128 + ((slope - 1.0) * b as f64 + offset).round() as i128;
        let error = (mapped - a as i128).abs();
        assert!(error < 1_000, "at {i} s: off by {error} ns");
    }

    // With beta as the reference, alpha is mapped the other way.
    let out = sync(
        &[&alpha, &beta],
        &["--format", "json", "--reference", "beta"],
    );
    let doc: J = serde_json::from_str(&ok_stdout(&out)).unwrap();
    assert_eq!(doc["reference"], "beta");
    let alpha_slope = doc["hosts"][0]["slope"].as_f64().unwrap();
    assert!(
        (alpha_slope * slope - 1.0).abs() < 1e-9,
        "{alpha_slope} · {slope}"
    );
}

#[test]
fn text_output_is_a_table_with_the_drift() {
    let dir = tempfile::tempdir().unwrap();
    let [alpha, beta, _] = three_runs(dir.path());
    let out = sync(&[&beta, &alpha], &[]);
    let text = ok_stdout(&out);
    assert!(text.starts_with("reference clock: beta"), "{text}");
    let alpha_row = text.lines().find(|l| l.starts_with("alpha ")).expect(&text);
    let cells: Vec<&str> = alpha_row.split_whitespace().collect();
    assert_eq!(&cells[..3], ["alpha", "accurate", "600"], "{alpha_row}");
    // beta's clock runs 31 ppm fast, so alpha's time onto beta's has a
    // slope of 1 + 31 ppm (within 0.1 ppm: 100 ns over a second).
    let drift: f64 = cells[3].parse().unwrap();
    assert!((drift - 31.0).abs() < 0.1, "{alpha_row}");
    let offset: f64 = cells[4].parse().unwrap();
    let at_start = offset + drift * 1e-6 * ALPHA_START as f64;
    let true_at_start = (beta_of_alpha(ALPHA_START) - ALPHA_START) as f64;
    // The drift is printed to 0.001 ppm, 5 µs over the 5000 s of uptime.
    assert!((at_start - true_at_start).abs() < 10_000.0, "{alpha_row}");
}

#[test]
fn bad_inputs_say_which_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let [alpha, _, _] = three_runs(dir.path());
    let stderr = |out: Output| {
        assert!(!out.status.success());
        String::from_utf8(out.stderr).unwrap()
    };
    let missing = dir.path().join("nowhere");
    let e = stderr(sync(&[&missing], &[]));
    assert!(
        e.contains("nowhere") && e.contains("not a run folder"),
        "{e}"
    );
    let e = stderr(sync(&[&alpha, &alpha], &[]));
    assert!(e.contains("both host alpha"), "{e}");
    let e = stderr(sync(&[&alpha], &["--reference", "delta"]));
    assert!(
        e.contains("--reference delta") && e.contains("hosts: alpha"),
        "{e}"
    );
    std::fs::write(alpha.join("manifest.json"), "{\"host\": 3}").unwrap();
    let e = stderr(sync(&[&alpha], &[]));
    assert!(
        e.contains("manifest.json") && e.contains("\"host\" must be a non-empty string"),
        "{e}"
    );
}

#[test]
fn ctf_traces_are_hosts_by_their_hostname_and_say_why_nothing_matched() {
    let ctf = testdata("kernel/ctf");
    let arm = ctf.join("bug446190/trace");
    let qemu = ctf.join("flipping-endianness/trace");
    let out = sync(&[&arm, &qemu], &["--format", "json"]);
    let doc: J = serde_json::from_str(&ok_stdout(&out)).unwrap();
    assert_eq!(doc["reference"], "lager");
    assert_eq!(doc["hosts"][1]["host"], "qemu0");
    assert_eq!(doc["hosts"][1]["quality"], "fail");
    let stderr = String::from_utf8(out.stderr).unwrap();
    // bug446190 has 16 net_dev_queue and 326 netif_receive_skb, without TCP headers.
    assert!(
        stderr.contains("342 packet events, none with TCP header fields"),
        "{stderr}"
    );
}

/// A minimal LTTng-like CTF trace: the hostname in the environment, one
/// stream, and TCP segment events whose header fields sit in a nested
/// struct, as `net_dev_queue` / `netif_receive_skb` carry them.
const CTF_METADATA: &str = r#"/* CTF 1.8 */
typealias integer { size = 8; align = 8; signed = false; } := uint8_t;
typealias integer { size = 32; align = 8; signed = false; } := uint32_t;
typealias integer { size = 64; align = 8; signed = false; } := uint64_t;
trace {
    major = 1;
    minor = 8;
    byte_order = le;
    packet.header := struct { uint32_t magic; uint32_t stream_id; };
};
env {
    hostname = "HOST";
    domain = "kernel";
    tracer_name = "lttng-modules";
};
clock { name = "monotonic"; freq = 1000000000; offset_s = 0; offset = 0; };
typealias integer { size = 64; align = 8; signed = false; map = clock.monotonic.value; } := uint64_clock_t;
stream {
    id = 0;
    packet.context := struct {
        uint64_clock_t timestamp_begin;
        uint64_clock_t timestamp_end;
        uint64_t content_size;
        uint64_t packet_size;
        uint32_t cpu_id;
    };
    event.header := struct { uint32_t id; uint64_clock_t timestamp; };
};
event {
    name = "net_dev_queue";
    id = 0;
    stream_id = 0;
    fields := struct {
        uint64_t _skbaddr;
        struct { uint32_t _seq; uint32_t _ack_seq; uint8_t _flags; } _network_header;
    };
};
event {
    name = "netif_receive_skb";
    id = 1;
    stream_id = 0;
    fields := struct {
        uint64_t _skbaddr;
        struct { uint32_t _seq; uint32_t _ack_seq; uint8_t _flags; } _network_header;
    };
};
"#;

/// (event id: 0 sent, 1 received; ts; seq) of one host.
fn write_ctf(dir: &Path, host: &str, mut events: Vec<(u32, u64, u32)>) -> PathBuf {
    events.sort_by_key(|e| e.1);
    let trace = dir.join(host);
    std::fs::create_dir_all(&trace).unwrap();
    std::fs::write(trace.join("metadata"), CTF_METADATA.replace("HOST", host)).unwrap();
    let mut body = Vec::new();
    for &(id, ts, seq) in &events {
        body.extend_from_slice(&id.to_le_bytes());
        body.extend_from_slice(&ts.to_le_bytes());
        body.extend_from_slice(&0xffff_8800_0000_0000u64.to_le_bytes());
        body.extend_from_slice(&seq.to_le_bytes());
        body.extend_from_slice(&(seq ^ 0x5555).to_le_bytes()); // ack_seq
        body.push(0x18); // PSH|ACK
    }
    let header_len = 4 + 4 + 8 + 8 + 8 + 8 + 4;
    let size_bits = ((header_len + body.len()) * 8) as u64;
    let mut packet = Vec::new();
    packet.extend_from_slice(&0xC1FC_1FC1u32.to_le_bytes());
    packet.extend_from_slice(&0u32.to_le_bytes());
    packet.extend_from_slice(&events[0].1.to_le_bytes());
    packet.extend_from_slice(&events[events.len() - 1].1.to_le_bytes());
    packet.extend_from_slice(&size_bits.to_le_bytes());
    packet.extend_from_slice(&size_bits.to_le_bytes());
    packet.extend_from_slice(&0u32.to_le_bytes());
    packet.extend_from_slice(&body);
    std::fs::write(trace.join("stream_0"), packet).unwrap();
    trace
}

/// hotel's clock from india's: −12 ppm, 41 ms behind.
fn hotel_of_india(india_ns: u64) -> u64 {
    india_ns - india_ns * 12 / 1_000_000 - 41_000_000
}

#[test]
fn tcp_segments_of_two_ctf_traces_recover_their_clocks() {
    let dir = tempfile::tempdir().unwrap();
    let mut random = Random(7);
    let (mut india, mut hotel) = (Vec::new(), Vec::new());
    let start = 1_000 * SECOND;
    for k in 0..200u32 {
        // india → hotel, then hotel → india, at random times over 10 s.
        let send = start + (10.0 * SECOND as f64 * random.unit()) as u64;
        india.push((0, send, k));
        hotel.push((1, hotel_of_india(send + random.delay()), k));
        let receive = start + (10.0 * SECOND as f64 * random.unit()) as u64;
        hotel.push((0, hotel_of_india(receive - random.delay()), 100_000 + k));
        india.push((1, receive, 100_000 + k));
    }
    // A segment india sends and sees come back with the same header (a
    // loopback capture): never matched with itself.
    india.push((0, start + 5 * SECOND, 77_777));
    india.push((1, start + 5 * SECOND + 1_000, 77_777));
    let india_dir = write_ctf(dir.path(), "india", india);
    let hotel_dir = write_ctf(dir.path(), "hotel", hotel);
    let out = sync(&[&india_dir, &hotel_dir], &["--format", "json"]);
    let doc: J = serde_json::from_str(&ok_stdout(&out)).unwrap();
    assert_eq!(doc["reference"], "india");
    let h = &doc["hosts"][1];
    assert_eq!(
        (
            h["host"].as_str(),
            h["quality"].as_str(),
            h["matched"].as_u64()
        ),
        (Some("hotel"), Some("accurate"), Some(400))
    );
    let (slope, offset) = (
        h["slope"].as_f64().unwrap(),
        h["offset_ns"].as_f64().unwrap(),
    );
    for i in 0..=10 {
        let a = start + i * SECOND;
        let b = hotel_of_india(a);
        let mapped = b as i128 + ((slope - 1.0) * b as f64 + offset).round() as i128;
        let error = (mapped - a as i128).abs();
        assert!(error < 1_000, "at {i} s: off by {error} ns");
    }
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("0 client/server span pairs and 400 TCP segments matched"),
        "{stderr}"
    );

    // The same trace imported into a run: the run is host india (from the
    // trace, as it has no manifest) and its segments count.
    let run = dir.path().join("india-run");
    let import = deepspan()
        .args(["import", "-o"])
        .arg(&run)
        .arg("--ctf")
        .arg(&india_dir)
        .output()
        .unwrap();
    assert!(
        import.status.success(),
        "{}",
        String::from_utf8_lossy(&import.stderr)
    );
    let out = sync(&[&hotel_dir, &run], &["--format", "json"]);
    let doc: J = serde_json::from_str(&ok_stdout(&out)).unwrap();
    assert_eq!(doc["reference"], "hotel");
    let h = &doc["hosts"][1];
    assert_eq!(
        (
            h["host"].as_str(),
            h["quality"].as_str(),
            h["matched"].as_u64()
        ),
        (Some("india"), Some("accurate"), Some(400))
    );
    let slope = h["slope"].as_f64().unwrap();
    // hotel runs 12 ppm slow: india onto hotel has a slope of 1 − 12 ppm.
    assert!(
        (slope - 1.0 + 12e-6).abs() < 1e-7,
        "india onto hotel: slope {slope}"
    );
}
