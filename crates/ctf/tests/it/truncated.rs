//! CTF stream files cut short at many offsets (as a tracer killed while
//! writing leaves them): the trace still opens and decodes every whole
//! packet before the cut, with no error; [`CtfTrace::truncations`] names
//! the file and what is lost; the events of the cut file are exactly a
//! prefix of the whole file's, and the other files' events are untouched.
//! Metadata cut short is an error naming the metadata file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::common::*;
use deepspan_ctf::CtfTrace;

/// Events per file: (byte offset of the event, absolute ts), in the order
/// the file holds them.
type PerFile = BTreeMap<PathBuf, Vec<(u64, u64)>>;

fn decode(root: &Path, what: &str) -> PerFile {
    let trace = CtfTrace::open(root).unwrap_or_else(|e| panic!("{what}: open: {e}"));
    let mut out = PerFile::new();
    for e in trace.events() {
        let e = e.unwrap_or_else(|e| panic!("{what}: {e}"));
        let (path, offset) = e.source();
        out.entry(path.to_path_buf())
            .or_default()
            .push((offset, e.ts()));
    }
    for events in out.values_mut() {
        // The merge interleaves files; each file's own order is by offset.
        events.sort_unstable();
    }
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::write(&target, std::fs::read(entry.path()).unwrap()).unwrap();
        }
    }
}

/// Where packets start: the offsets of the CTF packet magic in either byte
/// order (found independently of the reader).
fn packet_starts(bytes: &[u8]) -> BTreeSet<usize> {
    let le = 0xC1FC_1FC1u32.to_le_bytes();
    let be = 0xC1FC_1FC1u32.to_be_bytes();
    (0..bytes.len().saturating_sub(3))
        .filter(|&i| i % 4 == 0 && (bytes[i..i + 4] == le || bytes[i..i + 4] == be))
        .collect()
}

/// The stream files of the test: per trace folder (relative to the
/// corpus), the stream files to cut.
const TARGETS: [(&str, &[&str]); 5] = [
    ("bug446190/trace", &["channel0_1"]),
    ("flipping-endianness/trace", &["channel-context-switches_0"]),
    (
        "lttng-tracefile-rotation/kernel",
        &["mychan_0_1", "mychan_3_1"],
    ),
    (
        "multi-domains",
        &["kernel/kernel_channel_0", "ust/ust2_channel_1"],
    ),
    ("perf-taskset2/trace", &[]),
];

#[test]
fn cut_stream_files_decode_their_whole_packets_with_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let mut tried = 0;
    for (folder, files) in TARGETS {
        let root = tmp.path().join(folder.replace('/', "_"));
        copy_dir(&corpus(folder), &root);
        let full = decode(&root, folder);
        assert!(CtfTrace::open(&root).unwrap().truncations().is_empty());
        let mut files: Vec<String> = files.iter().map(|f| f.to_string()).collect();
        if files.is_empty() {
            // Every stream file of a small trace.
            files = full
                .keys()
                .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
                .collect();
        }
        for file in files {
            let path = root.join(&file);
            let bytes = std::fs::read(&path).unwrap();
            let all = &full[&path];
            let starts = packet_starts(&bytes);
            let indexed = path
                .parent()
                .unwrap()
                .join("index")
                .join(format!(
                    "{}.idx",
                    path.file_name().unwrap().to_str().unwrap()
                ))
                .is_file();
            assert!(starts.contains(&0), "{folder}/{file}: no packet at 0");
            let mut cuts: BTreeSet<usize> = (0..bytes.len())
                .step_by((bytes.len() / 90).max(1))
                .collect();
            for &s in &starts {
                for c in [s.wrapping_sub(1), s, s + 1, s + 40] {
                    if c < bytes.len() {
                        cuts.insert(c);
                    }
                }
            }
            for cut in cuts {
                tried += 1;
                let what = format!("{folder}/{file} cut at {cut}");
                std::fs::write(&path, &bytes[..cut]).unwrap();
                let got = decode(&root, &what);
                for (p, events) in &full {
                    if *p != path {
                        assert_eq!(got.get(p), Some(events), "{what}: {} changed", p.display());
                    }
                }
                let kept = got.get(&path).map_or(&[][..], Vec::as_slice);
                assert!(all.starts_with(kept), "{what}: not a prefix");
                assert!(kept.iter().all(|&(o, _)| o < cut as u64), "{what}");
                let cuts = CtfTrace::open(&root).unwrap();
                // The warning comes out of decoding (or opening).
                let _ = cuts.events().count();
                let warnings = cuts.truncations();
                let before = |at: u64| all.iter().filter(|&&(o, _)| o < at).count();
                if starts.contains(&cut) && !indexed {
                    // Cut between packets, and no index: nothing tells that
                    // more was meant to follow; nothing before is lost.
                    assert!(warnings.is_empty(), "{what}: {warnings:?}");
                    assert_eq!(
                        kept.len(),
                        before(cut as u64),
                        "{what}: events lost before the cut"
                    );
                    continue;
                }
                assert_eq!(warnings.len(), 1, "{what}: {warnings:?}");
                let w = &warnings[0];
                let text = w.to_string();
                assert_eq!(w.path, path, "{what}");
                assert_eq!(w.file_bytes, cut as u64, "{what}");
                assert!(text.contains("is cut short at byte"), "{what}: {text}");
                let packet = *starts.range(..=cut).next_back().unwrap() as u64;
                assert_eq!(w.packet_offset, packet, "{what}: {text}");
                if indexed {
                    assert_eq!(w.expected_bytes, Some(bytes.len() as u64), "{what}: {text}");
                    let packets = starts.range(packet as usize..).count() as u64;
                    assert_eq!(w.lost_packets, Some(packets), "{what}: {text}");
                }
                // Every whole packet before the cut is kept, and the cut
                // one too when only its padding is gone.
                assert!(
                    kept.len() == before(packet) || kept.len() == before(cut as u64),
                    "{what}: {} kept: {text}",
                    kept.len()
                );
                // Without an index, what follows the cut packet is unknown.
                let known_end = if indexed {
                    all.len()
                } else {
                    before(
                        starts
                            .range(packet as usize + 1..)
                            .next()
                            .map_or(u64::MAX, |&n| n as u64),
                    )
                };
                // (Packets the index lists past the cut may hold no event.)
                if indexed {
                    assert!(w.events_lost || kept.len() == known_end, "{what}: {text}");
                } else {
                    assert_eq!(w.events_lost, kept.len() < known_end, "{what}: {text}");
                }
                if let (Some(b), Some(e)) = (w.begin_ns, w.end_ns) {
                    // Without an index only the cut packet's times are known.
                    let known_until = if indexed {
                        u64::MAX
                    } else {
                        starts
                            .range(packet as usize + 1..)
                            .next()
                            .map_or(u64::MAX, |&n| n as u64)
                    };
                    assert!(
                        all[kept.len()..]
                            .iter()
                            .filter(|&&(o, _)| o < known_until)
                            .all(|&(_, ts)| b <= ts && ts <= e),
                        "{what}: lost events outside {text}"
                    );
                } else {
                    assert!(!indexed, "{what}: an index gives the times: {text}");
                }
            }
            std::fs::write(&path, &bytes).unwrap();
        }
    }
    assert!(tried > 700, "only {tried} cuts");
}

#[test]
fn cut_metadata_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    for folder in ["bug446190/trace", "lttng-tracefile-rotation/kernel"] {
        let root = tmp.path().join(folder.replace('/', "_"));
        copy_dir(&corpus(folder), &root);
        let path = root.join("metadata");
        let bytes = std::fs::read(&path).unwrap();
        for cut in (1..bytes.len()).step_by(bytes.len() / 23) {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            match CtfTrace::open(&root) {
                Ok(_) => panic!("{folder}: metadata cut at {cut} accepted"),
                Err(e) => assert_eq!(e.path(), path, "{folder} cut at {cut}: {e}"),
            }
        }
    }
}

/// An index that cannot be read (junk, a lying entry length) adds nothing:
/// the trace reads as without one.
#[test]
fn unreadable_indexes_are_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("t");
    copy_dir(&corpus("lttng-tracefile-rotation/kernel"), &root);
    let file = root.join("mychan_0_1");
    let bytes = std::fs::read(&file).unwrap();
    let idx = root.join("index").join("mychan_0_1.idx");
    let mut lying = std::fs::read(&idx).unwrap();
    lying[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
    for index in [b"junk".to_vec(), lying, Vec::new()] {
        std::fs::write(&idx, &index).unwrap();
        // Whole: no warning.
        std::fs::write(&file, &bytes).unwrap();
        let t = CtfTrace::open(&root).unwrap();
        assert!(t.events().all(|e| e.is_ok()));
        assert!(t.truncations().is_empty(), "{:?}", t.truncations());
        // Cut inside a packet: the warning, without index details.
        std::fs::write(&file, &bytes[..bytes.len() - 10]).unwrap();
        let t = CtfTrace::open(&root).unwrap();
        assert!(t.events().all(|e| e.is_ok()));
        let cuts = t.truncations();
        assert_eq!(cuts.len(), 1, "{cuts:?}");
        assert_eq!(cuts[0].lost_packets, None, "{}", cuts[0]);
    }
}
