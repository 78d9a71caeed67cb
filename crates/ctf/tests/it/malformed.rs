//! Malformed input: every failure is an error naming the file and a byte
//! offset inside it; nothing panics or hangs. Hand-picked breakages first,
//! then random mutations of small real traces (proptest).

use std::path::Path;

use crate::common::*;
use deepspan_ctf::{CtfTrace, Error, ErrorKind};
use proptest::prelude::*;

/// Decodes everything reachable and returns the errors met. Panics (test
/// failure) are what this guards against.
fn exercise(metadata: &[u8], streams: Vec<Vec<u8>>) -> Vec<Error> {
    let lens: Vec<usize> = streams.iter().map(Vec::len).collect();
    let mut errors = Vec::new();
    let trace = match CtfTrace::from_memory(metadata, streams) {
        Ok(t) => t,
        Err(e) => {
            check_error(&e, metadata.len(), &lens);
            return vec![e];
        }
    };
    let _ = trace.lost_events();
    let mut n = 0usize;
    for r in trace.events() {
        match r {
            Ok(e) => {
                let _ = (
                    e.fields(),
                    e.context(),
                    e.to_event(),
                    e.span_sync(),
                    e.packet_context(),
                );
                if let Some((name, _)) = e.fields().first() {
                    let _ = e.enum_label(name);
                }
                n += 1;
                // An event takes at least one bit: more would be a loop.
                assert!(
                    n <= lens.iter().sum::<usize>() * 8 + 1,
                    "more events than bits"
                );
            }
            Err(e) => {
                check_error(&e, metadata.len(), &lens);
                errors.push(e);
            }
        }
    }
    errors
}

fn check_error(e: &Error, metadata_len: usize, stream_lens: &[usize]) {
    let msg = e.to_string();
    match e.kind() {
        ErrorKind::Metadata { path, offset, .. } => {
            assert_eq!(path, Path::new("metadata"), "{msg}");
            assert!(
                *offset as usize <= metadata_len,
                "offset past the end: {msg}"
            );
        }
        ErrorKind::Data { path, offset, .. } => {
            let i: usize = path
                .to_str()
                .unwrap()
                .trim_start_matches("stream")
                .parse()
                .unwrap();
            assert!(
                *offset as usize <= stream_lens[i],
                "offset past the end: {msg}"
            );
        }
        other => panic!("unexpected error kind: {other}"),
    }
}

fn only_error(metadata: &[u8], stream: Vec<u8>) -> Error {
    let mut errors = exercise(metadata, vec![stream]);
    assert_eq!(errors.len(), 1, "{errors:?}");
    errors.remove(0)
}

fn rotation() -> (Vec<u8>, Vec<u8>) {
    small_trace(&corpus("lttng-tracefile-rotation/kernel"), 20)
}

fn patch_u64_le(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

// lttng-tracefile-rotation's packet: header magic(4) uuid(16) stream_id(4)
// stream_instance_id(8) = 32 bytes, then timestamp_begin, timestamp_end,
// content_size (byte 48), packet_size (byte 56), ...
const CONTENT_SIZE_AT: usize = 48;
const PACKET_SIZE_AT: usize = 56;

#[test]
fn small_real_trace_decodes() {
    let (m, s) = rotation();
    assert!(exercise(&m, vec![s]).is_empty());
}

/// Decodes a one-stream trace held in memory (no errors allowed) and
/// returns its events' count and the cuts it reports.
fn decode_cut(metadata: &[u8], stream: Vec<u8>) -> (usize, Vec<deepspan_ctf::StreamCut>) {
    let trace = CtfTrace::from_memory(metadata, vec![stream]).unwrap();
    let mut n = 0;
    for e in trace.events() {
        e.unwrap();
        n += 1;
    }
    (n, trace.truncations())
}

#[test]
fn truncated_packet() {
    // A file cut inside its only packet's events: the packet is dropped
    // (no error), and the cut is reported with the packet's times.
    let (m, mut s) = rotation();
    let len = s.len();
    s.truncate(len - 3);
    let (n, cuts) = decode_cut(&m, s);
    assert_eq!(n, 0);
    assert_eq!(cuts.len(), 1, "{cuts:?}");
    let text = cuts[0].to_string();
    assert_eq!(cuts[0].missing_bytes(), Some(3), "{text}");
    assert!(cuts[0].events_lost && cuts[0].begin_ns.is_some(), "{text}");
    assert!(
        text.starts_with(&format!("stream0 is cut short at byte {}", len - 3))
            && text.contains("events from"),
        "{text}"
    );
}

#[test]
fn content_size_larger_than_packet_size() {
    let (m, mut s) = rotation();
    let bits = s.len() as u64 * 8;
    patch_u64_le(&mut s, CONTENT_SIZE_AT, bits + 8);
    let e = only_error(&m, s);
    assert!(e.to_string().contains("content size"), "{e}");
}

#[test]
fn content_size_cutting_an_event() {
    let (m, mut s) = rotation();
    let bits = s.len() as u64 * 8;
    patch_u64_le(&mut s, CONTENT_SIZE_AT, bits - 8);
    let e = only_error(&m, s);
    let ErrorKind::Data {
        offset, message, ..
    } = e.kind()
    else {
        panic!("{e}")
    };
    assert!(message.contains("runs past the end"), "{e}");
    assert!(*offset > 64 && *offset < bits / 8, "{e}");
}

#[test]
fn zero_or_huge_packet_size() {
    let (m, mut s) = rotation();
    patch_u64_le(&mut s, PACKET_SIZE_AT, 0);
    patch_u64_le(&mut s, CONTENT_SIZE_AT, 0);
    assert!(only_error(&m, s).to_string().contains("packet size"));
    // A packet size past the end of the file reads as a cut file; its
    // content is all there, so its events are kept.
    let (m, s) = rotation();
    let (whole, _) = decode_cut(&m, s.clone());
    let mut s = s;
    patch_u64_le(&mut s, PACKET_SIZE_AT, u64::MAX - 7);
    let (n, cuts) = decode_cut(&m, s);
    assert_eq!(n, whole);
    assert_eq!(cuts.len(), 1, "{cuts:?}");
    assert!(!cuts[0].events_lost, "{}", cuts[0]);
    assert!(cuts[0].to_string().contains("padding is cut"));
}

#[test]
fn bad_magic_and_uuid() {
    let (m, mut s) = rotation();
    s[0] ^= 0xff;
    assert!(only_error(&m, s).to_string().contains("bad packet magic"));
    let (m, mut s) = rotation();
    s[7] ^= 0xff;
    assert!(only_error(&m, s).to_string().contains("uuid"));
}

#[test]
fn unknown_event_id() {
    // The first event header starts after the 84-byte packet header and
    // context; its low 5 bits are the compact id. Id 30 is not declared.
    let (m, mut s) = rotation();
    s[84] = (s[84] & !0x1f) | 30;
    let e = only_error(&m, s);
    assert_eq!(
        e.to_string(),
        "stream0: byte 84: unknown event id 30 in stream 0"
    );
}

#[test]
fn bad_metadata_is_reported_with_offset_and_line() {
    let good = std::fs::read(corpus("perf-taskset2/trace/metadata")).unwrap();
    let text = String::from_utf8(good).unwrap();
    let broken = text.replacen("size = 32;", "size = 99;", 1);
    let e = CtfTrace::from_memory(broken.as_bytes(), vec![])
        .err()
        .unwrap();
    let ErrorKind::Metadata {
        offset, message, ..
    } = e.kind()
    else {
        panic!("{e}")
    };
    assert_eq!(*offset as usize, broken.find("size = 99").unwrap(), "{e}");
    assert!(
        message.contains("integer size 99") && message.contains("line 9"),
        "{e}"
    );

    for (bad, why) in [
        ("trace { byte_order = le; }; event { fields := struct { unknown_t x; }; };", "unknown type"),
        ("trace { byte_order = le; };\nclock { name = c; freq = 0; };", "frequency"),
        ("event { name = x; };", "no `trace` block"),
        ("trace { byte_order = le; }; typealias integer { size = 8; } := u8;\nevent { fields := struct { u8 n; u8 s[m]; }; };", "`m` names no preceding field"),
        ("trace { byte_order = le; }; typealias integer { size = 8; } := u8;\nevent { fields := struct { u8 t; variant <t> { u8 a; } v; }; };", "not an enumeration"),
        ("trace { byte_order = le; }; typealias integer { size = 8; } := u8;\nevent { fields := struct { u8 x; struct { } e[99999999]; }; };", "empty elements"),
        ("trace { byte_order = le; }; typealias floating_point { exp_dig = 5; mant_dig = 11; } := half;", "only 32-bit and 64-bit"),
    ] {
        let e = CtfTrace::from_memory(bad.as_bytes(), vec![]).err().unwrap_or_else(|| panic!("{bad} accepted"));
        assert!(e.to_string().contains(why), "{bad}: {e}");
        check_error(&e, bad.len(), &[]);
    }
}

#[test]
fn exponential_typedefs_are_refused() {
    let mut m =
        String::from("trace { byte_order = le; }; typealias integer { size = 8; } := t0;\n");
    for i in 1..40 {
        m.push_str(&format!(
            "typedef struct {{ t{p} a; t{p} b; }} t{i};\n",
            p = i - 1
        ));
    }
    m.push_str("event { fields := struct { t39 x; }; };");
    let e = CtfTrace::from_memory(m.as_bytes(), vec![]).err().unwrap();
    assert!(e.to_string().contains("more than"), "{e}");
}

#[test]
fn sequence_lengths_that_lie() {
    let m = "trace { byte_order = le; }; typealias integer { size = 32; } := u32;\n\
             event { fields := struct { u32 n; u32 s[n]; struct { } e[n]; }; };";
    // No packet context: the whole stream is one packet; n = 2^32-1.
    let e = only_error(m.as_bytes(), vec![0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0]);
    assert!(e.to_string().contains("runs past the end"), "{e}");
    let m2 = "trace { byte_order = le; }; typealias integer { size = 32; } := u32;\n\
              event { fields := struct { u32 n; struct { } e[n]; }; };";
    let e = only_error(m2.as_bytes(), vec![0xff, 0xff, 0xff, 0xff]);
    assert!(e.to_string().contains("zero size"), "{e}");
}

#[test]
fn zero_length_events_are_an_error_not_a_loop() {
    let m = "trace { byte_order = le; }; event { name = nothing; fields := struct { }; };";
    let e = only_error(m.as_bytes(), vec![0; 16]);
    assert!(e.to_string().contains("zero length"), "{e}");
}

#[test]
fn missing_and_empty_folders() {
    let e = CtfTrace::open("/nonexistent/deepspan").err().unwrap();
    assert!(matches!(e.kind(), ErrorKind::Io { .. }), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let e = CtfTrace::open(dir.path()).err().unwrap();
    assert!(matches!(e.kind(), ErrorKind::NoTrace(_)), "{e}");
    // A stream file cut inside its first packet header opens, without
    // events, and is reported as cut.
    let trace = dir.path().join("t");
    std::fs::create_dir(&trace).unwrap();
    let (m, s) = rotation();
    std::fs::write(trace.join("metadata"), m).unwrap();
    std::fs::write(trace.join("chan_0"), &s[..10]).unwrap();
    let t = CtfTrace::open(dir.path()).unwrap();
    assert_eq!(t.events().count(), 0);
    let cuts = t.truncations();
    assert_eq!(cuts.len(), 1, "{cuts:?}");
    let text = cuts[0].to_string();
    assert!(
        text.contains("chan_0 is cut short at byte 10") && text.contains("header"),
        "{text}"
    );
    // A file whose first packet header is not a packet header at all
    // still fails at open, naming it.
    let mut junk = s.clone();
    junk[0] ^= 0xff;
    std::fs::write(trace.join("chan_0"), &junk).unwrap();
    let e = CtfTrace::open(dir.path()).err().unwrap();
    assert!(e.to_string().contains("chan_0"), "{e}");
}

fn bases() -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v = vec![
        rotation(),
        small_trace(&corpus("flipping-endianness/trace"), 15),
        small_trace(&corpus("perf-taskset2/trace"), 10),
        small_trace(&corpus("bug446190/trace"), 15),
        small_trace(&corpus("multi-domains/kernel"), 2),
    ];
    // Text metadata for the packetized ones too, so mutations reach TSDL.
    for t in ["flipping-endianness/trace", "multi-domains/kernel"] {
        let (_, s) = small_trace(&corpus(t), 10);
        let text = CtfTrace::open(corpus(t)).unwrap().traces()[0]
            .metadata_text()
            .to_string();
        v.push((text.into_bytes(), s));
    }
    v
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip {
        stream: bool,
        at: usize,
        xor: u8,
    },
    Truncate {
        stream: bool,
        at: usize,
    },
    Insert {
        stream: bool,
        at: usize,
        bytes: Vec<u8>,
    },
    Remove {
        stream: bool,
        at: usize,
        len: usize,
    },
    Word {
        at: usize,
        value: u64,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<bool>(), any::<usize>(), 1u8..).prop_map(|(stream, at, xor)| Mutation::Flip { stream, at, xor }),
        1 => (any::<bool>(), any::<usize>()).prop_map(|(stream, at)| Mutation::Truncate { stream, at }),
        1 => (any::<bool>(), any::<usize>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(stream, at, bytes)| Mutation::Insert { stream, at, bytes }),
        1 => (any::<bool>(), any::<usize>(), 1usize..16).prop_map(|(stream, at, len)| Mutation::Remove { stream, at, len }),
        2 => (any::<usize>(), prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>(), 0u64..4096])
            .prop_map(|(at, value)| Mutation::Word { at, value }),
    ]
}

fn apply(m: &Mutation, meta: &mut Vec<u8>, stream: &mut Vec<u8>) {
    let (s, at) = match m {
        Mutation::Word { at, value } => {
            // Aligned 64-bit words of the stream: sizes, timestamps, counters.
            if stream.len() >= 8 {
                let i = (at % (stream.len() / 8)) * 8;
                stream[i..i + 8].copy_from_slice(&value.to_le_bytes());
            }
            return;
        }
        Mutation::Flip { stream: s, at, .. }
        | Mutation::Truncate { stream: s, at }
        | Mutation::Insert { stream: s, at, .. }
        | Mutation::Remove { stream: s, at, .. } => (*s, *at),
    };
    let b = if s { stream } else { meta };
    let i = if b.is_empty() { 0 } else { at % b.len() };
    match m {
        Mutation::Flip { xor, .. } if !b.is_empty() => b[i] ^= xor,
        Mutation::Truncate { .. } => b.truncate(i),
        Mutation::Insert { bytes, .. } => {
            b.splice(i..i, bytes.iter().copied());
        }
        Mutation::Remove { len, .. } if !b.is_empty() => {
            let j = (i + len).min(b.len());
            b.drain(i..j);
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn mutated_traces_never_panic(base in 0usize..7, muts in prop::collection::vec(mutation(), 1..6)) {
        thread_local!(static BASES: Vec<(Vec<u8>, Vec<u8>)> = bases());
        let (mut meta, mut stream) = BASES.with(|b| b[base].clone());
        for m in &muts {
            apply(m, &mut meta, &mut stream);
        }
        exercise(&meta, vec![stream]);
    }
}
