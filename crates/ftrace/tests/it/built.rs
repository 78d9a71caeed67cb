//! Small traces built by the test builder, covering what the corpus files
//! lack: big-endian data, 4-byte kernel longs, time extends, absolute
//! timestamps, discarded events, lost events, `__rel_loc`, instances and
//! time options. Where trace-cmd is installed it decodes the same files and
//! must agree.

use crate::common::builder::*;
use crate::common::*;
use deepspan_ftrace::{Error, TraceDat, UNKNOWN_EVENT};
use deepspan_model::{EventKind, Value};

/// Per CPU: (ts, event name) expected, in order.
type Expected = Vec<(u64, u32, &'static str)>;

/// A two-CPU trace with one event of each kind and every page entry type.
fn sample(big: bool, long: usize) -> (Builder, Expected) {
    let mut b = Builder::new(big, long);
    let switch = if long == 8 {
        SCHED_SWITCH
    } else {
        SCHED_SWITCH_OLD
    };
    b.format("sched", switch)
        .format("sched", SCHED_WAKEUP)
        .format("sched", SCHED_PROCESS_EXEC)
        .format("irq", IRQ_HANDLER_ENTRY)
        .format("raw_syscalls", SYS_ENTER)
        .format("test", REL_LOC)
        .format("ftrace", PRINT);
    b.cmdlines = "100 bash\n200 worker thread\n".into();
    b.clock = Some("mono".into());

    let sw = payload(
        switch,
        big,
        &[
            ("common_pid", V::I(100)),
            ("prev_comm", V::S("bash")),
            ("prev_pid", V::I(100)),
            ("prev_prio", V::I(120)),
            ("prev_state", V::I(1)),
            ("next_comm", V::S("worker thread")),
            ("next_pid", V::I(200)),
            ("next_prio", V::I(-2)),
        ],
    );
    let wake = payload(
        SCHED_WAKEUP,
        big,
        &[
            ("common_pid", V::I(100)),
            ("comm", V::S("worker thread")),
            ("pid", V::I(200)),
            ("prio", V::I(120)),
            ("target_cpu", V::I(1)),
        ],
    );
    let exec = payload(
        SCHED_PROCESS_EXEC,
        big,
        &[
            ("common_pid", V::I(200)),
            ("filename", V::S("/usr/bin/true")),
            ("pid", V::I(200)),
            ("old_pid", V::I(200)),
        ],
    );
    let irq = payload(
        IRQ_HANDLER_ENTRY,
        big,
        &[("irq", V::I(42)), ("name", V::S("eth0-rx"))],
    );
    let sys = payload(
        SYS_ENTER,
        big,
        &[("common_pid", V::I(200)), ("id", V::I(59))],
    );
    let rel = payload(
        REL_LOC,
        big,
        &[
            ("common_pid", V::I(7)),
            ("value", V::I(-5)),
            ("msg", V::S("relative")),
        ],
    );
    let print = payload(
        PRINT,
        big,
        &[
            ("common_pid", V::I(100)),
            ("ip", V::I(0x1234)),
            ("buf", V::S("hello world\n")),
        ],
    );

    // CPU 0: plain events, a time extend, a discarded event, a long event.
    let mut p0 = Page::new(1_000_000, big);
    p0.event(10, &sw) // 1_000_010
        .event(5, &wake) // 1_000_015
        .extend(1 << 30) // +1073741824
        .event(7, &exec) // 1_073_741_824 + 1_000_022
        .discarded(3, 16) // +3 (kept, as libtraceevent does)
        .long_event(2, &irq); // +2
    let t_exec = 1_000_015 + (1 << 30) + 7;
    // CPU 1: an absolute timestamp, then events on a second page.
    let mut p1 = Page::new(2_000_000, big);
    p1.event(1, &sys) // 2_000_001
        .absolute(5_000_000)
        .event(4, &rel); // 5_000_004
    let mut p1b = Page::new(6_000_000, big);
    p1b.event(0, &print);
    b.cpus = vec![vec![p0], vec![p1, p1b]];
    let expected = vec![
        (1_000_010, 0, "sched_switch"),
        (1_000_015, 0, "sched_wakeup"),
        (2_000_001, 1, "sys_enter"),
        (5_000_004, 1, "rel_event"),
        (6_000_000, 1, "print"),
        (t_exec, 0, "sched_process_exec"),
        (t_exec + 3 + 2, 0, "irq_handler_entry"),
    ];
    (b, expected)
}

fn open_bytes(bytes: &[u8]) -> TraceDat {
    TraceDat::from_bytes(bytes.to_vec()).unwrap()
}

#[test]
fn decodes_every_entry_type_in_both_byte_orders_and_long_sizes() {
    for (big, long) in [(false, 8), (true, 8), (false, 4), (true, 4)] {
        let what = format!("big={big} long={long}");
        let (b, expected) = sample(big, long);
        let t = open_bytes(&b.build());
        assert_eq!(t.big_endian(), big, "{what}");
        assert_eq!(t.schema().long_size() as usize, long, "{what}");
        assert_eq!(t.clock(), Some("mono"), "{what}");
        assert_eq!(
            t.cmdlines().get(&200).map(String::as_str),
            Some("worker thread")
        );
        let s = t.schema().clone();
        let records = all_records(&t);
        let got: Vec<(u64, u32, &str)> =
            records.iter().map(|r| (r.ts, r.cpu, r.name(&s))).collect();
        assert_eq!(got, expected, "{what}");

        let events: Vec<_> = records.iter().map(|r| r.to_event(&s)).collect();
        match &events[0].kind {
            EventKind::SchedSwitch(sw) => {
                assert_eq!(
                    (sw.prev_tid, sw.next_tid, sw.prev_prio, sw.next_prio),
                    (100, 200, 120, -2),
                    "{what}"
                );
                assert_eq!(
                    (sw.prev_comm.to_string(), sw.next_comm.to_string()),
                    ("bash".into(), "worker thread".into())
                );
                assert_eq!(sw.prev_state, 1);
                assert!(!sw.prev_runnable());
            }
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(events[0].tid, 100);
        match &events[1].kind {
            EventKind::SchedWakeup(w) => assert_eq!(
                (w.tid, w.prio, w.target_cpu, w.comm.to_string()),
                (200, 120, 1, "worker thread".into())
            ),
            other => panic!("{what}: {other:?}"),
        }
        match &events[2].kind {
            EventKind::SysEnter { id, name, args } => {
                assert_eq!((*id, name.clone(), *args), (59, None, [0; 6]))
            }
            other => panic!("{what}: {other:?}"),
        }
        assert!(matches!(&events[3].kind, EventKind::Other { name } if &**name == "rel_event"));
        assert_eq!(
            records[3].field(&s, "msg"),
            Some(Value::Str("relative".into())),
            "{what}"
        );
        assert_eq!(
            records[3].field(&s, "value"),
            Some(Value::Int(-5)),
            "{what}"
        );
        assert_eq!(
            records[4].fields(&s).unwrap(),
            vec![
                ("ip".into(), Value::UInt(0x1234)),
                ("buf".into(), Value::Str("hello world\n".into()))
            ],
            "{what}"
        );
        match &events[5].kind {
            EventKind::SchedProcessExec {
                tid,
                old_tid,
                filename,
            } => {
                assert_eq!(
                    (*tid, *old_tid, &**filename),
                    (200, 200, "/usr/bin/true"),
                    "{what}"
                )
            }
            other => panic!("{what}: {other:?}"),
        }
        match &events[6].kind {
            EventKind::IrqHandlerEntry { irq, name } => {
                assert_eq!((*irq, &**name), (42, "eth0-rx"), "{what}")
            }
            other => panic!("{what}: {other:?}"),
        }
        // Typed mapping as exposed for inspection.
        let id = |name: &str| s.events().find(|f| f.name == name).unwrap().id;
        assert_eq!(s.typed_variant(id("sched_switch")), Some("SchedSwitch"));
        assert_eq!(
            s.typed_variant(id("sched_process_exec")),
            Some("SchedProcessExec")
        );
        assert_eq!(s.typed_variant(id("rel_event")), None);
        assert_eq!(s.typed_variant(id("print")), None);
        // Per CPU iteration gives the same records.
        let cpu1: Vec<u64> = t.cpu_records(1).unwrap().map(|r| r.unwrap().ts).collect();
        assert_eq!(cpu1, vec![2_000_001, 5_000_004, 6_000_000]);
    }
}

#[test]
fn trace_cmd_agrees_on_built_traces() {
    if !have_trace_cmd() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (big, long) in [(false, 8), (true, 8), (false, 4), (true, 4)] {
        let what = format!("big={big} long={long}");
        let (b, expected) = sample(big, long);
        let path = dir.path().join(format!("built-{big}-{long}.dat"));
        std::fs::write(&path, b.build()).unwrap();
        let lines = report(&["-R", "-t"], &path);
        let got: Vec<(u64, u32, &str)> = lines
            .iter()
            .map(|l| (l.ts, l.cpu, l.name.as_str()))
            .collect();
        assert_eq!(got, expected, "{what}: trace-cmd report");
        let fields: Vec<&str> = lines.iter().map(|l| l.fields.as_str()).collect();
        assert!(
            fields[0].contains("prev_comm=bash prev_pid=100") && fields[0].contains("next_prio=-2"),
            "{what}: {}",
            fields[0]
        );
        assert!(
            fields[3].contains("value=-5") && fields[3].contains("msg=relative"),
            "{what}: {}",
            fields[3]
        );
        assert!(
            fields[5].contains("filename=/usr/bin/true"),
            "{what}: {}",
            fields[5]
        );
        assert!(fields[6].contains("name=eth0-rx"), "{what}: {}", fields[6]);
    }
}

#[test]
fn lost_events_are_counted() {
    let (mut b, _) = sample(false, 8);
    b.cpus[0][0].missed = Some(Some(42));
    b.cpus[1][1].missed = Some(None);
    let t = open_bytes(&b.build());
    let mut records = t.records().unwrap();
    assert_eq!(records.by_ref().count(), 7);
    assert_eq!(
        records.lost_events(),
        43,
        "42 stored + 1 for a page without a count"
    );
    let mut cpu0 = t.cpu_records(0).unwrap();
    cpu0.by_ref().for_each(drop);
    assert_eq!(cpu0.lost_events(), 42);
    assert!(records.bytes_read() >= t.cpu_data_bytes());
}

#[test]
fn time_options_convert_like_trace_cmd() {
    let (mut b, expected) = sample(false, 8);
    // TSC2NSEC: ns = ts * 3 >> 1; OFFSET adds 1000 ns.
    let mut tsc = Vec::new();
    tsc.extend_from_slice(&3u32.to_le_bytes());
    tsc.extend_from_slice(&1u32.to_le_bytes());
    tsc.extend_from_slice(&0u64.to_le_bytes());
    b.options.push((14, tsc));
    b.options.push((7, b"1000\0".to_vec()));
    let bytes = b.build();
    let t = open_bytes(&bytes);
    assert_eq!(t.ts_offset(), 1000);
    let got: Vec<u64> = all_records(&t).iter().map(|r| r.ts).collect();
    let want: Vec<u64> = expected
        .iter()
        .map(|(ts, _, _)| ts * 3 / 2 + 1000)
        .collect();
    assert_eq!(got, want);
    if have_trace_cmd() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tsc.dat");
        std::fs::write(&path, &bytes).unwrap();
        let theirs: Vec<u64> = report(&["-t"], &path).iter().map(|l| l.ts).collect();
        assert_eq!(theirs, want, "trace-cmd report -t");
    }
}

#[test]
fn instances_are_separate_buffers() {
    let (mut b, _) = sample(false, 8);
    let wake = payload(
        SCHED_WAKEUP,
        false,
        &[("pid", V::I(9)), ("comm", V::S("inst"))],
    );
    let mut p = Page::new(10, false);
    p.event(1, &wake).event(1, &wake);
    b.instances.push(("mine".into(), vec![vec![], vec![p]]));
    let bytes = b.build();
    let t = open_bytes(&bytes);
    assert_eq!(t.instances().collect::<Vec<_>>(), vec!["mine"]);
    assert_eq!(all_records(&t).len(), 7, "top instance unchanged");
    let inst: Vec<(u64, u32)> = t
        .instance_records("mine")
        .unwrap()
        .map(|r| r.map(|r| (r.ts, r.cpu)).unwrap())
        .collect();
    assert_eq!(inst, vec![(11, 1), (12, 1)]);
    assert!(matches!(
        t.instance_records("nope"),
        Err(Error::NoSuchInstance { .. })
    ));
    if have_trace_cmd() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inst.dat");
        std::fs::write(&path, &bytes).unwrap();
        let theirs = report(&["-t"], &path);
        assert_eq!(theirs.len(), 9, "trace-cmd shows top and instance records");
        assert_eq!(
            theirs.iter().filter(|l| l.ts == 11 || l.ts == 12).count(),
            2
        );
    }
}

#[test]
fn cpu_records_bounds_and_empty_cpus() {
    let (mut b, _) = sample(false, 8);
    b.cpus.push(vec![]);
    let t = open_bytes(&b.build());
    assert_eq!(t.cpus(), 3);
    assert_eq!(t.cpu_records(2).unwrap().count(), 0);
    let e = t.cpu_records(3).err().unwrap();
    assert!(matches!(e, Error::NoSuchCpu { cpu: 3, cpus: 3 }), "{e}");
}

#[test]
fn unknown_event_ids_decode_generically() {
    let (mut b, _) = sample(false, 8);
    let mut bogus = payload(SCHED_WAKEUP, false, &[("common_pid", V::I(77))]);
    bogus[0..2].copy_from_slice(&4242u16.to_le_bytes());
    let mut p = Page::new(1, false);
    p.event(1, &bogus);
    b.cpus.push(vec![p]);
    let t = open_bytes(&b.build());
    let s = t.schema().clone();
    let r = t.cpu_records(2).unwrap().next().unwrap().unwrap();
    assert_eq!(
        (r.event_id, r.name(&s), r.tid(&s)),
        (4242, UNKNOWN_EVENT, 77)
    );
    assert!(matches!(r.to_event(&s).kind, EventKind::Other { name } if &*name == UNKNOWN_EVENT));
    assert!(r.fields(&s).is_err());
    assert_eq!(r.field(&s, "pid"), None);
}

#[test]
fn commit_beyond_the_page_is_an_error_naming_the_offset() {
    let (b, _) = sample(false, 8);
    let mut bytes = b.build();
    let t = open_bytes(&bytes);
    let span_offset = {
        // CPU 1's first page: find it through a record's absence of error.
        let fly = bytes.windows(10).position(|w| w == b"flyrecord\0").unwrap() + 10;
        u64::from_le_bytes(bytes[fly + 16..fly + 24].try_into().unwrap()) as usize
    };
    drop(t);
    bytes[span_offset + 8..span_offset + 16].copy_from_slice(&9000u64.to_le_bytes());
    let t = open_bytes(&bytes);
    let errors: Vec<String> = t
        .records()
        .unwrap()
        .filter_map(|r| r.err())
        .map(|e| e.to_string())
        .collect();
    assert_eq!(
        errors,
        vec![format!("trace.dat offset {span_offset:#x}: CPU 1 page header: commit size 9000 exceeds page size 4096")]
    );
    // CPU 0 is still decoded in full.
    assert_eq!(
        t.records()
            .unwrap()
            .filter(|r| r.as_ref().is_ok_and(|r| r.cpu == 0))
            .count(),
        4
    );
}

/// Writes the built sample traces to $DEEPSPAN_WRITE_SEEDS (fuzzing seeds,
/// manual inspection); does nothing otherwise.
#[test]
fn write_seeds() {
    let Ok(dir) = std::env::var("DEEPSPAN_WRITE_SEEDS") else {
        return;
    };
    for (big, long) in [(false, 8), (true, 8), (false, 4), (true, 4)] {
        let (mut b, _) = sample(big, long);
        b.page_size = 256;
        std::fs::write(format!("{dir}/built-{big}-{long}.dat"), b.build()).unwrap();
    }
    let (mut b, _) = sample(false, 8);
    b.page_size = 256;
    b.cpus[0][0].missed = Some(Some(3));
    let mut tsc = Vec::new();
    tsc.extend_from_slice(&3u32.to_le_bytes());
    tsc.extend_from_slice(&1u32.to_le_bytes());
    tsc.extend_from_slice(&0u64.to_le_bytes());
    b.options.push((14, tsc));
    let wake = payload(
        SCHED_WAKEUP,
        false,
        &[("pid", V::I(9)), ("comm", V::S("inst"))],
    );
    let mut p = Page::new(10, false);
    p.event(1, &wake);
    b.instances.push(("mine".into(), vec![vec![p], vec![]]));
    std::fs::write(format!("{dir}/built-options.dat"), b.build()).unwrap();
}

/// Records as comparable tuples: (ts, cpu, name, fields).
fn decoded(t: &TraceDat) -> Vec<(u64, u32, String, deepspan_model::Fields)> {
    let s = t.schema().clone();
    all_records(t)
        .iter()
        .map(|r| (r.ts, r.cpu, r.name(&s).to_string(), r.fields(&s).unwrap()))
        .collect()
}

#[test]
fn built_v7_files_decode_like_v6_with_every_compression() {
    let dir = tempfile::tempdir().unwrap();
    for big in [false, true] {
        let (mut b, expected) = sample(big, 8);
        // Several pages on CPU 1 so that compressed data has two chunks.
        let print = payload(PRINT, big, &[("buf", V::S("more"))]);
        for i in 0..3 {
            let mut p = Page::new(7_000_000 + i * 1000, big);
            p.event(1, &print);
            b.cpus[1].push(p);
        }
        let v6 = decoded(&open_bytes(&b.build()));
        assert_eq!(v6.len(), expected.len() + 3);
        for c in [Compression::None, Compression::Zstd, Compression::Zlib] {
            let what = format!("big={big} {c:?}");
            let bytes = b.build_v7(c);
            let t = TraceDat::from_bytes(bytes.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                (t.version(), t.clock(), t.cpus()),
                (7, Some("mono"), 2),
                "{what}"
            );
            assert_eq!(decoded(&t), v6, "{what}");
            // trace-cmd referees the builder's v7 layout (its build here
            // has no zlib).
            if c != Compression::Zlib && have_trace_cmd() {
                let path = dir.path().join(format!("v7-{big}-{c:?}.dat"));
                std::fs::write(&path, &bytes).unwrap();
                let theirs: Vec<(u64, u32, String)> = report(&["-t"], &path)
                    .into_iter()
                    .map(|l| (l.ts, l.cpu, l.name))
                    .collect();
                let ours: Vec<(u64, u32, String)> = v6
                    .iter()
                    .map(|(ts, cpu, name, _)| (*ts, *cpu, name.clone()))
                    .collect();
                assert_eq!(theirs, ours, "{what}: trace-cmd report");
            }
        }
    }
}

#[test]
fn large_cpu_data_reads_in_chunks_from_files() {
    // 300 pages (1.2 MB) per CPU: several read chunks, whose buffers are
    // reused when no record holds on to them.
    let mut b = Builder::new(false, 8);
    b.format("sched", SCHED_WAKEUP);
    for cpu in 0..2 {
        let mut pages = Vec::new();
        for i in 0..300u64 {
            let mut p = Page::new(1_000 + i * 100_000 + cpu, false);
            for j in 0..50 {
                let w = payload(
                    SCHED_WAKEUP,
                    false,
                    &[("pid", V::I((i * 50 + j) as i64)), ("comm", V::S("w"))],
                );
                p.event(10, &w);
            }
            pages.push(p);
        }
        b.cpus.push(pages);
    }
    let bytes = b.build();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("large.dat");
    std::fs::write(&path, &bytes).unwrap();
    let from_file = TraceDat::open(&path).unwrap();
    let from_memory = open_bytes(&bytes);
    // Kept records (no reuse possible) and streamed ones (reuse) agree.
    let kept = all_records(&from_file);
    assert_eq!(kept.len(), 2 * 300 * 50);
    assert_eq!(kept, all_records(&from_memory));
    let s = from_file.schema().clone();
    let mut expected = kept.iter();
    for r in from_file.records().unwrap() {
        let r = r.unwrap();
        assert_eq!(&r, expected.next().unwrap());
        assert_eq!(r.field(&s, "comm"), Some(Value::Str("w".into())));
    }
    let pids: Vec<i64> = from_file
        .cpu_records(1)
        .unwrap()
        .map(|r| match r.unwrap().field(&s, "pid") {
            Some(Value::Int(p)) => p,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(pids, (0..15_000).collect::<Vec<i64>>());
}

#[test]
fn readers_can_move_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<TraceDat>();
    send_sync::<deepspan_ftrace::Schema>();
    send_sync::<deepspan_ftrace::Record>();
    send::<deepspan_ftrace::Records>();
    send::<deepspan_ftrace::CpuRecords>();
    send_sync::<Error>();
}
