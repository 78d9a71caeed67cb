//! What the recorder's eBPF captures share: a loaded program's ring buffer
//! and its count of records that did not fit, and the thread that drains
//! that ring into a file of the run while the recording lasts.
//!
//! eBPF is not tracefs: no tracing setting is touched, and the programs are
//! detached when their [`Ring`] is dropped, however the recorder exits.
//! Programs write with `BPF_RB_NO_WAKEUP` (a wake-up per record costs
//! microseconds in a VM) and the thread polls, as often as the ring's fill
//! rate needs ([`next_wait`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::Error;

/// The shortest wait between two drains of a ring. The smallest ring (1
/// MiB, 24-byte records with the ring's 8-byte header) holds 32 000
/// records: 10 ms leaves room for 3 million a second.
const DRAIN_AT_LEAST_EVERY: Duration = Duration::from_millis(10);
/// The longest: after an idle stretch, a burst of up to 330 000 records a
/// second (the smallest ring) fits until the next drain.
const DRAIN_AT_MOST_EVERY: Duration = Duration::from_millis(100);

/// How long to wait before the next drain, from the last one: `drained`
/// bytes of a ring of `capacity` bytes came in over `since`. The wait lets
/// the ring fill to a quarter at that rate (a burst of four times the rate
/// still fits), within [`DRAIN_AT_LEAST_EVERY`] ..
/// [`DRAIN_AT_MOST_EVERY`]. A fixed 10 ms was 100 wake-ups a second per
/// capture whatever came in: on HotROD at 100 requests/s the three drain
/// threads were a sixth of the agent's own CPU time.
fn next_wait(drained: usize, capacity: usize, since: Duration) -> Duration {
    if drained == 0 {
        return DRAIN_AT_MOST_EVERY;
    }
    let quarter = capacity / 4;
    let wait = since.mul_f64(quarter as f64 / drained as f64);
    wait.clamp(DRAIN_AT_LEAST_EVERY, DRAIN_AT_MOST_EVERY)
}

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
                let capacity = ring.capacity();
                let mut last_drain = std::time::Instant::now();
                loop {
                    // The flag is read before the drain: records of the
                    // last moments are drained after it is set. A capture
                    // dropped without `stop` (the recording failed) ends
                    // the thread too.
                    let last =
                        stopping.load(Ordering::Acquire) || Arc::strong_count(&stopping) == 1;
                    let mut drained = 0;
                    ring.drain(&mut |record| {
                        // The ring's 8-byte header, the record padded to 8.
                        drained += 8 + record.len().next_multiple_of(8);
                        sink.push(record)
                    })?;
                    if last {
                        break;
                    }
                    let now = std::time::Instant::now();
                    let wait = next_wait(drained, capacity, now - last_drain);
                    last_drain = now;
                    sleep_unless_stopped(wait, &stopping);
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

/// Sleeps `wait`, or less once `stopping` is set: the last drain of a
/// stopping capture does not wait out a long interval.
fn sleep_unless_stopped(wait: Duration, stopping: &Arc<AtomicBool>) {
    let until = std::time::Instant::now() + wait;
    loop {
        let now = std::time::Instant::now();
        if now >= until || stopping.load(Ordering::Acquire) {
            return;
        }
        std::thread::sleep((until - now).min(DRAIN_AT_LEAST_EVERY));
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
        /// The ring's size in bytes.
        capacity: usize,
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
        let capacity = match &map {
            aya::maps::Map::RingBuf(data) => data
                .info()
                .map(|info| info.max_entries() as usize)
                .map_err(|e| format!("cannot read {what}'s ring size: {e}"))?,
            _ => return Err(format!("{what}'s map {ring} is no ring buffer")),
        };
        let ring = RingBuf::try_from(map).map_err(|e| format!("cannot open {what}'s ring: {e}"))?;
        let lost = ebpf
            .take_map("LOST")
            .ok_or_else(|| format!("{what} has no map LOST"))?;
        let lost = PerCpuArray::try_from(lost)
            .map_err(|e| format!("cannot open {what}'s LOST map: {e}"))?;
        Ok(Ring {
            ring,
            capacity,
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
        pub(super) fn capacity(&self) -> usize {
            self.capacity
        }

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
    fn capacity(&self) -> usize {
        match *self {}
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;
    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_wait_lets_the_ring_fill_to_a_quarter_at_the_last_rate() {
        // An eighth of the ring in 20 ms: a quarter in 40 ms.
        assert_eq!(next_wait(MIB / 8, MIB, 20 * MS), 40 * MS);
        // A quarter in 30 ms: 30 ms again.
        assert_eq!(next_wait(MIB / 4, MIB, 30 * MS), 30 * MS);
    }

    #[test]
    fn the_wait_stays_within_its_bounds() {
        assert_eq!(next_wait(0, MIB, 10 * MS), DRAIN_AT_MOST_EVERY);
        assert_eq!(next_wait(1024, MIB, 10 * MS), DRAIN_AT_MOST_EVERY);
        // The whole ring in 10 ms (records may have been lost): as often as
        // allowed.
        assert_eq!(next_wait(MIB, MIB, 10 * MS), DRAIN_AT_LEAST_EVERY);
    }

    #[test]
    fn a_stopping_capture_does_not_sleep_out_its_wait() {
        let stopping = Arc::new(AtomicBool::new(true));
        let started = std::time::Instant::now();
        sleep_unless_stopped(Duration::from_secs(60), &stopping);
        assert!(started.elapsed() < Duration::from_secs(60));
    }
}
