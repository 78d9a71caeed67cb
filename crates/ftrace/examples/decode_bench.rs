//! Decode throughput: iterates all records of a trace.dat in time order and
//! decodes each with the typed path.
//!
//! cargo run --release -p deepspan-ftrace --example decode_bench -- trace.dat [--fields]

use std::time::Instant;

use deepspan_ftrace::TraceDat;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: decode_bench <trace.dat> [--fields]")?;
    let fields = args.next().as_deref() == Some("--fields");
    let start = Instant::now();
    let trace = TraceDat::open(path.as_ref())?;
    let opened = start.elapsed();
    let schema = trace.schema().clone();
    let mut records = trace.records()?;
    let (mut n, mut typed, mut field_count) = (0u64, 0u64, 0usize);
    for r in records.by_ref() {
        let r = r?;
        let e = std::hint::black_box(r.to_event(&schema));
        if !matches!(e.kind, deepspan_model::EventKind::Other { .. }) {
            typed += 1;
        }
        if fields {
            field_count += r.fields(&schema)?.len();
        }
        n += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let mb = trace.cpu_data_bytes() as f64 / 1e6;
    println!(
        "{n} records ({typed} typed{}), {mb:.1} MB of CPU data, open {:.1} ms, total {secs:.3} s: {:.0} MB/s, {:.1} M records/s, lost {}",
        if fields { format!(", {field_count} fields") } else { String::new() },
        opened.as_secs_f64() * 1e3,
        mb / secs,
        n as f64 / secs / 1e6,
        records.lost_events()
    );
    Ok(())
}
