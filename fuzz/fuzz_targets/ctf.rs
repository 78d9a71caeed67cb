//! Fuzzes the CTF reader with an in-memory trace: any input must decode or
//! fail with an error, never panic or hang.
//!
//! Input layout (seeds in fuzz/ctf_seeds, written by
//! `cargo run --release -p deepspan-ctf --example write_ctf_fuzz_seeds`):
//! - first byte % 8 in 1..=6: a fixed real metadata (packetized LE/BE, text,
//!   old and new LTTng, perf, the synthetic one) and the rest is one stream,
//!   so mutations concentrate on the binary decoder;
//! - otherwise: TSDL metadata text up to the first NUL, then one stream, so
//!   the parser and layout compiler are fuzzed too.
#![no_main]

use deepspan_ctf::CtfTrace;
use libfuzzer_sys::fuzz_target;

static FIXED: [&[u8]; 6] = [
    include_bytes!("../../../shared/testdata/kernel/ctf/lttng-tracefile-rotation/kernel/metadata"),
    include_bytes!("../../../shared/testdata/kernel/ctf/flipping-endianness/trace/metadata"),
    include_bytes!("../../../shared/testdata/kernel/ctf/bug446190/trace/metadata"),
    include_bytes!("../../../shared/testdata/kernel/ctf/perf-taskset2/trace/metadata"),
    include_bytes!("../../../shared/testdata/kernel/ctf/multi-domains/kernel/metadata"),
    include_bytes!("../../crates/ctf/tests/data/synthetic.tsdl"),
];

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (metadata, stream) = match mode % 8 {
        m @ 1..=6 => (FIXED[m as usize - 1], rest),
        _ => match rest.iter().position(|&b| b == 0) {
            Some(nul) => (&rest[..nul], &rest[nul + 1..]),
            None => (rest, &[][..]),
        },
    };
    let Ok(trace) = CtfTrace::from_memory(metadata, vec![stream.to_vec()]) else {
        return;
    };
    for info in trace.traces() {
        let _ = (
            info.hostname(),
            info.clock_offset_ns(),
            info.tid_inferred(),
            info.event_class_count(),
        );
    }
    let _ = trace.lost_events();
    let mut events = trace.events();
    for event in events.by_ref() {
        let Ok(event) = event else { continue };
        let _ = (
            event.to_event(),
            event.span_sync(),
            event.context(),
            event.packet_context(),
            trace.class_name(event.class_index()),
        );
        if let Some((name, _)) = event.fields().first() {
            let _ = event.enum_label(name);
        }
    }
    let _ = events.lost_event_records();
    // Each stream on its own, as parallel readers take them.
    for reader in trace.stream_events().into_iter().flatten() {
        let _ = reader.bytes();
        for event in reader.flatten() {
            let _ = (event.to_event(), event.class_index());
        }
    }
});
