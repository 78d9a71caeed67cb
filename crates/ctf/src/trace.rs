//! Opening a folder of traces and iterating over all their events in time
//! order.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use deepspan_model::{Merge, Tid};

use crate::error::{Error, Result};
use crate::event::CtfEvent;
use crate::metadata::{parse_metadata, read_metadata, Clock, EnvValue, TraceMeta};
use crate::stream::{
    first_preamble, scan_lost, LostEvents, LostLog, Source, StreamEvents, StreamSpec, TraceShared,
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
            return Err(Error::NoTrace(dir.to_path_buf()));
        }
        dirs.sort();
        let mut out = CtfTrace {
            traces: Vec::new(),
            streams: Vec::new(),
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
        for (i, src) in files.into_iter().enumerate() {
            if let Some(p) = first_preamble(&meta, &src)? {
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
        let shared = Arc::new(TraceShared {
            index,
            dir,
            meta,
            offsets_ns,
            tid_inferred,
        });
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

    /// The traces, in the order of [`CtfEvent::trace_index`].
    pub fn traces(&self) -> &[TraceInfo] {
        &self.traces
    }

    /// All events of all traces, ordered by absolute timestamp (ties keep
    /// trace, then stream order). Streams are read lazily, one packet at a
    /// time each. A decoding error is returned in place and ends the stream
    /// it comes from; the other streams go on.
    pub fn events(&self) -> Events {
        let lost = Arc::new(Mutex::new(LostLog::default()));
        let inputs = self
            .streams
            .iter()
            .map(|s| StreamEvents::new(s.clone(), lost.clone()))
            .collect();
        Events {
            merge: Merge::new(inputs),
            infer: self.traces.iter().map(|t| t.shared.tid_inferred).collect(),
            cpu_tid: vec![HashMap::new(); self.traces.len()],
            lost,
        }
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

/// Time-ordered events of a [`CtfTrace`]; see [`CtfTrace::events`].
pub struct Events {
    merge: Merge<StreamEvents, CtfEvent, Error>,
    infer: Vec<bool>,
    /// Per trace: the thread last switched in on each CPU.
    cpu_tid: Vec<HashMap<u32, Tid>>,
    lost: Arc<Mutex<LostLog>>,
}

impl Events {
    /// Events discarded by the tracer in the packets read so far (complete
    /// once the iteration is over).
    pub fn lost_events(&self) -> u64 {
        self.lost.lock().map(|l| l.total).unwrap_or(0)
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

    fn next(&mut self) -> Option<Self::Item> {
        let mut event = match self.merge.next()? {
            Ok(e) => e,
            Err(e) => return Some(Err(e)),
        };
        let t = event.trace_index();
        if self.infer.get(t).copied().unwrap_or(false) && !event.tid_known() {
            let cpus = &mut self.cpu_tid[t];
            // A sched_switch runs in the context of the task switched out.
            let current = match event.switch {
                Some((prev, next)) => {
                    cpus.insert(event.cpu(), next);
                    Some(prev)
                }
                None => cpus.get(&event.cpu()).copied(),
            };
            if let Some(tid) = current {
                event.set_tid(tid);
            }
        }
        Some(Ok(event))
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
