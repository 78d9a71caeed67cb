//! `/metrics` over a real socket: a plain HTTP GET, the exposition parsed
//! line by line (names, labels, values) after a few increments, the
//! forwarder's counters read at scrape time, loopback only unless asked.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use deepspan_agent::forward::{EncodedRequest, ForwardConfig, Forwarder};
use deepspan_agent::metrics::{AgentMetrics, Error};

fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

/// `name{labels}` → value, for every sample line; checks the comment lines
/// and the closing `# EOF`.
fn parse(text: &str) -> BTreeMap<String, f64> {
    assert!(text.ends_with("# EOF\n"), "{text}");
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if let Some(comment) = line.strip_prefix("# ") {
            let word = comment.split_whitespace().next().unwrap();
            assert!(["HELP", "TYPE", "UNIT", "EOF"].contains(&word), "{line}");
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        let name = series.split('{').next().unwrap();
        assert!(
            name.starts_with("deepspan_agent_")
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line}"
        );
        if let Some(labels) = series.strip_prefix(name) {
            if !labels.is_empty() {
                let inner = labels.strip_prefix('{').unwrap().strip_suffix('}').unwrap();
                for pair in inner.split(',') {
                    let (k, v) = pair.split_once('=').unwrap();
                    assert!(k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
                    assert!(v.starts_with('"') && v.ends_with('"'), "{line}");
                }
            }
        }
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
        samples.insert(series.to_string(), value);
    }
    samples
}

#[test]
fn metrics_are_served_and_parse() {
    let metrics = AgentMetrics::new();
    // A forwarder to a port nobody listens on, budget of one request: its
    // counters show up at scrape time.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let forwarder = Forwarder::start(
        &format!("http://127.0.0.1:{port}"),
        ForwardConfig {
            max_queue_bytes: 100,
            ..ForwardConfig::default()
        },
    )
    .unwrap();
    metrics.watch_forwarder(forwarder.stats_handle());
    for _ in 0..3 {
        forwarder.send(EncodedRequest {
            bytes: vec![0u8; 60].into(),
            spans: 5,
        });
    }
    forwarder.send(EncodedRequest {
        bytes: vec![0u8; 101].into(),
        spans: 7,
    });
    metrics.spans_received.inc_by(20);
    metrics.anomalies.inc();
    metrics.within_tail.inc_by(3);
    metrics.snapshots_taken.inc();
    metrics.skip_snapshot("rate_limit");
    metrics.skip_snapshot("rate_limit");
    metrics.skip_snapshot("left_ring_buffer");
    metrics.drop_spans("diagnosis_wait_full", 4);

    let server = metrics
        .serve("127.0.0.1:0".parse().unwrap(), false)
        .unwrap();
    let (head, body) = get(server.local_addr(), "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    let samples = parse(&body);
    let at = |k: &str| {
        *samples
            .get(k)
            .unwrap_or_else(|| panic!("no {k} in\n{body}"))
    };
    for (series, want) in [
        ("deepspan_agent_spans_received_total", 20.0),
        ("deepspan_agent_anomalies_total", 1.0),
        ("deepspan_agent_anomalies_within_tail_total", 3.0),
        ("deepspan_agent_snapshots_total", 1.0),
        (
            r#"deepspan_agent_snapshots_skipped_total{reason="rate_limit"}"#,
            2.0,
        ),
        (
            r#"deepspan_agent_snapshots_skipped_total{reason="left_ring_buffer"}"#,
            1.0,
        ),
        (
            r#"deepspan_agent_spans_dropped_total{reason="diagnosis_wait_full"}"#,
            4.0,
        ),
        (
            r#"deepspan_agent_forward_spans_dropped_total{reason="oversize"}"#,
            7.0,
        ),
        ("deepspan_agent_forward_spans_sent_total", 0.0),
    ] {
        assert_eq!(at(series), want, "{series}");
    }
    // One 60-byte request fits the budget of 100; the two older ones were
    // pushed out (counted once the try under way, if any, has failed).
    assert_eq!(at("deepspan_agent_forward_queue_bytes"), 60.0);
    assert_eq!(at("deepspan_agent_forward_queue_bytes_peak"), 60.0);
    assert!(at("deepspan_agent_resident_memory_bytes") > 1e6);

    let (head, _) = get(server.local_addr(), "/other");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");

    let line = metrics.summary_line();
    for part in [
        "spans in 20",
        "anomalies 1 (3 more within their tail)",
        "snapshots 1",
        "rate_limit 2",
        "left_ring_buffer 1",
        "diagnosis_wait_full 4",
        "forward oversize 7",
        "queue 60 B",
        "RSS ",
    ] {
        assert!(line.contains(part), "{part:?} not in {line:?}");
    }
    let addr = server.local_addr();
    server.shutdown();
    assert!(
        TcpStream::connect(addr).is_err(),
        "still listening after shutdown"
    );
    drop(forwarder);
}

#[test]
fn only_loopback_unless_asked() {
    let metrics = AgentMetrics::new();
    assert!(matches!(
        metrics.serve("0.0.0.0:0".parse().unwrap(), false),
        Err(Error::NotLoopback(_))
    ));
    let server = metrics.serve("0.0.0.0:0".parse().unwrap(), true).unwrap();
    let port = server.local_addr().port();
    let (head, _) = get(SocketAddr::from(([127, 0, 0, 1], port)), "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}
