//! The captures every recording takes at each context switch (CPU
//! throttling, sleeps in system calls, switches out of idle) come from one
//! eBPF program (`bpf/sched_switch.bpf.c`), loaded once for the three: a
//! program's dispatch is paid on every switch of the host, so one program
//! instead of three saves two of them (bench/README.md). Each capture
//! takes its part's ring from [`SwitchProgram::ring`] and drains it on its
//! own thread into its own file, as if it had a program of its own.
//!
//! A kernel may refuse one part and not the others: the throttling part
//! reads a mark only Linux 6.18 and later put on a task. When the program
//! with every part does not load, each part is loaded alone to find which
//! the kernel refuses; the program is then loaded with the others, and
//! each refused part's capture says why it is missing.

use crate::bpf::Ring;

/// A part of the context-switch program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SwitchPart {
    /// A thread leaving its CPU for its cgroup's quota (`throttle.rs`).
    Throttle,
    /// A thread going to sleep in a system call (`blocked_syscalls.rs`).
    Blocked,
    /// An idle CPU given to a thread (`idle_switches.rs`).
    Idle,
}

impl SwitchPart {
    const ALL: [SwitchPart; 3] = [SwitchPart::Throttle, SwitchPart::Blocked, SwitchPart::Idle];

    /// The program's switch that turns the part on, its ring, and the
    /// ring's lost-record counter.
    fn names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            SwitchPart::Throttle => ("WITH_THROTTLE", "HELD", "HELD_LOST"),
            SwitchPart::Blocked => ("WITH_BLOCKED", "BLOCKED", "BLOCKED_LOST"),
            SwitchPart::Idle => ("WITH_IDLE", "SWITCHES", "SWITCHES_LOST"),
        }
    }

    /// What the kernel must have for the part.
    fn needs(self) -> &'static str {
        match self {
            SwitchPart::Throttle => "the per-task throttle mark of Linux 6.18 and later",
            SwitchPart::Blocked => "bpf_task_pt_regs, Linux 5.15 and later",
            SwitchPart::Idle => "BTF and the sched_switch tracepoint",
        }
    }

    /// Why this build has no such part, if it has none.
    fn not_in_this_build(self) -> Option<String> {
        #[cfg(not(deepspan_bpf))]
        {
            return Some(crate::bpf::not_built(&format!("{self:?}")));
        }
        #[allow(unreachable_code)]
        (self == SwitchPart::Blocked && cfg!(not(deepspan_bpf_syscalls))).then(|| {
            format!(
                "the program reads x86_64's registers (orig_ax, di, si, dx), and this is {}",
                std::env::consts::ARCH
            )
        })
    }
}

/// The context-switch program of one recording or flight recorder, loaded
/// at the first [`SwitchProgram::ring`] with every part this build has.
#[derive(Default)]
pub(crate) struct SwitchProgram {
    rings: Option<Vec<(SwitchPart, Result<Ring, String>)>>,
}

impl SwitchProgram {
    /// The ring of `part`, once: its records flow from the moment the
    /// program was loaded. An error says why this kernel or build cannot
    /// run the part.
    pub(crate) fn ring(&mut self, part: SwitchPart) -> Result<Ring, String> {
        let rings = self
            .rings
            .get_or_insert_with(|| load_every_part(program::load));
        let slot = rings
            .iter_mut()
            .find(|(p, _)| *p == part)
            .map(|(_, ring)| ring)
            .ok_or_else(|| format!("no {part:?} part"))?;
        std::mem::replace(slot, Err(format!("the {part:?} ring was taken already")))
    }
}

/// Every part's ring, or why the part cannot run, from `load` (which
/// loads the program with the parts it is given on).
fn load_every_part<R>(
    load: impl Fn(&[SwitchPart]) -> Result<Vec<R>, String>,
) -> Vec<(SwitchPart, Result<R, String>)> {
    let mut rings = Vec::new();
    let mut built = Vec::new();
    for part in SwitchPart::ALL {
        match part.not_in_this_build() {
            Some(why) => rings.push((part, Err(why))),
            None => built.push(part),
        }
    }
    let loaded = match load(&built) {
        Ok(loaded) => loaded,
        Err(_) => {
            // Which part the kernel refuses: each alone.
            let mut accepted = Vec::new();
            for &part in &built {
                match load(&[part]) {
                    Ok(_) => accepted.push(part),
                    Err(why) => rings.push((part, Err(why))),
                }
            }
            built = accepted;
            match load(&built) {
                Ok(loaded) => loaded,
                Err(why) => {
                    rings.extend(built.iter().map(|&p| (p, Err(why.clone()))));
                    return rings;
                }
            }
        }
    };
    rings.extend(built.into_iter().zip(loaded.into_iter().map(Ok)));
    rings
}

#[cfg(deepspan_bpf)]
mod program {
    use super::SwitchPart;
    use crate::bpf::Ring;

    /// The ELF reader needs the object aligned, which include_bytes! is not.
    static OBJECT: &[u8] =
        aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sched_switch.bpf.o"));

    /// Loads and attaches the program with `parts` on: their rings, in
    /// that order.
    pub(super) fn load(parts: &[SwitchPart]) -> Result<Vec<Ring>, String> {
        if parts.is_empty() {
            return Ok(Vec::new());
        }
        let globals: Vec<(&str, u8)> = SwitchPart::ALL
            .iter()
            .map(|p| (p.names().0, u8::from(parts.contains(p))))
            .collect();
        let rings: Vec<(&str, &str)> = parts
            .iter()
            .map(|p| {
                let (_, ring, lost) = p.names();
                (ring, lost)
            })
            .collect();
        let needs = parts
            .iter()
            .map(|p| p.needs())
            .collect::<Vec<_>>()
            .join("; ");
        crate::bpf::load_parts(
            OBJECT,
            "the context-switch program",
            &globals,
            |ebpf| crate::bpf::attach_tracepoints(ebpf, &["sched_switch"], &needs),
            &rings,
        )
    }
}

#[cfg(not(deepspan_bpf))]
mod program {
    use super::SwitchPart;
    use crate::bpf::Ring;

    pub(super) fn load(parts: &[SwitchPart]) -> Result<Vec<Ring>, String> {
        match parts.first() {
            None => Ok(Vec::new()),
            Some(p) => Err(p.not_in_this_build().unwrap_or_default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel that refuses the throttling part: loading "rings" that
    /// name their part.
    fn without_throttling(parts: &[SwitchPart]) -> Result<Vec<SwitchPart>, String> {
        match parts.contains(&SwitchPart::Throttle) {
            true => Err("no throttle mark".into()),
            false => Ok(parts.to_vec()),
        }
    }

    #[test]
    fn a_part_the_kernel_refuses_says_why_and_the_others_still_run() {
        let rings = load_every_part(without_throttling);
        assert_eq!(rings.len(), 3);
        for (part, ring) in rings {
            match (part, ring) {
                (SwitchPart::Throttle, ring) => assert_eq!(ring, Err("no throttle mark".into())),
                (part, Ok(ring)) => assert_eq!(part, ring, "each part gets its own ring"),
                // Only where this build has no such part.
                (part, Err(why)) => assert_eq!(Some(why), part.not_in_this_build()),
            }
        }
    }

    #[test]
    fn every_part_this_build_has_gets_its_ring() {
        let rings = load_every_part(|parts: &[SwitchPart]| Ok(parts.to_vec()));
        for (part, ring) in rings {
            match part.not_in_this_build() {
                None => assert_eq!(ring, Ok(part)),
                Some(why) => assert_eq!(ring, Err(why)),
            }
        }
    }
}
