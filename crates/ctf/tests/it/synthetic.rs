//! A hand-built trace exercising what the corpus does not: LTTng ≥ 2.6
//! syscall names, compact-header timestamp wrap-around and the extended
//! escape, bit-packed and big-endian integers in a little-endian trace,
//! floats, a variant selected by an enumeration range, a sequence, nested
//! structs, a `tid` context, lost events, and a clock with offset_s. Decoded
//! by us and by babeltrace2 (the same bytes written to a folder).

use std::path::Path;

use crate::common::synthetic::{streams, METADATA};
use crate::common::*;
use deepspan_ctf::{CtfTrace, Error};
use deepspan_model::{EventKind, Value};

#[test]
fn synthetic_trace_decodes_as_built() {
    let t = CtfTrace::from_memory(METADATA.as_bytes(), streams()).unwrap();
    let info = &t.traces()[0];
    assert_eq!(info.hostname(), Some("synth"));
    assert_eq!(info.clock_offset_ns(), 10_000_000_005);
    assert!(!info.tid_inferred());
    let mut it = t.events();
    let ev: Vec<_> = it.by_ref().map(|e| e.unwrap()).collect();
    assert_eq!(it.lost_events(), 4);
    let ts: Vec<u64> = ev.iter().map(|e| e.monotonic_ns()).collect();
    assert_eq!(ts, [1000, 2000, (1 << 27) + 5, (1 << 27) + 30]);
    assert!(ev
        .iter()
        .all(|e| e.ts() == e.monotonic_ns() + 10_000_000_005));
    assert!(ev.iter().all(|e| e.cpu() == 3));

    let enter = ev[0].to_event();
    assert_eq!(enter.tid, 42);
    assert_eq!(
        enter.kind,
        EventKind::SysEnter {
            id: -1,
            name: Some("futex".into()),
            args: [0x7f00_dead, 128, 1, 0, 0, 0]
        }
    );
    assert_eq!(
        ev[2].to_event().kind,
        EventKind::SysExit {
            id: -1,
            name: Some("futex".into()),
            ret: -11
        }
    );

    let misc = &ev[1];
    assert_eq!(misc.loglevel(), Some(13));
    assert_eq!(misc.enum_label("sel"), Some("B"));
    let names: Vec<&str> = misc.fields().iter().map(|(n, _)| &**n).collect();
    assert_eq!(
        names,
        [
            "bits3",
            "pad5",
            "be13",
            "be3",
            "f32",
            "f64",
            "sel",
            "var",
            "n",
            "seq",
            "s",
            "nested.a",
            "nested.inner.b"
        ]
    );
    let vals: Vec<&Value> = misc.fields().iter().map(|(_, v)| v).collect();
    assert_eq!(
        vals,
        [
            &Value::Int(-2),
            &Value::UInt(0b10101),
            &Value::UInt(0x1abc),
            &Value::Int(3),
            &Value::Float(1.5),
            &Value::Float(-2.25),
            &Value::UInt(3),
            &Value::Str("hello".into()),
            &Value::UInt(2),
            &Value::Array(vec![Value::UInt(7), Value::UInt(65535)]),
            &Value::Str("x".into()),
            &Value::UInt(1),
            &Value::UInt(2),
        ]
    );
    assert_eq!(misc.context_field("tid"), Some(&Value::Int(42)));
    assert_eq!(ev[3].enum_label("sel"), Some("C"));
    assert_eq!(ev[3].field("var.x"), Some(&Value::UInt(9)));
    assert_eq!(ev[3].field("var.y"), Some(&Value::UInt(10)));
    assert_eq!(ev[3].field("seq"), Some(&Value::Array(vec![])));
    assert_eq!(ev[3].tid(), 7);
    assert_eq!(ev[3].field("be3"), Some(&Value::Int(-4)));
}

#[test]
fn synthetic_trace_matches_babeltrace2() {
    if !tool_available("babeltrace2") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    if let Ok(keep) = std::env::var("DEEPSPAN_KEEP_SYNTHETIC") {
        std::fs::create_dir_all(&keep).unwrap();
        std::fs::write(Path::new(&keep).join("metadata"), METADATA).unwrap();
        std::fs::write(Path::new(&keep).join("chan_0"), &streams()[0]).unwrap();
    }
    std::fs::write(dir.path().join("metadata"), METADATA).unwrap();
    std::fs::write(dir.path().join("chan_0"), &streams()[0]).unwrap();
    let t = CtfTrace::open(dir.path()).unwrap();
    let ours: Vec<BtEvent> = t.events().map(|e| our_event(&e.unwrap())).collect();
    assert_same_events(&ours, &babeltrace_events(dir.path()), "synthetic");
}

#[test]
fn cut_packets_are_reported_not_errors() {
    let mut s = streams();
    // Cut the second packet in the middle.
    let len = s[0].len();
    s[0].truncate(len - 20);
    let t = CtfTrace::from_memory(METADATA.as_bytes(), s).unwrap();
    let results: Vec<_> = t.events().collect();
    assert!(results.iter().all(|r| r.is_ok()), "no error");
    assert_eq!(results.len(), 3, "events before the damage are kept");
    let cuts = t.truncations();
    assert_eq!(cuts.len(), 1, "{cuts:?}");
    assert_eq!(cuts[0].path.to_str(), Some("stream0"));
    assert_eq!(cuts[0].file_bytes, len as u64 - 20);
    assert_eq!(cuts[0].missing_bytes(), Some(20));
    assert!(cuts[0].packet_offset > 0 && cuts[0].packet_offset < len as u64);
}

#[test]
fn reader_types_can_move_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<CtfTrace>();
    send_sync::<deepspan_ctf::CtfEvent>();
    send::<deepspan_ctf::Events>();
    send_sync::<Error>();
}
