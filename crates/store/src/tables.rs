//! The analysis tables: their columns and how each is written from the
//! analysis results. Column meanings are documented in docs/tables.md;
//! times are CLOCK_MONOTONIC ns of the recording host, ids are lower-case
//! hex as in OTLP.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use deepspan_analysis::{
    softirq_name, syscall_label, Arch, BlockReason, Containers, EdgeType, KernelModel, RequestPath,
    SpanIdx, SyscallInterval, SyscallLabelKey, ThreadState,
};
use deepspan_model::container::Container;
use deepspan_model::{Comm, Tid};
use rustc_hash::FxHashMap;

use crate::columns::{columns, ColumnarTable, Optional, OptionalText, Required, Text};
use crate::history::{HistoryWriter, LaneKey as HistoryLane, Record as HistoryRecord, NO_STRING};
use crate::kept::KeptTable;
use crate::rows::table;
use crate::table::{interned, Column, TableWriter};
use crate::{span_hex, trace_hex, AnalysisResults, Error};

table! {
    /// One interval of a thread's state (`thread_states`).
    pub struct ThreadStateRow, schema THREAD_STATES_COLUMNS {
        tid: i32,
        pid: Option<i32>,
        comm: Option<String>,
        start_ns: i64,
        end_ns: i64,
        duration_ns: i64,
        state: String,
        cpu: Option<i32>,
        waker_tid: Option<i32>,
        detail: Option<String>,
        syscall: Option<String>,
    }
}

table! {
    /// One system call (`syscalls`).
    pub struct SyscallRow, schema SYSCALLS_COLUMNS {
        tid: i32,
        pid: Option<i32>,
        start_ns: i64,
        end_ns: i64,
        duration_ns: i64,
        nr: i32,
        name: Option<String>,
        arg0: u64,
        arg1: u64,
        ret: Option<i64>,
        entry_seen: bool,
        exit_seen: bool,
    }
}

table! {
    /// One request with its totals (`requests`).
    pub struct RequestRow, schema REQUESTS_COLUMNS {
        trace_id: String,
        span_id: String,
        parent_span_id: Option<String>,
        service: String,
        operation: String,
        kind: String,
        start_ns: i64,
        end_ns: i64,
        duration_ns: i64,
        sync: String,
        tid: Option<i32>,
        pieces: i64,
        running_ns: i64,
        preempted_ns: i64,
        throttled_ns: i64,
        blocked_by_requests_ns: i64,
        unknown_ns: i64,
        top_cause: Option<String>,
        top_cause_ns: i64,
        lost_events: i64,
        truncated: bool,
        arrival_ns: Option<i64>,
        arrival_by: Option<String>,
        queue_ns: i64,
        queue_cause: Option<String>,
        critical_path_first_row: Option<i64>,
    }
}

table! {
    /// One piece of a request's critical path (`critical_path`), `seq` in
    /// path order.
    pub struct CriticalPathRow, schema CRITICAL_PATH_COLUMNS {
        trace_id: String,
        span_id: String,
        seq: i32,
        start_ns: i64,
        end_ns: i64,
        duration_ns: i64,
        state: String,
        tid: Option<i32>,
        comm: Option<String>,
        syscall: Option<String>,
        waiting_in: Option<String>,
        detail: Option<String>,
        working_for_span_id: Option<String>,
        blocked_by_request: Option<String>,
        blocked_by_trace_id: Option<String>,
        shared: i32,
        vertical: bool,
        lost: bool,
        preempted_by_tid: Option<i32>,
        preempted_by_comm: Option<String>,
        throttled_ns: Option<i64>,
        contended_ns: Option<i64>,
        wakeup_ns: Option<i64>,
    }
}

table! {
    /// One cause of a request's time (`request_summary`).
    pub struct RequestSummaryRow, schema REQUEST_SUMMARY_COLUMNS {
        trace_id: String,
        span_id: String,
        state: String,
        tid: Option<i32>,
        comm: Option<String>,
        blocked_by_request: Option<String>,
        ns: i64,
        share: f64,
        throttled_ns: i64,
        contended_ns: i64,
        wakeup_ns: i64,
    }
}

table! {
    /// Time a request's path spent in one system call (`request_syscalls`).
    pub struct RequestSyscallRow, schema REQUEST_SYSCALLS_COLUMNS {
        trace_id: String,
        span_id: String,
        syscall: String,
        ns: i64,
        share: f64,
    }
}

table! {
    /// A request's diagnosis (`diagnoses`); the JSON columns hold the
    /// diagnosis contract's objects ([`crate::diagnosis`]).
    pub struct DiagnosisRow, schema DIAGNOSES_COLUMNS {
        trace_id: String,
        span_id: String,
        anomalous: bool,
        baseline_ns: Option<i64>,
        cause: Option<String>,
        headline: Option<String>,
        evidence_json: Option<String>,
        culprits_json: Option<String>,
        root_cause: Option<String>,
        root_headline: Option<String>,
        root_chain: Option<String>,
        root_evidence_json: Option<String>,
        root_culprits_json: Option<String>,
    }
}

table! {
    /// The container and pod of a process that ran in one (`containers`):
    /// join other tables on `pid`.
    pub struct ContainerRow, schema CONTAINERS_COLUMNS {
        pid: i32,
        container_id: Option<String>,
        container_name: Option<String>,
        container_runtime: Option<String>,
        pod_uid: Option<String>,
        pod_name: Option<String>,
        pod_namespace: Option<String>,
    }
}

impl ContainerRow {
    /// The row's container and pod.
    pub fn container(&self) -> Container {
        Container {
            id: self.container_id.clone(),
            runtime: self.container_runtime.clone(),
            name: self.container_name.clone(),
            pod_uid: self.pod_uid.clone(),
            pod_name: self.pod_name.clone(),
            pod_namespace: self.pod_namespace.clone(),
        }
    }
}

/// One row per process that ran in a container, by pid.
pub fn write_containers(path: &Path, containers: &Containers) -> Result<u64, Error> {
    let mut w = TableWriter::create(path, CONTAINERS_COLUMNS)?;
    for (pid, c) in containers.iter() {
        w.i32(pid);
        w.opt_str(c.id.as_deref());
        w.opt_str(c.name.as_deref());
        w.opt_str(c.runtime.as_deref());
        w.opt_str(c.pod_uid.as_deref());
        w.opt_str(c.pod_name.as_deref());
        w.opt_str(c.pod_namespace.as_deref());
        w.end_row()?;
    }
    w.finish()
}

/// Layout version of the `diagnoses` table: 2 added the root cause
/// (`root_*` columns).
pub const DIAGNOSES_VERSION: u32 = 2;

/// Layout version of the `requests` table: 2 added the arrival and queue
/// columns, 3 where each request's rows are in `critical_path`
/// (docs/tables.md).
pub const REQUESTS_VERSION: u32 = 3;

table! {
    /// One cause of an operation's time over its requests
    /// (`operation_summary`).
    pub struct OperationSummaryRow, schema OPERATION_SUMMARY_COLUMNS {
        service: String,
        operation: String,
        requests: i64,
        total_ns: i64,
        mean_ns: i64,
        max_ns: i64,
        state: String,
        comm: Option<String>,
        blocked_by_requests: bool,
        ns: i64,
        share: f64,
        throttled_ns: i64,
        contended_ns: i64,
    }
}

/// The name of a thread state in tables: the critical-path state names,
/// with WAIT_CPU (woken, not yet on a CPU) kept apart from PREEMPTED.
pub fn state_name(s: ThreadState) -> &'static str {
    match s {
        ThreadState::WaitCpu => "WAIT_CPU",
        other => other.edge_type().name(),
    }
}

/// The name of a critical-path state (`DEFAULT`, a link without a state of
/// its own, reads as UNKNOWN).
pub fn path_state_name(s: EdgeType) -> &'static str {
    match s {
        EdgeType::Default => "UNKNOWN",
        other => other.name(),
    }
}

/// Parquet strings made once per key ([`interned`]: free to clone).
///
/// Rows come grouped by thread and by request, so the key of the previous
/// row answers most lookups without hashing; the map holds the rest.
struct StringCache<K> {
    last_key: Option<K>,
    last: Bytes,
    all: FxHashMap<K, Bytes>,
}

impl<K> Default for StringCache<K> {
    fn default() -> Self {
        StringCache {
            last_key: None,
            last: Bytes::new(),
            all: FxHashMap::default(),
        }
    }
}

impl<K: Copy + Eq + Hash> StringCache<K> {
    #[inline]
    fn get<T: AsRef<[u8]>>(&mut self, key: K, make: impl FnOnce() -> T) -> &Bytes {
        if self.last_key != Some(key) {
            self.look_up(key, make);
        }
        &self.last
    }

    #[cold]
    fn look_up<T: AsRef<[u8]>>(&mut self, key: K, make: impl FnOnce() -> T) {
        self.last = self
            .all
            .entry(key)
            .or_insert_with(|| interned(make().as_ref()))
            .clone();
        self.last_key = Some(key);
    }
}

/// A thread name as a Parquet string.
fn comm_string(cache: &mut StringCache<Comm>, c: Comm) -> &Bytes {
    cache.get(c, || c.to_string_lossy())
}

/// What the kernel tables need: they do not depend on spans, so they can be
/// written while requests are analysed.
pub struct KernelContext<'a> {
    pub model: &'a KernelModel,
    pub arch: Arch,
    /// Thread → process, where the recorder saved it.
    pub pids: &'a HashMap<Tid, Tid>,
}

impl KernelContext<'_> {
    fn pid(&self, tid: Tid) -> Option<Tid> {
        self.model
            .thread(tid)
            .and_then(|t| t.pid)
            .or_else(|| self.pids.get(&tid).copied())
    }
}

static NO_WAKEUP: Bytes = Bytes::from_static(b"no wake-up seen");
static PACKET_FROM: Bytes = Bytes::from_static(b"packet from the waker");

columns! {
    struct ThreadStateColumns {
        tid: Required<i32>,
        pid: Optional<i32>,
        comm: OptionalText,
        start_ns: Required<i64>,
        end_ns: Required<i64>,
        duration_ns: Required<i64>,
        state: Text,
        cpu: Optional<i32>,
        waker_tid: Optional<i32>,
        detail: OptionalText,
        syscall: OptionalText,
    }
}

/// The history's index of each string of the table's caches, by address:
/// every one is either static or held by a cache until the table is
/// written, so an address names one string (and hashing it is cheaper than
/// hashing the text, once per record).
#[derive(Default)]
struct HistoryStrings(FxHashMap<(usize, usize), u32>);

impl HistoryStrings {
    fn id(&mut self, history: &mut HistoryWriter, s: &[u8]) -> u32 {
        *self
            .0
            .entry((s.as_ptr() as usize, s.len()))
            .or_insert_with(|| history.string(&String::from_utf8_lossy(s)))
    }
}

/// All thread states of the model: the `thread_states` table at `path`,
/// and the same states per thread, with each CPU's running threads, as the
/// state history at `history_path` ([`crate::history`]).
pub fn write_thread_states(
    path: &Path,
    history_path: &Path,
    r: &KernelContext,
) -> Result<u64, Error> {
    let mut table = ColumnarTable::<ThreadStateColumns>::create(path, THREAD_STATES_COLUMNS)?;
    let mut history = HistoryWriter::create(history_path)?;
    let mut ids = HistoryStrings::default();
    let mut cpus: BTreeMap<i32, Vec<HistoryRecord>> = BTreeMap::new();
    let mut comms = StringCache::default();
    // Labels and details repeat: each made once.
    let mut labels = StringCache::default();
    let mut details = StringCache::default();
    for th in r.model.threads() {
        let pid = r.pid(th.tid);
        // States and system calls are both in time order: one cursor.
        let syscalls = th.syscalls();
        let mut next_syscall = 0;
        // Names too: (since, name) in time order; the first name also
        // stands for the time before it, as `name_at` says.
        let names = th.names();
        let mut name = 0;
        let mut lane = Vec::with_capacity(th.states().len());
        for s in th.states() {
            while next_syscall < syscalls.len() && syscalls[next_syscall].end <= s.start {
                next_syscall += 1;
            }
            while name + 1 < names.len() && names[name + 1].0 <= s.start {
                name += 1;
            }
            let w = &mut table.columns;
            w.tid.push(th.tid);
            w.pid.push(pid);
            w.comm
                .push(names.get(name).map(|n| comm_string(&mut comms, n.1)));
            w.start_ns.push_u64(s.start);
            w.end_ns.push_u64(s.end);
            w.duration_ns.push_u64(s.duration());
            w.state.push_static(state_name(s.state));
            w.cpu
                .push((s.cpu != deepspan_analysis::NO_CPU).then_some(s.cpu as i32));
            let waker = match s.state {
                ThreadState::Blocked(BlockReason::Thread(t) | BlockReason::PacketFrom(t)) => {
                    Some(t)
                }
                _ => None,
            };
            w.waker_tid.push(waker);
            let detail = match s.state {
                ThreadState::Blocked(BlockReason::Unexplained) => Some(&NO_WAKEUP),
                ThreadState::Blocked(BlockReason::PacketFrom(_)) => Some(&PACKET_FROM),
                ThreadState::Blocked(reason @ (BlockReason::Irq(_) | BlockReason::Softirq(_))) => {
                    Some(details.get(reason, || {
                        match reason {
                            BlockReason::Irq(irq) => r
                                .model
                                .irq_name(irq)
                                .map(|n| format!("irq {irq} {n}"))
                                .unwrap_or_else(|| format!("irq {irq}")),
                            BlockReason::Softirq(v) => format!("softirq {}", softirq_name(v)),
                            _ => String::new(),
                        }
                    }))
                }
                _ => None,
            };
            w.detail.push(detail);
            // What it waited in; not said for RUNNING (it is in many).
            let inside = syscalls
                .get(next_syscall)
                .filter(|sc| sc.start <= s.start && s.state != ThreadState::Running);
            let syscall = inside.map(|sc| {
                labels.get(SyscallLabelKey::of(sc), || {
                    syscall_label(r.model, r.arch, sc)
                })
            });
            let state = ids.id(&mut history, state_name(s.state).as_bytes());
            let cpu = if s.cpu != deepspan_analysis::NO_CPU {
                s.cpu as i32
            } else {
                -1
            };
            let record = HistoryRecord {
                start: s.start as i64,
                end: s.end as i64,
                state,
                cpu,
                tid: waker.unwrap_or(-1),
                syscall: syscall.map_or(NO_STRING, |b| ids.id(&mut history, b)),
                detail: detail.map_or(NO_STRING, |b| ids.id(&mut history, b)),
            };
            w.syscall.push(syscall);
            table.end_row()?;
            if s.state == ThreadState::Running && cpu >= 0 {
                cpus.entry(cpu).or_default().push(HistoryRecord {
                    tid: th.tid,
                    ..record
                });
            }
            lane.push(record);
        }
        let comm = names.first().map(|n| n.1.to_string_lossy());
        history.lane(HistoryLane::Thread(th.tid), pid, comm, lane)?;
    }
    for (cpu, slices) in cpus {
        history.cpu_lane(cpu, slices)?;
    }
    history.finish()?;
    table.finish()
}

columns! {
    struct SyscallColumns {
        tid: Required<i32>,
        pid: Optional<i32>,
        start_ns: Required<i64>,
        end_ns: Required<i64>,
        duration_ns: Required<i64>,
        nr: Required<i32>,
        name: OptionalText,
        arg0: Required<i64>,
        arg1: Required<i64>,
        ret: Optional<i64>,
        entry_seen: Required<bool>,
        exit_seen: Required<bool>,
    }
}

/// All system calls of the model; the rows written, and a copy of the
/// `keep` columns in memory when asked for.
pub fn write_syscalls(
    path: &Path,
    r: &KernelContext,
    keep: Option<&[Column]>,
) -> Result<(u64, Option<KeptTable>), Error> {
    let mut table = ColumnarTable::<SyscallColumns>::create(path, SYSCALLS_COLUMNS)?;
    if let Some(columns) = keep {
        table.keep(columns);
    }
    let mut names = NameCache::default();
    for th in r.model.threads() {
        let pid = r.pid(th.tid);
        for s in th.syscalls() {
            let w = &mut table.columns;
            w.tid.push(th.tid);
            w.pid.push(pid);
            w.start_ns.push_u64(s.start);
            w.end_ns.push_u64(s.end);
            w.duration_ns.push_u64(s.end.saturating_sub(s.start));
            w.nr.push(s.id);
            w.name.push(names.get(r, s));
            w.arg0.push_u64(s.arg0);
            w.arg1.push_u64(s.arg1);
            w.ret.push(s.exit_seen.then_some(s.ret));
            w.entry_seen.push(s.entry_seen);
            w.exit_seen.push(s.exit_seen);
            table.end_row()?;
        }
    }
    table.finish_kept()
}

/// Syscall names as Parquet strings, made once per name: from the number
/// table (static), or as the trace named it.
#[derive(Default)]
struct NameCache {
    /// By number, for the names of the number table.
    by_id: FxHashMap<i32, Option<Bytes>>,
    /// By the model's name index, for names the trace gave.
    by_name: Vec<Option<Bytes>>,
    last_id: Option<i32>,
    last: Option<Bytes>,
}

impl NameCache {
    fn get(&mut self, r: &KernelContext, s: &SyscallInterval) -> Option<&Bytes> {
        if s.name == 0 {
            if self.last_id != Some(s.id) {
                let name = self.by_id.entry(s.id).or_insert_with(|| {
                    deepspan_analysis::syscall_name(r.arch, s.id)
                        .map(|n| Bytes::from_static(n.as_bytes()))
                });
                self.last = name.clone();
                self.last_id = Some(s.id);
            }
            return self.last.as_ref();
        }
        let i = s.name as usize;
        if self.by_name.len() <= i {
            self.by_name.resize(i + 1, None);
        }
        if self.by_name[i].is_none() {
            let name = r.model.syscall_name(s)?;
            let name = name.strip_prefix("sys_").unwrap_or(name);
            self.by_name[i] = Some(interned(name.as_bytes()));
        }
        self.by_name[i].as_ref()
    }
}

/// One row per request.
pub fn write_requests(path: &Path, r: &AnalysisResults) -> Result<u64, Error> {
    let mut w = TableWriter::create_versioned(path, REQUESTS_COLUMNS, Some(REQUESTS_VERSION))?;
    for rec in r.requests {
        let (p, summary, t) = (&rec.path, &rec.summary, &rec.totals);
        let Some(span) = r.span(p.request) else {
            continue;
        };
        w.str(&trace_hex(span.trace_id));
        w.str(&span_hex(span.span_id));
        w.opt_str(span.parent_span_id.map(span_hex).as_deref());
        w.str(&span.service);
        w.str(&span.operation);
        w.static_str(span.kind);
        w.u64(p.start);
        w.u64(p.end);
        w.u64(p.duration());
        w.static_str(p.sync.name());
        w.opt_i32(p.home.first().map(|h| h.tid));
        w.u64(t.pieces);
        w.u64(t.running_ns);
        w.u64(t.preempted_ns);
        w.u64(t.throttled_ns);
        w.u64(t.blocked_by_requests_ns);
        w.u64(t.unknown_ns);
        // Blocking requests grouped by operation: five requests of the
        // same queue are one cause.
        let top = crate::cause_groups(summary, r.spans).into_iter().next();
        w.opt_str(
            top.as_ref()
                .map(|g| crate::cause_group_label(g, r.spans))
                .as_deref(),
        );
        w.u64(top.map_or(0, |g| g.ns));
        w.u64(rec.lost_events);
        w.bool(p.truncated);
        w.opt_u64(p.arrival.map(|a| a.ts));
        w.opt_str(p.arrival.map(|a| a.by.name()));
        w.u64(p.queue_ns());
        let queue_top = rec
            .queue
            .as_ref()
            .and_then(|q| crate::cause_groups(&q.summary, r.spans).into_iter().next());
        w.opt_str(
            queue_top
                .as_ref()
                .map(|g| crate::queue_group_label(g, r.spans))
                .as_deref(),
        );
        w.opt_u64(rec.path_rows.as_ref().map(|rows| rows.start));
        w.end_row()?;
    }
    w.finish()
}

columns! {
    struct CriticalPathColumns {
        trace_id: Text,
        span_id: Text,
        seq: Required<i32>,
        start_ns: Required<i64>,
        end_ns: Required<i64>,
        duration_ns: Required<i64>,
        state: Text,
        tid: Optional<i32>,
        comm: OptionalText,
        syscall: OptionalText,
        waiting_in: OptionalText,
        detail: OptionalText,
        working_for_span_id: OptionalText,
        blocked_by_request: OptionalText,
        blocked_by_trace_id: OptionalText,
        shared: Required<i32>,
        vertical: Required<bool>,
        lost: Required<bool>,
        preempted_by_tid: Optional<i32>,
        preempted_by_comm: OptionalText,
        throttled_ns: Optional<i64>,
        contended_ns: Optional<i64>,
        wakeup_ns: Optional<i64>,
    }
}

/// What the critical-path rows need besides the path.
pub struct PathContext<'a> {
    pub model: &'a KernelModel,
    pub arch: Arch,
    /// Indexed by span index.
    pub spans: &'a [crate::SpanMeta],
}

/// Writes every piece of every request's critical path, one request at a
/// time as they are computed.
///
/// A path has many pieces that repeat a few values (threads, their names,
/// system calls, spans): each string is made once and cloned after (a
/// reference count), never formatted per row.
pub struct CriticalPathWriter {
    table: ColumnarTable<CriticalPathColumns>,
    // One cache per column: each sees runs of the same key.
    comms: StringCache<Comm>,
    holder_comms: StringCache<Comm>,
    syscalls: StringCache<SyscallLabelKey>,
    waiting_in: StringCache<SyscallLabelKey>,
    /// The previous row's qualifier: pieces of a path share them.
    last_qualifier: LastQualifier,
    /// Per span index: its span id and trace id in hex, once made.
    span_ids: Vec<Option<(Bytes, Bytes)>>,
}

impl CriticalPathWriter {
    pub fn create(path: &Path) -> Result<CriticalPathWriter, Error> {
        Ok(CriticalPathWriter {
            table: ColumnarTable::create(path, CRITICAL_PATH_COLUMNS)?,
            comms: StringCache::default(),
            holder_comms: StringCache::default(),
            syscalls: StringCache::default(),
            waiting_in: StringCache::default(),
            last_qualifier: LastQualifier::default(),
            span_ids: Vec::new(),
        })
    }

    /// Appends the rows of one request's path; their row numbers (none
    /// for a path of no known span).
    pub fn write(&mut self, ctx: &PathContext, p: &RequestPath) -> Result<Range<u64>, Error> {
        let first = self.table.rows();
        let Some((span_id, trace_id)) = span_strings(&mut self.span_ids, ctx, p.request).cloned()
        else {
            return Ok(first..first);
        };
        for (seq, piece) in p.pieces.iter().enumerate() {
            let w = &mut self.table.columns;
            w.trace_id.push(&trace_id);
            w.span_id.push(&span_id);
            w.seq.push(i32::try_from(seq).unwrap_or(i32::MAX));
            w.start_ns.push_u64(piece.start);
            w.end_ns.push_u64(piece.end);
            w.duration_ns.push_u64(piece.duration());
            w.state.push_static(path_state_name(piece.state));
            w.tid.push(piece.tid);
            w.comm
                .push(piece.comm.map(|c| comm_string(&mut self.comms, c)));
            let syscall = piece
                .syscall
                .map(|s| label_string(&mut self.syscalls, ctx, &s));
            w.syscall.push(syscall);
            let waiting = piece
                .waiting_in
                .map(|s| label_string(&mut self.waiting_in, ctx, &s));
            w.waiting_in.push(waiting);
            let qualifier = piece
                .qualifier
                .as_ref()
                .map(|q| qualifier_string(&mut self.last_qualifier, q));
            w.detail.push(qualifier);
            let working = piece
                .span
                .and_then(|s| span_strings(&mut self.span_ids, ctx, s))
                .map(|ids| &ids.0);
            w.working_for_span_id.push(working);
            let blocker = piece
                .blocked_by
                .and_then(|b| span_strings(&mut self.span_ids, ctx, b));
            w.blocked_by_request.push(blocker.map(|ids| &ids.0));
            w.blocked_by_trace_id.push(blocker.map(|ids| &ids.1));
            w.shared
                .push(i32::try_from(piece.shared).unwrap_or(i32::MAX));
            w.vertical.push(piece.vertical);
            w.lost.push(piece.lost);
            let wait = piece.cpu_wait;
            let holder = wait.and_then(|x| x.holder);
            w.preempted_by_tid.push(holder);
            let holder_comm = holder
                .and_then(|t| ctx.model.thread(t))
                .and_then(|t| t.name_at(piece.start))
                .map(|c| comm_string(&mut self.holder_comms, c));
            w.preempted_by_comm.push(holder_comm);
            w.throttled_ns.push_u64(wait.map(|x| x.throttled_ns));
            w.contended_ns.push_u64(wait.map(|x| x.contended_ns));
            w.wakeup_ns.push_u64(wait.map(|x| x.wakeup_ns));
            self.table.end_row()?;
        }
        Ok(first..self.table.rows())
    }

    /// Keeps a copy of `columns` in memory as they are written, for
    /// [`CriticalPathWriter::finish`].
    pub fn keep(&mut self, columns: &[Column]) {
        self.table.keep(columns);
    }

    /// Writes the rest and the footer; the rows written, and the copy kept
    /// if asked for.
    pub fn finish(self) -> Result<(u64, Option<KeptTable>), Error> {
        self.table.finish_kept()
    }
}

/// A system call's label as a Parquet string, made once per label key.
fn label_string<'c>(
    cache: &'c mut StringCache<SyscallLabelKey>,
    ctx: &PathContext,
    s: &SyscallInterval,
) -> &'c Bytes {
    cache.get(SyscallLabelKey::of(s), || {
        syscall_label(ctx.model, ctx.arch, s)
    })
}

/// A piece's qualifier as a Parquet string: the previous one again, or
/// looked up in the interner.
fn qualifier_string<'c>(last: &'c mut LastQualifier, q: &Arc<str>) -> &'c Bytes {
    let same = last
        .key
        .as_ref()
        .is_some_and(|k| Arc::ptr_eq(k, q) || **k == **q);
    if !same {
        last.key = Some(q.clone());
        last.value = interned(q.as_bytes());
    }
    &last.value
}

/// The previous row's qualifier: pieces of a path share them.
#[derive(Default)]
struct LastQualifier {
    key: Option<Arc<str>>,
    value: Bytes,
}

/// A span's id and trace id in hex as Parquet strings, made once per span;
/// `None` for an index that is not a span.
fn span_strings<'c>(
    cache: &'c mut Vec<Option<(Bytes, Bytes)>>,
    ctx: &PathContext,
    idx: SpanIdx,
) -> Option<&'c (Bytes, Bytes)> {
    let i = idx as usize;
    let span = ctx.spans.get(i)?;
    if cache.len() <= i {
        cache.resize(i + 1, None);
    }
    let ids = cache[i].get_or_insert_with(|| {
        (
            interned(span_hex(span.span_id).as_bytes()),
            interned(trace_hex(span.trace_id).as_bytes()),
        )
    });
    Some(ids)
}

/// Per request: time per (state, thread, blocking request), and per
/// system call.
pub fn write_request_summaries(
    summary_path: &Path,
    syscalls_path: &Path,
    r: &AnalysisResults,
) -> Result<(u64, u64), Error> {
    let mut w = TableWriter::create(summary_path, REQUEST_SUMMARY_COLUMNS)?;
    let mut ws = TableWriter::create(syscalls_path, REQUEST_SYSCALLS_COLUMNS)?;
    for rec in r.requests {
        let (p, s) = (&rec.path, &rec.summary);
        let Some(span) = r.span(p.request) else {
            continue;
        };
        let (trace_id, span_id) = (trace_hex(span.trace_id), span_hex(span.span_id));
        let total = s.total_ns.max(1) as f64;
        for row in &s.by_state {
            w.str(&trace_id);
            w.str(&span_id);
            w.static_str(path_state_name(row.state));
            w.opt_i32(row.tid);
            w.opt_str(row.comm.map(|c| c.to_string_lossy()).as_deref());
            let blocker = row
                .blocked_by
                .and_then(|b| r.span(b))
                .map(|b| span_hex(b.span_id));
            w.opt_str(blocker.as_deref());
            w.u64(row.ns);
            w.f64(row.ns as f64 / total);
            w.u64(row.throttled_ns);
            w.u64(row.contended_ns);
            w.u64(row.wakeup_ns);
            w.end_row()?;
        }
        for (label, ns) in &s.by_syscall {
            ws.str(&trace_id);
            ws.str(&span_id);
            ws.str(label);
            ws.u64(*ns);
            ws.f64(*ns as f64 / total);
            ws.end_row()?;
        }
    }
    Ok((w.finish()?, ws.finish()?))
}

/// One row per request: anomaly flag, baseline and diagnosis (cause,
/// headline; evidence and culprits as JSON text, as in `requests.json`).
pub fn write_diagnoses(path: &Path, r: &AnalysisResults) -> Result<u64, Error> {
    let mut w = TableWriter::create_versioned(path, DIAGNOSES_COLUMNS, Some(DIAGNOSES_VERSION))?;
    for rec in r.requests {
        let Some(span) = r.span(rec.path.request) else {
            continue;
        };
        w.str(&trace_hex(span.trace_id));
        w.str(&span_hex(span.span_id));
        w.bool(rec.anomalous);
        w.opt_u64(rec.baseline_ns);
        let d = rec
            .diagnosis
            .as_ref()
            .map(|d| crate::diagnosis::DiagnosisDoc::new(d, r.spans));
        w.opt_str(d.as_ref().map(|d| d.cause.name()));
        w.opt_str(d.as_ref().map(|d| d.headline.as_str()));
        w.opt_str(
            d.as_ref()
                .map(|d| json_text(&d.evidence, path))
                .transpose()?
                .as_deref(),
        );
        w.opt_str(
            d.as_ref()
                .map(|d| json_text(&d.culprits, path))
                .transpose()?
                .as_deref(),
        );
        // The root cause: the cause itself when not blocked by others
        // (`root_chain` null then).
        let root = d.as_ref().and_then(|d| d.root_cause.as_ref());
        w.opt_str(root.map(|r| r.cause.name()));
        w.opt_str(root.map(|r| r.headline.as_str()));
        w.opt_str(root.and_then(|r| r.chain.as_deref()));
        w.opt_str(
            root.map(|r| json_text(&r.evidence, path))
                .transpose()?
                .as_deref(),
        );
        w.opt_str(
            root.map(|r| json_text(&r.culprits, path))
                .transpose()?
                .as_deref(),
        );
        w.end_row()?;
    }
    w.finish()
}

/// `v` as compact JSON text, as the JSON columns hold it.
fn json_text(v: &impl serde::Serialize, path: &Path) -> Result<String, Error> {
    serde_json::to_string(v).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        at: None,
        source,
    })
}

/// Per operation (`service`, `operation`): time per (state, thread name,
/// blocked by other requests or not) over all its requests.
pub fn write_operation_summary(path: &Path, r: &AnalysisResults) -> Result<u64, Error> {
    let mut w = TableWriter::create(path, OPERATION_SUMMARY_COLUMNS)?;
    for op in r.operations {
        let total = op.total_ns.max(1) as f64;
        for row in &op.rows {
            w.str(&op.key.0);
            w.str(&op.key.1);
            w.u64(op.requests as u64);
            w.u64(op.total_ns);
            w.u64(op.total_ns / op.requests.max(1) as u64);
            w.u64(op.max_ns);
            w.static_str(path_state_name(row.state));
            w.opt_str(row.comm.map(|c| c.to_string_lossy()).as_deref());
            w.bool(row.blocked);
            w.u64(row.ns);
            w.f64(row.ns as f64 / total);
            w.u64(row.throttled_ns);
            w.u64(row.contended_ns);
            w.end_row()?;
        }
    }
    w.finish()
}

/// Thread name for display: `tid/comm`; in a run of several hosts, a
/// thread of host N > 0 is `hN:tid/comm` (its own tid on its host; the
/// hosts are listed in `hosts.json` and the analysis notes).
pub fn thread_label(tid: Option<Tid>, comm: Option<&str>) -> String {
    match (tid, comm) {
        (Some(t), Some(c)) if !c.is_empty() => format!("{}/{c}", deepspan_analysis::tid_label(t)),
        (Some(t), _) => deepspan_analysis::tid_label(t),
        (None, _) => "-".to_string(),
    }
}
