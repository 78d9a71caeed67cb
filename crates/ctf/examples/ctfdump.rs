//! Prints the events of a CTF trace folder, one per line, or with `--count`
//! only totals and the time taken (a quick throughput check; add
//! `--to-event` and/or `--fields` to include building typed events or field
//! lists).

use std::io::Write;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let count_only = args.iter().any(|a| a == "--count");
    // With --count: also build typed events / field lists (cost check).
    let typed = args.iter().any(|a| a == "--to-event");
    let fields = args.iter().any(|a| a == "--fields");
    let Some(dir) = args.iter().find(|a| !a.starts_with("--")) else {
        eprintln!("usage: ctfdump [--count [--to-event] [--fields]] TRACE_DIR");
        std::process::exit(2);
    };
    // --repeat=N: iterate N times (throughput on small traces).
    let repeat: u32 = args
        .iter()
        .find_map(|a| a.strip_prefix("--repeat="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let t0 = std::time::Instant::now();
    let trace = match deepspan_ctf::CtfTrace::open(dir) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    for _ in 1..repeat {
        for e in trace.events() {
            let e = e.expect("decode");
            if typed {
                std::hint::black_box(e.to_event());
            }
            if fields {
                std::hint::black_box(e.fields());
            }
        }
    }
    let mut events = trace.events();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut n = 0u64;
    for e in events.by_ref() {
        match e {
            Ok(e) => {
                n += 1;
                if typed {
                    std::hint::black_box(e.to_event());
                }
                if fields {
                    std::hint::black_box(e.fields());
                }
                if !count_only {
                    let (file, offset) = e.source();
                    let line = format!(
                        "{} {} cpu={} tid={} {:?} {:?} @{}:{offset}",
                        e.ts(),
                        e.name(),
                        e.cpu(),
                        e.tid(),
                        e.context(),
                        e.fields(),
                        file.display()
                    );
                    if writeln!(out, "{line}").is_err() {
                        return; // reader went away (e.g. `| head`)
                    }
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    }
    let _ = out.flush();
    let per_event = t0.elapsed().as_nanos() as f64 / (n as f64 * repeat as f64);
    eprintln!(
        "{n} events, {} lost, {:?} ({per_event:.0} ns/event)",
        events.lost_events(),
        t0.elapsed()
    );
}
