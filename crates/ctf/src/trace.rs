//! Opening a folder of traces and iterating over all their events in time
//! order.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use deepspan_model::{Name, Tid};

use crate::error::{Error, ErrorKind, Result};
use crate::event::CtfEvent;
use crate::metadata::{parse_metadata, read_metadata, Clock, EnvValue, EventClass, TraceMeta};
use crate::stream::{
    abs_ns, first_preamble, index_tail, note_cut, packet_map, part_of, scan_lost, LostEvents,
    LostLog, PacketAt, ReadOptions, Source, StreamCut, StreamEvents, StreamSpec, TraceShared,
};

/// Folders deeper than this below the opened one are not searched (also
/// stops symlink loops).
const MAX_SEARCH_DEPTH: usize = 12;

/// One or more CTF traces read as a single time-ordered event stream.
///
/// ```no_run
/// let trace = deepspan_ctf::CtfTrace::open("lttng-session/")?;
/// for event in trace.events() {
///     let event = event?;
///     println!("{} {} {:?}", event.ts(), event.name(), event.fields());
/// }
/// # Ok::<(), deepspan_ctf::Error>(())
/// ```
pub struct CtfTrace {
    traces: Vec<TraceInfo>,
    streams: Vec<StreamSpec>,
    /// Every event class of every trace, by [`CtfEvent::class_index`].
    class_names: Vec<Name>,
}

/// What one trace of a [`CtfTrace`] declares.
#[derive(Clone)]
pub struct TraceInfo {
    shared: Arc<TraceShared>,
    streams: usize,
}

impl CtfTrace {
    /// Opens every trace found in `dir` or below it (any folder holding a
    /// `metadata` file: an LTTng session's `kernel/` and `ust/...` traces,
    /// per-uid or per-pid buffers). Reads the metadata and the first packet
    /// header of each stream file; events are read by [`CtfTrace::events`].
    pub fn open(dir: impl AsRef<Path>) -> Result<CtfTrace> {
        let dir = dir.as_ref();
        std::fs::metadata(dir).map_err(|e| Error::io(dir, e))?;
        let mut dirs = Vec::new();
        find_traces(dir, 0, &mut dirs)?;
        if dirs.is_empty() {
            return Err(ErrorKind::NoTrace(dir.to_path_buf()).into());
        }
        dirs.sort();
        let mut out = CtfTrace {
            traces: Vec::new(),
            streams: Vec::new(),
            class_names: Vec::new(),
        };
        for d in dirs {
            let meta = read_metadata(&d.join("metadata"))?;
            let mut files = Vec::new();
            let entries = std::fs::read_dir(&d).map_err(|e| Error::io(&d, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| Error::io(&d, e))?;
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name == "metadata" || name.starts_with('.') {
                    continue;
                }
                let ft = entry.file_type().map_err(|e| Error::io(&entry.path(), e))?;
                if ft.is_file() || (ft.is_symlink() && entry.path().is_file()) {
                    files.push(Source::File(entry.path()));
                }
            }
            out.add_trace(d, meta, files)?;
        }
        Ok(out)
    }

    /// A single trace held in memory: TSDL metadata (text or packetized)
    /// and the bytes of its stream files. For tests, fuzzing and traces
    /// received over the network; errors name the streams `stream<i>`.
    pub fn from_memory(metadata: &[u8], streams: Vec<Vec<u8>>) -> Result<CtfTrace> {
        let meta = parse_metadata(Path::new("metadata"), metadata)?;
        let files = streams
            .into_iter()
            .enumerate()
            .map(|(i, data)| Source::Memory {
                name: PathBuf::from(format!("stream{i}")),
                data: data.into(),
            })
            .collect();
        let mut out = CtfTrace {
            traces: Vec::new(),
            streams: Vec::new(),
            class_names: Vec::new(),
        };
        out.add_trace(PathBuf::from("."), meta, files)?;
        Ok(out)
    }

    /// Groups the files of a trace into streams: files with the same stream
    /// class and instance id are one stream (LTTng tracefile rotation),
    /// read in the order of their first packet's begin timestamp.
    fn add_trace(&mut self, dir: PathBuf, meta: TraceMeta, files: Vec<Source>) -> Result<()> {
        let index = self.traces.len();
        // Which files are one stream: same stream class and instance id
        // (LTTng ≥ 2.8 packet headers), or for older traces the same
        // rotation base name (`chan_0_0`, `chan_0_1` → `chan_0`).
        #[derive(PartialEq, Eq, PartialOrd, Ord)]
        enum Identity {
            Instance(u64),
            Rotation(String),
            Alone(usize),
        }
        let mut firsts = Vec::new();
        // Files cut short inside their first packet header (or empty while
        // their index lists packets): nothing to read. Their times are
        // filled in once the clock offsets are known.
        let mut cuts = Vec::new();
        let mut cut_ticks = Vec::new();
        for (i, src) in files.into_iter().enumerate() {
            let (first, cut_at) = match first_preamble(&meta, &src)? {
                Ok(Some(first)) => (Some(first), None),
                Ok(None) => (None, Some(0)),
                Err(file_bytes) => (None, Some(file_bytes)),
            };
            if let Some(file_bytes) = cut_at {
                let tail = matches!(src, Source::File(_))
                    .then(|| index_tail(src.path(), file_bytes))
                    .flatten();
                // An empty file is a cut only when its index says so.
                if file_bytes > 0 || tail.is_some() {
                    cuts.push(StreamCut {
                        trace: index,
                        path: src.path().to_path_buf(),
                        packet_offset: 0,
                        file_bytes,
                        expected_bytes: tail.as_ref().map(|t| t.end),
                        lost_packets: tail.as_ref().map(|t| t.packets),
                        begin_ns: None,
                        end_ns: None,
                        events_lost: true,
                    });
                    cut_ticks.push(tail);
                }
            }
            if let Some(p) = first {
                let identity = match (p.instance, rotation_base(src.path())) {
                    (Some(inst), _) => Identity::Instance(inst),
                    (None, Some(base)) => Identity::Rotation(base),
                    (None, None) => Identity::Alone(i),
                };
                firsts.push(((p.stream.id, identity), p.ts_begin.unwrap_or(0), src));
            }
        }
        firsts.sort_by(|a, b| {
            (&a.0, a.1)
                .cmp(&(&b.0, b.1))
                .then_with(|| a.2.path().cmp(b.2.path()))
        });
        let mut groups: Vec<((u64, Identity), Vec<Source>)> = Vec::new();
        for (key, _, src) in firsts {
            match groups.last_mut() {
                Some((k, files)) if *k == key => files.push(src),
                _ => groups.push((key, vec![src])),
            }
        }
        let has_tid = meta
            .streams
            .iter()
            .any(|s| s.ctx_tid.is_some() || s.ctx_vtid.is_some());
        let has_perf_tid = meta_has_perf_tid(&meta)
            || meta
                .streams
                .iter()
                .any(|s| s.events().any(|e| e.perf_tid.is_some()));
        let tid_inferred = meta.kernel && !has_tid && !has_perf_tid;
        let offsets_ns = meta.clocks.iter().map(Clock::offset_ns).collect();
        let class_base = self.class_names.len();
        let mut classes: Vec<&EventClass> = meta
            .streams
            .iter()
            .flat_map(|s| s.events())
            .map(|c| &**c)
            .collect();
        classes.sort_by_key(|c| c.seq);
        self.class_names
            .extend(classes.iter().map(|c| c.name.clone()));
        let shared = Arc::new(TraceShared {
            index,
            class_base,
            dir,
            meta,
            offsets_ns,
            tid_inferred,
            cuts: Mutex::new(Vec::new()),
        });
        for (mut cut, tail) in cuts.into_iter().zip(cut_ticks) {
            if let Some(t) = tail {
                if let Some(stream) = shared.meta.stream(t.stream_id) {
                    cut.begin_ns = Some(abs_ns(&shared, stream, t.begin_ticks));
                    cut.end_ns = Some(abs_ns(&shared, stream, t.end_ticks));
                }
            }
            note_cut(&shared.cuts, cut);
        }
        self.traces.push(TraceInfo {
            shared: shared.clone(),
            streams: groups.len(),
        });
        for (_, files) in groups {
            self.streams.push(StreamSpec {
                trace: shared.clone(),
                files,
            });
        }
        Ok(())
    }

    /// Event classes of all traces: [`CtfEvent::class_index`] is below it.
    pub fn class_count(&self) -> usize {
        self.class_names.len()
    }

    /// The name of the event class with this [`CtfEvent::class_index`].
    pub fn class_name(&self, index: usize) -> Option<&Name> {
        self.class_names.get(index)
    }

    /// The traces, in the order of [`CtfEvent::trace_index`].
    pub fn traces(&self) -> &[TraceInfo] {
        &self.traces
    }

    /// All events of all traces, ordered by absolute timestamp (ties keep
    /// trace, then stream order). Streams are read lazily, one packet at a
    /// time each. A decoding error is returned in place and ends the stream
    /// it comes from; the other streams go on.
    pub fn events(&self) -> Events {
        self.events_with(ReadOptions::default())
    }

    pub(crate) fn events_with(&self, opts: ReadOptions) -> Events {
        let lost = Arc::new(Mutex::new(LostLog::default()));
        let inputs = self
            .streams
            .iter()
            .map(|s| StreamEvents::new(s.clone(), lost.clone(), opts))
            .collect();
        let infer: Vec<bool> = self.traces.iter().map(|t| t.shared.tid_inferred).collect();
        Events {
            merge: Merge::new(inputs),
            any_infer: infer.iter().any(|&i| i),
            infer,
            cpu_tid: (0..self.traces.len()).map(|_| CpuTids::default()).collect(),
            lost,
        }
    }

    /// The events of each stream on its own, in the stream's time order,
    /// for readers that decode streams in parallel and merge by
    /// [`CtfEvent::ts`] (ties: lower index first, as [`CtfTrace::events`]
    /// does). `None` when that would give other events than `events()`:
    /// a trace whose thread ids are inferred from context switches must
    /// have one stream per CPU (one channel), because a stream sees only
    /// its own switches.
    pub fn stream_events(&self) -> Option<Vec<StreamReader>> {
        if !self.readable_per_stream() {
            return None;
        }
        let lost = Arc::new(Mutex::new(LostLog::default()));
        Some(
            self.streams
                .iter()
                .map(|s| {
                    let events = StreamEvents::new(s.clone(), lost.clone(), ReadOptions::default());
                    StreamReader::new(events, s.files.iter().map(|f| f.len()).sum(), None)
                })
                .collect(),
        )
    }

    /// Like [`CtfTrace::stream_events`], with the streams larger than
    /// `1 / parts` of the trace cut into runs of whole packets of about
    /// that size, each read on its own: so that `parts` threads share the
    /// work evenly even when one stream holds most of the trace (one CPU
    /// traced, or one busy CPU). The readers of one stream come one after
    /// the other, in order: merged by [`CtfEvent::ts`] (ties: lower index
    /// first) they give the events of `events()`, and together the same
    /// discarded-event log. Thread ids inferred from context switches
    /// are exact: a run starts with the thread switched in last before it
    /// (found by decoding the packets before it, back to the first with a
    /// switch). Differences: an error in a stream ends only the run it
    /// is in, not the rest of the stream; a stream whose packets cannot
    /// be listed (an error at a packet header) is read whole.
    pub fn stream_parts(&self, parts: usize) -> Option<Vec<StreamReader>> {
        if !self.readable_per_stream() {
            return None;
        }
        let lost = Arc::new(Mutex::new(LostLog::default()));
        let sizes: Vec<u64> = self
            .streams
            .iter()
            .map(|s| s.files.iter().map(|f| f.len()).sum())
            .collect();
        let share = sizes
            .iter()
            .sum::<u64>()
            .div_ceil(parts.max(1) as u64)
            .max(1);
        let mut out = Vec::new();
        for (s, &bytes) in self.streams.iter().zip(&sizes) {
            let runs = bytes.div_ceil(share);
            let packets = if runs > 1 {
                packet_map(s)
                    .ok()
                    .filter(|p| p.len() >= 2 * MIN_RUN_PACKETS)
            } else {
                None
            };
            let Some(packets) = packets else {
                let events = StreamEvents::new(s.clone(), lost.clone(), ReadOptions::default());
                out.push(StreamReader::new(events, bytes, None));
                continue;
            };
            let packets: Arc<[PacketAt]> = packets.into();
            let starts = run_starts(&packets, runs);
            for (i, &from) in starts.iter().enumerate() {
                let to = starts.get(i + 1).copied();
                let run_bytes = packets[from..to.unwrap_or(packets.len())]
                    .iter()
                    .map(|p| p.bytes)
                    .sum();
                let seed = (s.trace.tid_inferred && from > 0).then(|| TidSeed {
                    spec: s.clone(),
                    packets: packets.clone(),
                    before: from,
                });
                let part = part_of(&packets, from, to);
                let events =
                    StreamEvents::part(s.clone(), lost.clone(), ReadOptions::default(), &part);
                out.push(StreamReader::new(events, run_bytes, seed));
            }
        }
        Some(out)
    }

    /// Whether the streams read one by one give the events of `events()`:
    /// a trace whose thread ids are inferred from context switches must
    /// have one stream per CPU (one channel), because a stream sees only
    /// its own switches.
    fn readable_per_stream(&self) -> bool {
        let mut channels: HashMap<usize, HashSet<String>> = HashMap::new();
        for s in &self.streams {
            if s.trace.tid_inferred {
                let file = s
                    .files
                    .first()
                    .map(|f| f.path().to_path_buf())
                    .unwrap_or_default();
                channels
                    .entry(s.trace.index)
                    .or_default()
                    .insert(channel_of(&file));
            }
        }
        channels.values().all(|c| c.len() <= 1)
    }

    /// The stream files found cut short so far: those whose first packet
    /// header is cut (seen when opened), and every cut packet an iteration
    /// of this trace has reached (complete once one iteration is over).
    /// The events of the whole packets before a cut are decoded; these say
    /// what is lost, for a warning.
    pub fn truncations(&self) -> Vec<StreamCut> {
        self.traces
            .iter()
            .flat_map(|t| t.shared.cuts.lock().map(|c| c.clone()).unwrap_or_default())
            .collect()
    }

    /// Total events the tracer discarded, from the packet contexts' counters
    /// (reads only packet headers).
    pub fn lost_events(&self) -> Result<u64> {
        let mut total = 0u64;
        for s in &self.streams {
            total = total.saturating_add(scan_lost(s)?);
        }
        Ok(total)
    }
}

fn meta_has_perf_tid(meta: &TraceMeta) -> bool {
    // perf-to-CTF traces carry the thread in every payload.
    meta.env("tracer_name")
        .is_some_and(|v| *v == EnvValue::Str("perf".into()))
}

/// `chan_0_1` → `chan_0`: the name of a rotated tracefile without its
/// rotation index (only for names ending in `_<cpu>_<index>`).
fn rotation_base(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    let (base, index) = name.rsplit_once('_')?;
    let (_, cpu) = base.rsplit_once('_')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(index) && digits(cpu)).then(|| base.to_string())
}

fn find_traces(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> Result<()> {
    if dir.join("metadata").is_file() {
        out.push(dir.to_path_buf());
        return Ok(());
    }
    if depth >= MAX_SEARCH_DEPTH {
        return Ok(());
    }
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let path = entry.path();
        if path.is_dir() {
            find_traces(&path, depth + 1, out)?;
        }
    }
    Ok(())
}

/// `channel0_3` (or rotated `channel0_3_12`) → `channel0`: the channel a
/// per-CPU stream file belongs to.
fn channel_of(path: &Path) -> String {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let name = rotation_base(path).unwrap_or_else(|| name.to_string());
    match name.rsplit_once('_') {
        Some((base, cpu)) if !cpu.is_empty() && cpu.bytes().all(|b| b.is_ascii_digit()) => {
            base.to_string()
        }
        _ => name,
    }
}

/// Packets a run of [`CtfTrace::stream_parts`] has at least: a run that
/// infers thread ids may decode the packet before it once more.
const MIN_RUN_PACKETS: usize = 4;

/// The first packet of each of `runs` runs of about equal bytes (each of
/// at least [`MIN_RUN_PACKETS`] packets) of a stream's `packets`. A run
/// starts only at a packet that sets the clock (compact timestamps count
/// from the clock the packets before left).
fn run_starts(packets: &[PacketAt], runs: u64) -> Vec<usize> {
    let total: u64 = packets.iter().map(|p| p.bytes).sum();
    let mut starts = vec![0];
    let mut at = 0u64;
    for (i, p) in packets.iter().enumerate() {
        let last = *starts.last().unwrap_or(&0);
        let run = starts.len() as u64;
        // Cut where this packet starts nearer the next target than the
        // next packet would.
        let target = total / runs * run;
        if run < runs
            && p.sets_clock
            && i >= last + MIN_RUN_PACKETS
            && i + MIN_RUN_PACKETS <= packets.len()
            && at + p.bytes / 2 >= target
        {
            starts.push(i);
        }
        at += p.bytes;
    }
    starts
}

/// Where a run of a stream finds the thread last switched in before it.
struct TidSeed {
    spec: StreamSpec,
    packets: Arc<[PacketAt]>,
    /// Index in `packets` of the run's first packet.
    before: usize,
}

/// The events of one stream, or of a run of packets of it; see
/// [`CtfTrace::stream_events`] and [`CtfTrace::stream_parts`].
pub struct StreamReader {
    bytes: u64,
    events: StreamEvents,
    infer: bool,
    cpu_tid: CpuTids,
    /// Until the first event: where the thread ids at the start of the run
    /// are found.
    seed: Option<TidSeed>,
    lost: Arc<Mutex<LostLog>>,
}

impl StreamReader {
    fn new(events: StreamEvents, bytes: u64, seed: Option<TidSeed>) -> StreamReader {
        StreamReader {
            bytes,
            infer: events.trace().tid_inferred,
            lost: events.lost_log(),
            events,
            cpu_tid: CpuTids::default(),
            seed,
        }
    }

    /// Bytes of the stream's files, or of the run's packets (a size to
    /// balance work by).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Sets the thread switched in last on each CPU before the run:
    /// decodes the packets before it, from the last one back, up to the
    /// first that has a context switch (the state the whole stream's
    /// reader would have there). A packet that does not decode is
    /// skipped: the run before reports its error.
    #[cold]
    fn seed_tids(&mut self, seed: TidSeed) {
        // Their losses were counted by the run they belong to.
        let lost: Arc<Mutex<LostLog>> = Arc::default();
        for j in (0..seed.before).rev() {
            let part = part_of(&seed.packets, j, Some(j + 1));
            let packet = StreamEvents::part(
                seed.spec.clone(),
                lost.clone(),
                ReadOptions::default(),
                &part,
            );
            let mut switched = false;
            for event in packet.map_while(Result::ok) {
                if let Some((_, next)) = event.switch() {
                    self.cpu_tid.set(event.cpu(), next);
                    switched = true;
                }
            }
            if switched {
                return;
            }
        }
    }

    /// The discarded-event log shared by all readers of one
    /// [`CtfTrace::stream_events`] call; it outlives the readers.
    pub fn lost_log(&self) -> LostLogHandle {
        LostLogHandle(self.lost.clone())
    }
}

/// Discarded events reported by the packets read so far; see
/// [`StreamReader::lost_log`].
#[derive(Clone)]
pub struct LostLogHandle(Arc<Mutex<LostLog>>);

impl LostLogHandle {
    pub fn total(&self) -> u64 {
        self.0.lock().map(|l| l.total).unwrap_or(0)
    }

    /// Where the events were lost, packet by packet.
    pub fn records(&self) -> Vec<LostEvents> {
        self.0.lock().map(|l| l.records.clone()).unwrap_or_default()
    }

    /// Number of reports, cheaper than [`LostLogHandle::records`].
    pub fn reports(&self) -> usize {
        self.0.lock().map(|l| l.records.len()).unwrap_or(0)
    }
}

impl Iterator for StreamReader {
    type Item = Result<CtfEvent>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if let Some(seed) = self.seed.take() {
            self.seed_tids(seed);
        }
        let mut event = match self.events.next()? {
            Ok(e) => e,
            Err(e) => return Some(Err(e)),
        };
        if self.infer && !event.tid_known() {
            // A sched_switch runs in the context of the task switched out.
            let current = match event.switch() {
                Some((prev, next)) => {
                    self.cpu_tid.set(event.cpu(), next);
                    Some(prev)
                }
                None => self.cpu_tid.get(event.cpu()),
            };
            if let Some(tid) = current {
                event.set_tid(tid);
            }
        }
        Some(Ok(event))
    }
}

/// Time-ordered events of a [`CtfTrace`]; see [`CtfTrace::events`].
pub struct Events {
    merge: Merge,
    infer: Vec<bool>,
    any_infer: bool,
    /// Per trace: the thread last switched in on each CPU.
    cpu_tid: Vec<CpuTids>,
    lost: Arc<Mutex<LostLog>>,
}

/// The thread last switched in on each CPU of a trace.
#[derive(Default)]
struct CpuTids {
    small: Vec<Option<Tid>>,
    large: HashMap<u32, Tid>,
}

impl CpuTids {
    const SMALL: u32 = 4096;

    #[inline(always)]
    fn get(&self, cpu: u32) -> Option<Tid> {
        if cpu < Self::SMALL {
            self.small.get(cpu as usize).copied().flatten()
        } else {
            self.large.get(&cpu).copied()
        }
    }

    fn set(&mut self, cpu: u32, tid: Tid) {
        if cpu < Self::SMALL {
            let i = cpu as usize;
            if self.small.len() <= i {
                self.small.resize(i + 1, None);
            }
            self.small[i] = Some(tid);
        } else {
            self.large.insert(cpu, tid);
        }
    }
}

/// K-way merge of the streams on (timestamp, stream index): stable. Each
/// stream's next event waits decoded in its chunk; only the earliest is
/// taken. The stream that gave the last event stays current as long as its
/// next event still comes first, which costs one comparison; the heap
/// holds the other streams' next timestamps.
///
/// An error from a stream is handed out as soon as that stream is polled,
/// and the stream is not polled again; nothing decoded before it is lost.
struct Merge {
    inputs: Vec<StreamEvents>,
    /// Min-heap of (next timestamp, stream) of every stream with a next
    /// event except the current one.
    heap: Vec<(u64, usize)>,
    /// The stream whose next event comes first.
    current: Option<usize>,
    /// An event taken just before its stream failed: handed out right
    /// after the error.
    pending: Option<CtfEvent>,
    /// Streams not polled yet (first poll is lazy so that an error of any
    /// stream surfaces through `next`).
    unprimed: Vec<usize>,
}

impl Merge {
    fn new(inputs: Vec<StreamEvents>) -> Merge {
        let n = inputs.len();
        Merge {
            inputs,
            heap: Vec::with_capacity(n),
            current: None,
            pending: None,
            unprimed: (0..n).rev().collect(),
        }
    }

    #[inline(always)]
    fn next(&mut self) -> Option<Result<CtfEvent>> {
        if !self.unprimed.is_empty() {
            if let Err(e) = self.prime() {
                return Some(Err(e));
            }
        }
        if let Some(event) = self.pending.take() {
            return Some(Ok(event));
        }
        loop {
            let cur = self.current?;
            let input = &mut self.inputs[cur];
            let Some((event, _)) = input.pop() else {
                // Not reached: a current stream has its next event ready.
                self.current = self.heap_pop();
                continue;
            };
            match input.peek() {
                Some(Ok(ts)) => self.choose(cur, ts),
                None => self.current = self.heap_pop(),
                Some(Err(e)) => {
                    self.current = self.heap_pop();
                    self.pending = Some(event);
                    return Some(Err(e));
                }
            }
            return Some(Ok(event));
        }
    }

    /// After stream `cur` gave an event and its next one is at `ts`: which
    /// stream comes next. It stays current while it still comes first
    /// (ties: lower stream first).
    #[inline(always)]
    fn choose(&mut self, cur: usize, ts: u64) {
        let key = (ts, cur);
        if let Some(&top) = self.heap.first() {
            if top < key {
                self.current = Some(top.1);
                self.heap_replace_top(key);
            }
        }
    }

    fn heap_push(&mut self, key: (u64, usize)) {
        let h = &mut self.heap;
        h.push(key);
        let mut i = h.len() - 1;
        while i > 0 {
            let parent = (i - 1) / 2;
            if h[parent] <= h[i] {
                break;
            }
            h.swap(parent, i);
            i = parent;
        }
    }

    /// The stream of the smallest key, taken off the heap.
    fn heap_pop(&mut self) -> Option<usize> {
        let last = self.heap.pop()?;
        if self.heap.is_empty() {
            return Some(last.1);
        }
        let top = self.heap[0];
        self.heap_replace_top(last);
        Some(top.1)
    }

    /// Replaces the smallest key by `key` and restores the heap order.
    #[inline(always)]
    fn heap_replace_top(&mut self, key: (u64, usize)) {
        let h = &mut self.heap;
        let n = h.len();
        let mut i = 0;
        loop {
            let l = 2 * i + 1;
            if l >= n {
                break;
            }
            let c = if l + 1 < n && h[l + 1] < h[l] {
                l + 1
            } else {
                l
            };
            if key <= h[c] {
                break;
            }
            h[i] = h[c];
            i = c;
        }
        h[i] = key;
    }

    /// Polls every stream once (in stream order), then picks the first.
    #[cold]
    fn prime(&mut self) -> Result<()> {
        while let Some(idx) = self.unprimed.pop() {
            match self.inputs[idx].peek() {
                Some(Ok(ts)) => self.heap_push((ts, idx)),
                None => {}
                Some(Err(e)) => {
                    if self.unprimed.is_empty() {
                        self.current = self.heap_pop();
                    }
                    return Err(e);
                }
            }
        }
        self.current = self.heap_pop();
        Ok(())
    }
}

#[cfg(test)]
impl Iterator for Merge {
    type Item = Result<CtfEvent>;

    fn next(&mut self) -> Option<Self::Item> {
        Merge::next(self)
    }
}

impl Events {
    /// Events discarded by the tracer in the packets read so far (complete
    /// once the iteration is over).
    pub fn lost_events(&self) -> u64 {
        self.lost.lock().map(|l| l.total).unwrap_or(0)
    }

    /// The discarded-event log of this iteration, shared; it outlives it.
    pub fn lost_log(&self) -> LostLogHandle {
        LostLogHandle(self.lost.clone())
    }

    /// Where the discarded events were, packet by packet, so far.
    pub fn lost_event_records(&self) -> Vec<LostEvents> {
        self.lost
            .lock()
            .map(|l| l.records.clone())
            .unwrap_or_default()
    }
}

impl Iterator for Events {
    type Item = Result<CtfEvent>;

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        let mut event = match self.merge.next()? {
            Ok(e) => e,
            Err(e) => return Some(Err(e)),
        };
        if self.any_infer {
            self.infer_tid(&mut event);
        }
        Some(Ok(event))
    }
}

impl Events {
    #[inline(always)]
    fn infer_tid(&mut self, event: &mut CtfEvent) {
        if event.tid_known() {
            return;
        }
        let t = if self.infer.len() == 1 {
            0
        } else {
            event.trace_index()
        };
        if self.infer.get(t).copied().unwrap_or(false) {
            let cpus = &mut self.cpu_tid[t];
            // A sched_switch runs in the context of the task switched out.
            let current = match event.switch() {
                Some((prev, next)) => {
                    cpus.set(event.cpu(), next);
                    Some(prev)
                }
                None => cpus.get(event.cpu()),
            };
            if let Some(tid) = current {
                event.set_tid(tid);
            }
        }
    }
}

impl TraceInfo {
    /// The folder of the trace.
    pub fn path(&self) -> &Path {
        &self.shared.dir
    }

    pub fn uuid(&self) -> Option<[u8; 16]> {
        self.shared.meta.uuid
    }

    /// The `env` block, in declaration order.
    pub fn env(&self) -> &[(String, EnvValue)] {
        &self.shared.meta.env
    }

    pub fn env_value(&self, key: &str) -> Option<&EnvValue> {
        self.shared.meta.env(key)
    }

    /// A string `env` entry.
    pub fn env_str(&self, key: &str) -> Option<&str> {
        match self.env_value(key)? {
            EnvValue::Str(s) => Some(s),
            EnvValue::Int(_) => None,
        }
    }

    /// `kernel` or `ust` for LTTng.
    pub fn domain(&self) -> Option<&str> {
        self.env_str("domain")
    }

    pub fn hostname(&self) -> Option<&str> {
        self.env_str("hostname")
    }

    pub fn tracer_name(&self) -> Option<&str> {
        self.env_str("tracer_name")
    }

    pub fn kernel_release(&self) -> Option<&str> {
        self.env_str("kernel_release")
    }

    pub fn clocks(&self) -> &[Clock] {
        &self.shared.meta.clocks
    }

    /// Nanoseconds from the Unix epoch to the zero of the trace's (first)
    /// clock: [`CtfEvent::ts`] − [`CtfEvent::monotonic_ns`].
    pub fn clock_offset_ns(&self) -> i128 {
        self.shared.offsets_ns.first().copied().unwrap_or(0)
    }

    /// True when the trace records no thread id per event (no `tid`/`vtid`
    /// context, not perf) and [`CtfEvent::tid`] is inferred per CPU from
    /// sched_switch (unknown, -1, before a CPU's first switch).
    pub fn tid_inferred(&self) -> bool {
        self.shared.tid_inferred
    }

    /// Number of streams (rotated files of one stream count once).
    pub fn stream_count(&self) -> usize {
        self.streams
    }

    /// Number of event classes declared.
    pub fn event_class_count(&self) -> usize {
        self.shared
            .meta
            .streams
            .iter()
            .map(|s| s.event_count())
            .sum()
    }

    /// Whether the trace maps kernel event names to typed events.
    pub fn is_kernel(&self) -> bool {
        self.shared.meta.kernel
    }

    /// The TSDL metadata text.
    pub fn metadata_text(&self) -> &str {
        &self.shared.meta.text
    }
}

impl std::fmt::Debug for TraceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceInfo")
            .field("path", &self.path())
            .field("domain", &self.domain())
            .field("hostname", &self.hostname())
            .field("streams", &self.streams)
            .field("tid_inferred", &self.tid_inferred())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus(rel: &str) -> PathBuf {
        Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/testdata/kernel/ctf"
        ))
        .join(rel)
    }

    /// Everything observable about each event (and errors), in order.
    fn observe(trace: &CtfTrace, opts: ReadOptions) -> Vec<String> {
        let mut events = trace.events_with(opts);
        // Kept alive till the end: windows and chunks must outlive the
        // reader's moving on.
        let all: Vec<Result<CtfEvent>> = events.by_ref().collect();
        let mut out: Vec<String> = all
            .iter()
            .map(|e| match e {
                Ok(e) => format!(
                    "{} {} {} {} {} {:?} {:?} {:?} {:?} {:?} {:?}",
                    e.ts(),
                    e.clock_ticks(),
                    e.cpu(),
                    e.tid(),
                    e.name(),
                    e.fields(),
                    e.context(),
                    e.packet_context(),
                    e.source(),
                    e.to_event(),
                    e.span_sync()
                ),
                Err(e) => format!("error: {e}"),
            })
            .collect();
        out.push(format!(
            "lost {} {:?}",
            events.lost_events(),
            events.lost_event_records()
        ));
        out
    }

    /// Read options that put window boundaries everywhere: tiny windows
    /// (events straddle them and windows grow), mapped or read.
    fn window_options() -> Vec<ReadOptions> {
        let o = |window, map_window, map| ReadOptions {
            window,
            map_window,
            map,
            whole: false,
        };
        vec![
            ReadOptions::default(),
            o(1, 1, false),
            o(64, 64, false),
            o(1000, 1000, false),
            o(64, 7, true),
            o(64, 5000, true),
        ]
    }

    fn whole() -> ReadOptions {
        ReadOptions {
            whole: true,
            map: false,
            ..ReadOptions::default()
        }
    }

    #[test]
    fn windows_and_chunks_decode_like_whole_packets() {
        for rel in [
            "bug446190/trace",
            "lttng-tracefile-rotation",
            "multi-domains",
            "perf-taskset2/trace",
            "flipping-endianness/trace",
        ] {
            let trace = CtfTrace::open(corpus(rel)).unwrap();
            let expected = observe(&trace, whole());
            assert!(expected.len() > 1, "{rel}");
            for opts in window_options() {
                let got = observe(&trace, opts);
                assert_eq!(got.len(), expected.len(), "{rel} {opts:?}");
                for (g, e) in got.iter().zip(&expected) {
                    assert_eq!(g, e, "{rel} {opts:?}");
                }
            }
        }
    }

    #[test]
    fn merge_orders_like_the_model_merge() {
        for rel in [
            "bug446190/trace",
            "lttng-tracefile-rotation",
            "multi-domains",
            "perf-taskset2/trace",
        ] {
            let trace = CtfTrace::open(corpus(rel)).unwrap();
            let lost = Arc::new(Mutex::new(LostLog::default()));
            let inputs: Vec<StreamEvents> = trace
                .streams
                .iter()
                .map(|s| StreamEvents::new(s.clone(), lost.clone(), ReadOptions::default()))
                .collect();
            let key = |e: &CtfEvent| (e.ts(), e.source().0.to_path_buf(), e.source().1);
            let expected: Vec<_> = deepspan_model::Merge::new(inputs)
                .map(|e| key(&e.unwrap()))
                .collect();
            let got: Vec<_> = Merge::new(
                trace
                    .streams
                    .iter()
                    .map(|s| StreamEvents::new(s.clone(), lost.clone(), ReadOptions::default()))
                    .collect(),
            )
            .map(|e| key(&e.unwrap()))
            .collect();
            assert_eq!(got, expected, "{rel}");
        }
    }

    #[test]
    fn windows_report_errors_like_whole_packets() {
        let dir = corpus("lttng-tracefile-rotation/kernel");
        let metadata = std::fs::read(dir.join("metadata")).unwrap();
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file() && !p.ends_with("metadata"))
            .collect();
        files.sort();
        let stream = std::fs::read(&files[0]).unwrap();
        let len = stream.len();
        // Truncations and byte flips all over the first packets.
        let mut cases = Vec::new();
        for cut in (0..len.min(6000)).step_by(97) {
            cases.push(stream[..cut].to_vec());
        }
        for at in (40..len.min(6000)).step_by(61) {
            let mut s = stream.clone();
            s[at] ^= 0xA5;
            cases.push(s);
        }
        for data in cases {
            let trace = match CtfTrace::from_memory(&metadata, vec![data]) {
                Ok(t) => t,
                Err(_) => continue,
            };
            let expected = observe(&trace, whole());
            for opts in window_options() {
                assert_eq!(observe(&trace, opts), expected, "{opts:?}");
            }
        }
    }

    /// Streams cut into runs of packets, decoded on their own and merged
    /// by time, give the events of the whole trace (typed, with inferred
    /// thread ids) and the same discarded-event total.
    #[test]
    fn stream_runs_merge_to_the_same_events() {
        use deepspan_model::{merge_parallel, Event};
        let mut cut = 0;
        for rel in [
            "bug446190/trace",
            "lttng-tracefile-rotation",
            "multi-domains",
            "perf-taskset2/trace",
            "synctraces/scp_src",
            "synctraces/scp_dest",
        ] {
            let trace = CtfTrace::open(corpus(rel)).unwrap();
            let mut events = trace.events();
            let sequential: Vec<Event> = events.by_ref().map(|e| e.unwrap().to_event()).collect();
            for parts in [1, 2, 3, 5, 8] {
                let Some(readers) = trace.stream_parts(parts) else {
                    continue;
                };
                if readers.len() > trace.streams.len() {
                    cut += 1;
                }
                let lost = readers[0].lost_log();
                let typed: Vec<_> = readers
                    .into_iter()
                    .map(|r| r.map(|e| e.map(|e| e.to_event())))
                    .collect();
                let mut merged = Vec::new();
                merge_parallel(typed, &mut |e| merged.push(e)).unwrap();
                assert_eq!(merged.len(), sequential.len(), "{rel} {parts}");
                for (i, (a, b)) in merged.iter().zip(&sequential).enumerate() {
                    assert_eq!(a, b, "{rel} {parts}: event {i}");
                }
                assert_eq!(lost.total(), events.lost_events(), "{rel} {parts}");
            }
        }
        assert!(cut >= 4, "only {cut} traces cut into runs");
    }

    #[test]
    fn runs_start_near_equal_shares() {
        let packet = |i: usize, bytes| PacketAt {
            file: 0,
            offset: i as u64 * 100,
            bytes,
            discarded: Some((i as u64, 32)),
            end_ns: Some(i as u64),
            sets_clock: true,
        };
        let packets: Vec<PacketAt> = (0..10).map(|i| packet(i, 100)).collect();
        assert_eq!(run_starts(&packets, 2), [0, 5]);
        assert_eq!(run_starts(&packets, 3), [0, 4]);
        assert_eq!(run_starts(&packets[..7], 2), [0]);
        // A packet that does not set the clock starts no run.
        let mut no_clock = packets.clone();
        no_clock[5].sets_clock = false;
        assert_eq!(run_starts(&no_clock, 2), [0, 6]);
        let part = part_of(&packets, 5, Some(8));
        assert_eq!(part.start, (0, 500));
        assert_eq!(part.stop, Some((0, 800)));
        assert_eq!((part.prev_discarded, part.prev_end_ns), (Some(4), Some(4)));
    }

    #[test]
    fn rotated_file_names() {
        assert_eq!(
            rotation_base(Path::new("/t/mychan_2_11")).as_deref(),
            Some("mychan_2")
        );
        assert_eq!(rotation_base(Path::new("channel0_3")), None);
        assert_eq!(rotation_base(Path::new("chan_x_1")), None);
    }
}
