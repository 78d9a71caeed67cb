//! Two hosts on one machine: a client and a server in two network
//! namespaces joined by a veth pair, recorded as two runs (`record --pid
//! … --host … --tcp-keys`), and, at the same time, as one run of both.
//! The server's run is given a synthetic clock (−37 ppm, 3.7 s ahead), as
//! if it were another machine.
//!
//! - `deepspan sync` recovers that clock from the TCP segments within 1 µs
//!   over the run;
//! - `deepspan analyze CLIENT_RUN SERVER_RUN --out MERGED` gives every
//!   request the critical path the single run gives it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{
    check, deepspan, kernel_or_skip, one_at_a_time, recording_started, wait_until, workload,
    KillOnDrop,
};
use serde_json::Value;

/// The synthetic clock of the server's host: `t · SLOPE + OFFSET`. A slope
/// below 1 keeps every trace.dat delta within its bits.
const SLOPE: f64 = 1.0 - 37e-6;
const OFFSET_NS: f64 = 3.7e9;

fn skewed(t: u64) -> u64 {
    (t as i128 + ((SLOPE - 1.0) * t as f64 + OFFSET_NS).round() as i128) as u64
}

/// Calls the client makes: about 4 ms each, so the run lasts about 10 s.
const CALLS: u32 = 2400;

/// Two network namespaces joined by a veth pair; removed on drop.
struct Namespaces {
    client: String,
    server: String,
    server_addr: String,
}

impl Namespaces {
    fn create() -> Namespaces {
        let pid = std::process::id();
        let ns = Namespaces {
            client: format!("ds-hosts-a-{pid}"),
            server: format!("ds-hosts-b-{pid}"),
            server_addr: format!("169.254.{}.2", 200 + pid % 50),
        };
        let client_addr = format!("169.254.{}.1", 200 + pid % 50);
        let (near, far) = (format!("dsa{pid}"), format!("dsb{pid}"));
        let ip = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().expect("run ip");
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        ip(&["netns", "add", &ns.client]);
        ip(&["netns", "add", &ns.server]);
        ip(&[
            "link", "add", &near, "netns", &ns.client, "type", "veth", "peer", "name", &far,
            "netns", &ns.server,
        ]);
        for (name, dev, addr) in [
            (&ns.client, &near, &client_addr),
            (&ns.server, &far, &ns.server_addr),
        ] {
            ip(&["-n", name, "addr", "add", &format!("{addr}/30"), "dev", dev]);
            ip(&["-n", name, "link", "set", dev, "up"]);
            ip(&["-n", name, "link", "set", "lo", "up"]);
        }
        ns
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in [&self.client, &self.server] {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}

/// Starts the workload `args` in namespace `ns`; returns it with the first
/// line it prints (its pid and, for the server, its port).
fn start_in(ns: &str, args: &[&str]) -> (KillOnDrop, Value) {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(workload())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the workload");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let hello: Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{args:?} said {line:?}: {e}"));
    (KillOnDrop(child), hello)
}

/// Background TCP traffic between the namespaces, as any host has: a
/// Python echo of 32-byte messages every 0.2 ms or so (bounded: at most
/// ECHO_ROUNDS round trips, or ECHO_SECONDS). Its segments give the clock
/// sync many more matched pairs; its processes are in neither run's pid
/// filter, so their events stay out of the kernel traces.
const ECHO_SERVER: &str = "
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen()
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    d = c.recv(64)
    if not d: break
    c.sendall(d)
";
const ECHO_CLIENT: &str = "
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
sys.stdin.readline()
deadline = time.monotonic() + float(sys.argv[4])
for _ in range(int(sys.argv[3])):
    if time.monotonic() > deadline: break
    c.sendall(b'x' * 32)
    n = 0
    while n < 32:
        n += len(c.recv(64))
    time.sleep(0.0002)
";
const ECHO_ROUNDS: u32 = 60_000;
const ECHO_SECONDS: f64 = 15.0;

fn start_echo(ns: &Namespaces) -> (KillOnDrop, KillOnDrop) {
    let python = |netns: &str, program: &str, args: &[String]| {
        Command::new("ip")
            .args(["netns", "exec", netns, "python3", "-c", program])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start python3")
    };
    let mut server = python(
        &ns.server,
        ECHO_SERVER,
        std::slice::from_ref(&ns.server_addr),
    );
    let mut port = String::new();
    BufReader::new(server.stdout.as_mut().unwrap())
        .read_line(&mut port)
        .unwrap();
    let client = python(
        &ns.client,
        ECHO_CLIENT,
        &[
            ns.server_addr.clone(),
            port.trim().to_string(),
            ECHO_ROUNDS.to_string(),
            ECHO_SECONDS.to_string(),
        ],
    );
    (KillOnDrop(server), KillOnDrop(client))
}

/// Starts `deepspan record` of `pids` into `run` and waits until it traces.
fn start_recording(run: &Path, pids: &[i64], host: Option<&str>) -> KillOnDrop {
    let mut cmd = deepspan();
    cmd.arg("record")
        .arg("-o")
        .arg(run)
        .args(["--no-otlp", "--tcp-keys"]);
    for pid in pids {
        cmd.args(["--pid", &pid.to_string()]);
    }
    if let Some(host) = host {
        cmd.args(["--host", host]);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start deepspan record");
    let recorder = KillOnDrop(child);
    wait_until(
        &format!("deepspan record into {} to start", run.display()),
        Duration::from_secs(120),
        || recording_started(recorder.0.id()),
    );
    recorder
}

fn stop_recording(mut recorder: KillOnDrop, run: &Path) {
    unsafe { libc::kill(recorder.0.id() as i32, libc::SIGINT) };
    let child = std::mem::replace(&mut recorder.0, Command::new("true").spawn().unwrap());
    let out = child.wait_with_output().unwrap();
    check(&format!("deepspan record into {}", run.display()), out);
}

fn import(run: &Path, spans: &Path) {
    check(
        "deepspan import",
        deepspan()
            .arg("import")
            .arg("-o")
            .arg(run)
            .arg("--otlp")
            .arg(spans)
            .output()
            .unwrap(),
    );
}

/// The server's run as another host's: every kernel, span and segment
/// time through [`skewed`].
fn skew_run(from: &Path, to: &Path, server_spans: &Path) {
    std::fs::create_dir_all(to.join("kernel")).unwrap();
    let stats = deepspan_ftrace::retime_trace_dat(
        &from.join("kernel/trace.dat"),
        &to.join("kernel/trace.dat"),
        &skewed,
    )
    .expect("retime the server's trace.dat");
    eprintln!("retimed: {stats:?}");
    for file in ["kernel/saved_tgids", "processes.json"] {
        if from.join(file).is_file() {
            std::fs::copy(from.join(file), to.join(file)).unwrap();
        }
    }
    let mut manifest: Value =
        serde_json::from_slice(&std::fs::read(from.join("manifest.json")).unwrap()).unwrap();
    for point in ["start", "end"] {
        let mono = manifest[point]["mono_ns"].as_u64().unwrap();
        manifest[point]["mono_ns"] = skewed(mono).into();
    }
    for sample in manifest["clock_samples"].as_array_mut().unwrap() {
        sample[1] = skewed(sample[1].as_u64().unwrap()).into();
    }
    std::fs::write(
        to.join("manifest.json"),
        serde_json::to_vec_pretty(&manifest).unwrap(),
    )
    .unwrap();
    let segments = std::fs::read_to_string(from.join("kernel/tcp_segments.tsv")).unwrap();
    let mut out = String::new();
    for line in segments.lines() {
        let mut fields: Vec<String> = line.split(' ').map(str::to_string).collect();
        if !line.starts_with('#') {
            fields[1] = skewed(fields[1].parse().unwrap()).to_string();
        }
        out.push_str(&fields.join(" "));
        out.push('\n');
    }
    std::fs::write(to.join("kernel/tcp_segments.tsv"), out).unwrap();
    // The server's spans: their deepspan monotonic times on the new clock.
    let mut doc: Value = serde_json::from_slice(&std::fs::read(server_spans).unwrap()).unwrap();
    for span in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
        .as_array_mut()
        .unwrap()
    {
        for attr in span["attributes"].as_array_mut().unwrap() {
            if attr["key"]
                .as_str()
                .is_some_and(|k| k.starts_with("deepspan.mono_"))
            {
                let t: u64 = attr["value"]["intValue"].as_str().unwrap().parse().unwrap();
                attr["value"]["intValue"] = skewed(t).to_string().into();
            }
        }
    }
    let skewed_spans = to.with_extension("spans.json");
    std::fs::write(&skewed_spans, serde_json::to_vec(&doc).unwrap()).unwrap();
    import(to, &skewed_spans);
}

/// How far the two analyses may differ on a (thread, state): the larger
/// of this and 2 % of the request. Each run's tracefs instance misses
/// switches out of the idle task of its own (this VM drops about half),
/// which the model infers at the thread's next event; a wake-up latency
/// of some microseconds then goes to the waker in one run and to the woken
/// thread's wait for a CPU in the other. An event of one host and one of
/// the other that were closer than the clock alignment's error may also be
/// ordered either way.
const TOLERANCE_NS: u64 = 20_000;

/// Pieces at least this long are compared in order too (against the other
/// path's pieces of at least half this).
const LONG_PIECE_NS: u64 = 100_000;

/// A request's critical path as comparable pieces: (thread without its
/// host bits, state, blocking request, duration), adjacent pieces of the
/// same kind joined.
///
/// The state of a thread outside the `traced` processes is left out: each
/// run saw such a thread only where it met that run's traced threads (a
/// switch from or to one), so the single run, which traces both
/// processes, knows more of its states than either host's run. RUNNING
/// and PREEMPTED are one: each instance misses switches of its own (out of
/// the idle task, about half here), and a missed switch-in is inferred at
/// the thread's next event, which moves time from one to the other (190 µs
/// in one CI run).
type Piece = (i64, String, String, u64);

fn join(pieces: impl IntoIterator<Item = Piece>) -> Vec<Piece> {
    let mut joined: Vec<Piece> = Vec::new();
    for p in pieces {
        match joined.last_mut() {
            Some(last) if (last.0, &last.1, &last.2) == (p.0, &p.1, &p.2) => last.3 += p.3,
            _ => joined.push(p),
        }
    }
    joined
}

fn pieces(run: &Path, span_ids: &[String], traced: &[i64]) -> HashMap<String, Vec<Piece>> {
    let paths =
        deepspan_store::read_critical_paths(run, span_ids).expect("read the critical paths");
    paths
        .into_iter()
        .map(|(request, path)| {
            let all = path.into_iter().map(|p| {
                let tid = p.tid.map_or(-1, |t| t & ((1 << 22) - 1));
                let state = match p.state.as_str() {
                    _ if !traced.contains(&tid) => "elsewhere".into(),
                    // A switch-in one instance missed is inferred at the
                    // thread's next event: time moves between the two.
                    "RUNNING" | "PREEMPTED" => "on or waiting for a CPU".into(),
                    _ => p.state,
                };
                (
                    tid,
                    state,
                    p.blocked_by_request.unwrap_or_default(),
                    p.end_ns - p.start_ns,
                )
            });
            (request.span_id, join(all))
        })
        .collect()
}

/// Whether two requests' comparable paths are the same: the same time on
/// each (thread, state, blocking request), within [`TOLERANCE_NS`] or 2 %,
/// and the same long pieces in the same order.
fn same_path(a: &[Piece], b: &[Piece]) -> bool {
    let totals = |path: &[Piece]| {
        let mut t: HashMap<(i64, String, String), u64> = HashMap::new();
        for p in path {
            *t.entry((p.0, p.1.clone(), p.2.clone())).or_default() += p.3;
        }
        t
    };
    let (ta, tb) = (totals(a), totals(b));
    let duration: u64 = a.iter().map(|p| p.3).sum();
    let tolerance = TOLERANCE_NS.max(duration / 50);
    let times_agree = ta.keys().chain(tb.keys()).all(|k| {
        ta.get(k)
            .copied()
            .unwrap_or(0)
            .abs_diff(tb.get(k).copied().unwrap_or(0))
            <= tolerance
    });
    let kinds = |path: &[Piece], at_least: u64| -> Vec<(i64, String, String)> {
        join(path.iter().filter(|p| p.3 >= at_least).cloned())
            .into_iter()
            .map(|p| (p.0, p.1, p.2))
            .collect()
    };
    // The long pieces of one, in order, among the other's medium ones.
    let in_order = |x: &[Piece], y: &[Piece]| {
        let mut others = kinds(y, LONG_PIECE_NS / 2).into_iter();
        kinds(x, LONG_PIECE_NS)
            .into_iter()
            .all(|k| others.any(|o| o == k))
    };
    times_agree && in_order(a, b) && in_order(b, a)
}

#[test]
#[ignore = "system: root, tracefs, network namespaces"]
fn two_namespaces_as_two_hosts_sync_to_the_microsecond_and_analyse_as_one() {
    if !kernel_or_skip("two_namespaces_as_two_hosts") {
        return;
    }
    // Echo load for 15 s and a clock judged to the microsecond: one at a
    // time with the other heavy kernel tests.
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    // DEEPSPAN_KEEP_HOSTS_TEST=1 keeps the runs for a look afterwards.
    let d = &if std::env::var_os("DEEPSPAN_KEEP_HOSTS_TEST").is_some() {
        let kept = dir.keep();
        eprintln!("runs kept in {}", kept.display());
        kept
    } else {
        dir.path().to_path_buf()
    };
    let ns = Namespaces::create();
    let (server, hello) = start_in(
        &ns.server,
        &[
            "rpc-server",
            &format!("{}:0", ns.server_addr),
            d.join("server.json").to_str().unwrap(),
        ],
    );
    let server_pid = hello["pid"].as_i64().unwrap();
    let addr = format!("{}:{}", ns.server_addr, hello["port"]);
    let (mut client, hello) = start_in(
        &ns.client,
        &[
            "rpc-client",
            &addr,
            d.join("client.json").to_str().unwrap(),
            &CALLS.to_string(),
        ],
    );
    let client_pid = hello["pid"].as_i64().unwrap();
    let (_echo_server, mut echo_client) = start_echo(&ns);

    let (alpha, beta, both) = (d.join("alpha"), d.join("beta"), d.join("both"));
    let recorders = [
        (
            start_recording(&alpha, &[client_pid], Some("alpha")),
            &alpha,
        ),
        (start_recording(&beta, &[server_pid], Some("beta")), &beta),
        (
            start_recording(&both, &[client_pid, server_pid], None),
            &both,
        ),
    ];
    echo_client
        .0
        .stdin
        .take()
        .unwrap()
        .write_all(b"go\n")
        .unwrap();
    client.0.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let status = client.0.wait().unwrap();
    assert!(status.success(), "rpc-client failed: {status}");
    let mut server = server;
    let status = server.0.wait().unwrap();
    assert!(status.success(), "rpc-server failed: {status}");
    for (recorder, run) in recorders {
        stop_recording(recorder, run);
    }
    import(&alpha, &d.join("client.json"));
    import(&both, &d.join("client.json"));
    import(&both, &d.join("server.json"));
    let beta_skewed = d.join("beta-skewed");
    skew_run(&beta, &beta_skewed, &d.join("server.json"));

    // The clock: beta's onto alpha's is the inverse of the skew.
    let out = check(
        "deepspan sync",
        deepspan()
            .arg("sync")
            .arg(&alpha)
            .arg(&beta_skewed)
            .args(["--format", "json"])
            .output()
            .unwrap(),
    );
    let sync: Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("{}", serde_json::to_string_pretty(&sync).unwrap());
    let host = sync["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["host"] == "beta")
        .expect("beta aligned")
        .clone();
    assert_eq!(host["quality"], "accurate", "{host}");
    let (slope, offset) = (
        host["slope"].as_f64().unwrap(),
        host["offset_ns"].as_f64().unwrap(),
    );
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(beta_skewed.join("manifest.json")).unwrap()).unwrap();
    let (start, end) = (
        manifest["start"]["mono_ns"].as_u64().unwrap(),
        manifest["end"]["mono_ns"].as_u64().unwrap(),
    );
    assert!(
        end - start >= 8_000_000_000,
        "the run lasted {} ns",
        end - start
    );
    let mut worst = 0f64;
    for i in 0..=100u64 {
        let u = start + (end - start) * i / 100;
        // The true time on alpha of beta's time u: skewed⁻¹(u).
        let truth = (u as f64 - OFFSET_NS) / SLOPE;
        let recovered = slope * u as f64 + offset;
        worst = worst.max((recovered - truth).abs());
    }
    eprintln!(
        "sync: worst error over the run {worst:.0} ns ({} segments matched)",
        host["matched"]
    );
    // The bounds hold the true transform: over the run (within the input's
    // time range) no time is further off than they allow (2 ns for the
    // skew's rounding to the ns).
    assert_eq!(host["bounds"], "enclosed", "{host}");
    let max_error = host["max_error_ns"].as_f64().unwrap();
    assert!(
        worst <= max_error + 2.0,
        "worst error {worst:.0} ns beyond the bounds' {max_error:.0} ns"
    );

    // The merged analysis against the single run's.
    let merged = d.join("merged");
    check(
        "deepspan analyze (two hosts)",
        deepspan()
            .arg("analyze")
            .arg(&alpha)
            .arg(&beta_skewed)
            .arg("--out")
            .arg(&merged)
            .output()
            .unwrap(),
    );
    // The merged run keeps the bound: hosts.json has it, and analysing the
    // merged run again notes it.
    let hosts: Value =
        serde_json::from_slice(&std::fs::read(merged.join("hosts.json")).unwrap()).unwrap();
    let kept = hosts["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|h| h["max_error_ns"].as_f64().filter(|&e| e > 0.0))
        .unwrap_or_else(|| panic!("a bound for the skewed host: {hosts}"));
    assert!(
        (kept - max_error).abs() <= 1.0,
        "{kept} against sync's {max_error}"
    );
    let again = check(
        "deepspan analyze (the merged run again)",
        deepspan().arg("analyze").arg(&merged).output().unwrap(),
    );
    let notes = String::from_utf8_lossy(&again.stderr);
    assert!(notes.contains("its times are off by at most"), "{notes}");
    check(
        "deepspan analyze (one run)",
        deepspan().arg("analyze").arg(&both).output().unwrap(),
    );
    let requests: Value =
        serde_json::from_slice(&std::fs::read(both.join("analysis/requests.json")).unwrap())
            .unwrap();
    let ids: Vec<String> = requests["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["span_id"].as_str().unwrap().to_string())
        .collect();
    assert!(ids.len() as u32 >= CALLS * 2, "{} requests", ids.len());
    let traced = [client_pid, server_pid];
    let single = pieces(&both, &ids, &traced);
    let across = pieces(&merged, &ids, &traced);
    let mut differ = Vec::new();
    for id in &ids {
        let across = across
            .get(id)
            .unwrap_or_else(|| panic!("request {id} not in the merged run"));
        if !same_path(&single[id], across) {
            differ.push(id.clone());
        }
    }
    if !differ.is_empty() {
        for id in differ.iter().take(3) {
            eprintln!(
                "request {id}:\n single: {:?}\n merged: {:?}",
                single[id], across[id]
            );
        }
    }
    eprintln!(
        "{} of {} requests have another critical path in the merged run",
        differ.len(),
        ids.len()
    );
    assert!(
        worst < 1000.0,
        "beta's clock recovered within {worst:.0} ns, not 1 µs"
    );
    // Under load a few requests (4 of 4 800 in one CI run) have a reply's
    // wake-up matched differently in the two analyses, ms apart (not yet
    // understood; ARCHITECTURE's known issues): at most 1 % may differ.
    assert!(
        differ.len() * 100 <= ids.len(),
        "{} of {} requests have another critical path in the merged run",
        differ.len(),
        ids.len()
    );
}
