//! What the recorder's eBPF captures share: a loaded program's ring buffer
//! and its count of records that did not fit, and the thread that drains
//! that ring into a file of the run while the recording lasts.
//!
//! eBPF is not tracefs: no tracing setting is touched, and the programs are
//! detached when their [`Ring`] is dropped, however the recorder exits.
//! Programs write with `BPF_RB_NO_WAKEUP` (a wake-up per record costs
//! microseconds in a VM) and the thread polls, as often as the ring's fill
//! rate needs ([`next_wait`]), and at once when its owner asks
//! ([`Capture::flush`]).

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

/// What a capture's thread drains: an eBPF ring buffer ([`Ring`]).
pub(crate) trait RingSource: Send + 'static {
    /// Size in bytes.
    fn capacity(&self) -> usize;
    /// Hands every record written so far to `each`, oldest first.
    fn drain(&mut self, each: &mut dyn FnMut(&[u8]) -> Result<(), String>) -> Result<(), String>;
    /// Records the ring had no room for.
    fn lost(&self) -> u64;
}

/// A running capture: the attached program and the thread writing its
/// records.
pub(crate) struct Capture<T> {
    control: Arc<Control>,
    writer: JoinHandle<Result<T, String>>,
}

/// What the owner of a capture asks of its thread, and how far the thread
/// got.
struct Control {
    asks: Mutex<Asks>,
    changed: Condvar,
}

#[derive(Default)]
struct Asks {
    stop: bool,
    /// Drains asked for by [`Capture::flush`], numbered from 1.
    flush_asked: u64,
    /// The last of them that a finished drain started after.
    flushed: u64,
}

impl Control {
    fn asks(&self) -> std::sync::MutexGuard<'_, Asks> {
        self.asks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Longest [`Capture::flush`] waits for the thread's drain.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

impl<T: Send + 'static> Capture<T> {
    /// Drains `ring` into `sink` on a thread named `name` until
    /// [`Capture::stop`] (or until the capture is dropped).
    pub(crate) fn start<S, R>(name: &str, ring: R, mut sink: S) -> Result<Capture<T>, Error>
    where
        S: RecordSink<Summary = T>,
        R: RingSource,
    {
        let control = Arc::new(Control {
            asks: Mutex::new(Asks::default()),
            changed: Condvar::new(),
        });
        let shared = control.clone();
        let writer = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let control = shared;
                let mut ring = ring;
                let capacity = ring.capacity();
                let mut last_drain = Instant::now();
                loop {
                    // The asks are read before the drain: records of the
                    // moments before them are drained after. A capture
                    // dropped without `stop` (the recording failed) ends
                    // the thread too.
                    let (last, flush) = {
                        let asks = control.asks();
                        (
                            asks.stop || Arc::strong_count(&control) == 1,
                            asks.flush_asked,
                        )
                    };
                    let mut drained = 0;
                    ring.drain(&mut |record| {
                        // The ring's 8-byte header, the record padded to 8.
                        drained += 8 + record.len().next_multiple_of(8);
                        sink.push(record)
                    })?;
                    control.asks().flushed = flush;
                    control.changed.notify_all();
                    if last {
                        break;
                    }
                    let now = Instant::now();
                    let wait = next_wait(drained, capacity, now - last_drain);
                    last_drain = now;
                    // Until the wait is over, or a stop or a flush is asked.
                    let asks = control.asks();
                    let _ = control
                        .changed
                        .wait_timeout_while(asks, wait, |a| !a.stop && a.flush_asked == flush);
                }
                sink.finish(ring.lost())
            })
            .map_err(|source| Error::Io {
                action: "start the thread",
                path: name.into(),
                source,
            })?;
        Ok(Capture { control, writer })
    }

    /// Has the thread drain the ring now, and returns once the records
    /// written before the call are in the sink: a flight recorder's window
    /// must hold its last moments, which a drain every 100 ms of a quiet
    /// ring would leave out. Err when the thread did not drain within
    /// [`FLUSH_TIMEOUT`] (it ended on an error, or the machine is stalled).
    pub(crate) fn flush(&self) -> Result<(), String> {
        let mut asks = self.control.asks();
        asks.flush_asked += 1;
        let want = asks.flush_asked;
        self.control.changed.notify_all();
        let deadline = Instant::now() + FLUSH_TIMEOUT;
        while asks.flushed < want {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.writer.is_finished() {
                return Err("the capture's thread ended before it drained its ring".into());
            }
            if left.is_zero() {
                return Err(format!(
                    "the capture's thread did not drain its ring within {} s",
                    FLUSH_TIMEOUT.as_secs()
                ));
            }
            // Woken by the drain; the period covers a thread that ended.
            asks = self
                .control
                .changed
                .wait_timeout(asks, left.min(DRAIN_AT_MOST_EVERY))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }

    /// Drains the ring a last time, detaches the program and returns what
    /// the sink made of it.
    pub(crate) fn stop(self) -> Result<T, String> {
        self.control.asks().stop = true;
        self.control.changed.notify_all();
        self.writer
            .join()
            .map_err(|_| "the writer thread panicked".to_string())?
    }
}

#[cfg(deepspan_bpf)]
pub(crate) use loaded::{attach_tracepoints, load, load_parts, load_tracepoints, Ring};

/// The programs, when this build has them (build.rs compiles them with
/// clang when clang is there).
#[cfg(deepspan_bpf)]
mod loaded {
    use std::sync::{Arc, Mutex};

    use aya::maps::{MapData, PerCpuArray, RingBuf};
    use aya::{Ebpf, EbpfLoader};

    /// A loaded object's ring buffer, and its per-CPU count of records
    /// that did not fit. Holds the object alive: its programs stay
    /// attached until the last ring of it is dropped.
    pub(crate) struct Ring {
        ring: RingBuf<MapData>,
        /// The ring's size in bytes.
        capacity: usize,
        lost: PerCpuArray<MapData, u64>,
        _object: Arc<Mutex<Ebpf>>,
    }

    /// Loads `object` with its `globals` (name, value) set;
    /// `configure` attaches its programs (and fills its maps). `what`
    /// names the object in errors.
    fn load_object(
        object: &[u8],
        what: &str,
        globals: &[(&str, u8)],
        configure: impl FnOnce(&mut Ebpf) -> Result<(), String>,
    ) -> Result<Ebpf, String> {
        let mut loader = EbpfLoader::new();
        for (name, value) in globals {
            loader.set_global(name, value, true);
        }
        let mut ebpf = loader
            .load(object)
            .map_err(|e| format!("cannot load {what}: {e}"))?;
        configure(&mut ebpf)?;
        Ok(ebpf)
    }

    /// Takes ring `ring` and its counter `lost` out of `ebpf`.
    fn take_ring(ebpf: &mut Ebpf, what: &str, ring: &str, lost: &str) -> Result<Taken, String> {
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
            .take_map(lost)
            .ok_or_else(|| format!("{what} has no map {lost}"))?;
        let lost = PerCpuArray::try_from(lost)
            .map_err(|e| format!("cannot open {what}'s lost-record counter: {e}"))?;
        Ok(Taken {
            ring,
            capacity,
            lost,
        })
    }

    /// A ring taken out of its object, before it is a [`Ring`].
    struct Taken {
        ring: RingBuf<MapData>,
        capacity: usize,
        lost: PerCpuArray<MapData, u64>,
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
        let mut rings = load_parts(object, what, &[], configure, &[(ring, "LOST")])?;
        Ok(rings.remove(0))
    }

    /// Loads an object with its `globals` set; `configure` attaches its
    /// programs; then each of `rings` (a ring and its lost-record counter)
    /// is taken. The rings keep the object, and its programs attached,
    /// until the last of them is dropped.
    pub(crate) fn load_parts(
        object: &[u8],
        what: &str,
        globals: &[(&str, u8)],
        configure: impl FnOnce(&mut Ebpf) -> Result<(), String>,
        rings: &[(&str, &str)],
    ) -> Result<Vec<Ring>, String> {
        let mut ebpf = load_object(object, what, globals, configure)?;
        let taken = rings
            .iter()
            .map(|(ring, lost)| take_ring(&mut ebpf, what, ring, lost))
            .collect::<Result<Vec<_>, String>>()?;
        let object = Arc::new(Mutex::new(ebpf));
        Ok(taken
            .into_iter()
            .map(|t| Ring {
                ring: t.ring,
                capacity: t.capacity,
                lost: t.lost,
                _object: object.clone(),
            })
            .collect())
    }

    /// Attaches the programs of `ebpf` that hook the BTF-typed tracepoints
    /// `tracepoints`, each program named as its tracepoint; `needs` says
    /// what the kernel must have when one does not load.
    pub(crate) fn attach_tracepoints(
        ebpf: &mut Ebpf,
        tracepoints: &[&str],
        needs: &str,
    ) -> Result<(), String> {
        use aya::programs::BtfTracePoint;
        let btf = aya::Btf::from_sys_fs().map_err(|e| format!("no kernel BTF: {e}"))?;
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
    }

    /// Loads an object whose programs hook the BTF-typed tracepoints
    /// `tracepoints`, each program named as its tracepoint, and attaches
    /// them; then takes its ring `ring` (and its counter `LOST`).
    pub(crate) fn load_tracepoints(
        object: &[u8],
        what: &str,
        ring: &str,
        tracepoints: &[&str],
        needs: &str,
    ) -> Result<Ring, String> {
        load(object, what, ring, |ebpf| {
            attach_tracepoints(ebpf, tracepoints, needs)
        })
    }

    impl super::RingSource for Ring {
        fn capacity(&self) -> usize {
            self.capacity
        }

        fn drain(
            &mut self,
            each: &mut dyn FnMut(&[u8]) -> Result<(), String>,
        ) -> Result<(), String> {
            while let Some(record) = self.ring.next() {
                each(&record)?;
            }
            Ok(())
        }

        /// Over all CPUs.
        fn lost(&self) -> u64 {
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
impl RingSource for Ring {
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

    /// A ring fed by the test: records pushed into `pending`.
    struct FakeRing {
        pending: Arc<Mutex<Vec<Vec<u8>>>>,
    }

    impl RingSource for FakeRing {
        fn capacity(&self) -> usize {
            MIB
        }

        fn drain(
            &mut self,
            each: &mut dyn FnMut(&[u8]) -> Result<(), String>,
        ) -> Result<(), String> {
            let records = std::mem::take(&mut *self.pending.lock().unwrap());
            records.iter().try_for_each(|r| each(r))
        }

        fn lost(&self) -> u64 {
            0
        }
    }

    /// Keeps what it is given where the test sees it.
    struct Shared(Arc<Mutex<Vec<Vec<u8>>>>);

    impl RecordSink for Shared {
        type Summary = usize;

        fn push(&mut self, record: &[u8]) -> Result<(), String> {
            self.0.lock().unwrap().push(record.to_vec());
            Ok(())
        }

        fn finish(self, _lost: u64) -> Result<usize, String> {
            Ok(self.0.lock().unwrap().len())
        }
    }

    #[test]
    fn a_flush_returns_once_what_the_ring_held_is_in_the_sink() {
        let pending = Arc::new(Mutex::new(Vec::new()));
        let sunk = Arc::new(Mutex::new(Vec::new()));
        let ring = FakeRing {
            pending: pending.clone(),
        };
        let capture = Capture::start("test-flush", ring, Shared(sunk.clone())).unwrap();
        for n in 0u8..5 {
            // The thread waits up to 100 ms between drains of a quiet ring;
            // a flush drains at once, and never returns before that drain.
            pending.lock().unwrap().push(vec![n]);
            capture.flush().unwrap();
            assert_eq!(sunk.lock().unwrap().last(), Some(&vec![n]));
        }
        pending.lock().unwrap().push(vec![9]);
        assert_eq!(capture.stop(), Ok(6), "stop drains what is left");
    }
}
