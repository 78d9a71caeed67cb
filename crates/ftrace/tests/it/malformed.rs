//! Broken input: truncated files, flipped bytes, lying sizes. The reader
//! must return errors that name the file offset (or, for a file cut short
//! after its event formats, a truncation report), never panic and never
//! hang. `truncated.rs` checks what a cut file still decodes.

use std::path::PathBuf;

use crate::common::builder::*;
use crate::common::*;
use deepspan_ftrace::{Error, TraceDat};
use proptest::prelude::*;

fn sample_file(big: bool) -> Vec<u8> {
    let mut b = Builder::new(big, 8);
    b.page_size = 256;
    b.format("sched", SCHED_SWITCH)
        .format("sched", SCHED_PROCESS_EXEC)
        .format("test", REL_LOC)
        .format("ftrace", PRINT);
    b.clock = Some("mono".into());
    let sw = payload(
        SCHED_SWITCH,
        big,
        &[("prev_comm", V::S("a")), ("next_pid", V::I(3))],
    );
    let exec = payload(
        SCHED_PROCESS_EXEC,
        big,
        &[("filename", V::S("/bin/sh")), ("pid", V::I(3))],
    );
    let rel = payload(REL_LOC, big, &[("msg", V::S("m"))]);
    let print = payload(PRINT, big, &[("buf", V::S("x"))]);
    let mut p0 = Page::new(100, big);
    p0.event(1, &sw).extend(1 << 28).long_event(2, &exec);
    let mut p1 = Page::new(50, big);
    p1.event(1, &rel).absolute(70).event(1, &print);
    p1.missed = Some(Some(2));
    b.cpus = vec![vec![p0], vec![p1]];
    b.build()
}

/// Opens and fully decodes `bytes` (typed and generic), returning the
/// number of records and the errors met. Fails the test on a non-located
/// error or on more records than the file could hold.
fn decode_all(bytes: &[u8]) -> (usize, Vec<Error>) {
    let t = match TraceDat::from_bytes(bytes.to_vec()) {
        Ok(t) => t,
        Err(e) => return (0, vec![e]),
    };
    let s = t.schema().clone();
    let _ = (
        t.cpu_data_bytes(),
        t.clock(),
        t.cmdlines().len(),
        t.instances().count(),
    );
    let mut n = 0;
    let mut errors = Vec::new();
    for r in t.records().unwrap() {
        match r {
            Ok(r) => {
                let _ = r.to_event(&s);
                let _ = r.fields(&s);
                let _ = r.name(&s);
                let _ = r.tid(&s);
                n += 1;
                assert!(n <= bytes.len(), "more records than bytes: a loop?");
            }
            Err(e) => errors.push(e),
        }
    }
    for cpu in 0..t.cpus().min(64) {
        for r in t.cpu_records(cpu).unwrap() {
            if let Err(e) = r {
                errors.push(e);
                break;
            }
        }
    }
    (n, errors)
}

/// Decode errors must say where they are.
fn assert_located(e: &Error) {
    let text = e.to_string();
    match e {
        Error::Field { .. } | Error::Format { .. } => {}
        _ => assert!(
            text.contains("trace.dat offset 0x"),
            "error without offset: {text}"
        ),
    }
}

/// Whether `bytes` open with a truncation report.
fn reported_cut(bytes: &[u8]) -> bool {
    TraceDat::from_bytes(bytes.to_vec()).is_ok_and(|t| t.truncation().is_some())
}

fn check_truncations(bytes: &[u8], cuts: impl Iterator<Item = usize>, full: usize, what: &str) {
    for cut in cuts {
        let (n, errors) = decode_all(&bytes[..cut]);
        errors.iter().for_each(assert_located);
        assert!(
            !errors.is_empty() || n == full || reported_cut(&bytes[..cut]),
            "{what}: cut at {cut}: no error and no truncation report, yet {n} of {full} records"
        );
    }
}

#[test]
fn every_truncation_of_a_small_trace_is_an_error_or_reported() {
    for big in [false, true] {
        let bytes = sample_file(big);
        let (full, errors) = decode_all(&bytes);
        assert!(errors.is_empty() && full == 4, "{errors:?} {full}");
        check_truncations(&bytes, 0..bytes.len(), full, "built");
    }
}

#[test]
fn truncations_of_corpus_traces() {
    for trace in TRACES {
        let bytes = std::fs::read(dat(trace)).unwrap();
        let (full, _) = decode_all(&bytes);
        let fly = bytes.windows(10).position(|w| w == b"flyrecord\0").unwrap();
        // Spread over the file, dense around the CPU table and data start
        // (the metadata before is mostly kallsyms text).
        let cuts = (0..bytes.len())
            .step_by(bytes.len() / 40)
            .chain((fly - 16..fly + 140).step_by(3))
            .chain((bytes.len() - 9000..bytes.len()).step_by(331));
        check_truncations(&bytes, cuts, full, trace);
    }
}

fn v7_conversions() -> Vec<(String, Vec<u8>)> {
    if !have_trace_cmd() {
        return Vec::new();
    }
    let dir = tempfile::tempdir().unwrap();
    let src: PathBuf = dir.path().join("small.dat");
    std::fs::write(&src, sample_file(false)).unwrap();
    let mut out = Vec::new();
    for c in ["none", "zstd", "zlib"] {
        if let Some(p) = convert_v7(&src, c, &dir.path().join(format!("small-{c}.dat"))) {
            out.push((c.to_string(), std::fs::read(p).unwrap()));
        }
    }
    out
}

#[test]
fn every_truncation_of_small_v7_traces_is_an_error_or_reported() {
    for (c, bytes) in v7_conversions() {
        let (full, errors) = decode_all(&bytes);
        assert!(errors.is_empty() && full == 4, "v7 {c}: {errors:?} {full}");
        check_truncations(&bytes, 0..bytes.len(), full, &format!("v7 {c}"));
    }
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn lying_sizes_are_errors() {
    let good = sample_file(false);
    let find = |needle: &[u8]| {
        good.windows(needle.len())
            .position(|w| w == needle)
            .unwrap()
    };
    let expect_error = |bytes: &[u8], what: &str, contains: &str| {
        let (_, errors) = decode_all(bytes);
        assert!(!errors.is_empty(), "{what}: no error");
        errors.iter().for_each(assert_located);
        let text = errors[0].to_string();
        assert!(text.contains(contains), "{what}: {text}");
    };

    let mut b = good.clone();
    put_u64(&mut b, find(b"header_page\0") + 12, u64::MAX);
    expect_error(&b, "header_page size", "header_page");

    let mut b = good.clone();
    put_u64(&mut b, find(b"header_event\0") + 13, 1 << 40);
    expect_error(&b, "header_event size", "header_event");

    let fly = find(b"flyrecord\0") + 10;
    // A CPU size past the end of the file reads as a cut file: its whole
    // pages decode, and the report says how much is missing.
    let mut b = good.clone();
    put_u64(&mut b, fly + 8, 1 << 40); // CPU 0 size
                                       // (CPU 0 now also takes CPU 1's page, the rest of the file.)
    let (n, errors) = decode_all(&b);
    assert!(errors.is_empty() && n == 6, "CPU size: {errors:?} {n}");
    let t = TraceDat::from_bytes(b.clone()).unwrap();
    let cut = t.truncation().expect("CPU size: a truncation report");
    assert_eq!(cut.cpus.len(), 1, "{cut}");
    assert_eq!(cut.cpus[0].declared_bytes, 1 << 40);
    assert!(cut.to_string().contains("bytes missing"), "{cut}");

    let mut b = good.clone();
    put_u64(&mut b, fly, u64::MAX - 10); // CPU 0 offset
    expect_error(&b, "CPU offset", "CPU 0");

    // The event-format count of the first system.
    let mut b = good.clone();
    let sched = find(b"sched\0") + 6;
    b[sched..sched + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    expect_error(&b, "format count", "offset");

    // A data event longer than the page's committed data.
    let mut b = good.clone();
    let page = u64::from_le_bytes(b[fly..fly + 8].try_into().unwrap()) as usize;
    b[page + 16..page + 20].copy_from_slice(&((1u32 << 5) | 28).to_le_bytes());
    expect_error(&b, "event length", "runs past the page's committed data");
}

#[test]
fn lying_sizes_in_v7_are_errors() {
    for (c, good) in v7_conversions() {
        let what = format!("v7 {c}");
        // The offset of the first options section.
        let head = good.iter().skip(10).position(|&b| b == 0).unwrap() + 10 + 1 + 6;
        let comp_end = {
            let n = good[head..].iter().position(|&b| b == 0).unwrap() + head + 1;
            good[n..].iter().position(|&b| b == 0).unwrap() + n + 1
        };
        let mut b = good.clone();
        put_u64(&mut b, comp_end, good.len() as u64 + 100);
        let (_, errors) = decode_all(&b);
        assert!(!errors.is_empty(), "{what}: options offset past the end");
        errors.iter().for_each(assert_located);
        let mut b = good.clone();
        put_u64(&mut b, comp_end, comp_end as u64 - 3);
        let (_, errors) = decode_all(&b);
        assert!(!errors.is_empty(), "{what}: options offset into the header");
    }
}

#[test]
fn junk_is_rejected() {
    for junk in [
        &b""[..],
        b"\x17\x08\x44",
        b"\x17\x08\x44tracing",
        b"\x17\x08\x44tracing5\0",
        b"PK\x03\x04 not a trace",
    ] {
        let e = TraceDat::from_bytes(junk.to_vec()).unwrap_err();
        assert_located(&e);
    }
    let e = TraceDat::open("/nonexistent/trace.dat".as_ref()).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/trace.dat"), "{e}");
}

/// Inputs the fuzzer found crashing (minimized), kept as regressions.
#[test]
fn fuzz_regressions() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fuzz-regressions");
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let (_, errors) = decode_all(&std::fs::read(&path).unwrap());
        errors.iter().for_each(assert_located);
        count += 1;
    }
    assert!(count > 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_mutations_never_panic(
        big in any::<bool>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = sample_file(big);
        for (at, value) in edits {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        let (_, errors) = decode_all(&bytes);
        errors.iter().for_each(assert_located);
    }

    #[test]
    fn random_mutations_of_the_data_area_never_panic(
        edits in prop::collection::vec((0usize..768, any::<u8>()), 1..16),
    ) {
        let mut bytes = sample_file(false);
        let data = bytes.len() - 768;
        for (at, value) in edits {
            bytes[data + at] = value;
        }
        let (_, errors) = decode_all(&bytes);
        errors.iter().for_each(assert_located);
    }
}
