//! Builds the kernel model of a trace.dat and prints what it found and how
//! fast: `cargo run --release -p deepspan-analysis --example kernel_model -- FILE [TID]`.

use std::time::Instant;

use deepspan_analysis::{critical_path, StateBuilder};
use deepspan_ftrace::TraceDat;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: kernel_model FILE [TID]")?;
    let tid: Option<i32> = args.next().map(|t| t.parse()).transpose()?;
    let trace = TraceDat::open(std::path::Path::new(&path))?;
    let schema = trace.schema().clone();
    let bytes = trace.cpu_data_bytes();

    // Decoding alone, then decoding plus the model, to separate the costs.
    let t0 = Instant::now();
    let mut n = 0u64;
    for r in trace.records()? {
        std::hint::black_box(r?.to_event(&schema));
        n += 1;
    }
    let decode = t0.elapsed();
    let t1 = Instant::now();
    let mut b = StateBuilder::new();
    for r in trace.records()? {
        b.push(&r?.to_event(&schema));
    }
    let model = b.finish();
    let both = t1.elapsed();
    let mb = bytes as f64 / 1e6;
    println!("{n} events, {mb:.1} MB of CPU data");
    println!(
        "decode: {:.3} s ({:.0} MB/s)",
        decode.as_secs_f64(),
        mb / decode.as_secs_f64()
    );
    println!(
        "decode + model: {:.3} s ({:.0} MB/s)",
        both.as_secs_f64(),
        mb / both.as_secs_f64()
    );
    let intervals: usize = model.threads().map(|t| t.states().len()).sum();
    println!(
        "{} threads, {intervals} state intervals, {} graph vertices, {} vertical edges",
        model.threads().count(),
        model.graph().vertex_count(),
        model.graph().vertical_count()
    );
    println!("{:?}", model.stats());
    // Where the model's memory goes (element counts × element sizes).
    let size = std::mem::size_of::<deepspan_analysis::StateInterval>();
    let syscalls: usize = model.threads().map(|t| t.syscalls().len()).sum();
    let timeline: usize = model.cpus().iter().map(|c| c.timeline().len()).sum();
    let interrupts: usize = model.cpus().iter().map(|c| c.interrupts().len()).sum();
    let mib = |n: usize, each: usize| (n * each) as f64 / (1 << 20) as f64;
    println!(
        "memory (MiB): states {:.1} ({size} B each), syscalls {:.1} ({} B), cpu timeline {:.1}, interrupts {:.1}, block io {:.1}, graph vertices {} + vertical edges {}",
        mib(intervals, size),
        mib(syscalls, std::mem::size_of::<deepspan_analysis::SyscallInterval>()),
        std::mem::size_of::<deepspan_analysis::SyscallInterval>(),
        mib(timeline, std::mem::size_of::<deepspan_analysis::CpuInterval>()),
        mib(interrupts, std::mem::size_of::<deepspan_analysis::InterruptInterval>()),
        mib(model.block_io().len(), std::mem::size_of::<deepspan_analysis::BlockIo>()),
        model.graph().vertex_count(),
        model.graph().vertical_count(),
    );
    if let Some(tid) = tid {
        let (start, end) = model.time_range();
        for p in critical_path(&model, tid, start, end).pieces {
            println!(
                "{:>16} {:>12} {:>7} {:<12} {:?}",
                p.start,
                p.duration(),
                p.tid,
                p.state.name(),
                p.qualifier
            );
        }
    }
    Ok(())
}
