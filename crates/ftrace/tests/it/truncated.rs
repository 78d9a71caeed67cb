//! trace.dat files cut short at many offsets (as a recorder killed while
//! writing, or a full disk, leaves them): past the event formats a cut v6
//! file decodes every whole page before the cut, with a truncation report;
//! the records are exactly a prefix of the whole file's, per CPU. Cuts in
//! the parts needed to decode anything, and every cut of a v7 file (whose
//! CPU table is written last), are errors that say the file is cut short.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::common::*;
use deepspan_ftrace::TraceDat;

/// One record's identity: time, event id and payload bytes.
type Key = (u64, u16, Vec<u8>);

/// Every record of every CPU (top instance), decoding each CPU on its own;
/// panics on a decode error.
fn per_cpu(t: &TraceDat, what: &str) -> Vec<Vec<Key>> {
    (0..t.cpus())
        .map(|cpu| {
            t.cpu_records(cpu)
                .unwrap()
                .map(|r| {
                    let r = r.unwrap_or_else(|e| panic!("{what}: CPU {cpu}: {e}"));
                    (r.ts, r.event_id, r.payload.to_vec())
                })
                .collect()
        })
        .collect()
}

fn corpus() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = TRACES.iter().map(|t| dat(t)).collect();
    let seeds = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/trace_dat_seeds"
    ));
    let mut seeds: Vec<PathBuf> = std::fs::read_dir(seeds)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    seeds.sort();
    files.extend(seeds);
    files
}

/// Reads a v6 file's layout the way trace-cmd writes it, independently of
/// the reader under test: where the event formats end (the first byte a
/// cut may fall on and still decode), and each CPU's (offset, size).
struct Layout {
    formats_end: usize,
    cpus: Vec<(u64, u64)>,
}

fn v6_layout(b: &[u8]) -> Layout {
    let le = b[b.iter().position(|&x| x == 0).unwrap() + 1] == 0;
    let u32_at = |i: usize| {
        let a: [u8; 4] = b[i..i + 4].try_into().unwrap();
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let u64_at = |i: usize| {
        let a: [u8; 8] = b[i..i + 8].try_into().unwrap();
        if le {
            u64::from_le_bytes(a)
        } else {
            u64::from_be_bytes(a)
        }
    };
    let cstr_end = |i: usize| i + b[i..].iter().position(|&x| x == 0).unwrap() + 1;
    // magic (10), version string, endianness, long size, page size.
    let mut p = cstr_end(3) + 2 + 4;
    for label in ["header_page\0", "header_event\0"] {
        assert_eq!(&b[p..p + label.len()], label.as_bytes());
        p += label.len();
        p += 8 + u64_at(p) as usize;
    }
    let ftrace = u32_at(p);
    p += 4;
    for _ in 0..ftrace {
        p += 8 + u64_at(p) as usize;
    }
    let systems = u32_at(p);
    p += 4;
    for _ in 0..systems {
        p = cstr_end(p);
        let n = u32_at(p);
        p += 4;
        for _ in 0..n {
            p += 8 + u64_at(p) as usize;
        }
    }
    let formats_end = p;
    let fly = b
        .windows(10)
        .position(|w| w == b"flyrecord\0")
        .expect("flyrecord label")
        + 10;
    // Kallsyms, printk and cmdlines sizes, then the CPU count.
    p += 4 + u32_at(p) as usize;
    p += 4 + u32_at(p) as usize;
    p += 8 + u64_at(p) as usize;
    let count = u32_at(p) as usize;
    let cpus = (0..count)
        .map(|i| (u64_at(fly + 16 * i), u64_at(fly + 16 * i + 8)))
        .collect();
    Layout { formats_end, cpus }
}

/// The cut offsets tried on a file of `len` bytes: a spread over the
/// whole file, every section boundary given, and every page boundary of
/// the CPU data, each ±1.
fn cuts(len: usize, boundaries: &[usize], page: usize, cpus: &[(u64, u64)]) -> BTreeSet<usize> {
    let mut out: BTreeSet<usize> = (0..len).step_by((len / 60).max(1)).collect();
    let mut near = boundaries.to_vec();
    for &(off, size) in cpus {
        let pages = (size as usize).div_ceil(page);
        // Every page boundary of small CPUs, a spread of large ones'.
        let step = (pages / 12).max(1);
        near.extend((0..=pages).step_by(step).map(|k| off as usize + k * page));
        near.push((off + size) as usize);
    }
    for b in near {
        for c in [b.wrapping_sub(1), b, b + 1] {
            if c < len {
                out.insert(c);
            }
        }
    }
    out
}

#[test]
fn cut_v6_files_decode_a_prefix_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let mut tried = 0;
    for path in corpus() {
        let bytes = std::fs::read(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        // The big-endian v7 seeds are refused whole (by trace-cmd too).
        let Ok(whole) = TraceDat::from_bytes(bytes.clone()) else {
            assert!(
                name.starts_with("v7-") && name.contains("-built-true"),
                "{name}: refused whole"
            );
            continue;
        };
        if whole.version() != 6 {
            continue;
        }
        assert!(whole.truncation().is_none(), "{name}: a whole file");
        let full = per_cpu(&whole, &name);
        let layout = v6_layout(&bytes);
        let page = whole.page_size() as usize;
        let cut_path = dir.path().join(&name);
        let mut counts = Vec::new();
        let offsets = cuts(bytes.len(), &[layout.formats_end], page, &layout.cpus);
        for &cut in &offsets {
            tried += 1;
            let what = format!("{name} cut at {cut}");
            std::fs::write(&cut_path, &bytes[..cut]).unwrap();
            let t = match TraceDat::open(&cut_path) {
                Ok(t) => t,
                Err(e) => {
                    let text = e.to_string();
                    assert!(cut < layout.formats_end, "{what}: refused: {text}");
                    assert!(
                        text.contains(&format!("cut short at byte {cut} inside the "))
                            && text.contains("no event can be decoded"),
                        "{what}: {text}"
                    );
                    continue;
                }
            };
            assert!(cut >= layout.formats_end, "{what}: opened");
            let warning = t
                .truncation()
                .unwrap_or_else(|| panic!("{what}: no warning"));
            assert_eq!(warning.present_bytes, cut as u64, "{what}");
            assert!(warning.to_string().starts_with("trace.dat is cut short"));
            let got = per_cpu(&t, &what);
            let mut kept_total = 0;
            for (cpu, (records, all)) in got.iter().zip(&full).enumerate() {
                assert!(
                    all.starts_with(records),
                    "{what}: CPU {cpu}: not a prefix ({} of {})",
                    records.len(),
                    all.len()
                );
                kept_total += records.len();
                let cut_cpu = warning.cpus.iter().find(|c| c.cpu == cpu as u32);
                match cut_cpu {
                    None => assert!(
                        records.len() == all.len() || warning.expected_bytes.is_none(),
                        "{what}: CPU {cpu} lost records but is not in the warning"
                    ),
                    Some(c) => {
                        assert_eq!(c.kept_bytes % page as u64, 0, "{what}: whole pages");
                        let (off, size) = layout.cpus[cpu];
                        let whole_pages = (cut as u64).saturating_sub(off).min(size) / page as u64;
                        assert_eq!(c.kept_bytes, whole_pages * page as u64, "{what}: CPU {cpu}");
                        assert_eq!(
                            c.last_kept_ns,
                            records.last().map(|r| r.0),
                            "{what}: CPU {cpu}: last kept time"
                        );
                    }
                }
            }
            if warning.expected_bytes.is_none() {
                assert_eq!(kept_total, 0, "{what}: no CPU table, yet records");
            } else if warning.instances_lost.is_empty() {
                assert_eq!(warning.expected_bytes, Some(bytes.len() as u64), "{what}");
            } else {
                assert!(warning.expected_bytes <= Some(bytes.len() as u64), "{what}");
            }
            counts.push((cut, kept_total));
        }
        // Records only grow with the cut: nothing decoded at one cut is
        // lost at a later one.
        for w in counts.windows(2) {
            assert!(w[0].1 <= w[1].1, "{name}: {:?} then {:?}", w[0], w[1]);
        }
        // A cut on a page boundary loses nothing before it: its records
        // are those of the cut a page further less one byte.
        for &(off, size) in &layout.cpus {
            for k in 0..(size as usize / page) {
                let at = off as usize + k * page;
                let find = |c: usize| counts.iter().find(|x| x.0 == c).map(|x| x.1);
                if let (Some(a), Some(b)) = (find(at), find(at + page - 1)) {
                    assert_eq!(a, b, "{name}: page at {at}");
                }
            }
        }
    }
    assert!(tried > 700, "only {tried} cuts");
}

/// Where a v7 file's trailing strings section (id 15: the descriptions of
/// the sections) starts, when the file ends with one.
fn strings_section(b: &[u8]) -> Option<usize> {
    (0..b.len().saturating_sub(16)).rev().find(|&p| {
        let id = u16::from_le_bytes([b[p], b[p + 1]]);
        let size = u64::from_le_bytes(b[p + 8..p + 16].try_into().unwrap());
        id == 15 && (p as u64 + 16).checked_add(size) == Some(b.len() as u64)
    })
}

#[test]
fn cut_v7_files_are_refused_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    for path in corpus() {
        let bytes = std::fs::read(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        // The big-endian v7 seeds are refused whole (by trace-cmd too).
        let Ok(whole) = TraceDat::from_bytes(bytes.clone()) else {
            assert!(
                name.starts_with("v7-") && name.contains("-built-true"),
                "{name}: refused whole"
            );
            continue;
        };
        if whole.version() != 7 {
            continue;
        }
        assert!(whole.truncation().is_none(), "{name}");
        let full = per_cpu(&whole, &name);
        let strings = strings_section(&bytes);
        let cut_path = dir.path().join(&name);
        let step = (bytes.len() / 100).max(1);
        for cut in (0..bytes.len()).step_by(step).chain([bytes.len() - 1]) {
            std::fs::write(&cut_path, &bytes[..cut]).unwrap();
            let text = match TraceDat::open(&cut_path) {
                Ok(t) => {
                    // Only the section descriptions (written last) are
                    // gone: nothing that decoding needs.
                    assert!(
                        strings.is_some_and(|s| cut >= s),
                        "{name} cut at {cut}: opened without its CPU table"
                    );
                    assert_eq!(per_cpu(&t, &name), full, "{name} cut at {cut}");
                    continue;
                }
                Err(e) => e.to_string(),
            };
            assert!(
                text.contains(&format!("cut short at byte {cut} inside the ")),
                "{name} cut at {cut}: {text}"
            );
        }
    }
}
