//! Decoding the test-corpus trace.dat files against their oracles
//! (`*.counts.json`, observed with trace-cmd 3.1.6), in v6 and in v7
//! conversions made with trace-cmd at test time.

use crate::common::*;
use deepspan_ftrace::TraceDat;

#[test]
fn v6_counts_match_oracle() {
    for trace in TRACES {
        let t = TraceDat::open(&dat(trace)).unwrap();
        assert_eq!(t.version(), 6);
        let c = counts(trace);
        let ff = &c["file_format"];
        assert_eq!(t.page_size(), ff["page_size"].as_u64().unwrap() as u32);
        assert_eq!(t.long_size(), ff["bytes_per_long"].as_u64().unwrap() as u32);
        assert_eq!(t.big_endian(), ff["endianness"] == "big");
        assert_eq!(t.cpus(), ff["cpus_with_data"].as_u64().unwrap() as u32);
        check_against_counts(&summarize(&t), trace);
    }
}

#[test]
fn header_facts() {
    let t = TraceDat::open(&dat("example_rtapp")).unwrap();
    assert_eq!(t.clock(), Some("local"));
    assert!(!t.cmdlines().is_empty());
    assert_eq!(
        t.cmdlines().get(&6973).map(String::as_str),
        Some("trace-cmd")
    );
    let t = TraceDat::open(&dat("sched_load")).unwrap();
    assert_eq!(t.clock(), None, "sched_load.dat saves no clock");
    assert_eq!(
        t.cpu_data_bytes(),
        36864 + 24576 + 40960 + 57344 + 24576 + 16384
    );
    assert_eq!(t.schema().long_size(), 8);
    assert!(t.schema().by_name("sched", "sched_switch").is_some());
}

/// Every record of `a` equals the one of `b` at the same position: time,
/// CPU, name and all field values.
fn assert_same_records(a: &TraceDat, b: &TraceDat, what: &str) {
    let (sa, sb) = (a.schema().clone(), b.schema().clone());
    let (ra, rb) = (all_records(a), all_records(b));
    assert_eq!(ra.len(), rb.len(), "{what}: record count");
    for (i, (x, y)) in ra.iter().zip(&rb).enumerate() {
        assert_eq!(
            (x.ts, x.cpu, x.name(&sa)),
            (y.ts, y.cpu, y.name(&sb)),
            "{what}: record {i}"
        );
        assert_eq!(
            x.fields(&sa).unwrap(),
            y.fields(&sb).unwrap(),
            "{what}: fields of record {i}"
        );
        assert_eq!(x.to_event(&sa), y.to_event(&sb), "{what}: typed record {i}");
    }
}

#[test]
fn v7_conversions_decode_like_v6() {
    if !have_trace_cmd() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for trace in TRACES {
        let v6 = TraceDat::open(&dat(trace)).unwrap();
        let mut converted = 0;
        for compression in ["none", "zstd", "zlib", "any"] {
            let out = dir.path().join(format!("{trace}-{compression}.dat"));
            let Some(path) = convert_v7(&dat(trace), compression, &out) else {
                continue;
            };
            let v7 = TraceDat::open(&path).unwrap_or_else(|e| panic!("{trace} {compression}: {e}"));
            assert_eq!(v7.version(), 7);
            if compression != "any" {
                assert_eq!(v7.compression(), Some(compression));
            }
            assert_eq!(v7.cpus(), v6.cpus());
            check_against_counts(&summarize(&v7), trace);
            assert_same_records(&v6, &v7, &format!("{trace} v7 {compression}"));
            // The same bytes held in memory decode the same.
            let mem = TraceDat::from_bytes(std::fs::read(&path).unwrap()).unwrap();
            assert_same_records(&v7, &mem, &format!("{trace} v7 {compression} in memory"));
            converted += 1;
        }
        assert!(
            converted >= 3,
            "{trace}: expected at least none, zstd and any conversions"
        );
    }
}
