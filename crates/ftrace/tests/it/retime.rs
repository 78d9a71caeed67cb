//! `retime_trace_dat`: a copy of a trace with a synthetic clock (offset and
//! drift) reads back, in deepspan's reader and in `trace-cmd report`, as
//! the same records at the mapped times; maps it cannot encode are errors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::builder::*;
use crate::common::*;
use deepspan_ftrace::{
    retime_trace_dat, write_trace_dat, RetimeError, RetimeStats, TraceDat, TraceDatMeta,
};

const SLOPE: f64 = 1.0 - 37e-6;
const OFFSET_NS: f64 = 3_700_000_000.0;

/// The synthetic clock: slope 1 - 37 ppm, offset +3.7 s.
fn drift(t: u64) -> u64 {
    let correction = ((SLOPE - 1.0) * t as f64 + OFFSET_NS).round() as i64;
    t.checked_add_signed(correction).unwrap()
}

/// Per CPU: (ts, event id, payload) in ring-buffer order, and lost events.
type PerCpu = BTreeMap<u32, (Vec<(u64, u16, Vec<u8>)>, u64)>;

fn per_cpu(t: &TraceDat) -> PerCpu {
    (0..t.cpus())
        .map(|cpu| {
            let mut it = t.cpu_records(cpu).unwrap();
            let records = it
                .by_ref()
                .map(|r| {
                    let r = r.unwrap();
                    (r.ts, r.event_id, r.payload.to_vec())
                })
                .collect();
            (cpu, (records, it.lost_events()))
        })
        .collect()
}

/// Retimes `input` with `map` and checks the copy record by record with the
/// crate's reader; returns the copy.
fn retime_and_check(input: &Path, dir: &Path, map: fn(u64) -> u64) -> (PathBuf, RetimeStats) {
    let out = dir.join(format!(
        "{}.retimed.dat",
        input.file_stem().unwrap().to_string_lossy()
    ));
    let stats = retime_trace_dat(input, &out, &map).unwrap();
    let before = TraceDat::open(input).unwrap();
    let after = TraceDat::open(&out).unwrap();
    let (a, b) = (per_cpu(&before), per_cpu(&after));
    assert_eq!(a.len(), b.len());
    let mut records = 0;
    for ((cpu, (orig, lost)), (cpu2, (new, lost2))) in a.iter().zip(&b) {
        assert_eq!(
            (cpu, lost),
            (cpu2, lost2),
            "{}: CPU, lost events",
            input.display()
        );
        assert_eq!(
            orig.len(),
            new.len(),
            "{}: CPU {cpu} record count",
            input.display()
        );
        for (i, (o, n)) in orig.iter().zip(new).enumerate() {
            assert_eq!(
                (map(o.0), o.1, &o.2),
                (n.0, n.1, &n.2),
                "{}: CPU {cpu} record {i} (original ts {})",
                input.display(),
                o.0
            );
        }
        records += orig.len() as u64;
    }
    assert!(records > 0);
    // (The stats and the data bytes below count instances too.)
    if before.instances().next().is_some() {
        return (out, stats);
    }
    assert_eq!(stats.records, records);
    // Nothing but the CPU data changes: the metadata before it is the same.
    let (x, y) = (std::fs::read(input).unwrap(), std::fs::read(&out).unwrap());
    assert_eq!(x.len(), y.len());
    let meta_len = x.len() - before.cpu_data_bytes() as usize;
    assert!(x[..meta_len] == y[..meta_len], "metadata changed");
    (out, stats)
}

/// `trace-cmd report -t` lines grouped by CPU: (ns, event name, fields).
fn report_per_cpu(file: &Path) -> BTreeMap<u32, Vec<(u64, String, String)>> {
    let mut m: BTreeMap<u32, Vec<_>> = BTreeMap::new();
    for l in report(&["-t"], file) {
        m.entry(l.cpu).or_default().push((l.ts, l.name, l.fields));
    }
    m
}

/// The oracle: trace-cmd prints every event of the copy at the mapped time
/// of the original's event (compared per CPU: mapping can make times of
/// different CPUs equal, which may change the order across CPUs).
fn check_with_trace_cmd(input: &Path, out: &Path, map: fn(u64) -> u64) {
    if !have_trace_cmd() {
        return;
    }
    let (a, b) = (report_per_cpu(input), report_per_cpu(out));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let mut lines = 0;
    for (cpu, orig) in &a {
        let new = &b[cpu];
        assert_eq!(
            orig.len(),
            new.len(),
            "{}: CPU {cpu} lines",
            input.display()
        );
        for (i, (o, n)) in orig.iter().zip(new).enumerate() {
            assert_eq!(
                (map(o.0), &o.1, &o.2),
                (n.0, &n.1, &n.2),
                "{}: trace-cmd CPU {cpu} line {i}",
                input.display()
            );
        }
        lines += orig.len();
    }
    assert!(
        lines > 0,
        "{}: trace-cmd printed no events",
        input.display()
    );
}

#[test]
fn corpus_traces_read_back_at_the_mapped_times() {
    let dir = tempfile::tempdir().unwrap();
    for trace in TRACES {
        let input = dat(trace);
        let (out, stats) = retime_and_check(&input, dir.path(), drift);
        eprintln!("{trace}: {stats:?}");
        assert!(stats.pages > 0, "{trace}: {stats:?}");
        check_with_trace_cmd(&input, &out, drift);
        // The first and last times move as the counts oracle says.
        let c = counts(trace);
        let s = summarize(&TraceDat::open(&out).unwrap());
        assert_eq!(s.first, drift(c["first_event_ts_ns"].as_u64().unwrap()));
        assert_eq!(s.last, drift(c["last_event_ts_ns"].as_u64().unwrap()));
    }
}

#[test]
fn identity_map_copies_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    for trace in TRACES {
        let input = dat(trace);
        let (out, _) = retime_and_check(&input, dir.path(), |t| t);
        assert!(std::fs::read(&input).unwrap() == std::fs::read(&out).unwrap());
    }
}

/// Pages with every entry type: events with the length in the type or in
/// a word, a time extend, a discarded event, an absolute timestamp, a page
/// with lost events (count stored), and a long gap just under 27 bits.
fn pages(big: bool) -> Vec<Vec<Page>> {
    let sw = payload(
        SCHED_SWITCH,
        big,
        &[
            ("common_pid", V::I(100)),
            ("prev_comm", V::S("bash")),
            ("prev_pid", V::I(100)),
            ("prev_prio", V::I(120)),
            ("prev_state", V::I(1)),
            ("next_comm", V::S("worker")),
            ("next_pid", V::I(200)),
            ("next_prio", V::I(120)),
        ],
    );
    let print = payload(
        PRINT,
        big,
        &[
            ("common_pid", V::I(100)),
            ("ip", V::I(0x1234)),
            ("buf", V::S("hello\n")),
        ],
    );
    let mut p0 = Page::new(1_000_000_000, big);
    p0.event(10, &sw)
        .event(5, &print)
        .extend(1 << 30)
        .event(7, &sw)
        .discarded(100_000_000, 16)
        .long_event(2, &print)
        .event((1 << 27) - 1, &sw);
    let mut p0b = Page::new(3_000_000_000, big);
    p0b.missed = Some(Some(17));
    p0b.event(0, &print).event(1, &sw);
    let mut p1 = Page::new(2_000_000_000, big);
    p1.event(1, &print).absolute(5_000_000_000).event(4, &sw);
    vec![vec![p0, p0b], vec![p1]]
}

fn built(big: bool) -> Builder {
    let mut b = Builder::new(big, 8);
    b.format("sched", SCHED_SWITCH).format("ftrace", PRINT);
    b.cmdlines = "100 bash\n200 worker\n".into();
    b.clock = Some("mono".into());
    b.cpus = pages(big);
    b
}

#[test]
fn built_traces_with_every_entry_type_read_back_at_the_mapped_times() {
    let dir = tempfile::tempdir().unwrap();
    for big in [false, true] {
        let input = dir.path().join(format!("built-big{big}.dat"));
        std::fs::write(&input, built(big).build()).unwrap();
        let (out, stats) = retime_and_check(&input, dir.path(), drift);
        assert_eq!(
            (
                stats.pages,
                stats.time_extends,
                stats.time_stamps,
                stats.discarded
            ),
            (3, 1, 1, 1),
            "big={big}"
        );
        check_with_trace_cmd(&input, &out, drift);
        let (out, _) = retime_and_check(&input, dir.path(), |t| t);
        assert!(std::fs::read(&input).unwrap() == std::fs::read(&out).unwrap());
    }
}

/// With an OFFSET option the map applies to the times including the
/// offset (those records carry); a named instance is retimed too.
#[test]
fn offset_option_and_instances_are_followed() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = built(false);
    b.options.push((7, b"123456789012\0".to_vec()));
    b.instances.push(("mine".into(), pages(false)));
    let input = dir.path().join("offset.dat");
    std::fs::write(&input, b.build()).unwrap();
    assert_eq!(TraceDat::open(&input).unwrap().ts_offset(), 123_456_789_012);
    let (out, stats) = retime_and_check(&input, dir.path(), drift);
    assert_eq!(stats.pages, 6);
    let times = |path: &Path| -> Vec<u64> {
        let t = TraceDat::open(path).unwrap();
        let v: Vec<u64> = t
            .instance_records("mine")
            .unwrap()
            .map(|r| r.unwrap().ts)
            .collect();
        v
    };
    let want: Vec<u64> = times(&input).into_iter().map(drift).collect();
    assert_eq!(times(&out), want);
    assert!(!want.is_empty());
    check_with_trace_cmd(&input, &out, drift);
}

#[test]
fn tsc2nsec_scaling_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = built(false);
    let mut tsc = Vec::new();
    tsc.extend_from_slice(&3u32.to_le_bytes());
    tsc.extend_from_slice(&1u32.to_le_bytes());
    tsc.extend_from_slice(&0u64.to_le_bytes());
    b.options.push((14, tsc));
    let input = dir.path().join("tsc.dat");
    std::fs::write(&input, b.build()).unwrap();
    let err = retime_trace_dat(&input, &dir.path().join("out.dat"), &drift).unwrap_err();
    assert!(
        matches!(err, RetimeError::Unsupported { .. }) && err.to_string().contains("TSC2NSEC"),
        "{err}"
    );
}

/// The trace-cmd comparison is not vacuous: it rejects a copy whose times
/// are off by one nanosecond.
#[test]
fn the_trace_cmd_oracle_notices_a_one_ns_error() {
    if !have_trace_cmd() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let input = dat("sched_load");
    let (out, _) = retime_and_check(&input, dir.path(), drift);
    let caught = std::panic::catch_unwind(|| {
        check_with_trace_cmd(&input, &out, |t| drift(t) + 1);
    });
    assert!(caught.is_err());
}

/// A trace written by the crate's own writer (the recorder's format).
#[test]
fn trace_from_the_crates_writer_reads_back_at_the_mapped_times() {
    let dir = tempfile::tempdir().unwrap();
    let big = cfg!(target_endian = "big");
    let page_size = 4096;
    let mut cpu_files = Vec::new();
    for (cpu, pages) in pages(big).iter().enumerate() {
        let path = dir.path().join(format!("cpu{cpu}.raw"));
        let bytes: Vec<u8> = pages.iter().flat_map(|p| p.bytes(page_size, 8)).collect();
        std::fs::write(&path, bytes).unwrap();
        cpu_files.push(path);
    }
    let header_page = format!(
        "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n\
         \tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n\
         \tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n\
         \tfield: char data;\toffset:16;\tsize:{};\tsigned:0;\n",
        page_size - 16
    );
    let meta = TraceDatMeta {
        page_size: page_size as u32,
        long_size: 8,
        header_page: header_page.into_bytes(),
        header_event: b"# compressed entry header\n\ttype_len    :    5 bits\n\ttime_delta  :   27 bits\n\tarray       :   32 bits\n\n\tpadding     : type == 29\n\ttime_extend : type == 30\n\ttime_stamp : type == 31\n\tdata max type_len  == 28\n".to_vec(),
        ftrace_formats: vec![PRINT.as_bytes().to_vec()],
        event_formats: vec![("sched".into(), vec![SCHED_SWITCH.as_bytes().to_vec()])],
        kallsyms: Vec::new(),
        printk_formats: Vec::new(),
        cmdlines: b"100 bash\n200 worker\n".to_vec(),
        trace_clock: "mono".into(),
        uname: Some("Linux test".into()),
        cpu_stats: vec!["entries: 0\n".into(), "entries: 0\n".into()],
    };
    let input = dir.path().join("written.dat");
    write_trace_dat(&input, &meta, &cpu_files).unwrap();
    let (out, stats) = retime_and_check(&input, dir.path(), drift);
    assert_eq!(stats.pages, 3);
    check_with_trace_cmd(&input, &out, drift);
}

/// A one-page trace whose second event comes `gap` ns after the first.
fn gap_trace(gap: u32) -> Vec<u8> {
    let mut b = built(false);
    let print = payload(
        PRINT,
        false,
        &[
            ("common_pid", V::I(1)),
            ("ip", V::I(1)),
            ("buf", V::S("x\n")),
        ],
    );
    let mut p = Page::new(1_000_000, false);
    p.event(1, &print).event(gap, &print);
    b.cpus = vec![vec![], vec![p]];
    b.build()
}

#[test]
fn a_map_that_stretches_a_delta_past_27_bits_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("gap.dat");
    std::fs::write(&input, gap_trace(100_000_000)).unwrap();
    let out = dir.path().join("out.dat");
    // Slope 2: the 100 ms delta becomes 200 ms, more than 2^27 ns.
    let err = retime_trace_dat(&input, &out, &|t| 2 * t).unwrap_err();
    let text = err.to_string();
    match &err {
        RetimeError::Page {
            cpu, page_offset, ..
        } => {
            assert_eq!(*cpu, 1, "{text}");
            assert_eq!(page_offset % 4096, 0, "{text}");
            assert!(*page_offset > 0, "{text}");
        }
        other => panic!("expected a page error, got {other:?}"),
    }
    assert!(text.contains("27 bits") && text.contains("CPU 1"), "{text}");
    assert!(!out.exists());
    // The same delta with the drifting clock (slope < 1) is fine.
    retime_trace_dat(&input, &out, &drift).unwrap();
}

#[test]
fn a_decreasing_map_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    for trace in TRACES {
        let out = dir.path().join("out.dat");
        let err =
            retime_trace_dat(&dat(trace), &out, &|t| (1u64 << 60) - t.min(1 << 59)).unwrap_err();
        assert!(
            matches!(err, RetimeError::Page { .. })
                && (err.to_string().contains("non-decreasing")
                    || err.to_string().contains("decreases")),
            "{trace}: {err}"
        );
        assert!(!out.exists());
    }
}

#[test]
fn v7_files_are_refused_saying_so() {
    if !have_trace_cmd() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut refused = 0;
    for compression in ["zstd", "none"] {
        let v7 = dir.path().join(format!("v7-{compression}.dat"));
        let Some(v7) = convert_v7(&dat("sched_load"), compression, &v7) else {
            continue;
        };
        let out = dir.path().join("out.dat");
        let err = retime_trace_dat(&v7, &out, &drift).unwrap_err();
        assert!(
            matches!(err, RetimeError::Unsupported { .. }) && err.to_string().contains("version 7"),
            "{compression}: {err}"
        );
        assert!(!out.exists());
        refused += 1;
    }
    assert!(refused > 0, "trace-cmd converted no v7 file");
}
