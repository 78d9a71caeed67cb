//! What the recorder's eBPF captures share: a loaded program's ring buffer
//! and its count of records that did not fit, and the thread that drains
//! that ring into a file of the run while the recording lasts.
//!
//! eBPF is not tracefs: no tracing setting is touched, and the programs are
//! detached when their [`Ring`] is dropped, however the recorder exits.
//! Programs write with `BPF_RB_NO_WAKEUP` (a wake-up per record costs
//! microseconds in a VM) and the thread polls every [`DRAIN_EVERY`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::Error;

/// How often a ring buffer is drained. The smallest ring (1 MiB, 24-byte
/// records with the ring's 8-byte header) holds 32 000 records: 10 ms
/// leaves room for 3 million a second.
pub(crate) const DRAIN_EVERY: Duration = Duration::from_millis(10);

/// Where a capture's records go: one call per record, then one at the end
/// with the ring's count of lost records.
pub(crate) trait RecordSink: Send + 'static {
    type Summary: Send + 'static;
    fn push(&mut self, record: &[u8]) -> Result<(), String>;
    fn finish(self, lost: u64) -> Result<Self::Summary, String>;
}

/// A running capture: the attached program and the thread writing its
/// records.
pub(crate) struct Capture<T> {
    stop: Arc<AtomicBool>,
    writer: JoinHandle<Result<T, String>>,
}

impl<T: Send + 'static> Capture<T> {
    /// Drains `ring` into `sink` on a thread named `name` until
    /// [`Capture::stop`] (or until the capture is dropped).
    pub(crate) fn start<S>(name: &str, ring: Ring, mut sink: S) -> Result<Capture<T>, Error>
    where
        S: RecordSink<Summary = T>,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let writer = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut ring = ring;
                loop {
                    // The flag is read before the drain: records of the
                    // last moments are drained after it is set. A capture
                    // dropped without `stop` (the recording failed) ends
                    // the thread too.
                    let last =
                        stopping.load(Ordering::Acquire) || Arc::strong_count(&stopping) == 1;
                    ring.drain(&mut |record| sink.push(record))?;
                    if last {
                        break;
                    }
                    std::thread::sleep(DRAIN_EVERY);
                }
                sink.finish(ring.lost())
            })
            .map_err(|source| Error::Io {
                action: "start the thread",
                path: name.into(),
                source,
            })?;
        Ok(Capture { stop, writer })
    }

    /// Drains the ring a last time, detaches the program and returns what
    /// the sink made of it.
    pub(crate) fn stop(self) -> Result<T, String> {
        self.stop.store(true, Ordering::Release);
        self.writer
            .join()
            .map_err(|_| "the writer thread panicked".to_string())?
    }
}

#[cfg(deepspan_bpf)]
pub(crate) use loaded::{load, load_sched_switch, load_tracepoints, Ring};

/// The programs, when this build has them (build.rs compiles them with
/// clang when clang is there).
#[cfg(deepspan_bpf)]
mod loaded {
    use aya::maps::{MapData, PerCpuArray, RingBuf};
    use aya::Ebpf;

    /// A loaded object's ring buffer (`name`), and its per-CPU count of
    /// records that did not fit (`LOST`). Holds the object's maps and
    /// links alive: dropping it detaches the programs.
    pub(crate) struct Ring {
        ring: RingBuf<MapData>,
        lost: PerCpuArray<MapData, u64>,
        _ebpf: Ebpf,
    }

    /// Loads an object; `configure` attaches its programs (and fills its
    /// maps), then its ring `ring` and counter `LOST` are taken. `what`
    /// names the capture in errors.
    pub(crate) fn load(
        object: &[u8],
        what: &str,
        ring: &str,
        configure: impl FnOnce(&mut Ebpf) -> Result<(), String>,
    ) -> Result<Ring, String> {
        let mut ebpf = Ebpf::load(object).map_err(|e| format!("cannot load {what}: {e}"))?;
        configure(&mut ebpf)?;
        let map = ebpf
            .take_map(ring)
            .ok_or_else(|| format!("{what} has no map {ring}"))?;
        let ring = RingBuf::try_from(map).map_err(|e| format!("cannot open {what}'s ring: {e}"))?;
        let lost = ebpf
            .take_map("LOST")
            .ok_or_else(|| format!("{what} has no map LOST"))?;
        let lost = PerCpuArray::try_from(lost)
            .map_err(|e| format!("cannot open {what}'s LOST map: {e}"))?;
        Ok(Ring {
            ring,
            lost,
            _ebpf: ebpf,
        })
    }

    /// Loads an object whose one program, `sched_switch`, hooks the
    /// BTF-typed `sched_switch` tracepoint, and attaches it; `needs` says
    /// what the kernel must have when the program does not load.
    pub(crate) fn load_sched_switch(
        object: &[u8],
        what: &str,
        ring: &str,
        needs: &str,
    ) -> Result<Ring, String> {
        load_tracepoints(object, what, ring, &["sched_switch"], needs)
    }

    /// Loads an object whose programs hook the BTF-typed tracepoints
    /// `tracepoints`, each program named as its tracepoint, and attaches
    /// them; `needs` says what the kernel must have when one does not
    /// load.
    pub(crate) fn load_tracepoints(
        object: &[u8],
        what: &str,
        ring: &str,
        tracepoints: &[&str],
        needs: &str,
    ) -> Result<Ring, String> {
        use aya::programs::BtfTracePoint;
        let btf = aya::Btf::from_sys_fs().map_err(|e| format!("no kernel BTF: {e}"))?;
        load(object, what, ring, |ebpf| {
            for &name in tracepoints {
                let program: &mut BtfTracePoint = ebpf
                    .program_mut(name)
                    .ok_or_else(|| format!("no program {name}"))?
                    .try_into()
                    .map_err(|e| format!("{name}: {e}"))?;
                program
                    .load(name, &btf)
                    .map_err(|e| format!("cannot load the {name} hook ({needs}): {e}"))?;
                program
                    .attach()
                    .map_err(|e| format!("cannot attach to {name}: {e}"))?;
            }
            Ok(())
        })
    }

    impl Ring {
        pub(super) fn drain(
            &mut self,
            each: &mut dyn FnMut(&[u8]) -> Result<(), String>,
        ) -> Result<(), String> {
            while let Some(record) = self.ring.next() {
                each(&record)?;
            }
            Ok(())
        }

        /// Records the ring had no room for, over all CPUs.
        pub(super) fn lost(&self) -> u64 {
            self.lost
                .get(&0, 0)
                .map(|per_cpu| per_cpu.iter().sum())
                .unwrap_or(0)
        }
    }
}

/// Without the programs there is never a ring to drain.
#[cfg(not(deepspan_bpf))]
pub(crate) enum Ring {}

#[cfg(not(deepspan_bpf))]
impl Ring {
    fn drain(&mut self, _each: &mut dyn FnMut(&[u8]) -> Result<(), String>) -> Result<(), String> {
        match *self {}
    }

    fn lost(&self) -> u64 {
        match *self {}
    }
}

/// Why a build without the programs cannot capture `what`.
#[cfg(not(deepspan_bpf))]
pub(crate) fn not_built(what: &str) -> String {
    format!(
        "{what}: this deepspan was built without its eBPF programs (clang was not found at build time): \
         install clang and libbpf-dev (scripts/setup.sh build does) and build again"
    )
}
