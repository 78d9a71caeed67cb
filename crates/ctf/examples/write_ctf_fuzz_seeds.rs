//! Writes the seeds of the CTF fuzz target (fuzz/fuzz_targets/ctf.rs, whose
//! comment describes the input layout) into fuzz/ctf_seeds: the first
//! packets of the corpus traces and the synthetic trace of the tests, each
//! behind its fixed-metadata byte, and two in text mode (metadata, NUL,
//! stream). Run with
//! `cargo run --release -p deepspan-ctf --example write_ctf_fuzz_seeds`.

#[path = "../tests/it/common/mod.rs"]
mod common;

use std::path::Path;

use common::synthetic::{streams, METADATA};
use common::{corpus, small_trace};

fn main() {
    let out = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/ctf_seeds"));
    std::fs::create_dir_all(out).unwrap();
    let fixed = [
        ("rotation", "lttng-tracefile-rotation/kernel", 12),
        ("flipping", "flipping-endianness/trace", 12),
        ("bug446190", "bug446190/trace", 12),
        ("perf", "perf-taskset2/trace", 6),
        ("multi-domains", "multi-domains/kernel", 2),
    ];
    for (i, (name, dir, n)) in fixed.iter().enumerate() {
        let (_, stream) = small_trace(&corpus(dir), *n);
        std::fs::write(
            out.join(format!("{name}.bin")),
            [&[1 + i as u8][..], &stream].concat(),
        )
        .unwrap();
    }
    let synth = &streams()[0];
    std::fs::write(out.join("synthetic.bin"), [&[6u8][..], synth].concat()).unwrap();
    let text_mode = |meta: &[u8], stream: &[u8]| [&[0u8][..], meta, &[0u8], stream].concat();
    std::fs::write(
        out.join("synthetic-text.bin"),
        text_mode(METADATA.as_bytes(), synth),
    )
    .unwrap();
    let (perf_meta, perf_stream) = small_trace(&corpus("perf-taskset2/trace"), 4);
    std::fs::write(
        out.join("perf-text.bin"),
        text_mode(&perf_meta, &perf_stream),
    )
    .unwrap();
    println!("fuzz seeds written to {}", out.display());
}
