//! What a trace.dat file that ends early still holds, and what it lost.
//!
//! A copy interrupted part way (a full disk, a killed `scp`) leaves a file
//! whose tables promise more bytes than there are. Everything up to the
//! event formats is needed to decode anything and stays an error when cut;
//! after that, the reader keeps every whole ring-buffer page before the cut
//! and describes the loss here, so callers can warn instead of refusing.

use std::fmt;

/// How a trace.dat file is cut short; see [`crate::TraceDat::truncation`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Truncation {
    /// Bytes the file has.
    pub present_bytes: u64,
    /// Bytes the file's own tables say it should have; `None` when the cut
    /// came before the CPU table, so the length of the data is unknown. A
    /// lower bound when [`Truncation::instances_lost`] is not empty (their
    /// sizes are in the lost part).
    pub expected_bytes: Option<u64>,
    /// The part of the file the cut falls in: `"CPU data"`, `"kallsyms"`,
    /// `"printk formats"`, `"cmdlines"`, `"options"`, `"CPU table"`, ...
    pub cut_in: &'static str,
    /// The CPUs (of the top instance) that lost data, by CPU number. Empty
    /// when the cut came before the CPU table: then no CPU has data.
    pub cpus: Vec<CpuCut>,
    /// Named buffer instances whose data could not be located at all.
    pub instances_lost: Vec<String>,
}

/// One CPU's share of a [`Truncation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuCut {
    pub cpu: u32,
    /// Bytes of ring-buffer data the CPU table gives this CPU.
    pub declared_bytes: u64,
    /// Bytes kept: the whole pages before the cut (a partial last page is
    /// dropped, so this is a multiple of the page size).
    pub kept_bytes: u64,
    /// Time (ns, as records give it) of the last event kept; `None` when no
    /// event of this CPU is kept.
    pub last_kept_ns: Option<u64>,
    /// Time (ns) at which the first dropped page starts, when its header is
    /// in the file: the lost events are from then on.
    pub lost_from_ns: Option<u64>,
}

impl Truncation {
    /// Bytes missing from the end of the file, when known.
    pub fn missing_bytes(&self) -> Option<u64> {
        self.expected_bytes
            .map(|e| e.saturating_sub(self.present_bytes))
    }
}

/// Nanoseconds as seconds with all nine decimals, as `trace-cmd report`
/// prints times.
struct Seconds(u64);

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:09} s",
            self.0 / 1_000_000_000,
            self.0 % 1_000_000_000
        )
    }
}

/// "CPU 2", "CPUs 2-3", "CPUs 0, 2-4".
fn cpu_list(cpus: &[u32]) -> String {
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for &cpu in cpus {
        match ranges.last_mut() {
            Some((_, end)) if end.checked_add(1) == Some(cpu) => *end = cpu,
            _ => ranges.push((cpu, cpu)),
        }
    }
    let text: Vec<String> = ranges
        .iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    let label = if cpus.len() == 1 { "CPU" } else { "CPUs" };
    format!("{label} {}", text.join(", "))
}

impl fmt::Display for Truncation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "trace.dat is cut short")?;
        match (self.expected_bytes, self.missing_bytes()) {
            (Some(expected), Some(missing)) => write!(
                f,
                ": {}{missing} of {expected} bytes missing (the file ends at byte {} in the {})",
                if self.instances_lost.is_empty() {
                    ""
                } else {
                    "at least "
                },
                self.present_bytes,
                self.cut_in
            )?,
            _ => write!(
                f,
                " at byte {} in the {}: the CPU table and all ring-buffer data are missing, no events",
                self.present_bytes, self.cut_in
            )?,
        }
        let mut empty = Vec::new();
        for c in &self.cpus {
            match c.last_kept_ns {
                Some(last) => {
                    write!(f, "; CPU {} ends at {}", c.cpu, Seconds(last))?;
                    match c.lost_from_ns {
                        Some(from) => write!(f, ", its events from {} on are lost", Seconds(from))?,
                        None => write!(f, ", its later events are lost")?,
                    }
                }
                None => match c.lost_from_ns {
                    Some(from) => write!(
                        f,
                        "; CPU {} has no data left, its events from {} on are lost",
                        c.cpu,
                        Seconds(from)
                    )?,
                    None => empty.push(c.cpu),
                },
            }
        }
        if !empty.is_empty() {
            let verb = if empty.len() == 1 { "has" } else { "have" };
            write!(f, "; {} {verb} no data left", cpu_list(&empty))?;
        }
        if !self.instances_lost.is_empty() {
            write!(
                f,
                "; buffer instances without data: {}",
                self.instances_lost.join(", ")
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_as_a_warning() {
        let t = Truncation {
            present_bytes: 1000,
            expected_bytes: Some(5096),
            cut_in: "CPU data",
            cpus: vec![
                CpuCut {
                    cpu: 1,
                    declared_bytes: 4096,
                    kept_bytes: 0,
                    last_kept_ns: Some(12_345_678_901),
                    lost_from_ns: Some(12_400_000_000),
                },
                CpuCut {
                    cpu: 2,
                    declared_bytes: 4096,
                    kept_bytes: 0,
                    last_kept_ns: None,
                    lost_from_ns: None,
                },
                CpuCut {
                    cpu: 3,
                    declared_bytes: 4096,
                    kept_bytes: 0,
                    last_kept_ns: None,
                    lost_from_ns: None,
                },
            ],
            instances_lost: Vec::new(),
        };
        assert_eq!(
            t.to_string(),
            "trace.dat is cut short: 4096 of 5096 bytes missing (the file ends at byte 1000 in the CPU data); \
             CPU 1 ends at 12.345678901 s, its events from 12.400000000 s on are lost; CPUs 2-3 have no data left"
        );
        assert_eq!(cpu_list(&[0, 2, 3, 4, 7]), "CPUs 0, 2-4, 7");
        assert_eq!(cpu_list(&[5]), "CPU 5");
        let early = Truncation {
            expected_bytes: None,
            cut_in: "kallsyms",
            cpus: Vec::new(),
            ..t
        };
        assert!(early.to_string().contains("at byte 1000 in the kallsyms"));
    }
}
