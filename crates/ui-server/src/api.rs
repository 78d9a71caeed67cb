//! The JSON API. Every handler reads the in-memory run ([`RunData`]); no
//! handler turns a request parameter into a file path, so nothing outside
//! the run folder can be reached through it.

use deepspan_store::json::{CauseGroup, DiagnosisDoc, QueueDoc, RequestEntry};
use deepspan_store::tables::RequestSummaryRow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::data::{LaneInterval, Piece, RequestPieces, RunData, RunSpans, PIECES_KEPT};
use crate::lod::{reduce, Drawn};
use crate::profile::Profiles;
use deepspan_store::history::{Lane, LaneKey};

/// What every handler sees.
pub struct AppState {
    pub data: RunData,
    pub spans: RunSpans,
    pub profiles: Profiles,
}

pub type Shared = Arc<AppState>;

/// An error answer: a status and a message saying what was wrong.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.message }))).into_response()
    }
}

type ApiResult = Result<Json<Value>, ApiError>;

/// Query parameters, checked: every parameter must be one the endpoint
/// knows, given once.
struct Params {
    values: HashMap<String, String>,
}

/// Most intervals a lane returns; the LOD keeps real views far below it.
const LANE_LIMIT: usize = 20_000;
/// Most intervals of a lane read from the state history for one window:
/// what a zoomed-out view of a long, busy run needs beyond it is not read
/// (the answer says `truncated`).
const WINDOW_LIMIT: usize = 2_000_000;

impl Params {
    fn parse(raw: Option<String>, allowed: &[&str]) -> Result<Params, ApiError> {
        let mut values = HashMap::new();
        let raw = raw.unwrap_or_default();
        for pair in raw.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let k = decode(k)?;
            let v = decode(v)?;
            if !allowed.contains(&k.as_str()) {
                return Err(ApiError::bad(format!(
                    "unknown parameter {k:?}; this endpoint takes {}",
                    if allowed.is_empty() {
                        "none".to_string()
                    } else {
                        allowed.join(", ")
                    }
                )));
            }
            if values.insert(k.clone(), v).is_some() {
                return Err(ApiError::bad(format!(
                    "parameter {k:?} is given more than once"
                )));
            }
        }
        Ok(Params { values })
    }

    fn str(&self, name: &str) -> Option<&str> {
        self.values
            .get(name)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }

    fn int(&self, name: &str) -> Result<Option<i64>, ApiError> {
        self.str(name)
            .map(|s| {
                s.parse::<i64>().map_err(|_| {
                    ApiError::bad(format!("{name}: expected a whole number, got {s:?}"))
                })
            })
            .transpose()
    }

    fn positive(&self, name: &str) -> Result<Option<i64>, ApiError> {
        match self.int(name)? {
            Some(v) if v <= 0 => Err(ApiError::bad(format!("{name}: must be > 0, got {v}"))),
            v => Ok(v),
        }
    }

    fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        self.str(name)
            .map(|s| match s {
                "true" | "1" => Ok(true),
                "false" | "0" => Ok(false),
                _ => Err(ApiError::bad(format!(
                    "{name}: expected true or false, got {s:?}"
                ))),
            })
            .transpose()
    }

    /// `[start_ns, end_ns)` (default: the run) and ns per pixel (default:
    /// the window over 2000 pixels).
    fn window(&self, run: (i64, i64)) -> Result<(i64, i64, i64), ApiError> {
        let start = self.int("start_ns")?.unwrap_or(run.0);
        let end = self.int("end_ns")?.unwrap_or(run.1.max(run.0 + 1));
        if start < 0 {
            return Err(ApiError::bad(format!(
                "start_ns: must be >= 0, got {start}"
            )));
        }
        if end <= start {
            return Err(ApiError::bad(format!(
                "empty time range: end_ns ({end}) must be after start_ns ({start})"
            )));
        }
        let resolution = self
            .positive("resolution_ns")?
            .unwrap_or(((end - start) / 2000).max(1));
        Ok((start, end, resolution))
    }
}

fn decode(s: &str) -> Result<String, ApiError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        ApiError::bad(format!("bad percent-encoding in the query: {s:?}"))
                    })?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| ApiError::bad(format!("query is not UTF-8: {s:?}")))
}

/// `work` run on the blocking pool (file reads, symbolization), off the
/// server's async threads; its error as a 500 saying it could not read
/// `what`.
async fn blocking<T, E>(
    what: &'static str,
    work: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, ApiError>
where
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let failed = |message| ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        message,
    };
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| failed(format!("reading {what} failed: {e}")))?
        .map_err(|e| failed(format!("cannot read {what}: {e}")))
}

/// The pieces of these requests (none for an id the run does not hold):
/// the first read of a request's reads its rows of the tables.
async fn pieces_of(
    st: &Shared,
    span_ids: Vec<String>,
) -> Result<Vec<Arc<RequestPieces>>, ApiError> {
    let state = st.clone();
    blocking("the run's critical paths", move || {
        let ids: Vec<&str> = span_ids.iter().map(String::as_str).collect();
        state.data.pieces_of(&ids)
    })
    .await
}

async fn pieces(st: &Shared, span_id: &str) -> Result<Arc<RequestPieces>, ApiError> {
    Ok(pieces_of(st, vec![span_id.to_string()]).await?.remove(0))
}

/// `GET /api/run`: what the run holds.
pub async fn run(State(st): State<Shared>, RawQuery(q): RawQuery) -> ApiResult {
    Params::parse(q, &[])?;
    let d = &st.data;
    let states: BTreeSet<&str> = d.history.states().collect();
    let services: BTreeSet<&str> = d.requests().iter().map(|r| r.service.as_str()).collect();
    let causes: BTreeSet<&str> = d.requests().iter().filter_map(cause).collect();
    let root_causes: BTreeSet<&str> = d.requests().iter().filter_map(root_cause).collect();
    Ok(Json(json!({
        "run": d.dir.root().display().to_string(),
        "trace": d.requests_doc.trace,
        "notes": d.requests_doc.notes,
        "operations": d.requests_doc.operations,
        "requests": d.requests().len(),
        "threads": thread_lanes(d).count(),
        "cpus": cpu_numbers(d),
        "intervals": d.intervals,
        "start_ns": d.range.0,
        "end_ns": d.range.1,
        "thread_states": states,
        "services": services,
        "causes": causes,
        "root_causes": root_causes,
        "has_diagnosis": d.requests().iter().any(|r| r.diagnosis.is_some()),
        "span_warnings": st.spans.warnings,
        // A merged run's hosts (null for a run of one host); a broken
        // hosts.json is reported, not fatal.
        "hosts": d.hosts.as_ref().and_then(|h| h.as_ref().ok()),
        "hosts_error": d.hosts.as_ref().and_then(|h| h.as_ref().err()),
    })))
}

/// `GET /api/requests`: the requests, filtered and sorted.
pub async fn requests(State(st): State<Shared>, RawQuery(q): RawQuery) -> ApiResult {
    let p = Params::parse(
        q,
        &[
            "sort",
            "order",
            "service",
            "operation",
            "cause",
            "root_cause",
            "anomalous",
            "limit",
            "start_ns",
            "end_ns",
        ],
    )?;
    let sort = p.str("sort").unwrap_or("duration");
    if !["duration", "start"].contains(&sort) {
        return Err(ApiError::bad(format!(
            "sort: expected duration or start, got {sort:?}"
        )));
    }
    let order = p
        .str("order")
        .unwrap_or(if sort == "duration" { "desc" } else { "asc" });
    if !["asc", "desc"].contains(&order) {
        return Err(ApiError::bad(format!(
            "order: expected asc or desc, got {order:?}"
        )));
    }
    let limit = p.positive("limit")?.map_or(usize::MAX, |v| v as usize);
    let anomalous = p.bool("anomalous")?;
    let from = p.int("start_ns")?;
    let to = p.int("end_ns")?;
    if let (Some(a), Some(b)) = (from, to) {
        if b <= a {
            return Err(ApiError::bad(format!(
                "empty time range: end_ns ({b}) must be after start_ns ({a})"
            )));
        }
    }
    let by_duration = sort == "duration";
    let mut list: Vec<&RequestEntry> = st
        .data
        .requests()
        .iter()
        .filter(|r| p.str("service").is_none_or(|v| r.service == v))
        .filter(|r| p.str("operation").is_none_or(|v| r.operation == v))
        .filter(|r| p.str("cause").is_none_or(|v| cause(r) == Some(v)))
        .filter(|r| p.str("root_cause").is_none_or(|v| root_cause(r) == Some(v)))
        .filter(|r| anomalous.is_none_or(|a| r.anomalous == a))
        .filter(|r| from.is_none_or(|f| r.end_ns as i64 > f))
        .filter(|r| to.is_none_or(|t| (r.start_ns as i64) < t))
        .collect();
    list.sort_by_key(|r| {
        if by_duration {
            r.duration_ns
        } else {
            r.start_ns
        }
    });
    if order == "desc" {
        list.reverse();
    }
    let total = list.len();
    list.truncate(limit);
    Ok(Json(json!({ "total": total, "requests": list })))
}

/// A request's diagnosed cause.
fn cause(r: &RequestEntry) -> Option<&'static str> {
    Some(r.diagnosis.as_ref()?.cause.name())
}

/// A request's root cause, through the chains of requests it waited for
/// (none in analyses made before root causes).
fn root_cause(r: &RequestEntry) -> Option<&'static str> {
    Some(r.diagnosis.as_ref()?.root_cause.as_ref()?.cause.name())
}

fn find_request<'a>(st: &'a AppState, id: &str) -> Result<(&'a RequestEntry, String), ApiError> {
    if id.is_empty() || id.len() > 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::bad(format!(
            "{id:?} is not a request id (a span id: 16 hex digits; or a trace id: 32)"
        )));
    }
    let id = id.to_ascii_lowercase();
    if let Some(r) = st.data.request(&id) {
        return Ok((r, id));
    }
    // A trace id: its root request, else its longest.
    let mut in_trace: Vec<&RequestEntry> = st
        .data
        .requests()
        .iter()
        .filter(|r| r.trace_id == id)
        .collect();
    in_trace.sort_by_key(|r| (r.parent_span_id.is_some(), std::cmp::Reverse(r.duration_ns)));
    let r = in_trace
        .first()
        .ok_or_else(|| ApiError::not_found(format!("no request with span id or trace id {id}")))?;
    Ok((r, r.span_id.clone()))
}

/// A request another one waited for, named for a link to its page; only
/// `span_id` when the run does not hold it.
#[derive(Debug, serde::Serialize)]
pub struct BlockerView<'a> {
    pub span_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_ns: Option<u64>,
}

fn blocker_view<'a>(d: &'a RunData, span_id: &'a str) -> BlockerView<'a> {
    let x = d.request(span_id);
    BlockerView {
        span_id,
        trace_id: x.map(|x| x.trace_id.as_str()),
        service: x.map(|x| x.service.as_str()),
        operation: x.map(|x| x.operation.as_str()),
        start_ns: x.map(|x| x.start_ns),
        end_ns: x.map(|x| x.end_ns),
    }
}

/// A request's queue (its time at its host before its span started) as
/// the request page shows it: `requests.json`'s `queue`, with its path's
/// pieces counted and the requests it was queued behind named.
#[derive(Debug, serde::Serialize)]
pub struct QueueView<'a> {
    /// When the request reached the host (CLOCK_MONOTONIC ns).
    pub arrival_ns: u64,
    /// `client_send` or `server_receive`.
    pub arrival_by: &'a str,
    /// `start_ns - arrival_ns`.
    pub ns: u64,
    /// The span's start: the queue covers `[arrival_ns, start_ns)`.
    pub start_ns: u64,
    /// The largest group's label (`queued behind 3 requests of [svc] op`);
    /// null when nothing is known of where the time went.
    pub label: Option<&'a str>,
    /// Where the time went, largest first.
    pub cause_groups: &'a [CauseGroup],
    pub diagnosis: Option<&'a DiagnosisDoc>,
    /// Pieces of its queue path (none in analyses made before queues).
    pub pieces: usize,
    /// The requests it was queued behind (of its groups, then of its
    /// path's pieces), each once.
    pub blockers: Vec<BlockerView<'a>>,
}

impl<'a> QueueView<'a> {
    fn new(
        d: &'a RunData,
        r: &'a RequestEntry,
        q: &'a QueueDoc,
        pieces: &'a RequestPieces,
    ) -> Self {
        let mut seen: HashSet<&str> = HashSet::new();
        let ids = q
            .cause_groups
            .iter()
            .flat_map(|g| g.blocked_by_requests.iter().map(String::as_str))
            .chain(
                pieces
                    .queue
                    .iter()
                    .filter_map(|p| pieces.name(p.blocked_by_request)),
            );
        let blockers = ids
            .filter(|id| seen.insert(id))
            .map(|id| blocker_view(d, id))
            .collect();
        QueueView {
            arrival_ns: q.arrival_ns,
            arrival_by: &q.arrival_by,
            ns: q.ns,
            start_ns: r.start_ns,
            label: q.cause_groups.first().map(|g| g.label.as_str()),
            cause_groups: &q.cause_groups,
            diagnosis: q.diagnosis.as_ref(),
            pieces: pieces.queue.len(),
            blockers,
        }
    }
}

/// `GET /api/requests/{id}`: one request, its summary, system calls and
/// diagnosis, the threads and blocking requests on its path, and its queue.
pub async fn request(
    State(st): State<Shared>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult {
    Params::parse(q, &[])?;
    let (r, span) = find_request(&st, &id)?;
    let d = &st.data;
    let all = pieces(&st, &span).await?;
    let pieces = &all.path;
    let mut threads: BTreeMap<i32, (Option<&str>, i64)> = BTreeMap::new();
    let mut blockers: BTreeSet<&str> = BTreeSet::new();
    for p in pieces {
        if let Some(tid) = p.tid {
            let e = threads.entry(tid).or_insert((all.name(p.comm), 0));
            e.1 += p.end - p.start;
        }
        if let Some(b) = all.name(p.blocked_by_request) {
            blockers.insert(b);
        }
    }
    let home = r.tid.map(i64::from);
    let mut thread_list: Vec<Value> = threads
        .iter()
        .map(|(tid, (comm, ns))| json!({"tid": tid, "comm": comm, "ns": ns, "home": Some(*tid as i64) == home}))
        .collect();
    // The request's own thread first, then by time on the path.
    thread_list.sort_by_key(|t| {
        (
            !t["home"].as_bool().unwrap_or(false),
            std::cmp::Reverse(t["ns"].as_i64()),
        )
    });
    let blockers: Vec<BlockerView> = blockers.iter().map(|b| blocker_view(d, b)).collect();
    let queue = r.queue.as_ref().map(|q| QueueView::new(d, r, q, &all));
    let mut summary: Vec<&RequestSummaryRow> =
        d.summaries.get(&span).into_iter().flatten().collect();
    summary.sort_by_key(|r| std::cmp::Reverse(r.ns));
    let summary: Vec<Value> = summary
        .into_iter()
        .map(|r| {
            json!({"state": r.state, "tid": r.tid, "comm": r.comm,
                   "blocked_by_request": r.blocked_by_request, "ns": r.ns, "share": r.share,
                   "throttled_ns": r.throttled_ns, "contended_ns": r.contended_ns,
                   "wakeup_ns": r.wakeup_ns})
        })
        .collect();
    Ok(Json(json!({
        "request": r,
        // How a span without deepspan fields was placed, and why (null when
        // the SDK placed it, or nothing did).
        "placement": d.placements.get(&span),
        "diagnosis": r.diagnosis,
        "summary": summary,
        "syscalls": d.syscalls.get(&span).map(|v| v.iter().map(|(s, ns)| json!({"syscall": s, "ns": ns})).collect::<Vec<_>>()),
        "pieces": pieces.len(),
        "threads": thread_list,
        "blockers": blockers,
        "lost_pieces": pieces.iter().filter(|p| p.lost).count(),
        // Its time queued before its span started (null when its arrival
        // is not known).
        "queue": queue,
    })))
}

/// `GET /api/requests/{id}/spans`: the spans of its trace for the Gantt
/// chart, with the span-level critical path.
pub async fn request_spans(
    State(st): State<Shared>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult {
    Params::parse(q, &[])?;
    let (r, span) = find_request(&st, &id)?;
    let view = st.spans.trace(&r.trace_id);
    Ok(Json(json!({
        "request_span_id": span,
        "trace": view,
    })))
}

/// `GET /api/requests/{id}/profile`: the request's flame graph (on-CPU
/// samples and off-CPU pieces of its critical path, `deepspan_profile`),
/// 404 when the run was recorded without `--profile`.
pub async fn request_profile(
    State(st): State<Shared>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult {
    Params::parse(q, &[])?;
    let (r, span) = find_request(&st, &id)?;
    if !st.profiles.recorded() {
        return Err(ApiError::not_found(
            "this run has no CPU samples: record it with `deepspan record --profile`",
        ));
    }
    let request = r.clone();
    let state = st.clone();
    // Reading the samples (first time) and symbolizing block.
    let profile = blocking("the run's CPU samples", move || {
        state.profiles.request(&state.data, &span, &request)
    })
    .await?;
    let t = profile.totals;
    Ok(Json(json!({
        "span_id": r.span_id,
        "duration_ns": r.duration_ns,
        "hz": profile.hz,
        "on_cpu_ns": t.on_cpu_ns,
        "off_cpu_ns": t.off_cpu_ns,
        "samples": t.samples,
        "unsampled_ns": t.unsampled_ns,
        "notes": profile.notes,
        "tree": profile.tree,
    })))
}

fn piece_json(names: &RequestPieces, p: &Piece, drawn: &Drawn) -> Value {
    let s = |i| names.name(i);
    let mut v = json!({
        "start_ns": drawn.start,
        "end_ns": drawn.end,
        "state": s(drawn.category),
        "n": drawn.merged,
        "coverage": drawn.coverage,
        "tid": p.tid,
        "comm": s(p.comm),
        "blocked_by_request": s(p.blocked_by_request),
    });
    if drawn.merged == 1 {
        let o = v.as_object_mut().expect("object");
        o.insert("syscall".into(), json!(s(p.syscall)));
        o.insert("waiting_in".into(), json!(s(p.waiting_in)));
        o.insert("detail".into(), json!(s(p.detail)));
        o.insert("shared".into(), json!(p.shared));
        o.insert("lost".into(), json!(p.lost));
        o.insert("preempted_by_tid".into(), json!(p.preempted_by_tid));
        o.insert("preempted_by_comm".into(), json!(s(p.preempted_by_comm)));
        o.insert("throttled_ns".into(), json!(p.throttled_ns));
        o.insert("contended_ns".into(), json!(p.contended_ns));
        o.insert("wakeup_ns".into(), json!(p.wakeup_ns));
    }
    v
}

/// `GET /api/requests/{id}/timeline?start_ns&end_ns&resolution_ns`: the
/// request's kernel critical path per thread, reduced for drawing, and the
/// hand-overs between threads (the arrows). The pieces of its queue path
/// (before its span started) are in the same lanes, marked `"queue": true`;
/// the default window starts at its arrival.
pub async fn request_timeline(
    State(st): State<Shared>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult {
    let p = Params::parse(q, &["start_ns", "end_ns", "resolution_ns"])?;
    let (r, span) = find_request(&st, &id)?;
    let arrival = r.queue.as_ref().map_or(r.start_ns, |q| q.arrival_ns);
    let req_range = (arrival.min(r.start_ns) as i64, r.end_ns as i64);
    let (from, to, res) = p.window(req_range)?;
    let all = pieces(&st, &span).await?;
    let (pieces, queue_pieces) = (all.path.as_slice(), all.queue.as_slice());
    // One lane per thread; the LOD runs per lane on that thread's pieces,
    // its queue's apart from its path's so that none is merged into the
    // other (the queue's all come first: they end at the span's start).
    let mut by_tid: BTreeMap<i32, [Vec<&Piece>; 2]> = BTreeMap::new();
    for (i, list) in [queue_pieces, pieces].into_iter().enumerate() {
        for piece in list {
            by_tid.entry(piece.tid.unwrap_or(-1)).or_default()[i].push(piece);
        }
    }
    let mut lanes = Vec::new();
    let mut truncated = false;
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for (tid, parts) in &by_tid {
        let mut intervals = Vec::new();
        for (i, lane) in parts.iter().enumerate() {
            let queue = i == 0;
            let (drawn, cut) = reduce(lane, from, to, res, LANE_LIMIT);
            truncated |= cut;
            for dr in &drawn {
                *counts
                    .entry(all.name(dr.category).unwrap_or("?"))
                    .or_default() += 1;
                let mut v = piece_json(&all, lane[dr.index], dr);
                if queue {
                    v["queue"] = json!(true);
                }
                intervals.push(v);
            }
        }
        let comm = parts.iter().flatten().next().and_then(|p| all.name(p.comm));
        lanes.push(json!({
            "tid": tid,
            "comm": comm,
            "intervals": intervals,
        }));
    }
    // Hand-overs: where the path (its queue's, then its own) moves from one
    // thread to another. At a coarse resolution only the first per pixel
    // is kept.
    let path: Vec<&Piece> = queue_pieces.iter().chain(pieces).collect();
    let mut arrows = Vec::new();
    let mut last_at: Option<i64> = None;
    for w in path.windows(2) {
        let at = w[1].start;
        if at < from || at >= to || w[0].tid == w[1].tid {
            continue;
        }
        if last_at.is_some_and(|last| at - last < res) {
            continue;
        }
        last_at = Some(at);
        arrows.push(json!({
            "at_ns": at,
            "from_tid": w[0].tid,
            "to_tid": w[1].tid,
            "blocked_by_request": all.name(w[1].blocked_by_request),
        }));
        if arrows.len() >= LANE_LIMIT {
            truncated = true;
            break;
        }
    }
    Ok(Json(json!({
        "start_ns": from,
        "end_ns": to,
        "resolution_ns": res,
        "lanes": lanes,
        "arrows": arrows,
        "truncated": truncated,
        "drawn_states": counts,
    })))
}

/// `GET /api/concurrent?start_ns&end_ns&resolution_ns&limit`: the requests
/// overlapping a window, each with its critical path, and the arrows from
/// a request to the requests it was blocked by.
pub async fn concurrent(State(st): State<Shared>, RawQuery(q): RawQuery) -> ApiResult {
    let p = Params::parse(q, &["start_ns", "end_ns", "resolution_ns", "limit"])?;
    let d = &st.data;
    let (from, to, res) = p.window(d.range)?;
    let limit = p.positive("limit")?.map_or(200, |v| v as usize);
    let mut reqs: Vec<&RequestEntry> = d
        .requests()
        .iter()
        .filter(|r| r.end_ns as i64 > from && (r.start_ns as i64) < to)
        .collect();
    reqs.sort_by_key(|r| r.start_ns);
    let total = reqs.len();
    reqs.truncate(limit);
    let shown: HashSet<&str> = reqs.iter().map(|r| r.span_id.as_str()).collect();
    let mut out = Vec::new();
    let mut arrows = Vec::new();
    // Read a batch of about `PIECES_KEPT` pieces at a time, each batch
    // dropped once drawn: a window over many long requests holds one
    // batch's paths, not all of them.
    for batch in batches_of_pieces(&reqs) {
        let read = pieces_of(&st, batch.iter().map(|r| r.span_id.clone()).collect()).await?;
        for (r, all) in batch.iter().zip(&read) {
            let span = r.span_id.as_str();
            let pieces = all.path.as_slice();
            let (drawn, _) = reduce(pieces, from, to, res, LANE_LIMIT);
            let mut last_blocker: Option<(&str, i64)> = None;
            for piece in pieces {
                if piece.end <= from || piece.start >= to {
                    continue;
                }
                if let Some(b) = all.name(piece.blocked_by_request) {
                    // One arrow per blocking stretch, not per piece.
                    if last_blocker.is_some_and(|(lb, end)| lb == b && end == piece.start) {
                        last_blocker = Some((b, piece.end));
                        continue;
                    }
                    last_blocker = Some((b, piece.end));
                    if shown.contains(b) && arrows.len() < LANE_LIMIT {
                        arrows.push(json!({"from": span, "to": b, "at_ns": piece.start.max(from), "state": all.name(piece.state)}));
                    }
                }
            }
            out.push(json!({
            "span_id": span,
            "trace_id": r.trace_id,
            "service": r.service,
            "operation": r.operation,
            "start_ns": r.start_ns,
            "end_ns": r.end_ns,
            "duration_ns": r.duration_ns,
            "anomalous": r.anomalous,
            "cause": cause(r),
            "intervals": drawn.iter().map(|dr| piece_json(all, &pieces[dr.index], dr)).collect::<Vec<_>>(),
        }));
        }
    }
    Ok(Json(json!({
        "start_ns": from,
        "end_ns": to,
        "resolution_ns": res,
        "total": total,
        "requests": out,
        "arrows": arrows,
    })))
}

/// `requests` in consecutive batches of at most [`PIECES_KEPT`] pieces of
/// path by `requests.json`'s row counts (one request more than that is a
/// batch alone; analyses without counts make one batch).
fn batches_of_pieces<'a>(requests: &'a [&'a RequestEntry]) -> Vec<&'a [&'a RequestEntry]> {
    let mut batches = Vec::new();
    let (mut first, mut pieces) = (0, 0u64);
    for (i, r) in requests.iter().enumerate() {
        let n = r.critical_path_rows.map_or(0, |rows| rows.count);
        if i > first && pieces + n > PIECES_KEPT as u64 {
            batches.push(&requests[first..i]);
            (first, pieces) = (i, 0);
        }
        pieces += n;
    }
    batches.push(&requests[first..]);
    batches
}

/// The thread lanes of the history, by tid.
fn thread_lanes(d: &RunData) -> impl Iterator<Item = (i32, &Lane)> {
    d.history.lanes().iter().filter_map(|l| match l.key {
        LaneKey::Thread(tid) => Some((tid, l)),
        LaneKey::Cpu(_) => None,
    })
}

fn cpu_numbers(d: &RunData) -> Vec<i32> {
    d.history
        .lanes()
        .iter()
        .filter_map(|l| match l.key {
            LaneKey::Cpu(cpu) => Some(cpu),
            LaneKey::Thread(_) => None,
        })
        .collect()
}

/// A failed read of the state history (the file changed or was damaged
/// under the server).
fn history_err(e: deepspan_store::Error) -> ApiError {
    ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        message: format!("cannot read the run's state history: {e}"),
    }
}

/// The history's string `id` (state, system call, detail).
fn hs(d: &RunData, id: u32) -> Option<&str> {
    d.history.string(id)
}

/// `GET /api/threads`: every thread with its time on CPU.
pub async fn threads(State(st): State<Shared>, RawQuery(q): RawQuery) -> ApiResult {
    Params::parse(q, &[])?;
    let list: Vec<Value> = thread_lanes(&st.data)
        .map(|(tid, t)| json!({"tid": tid, "pid": t.pid, "comm": t.comm, "intervals": t.records, "running_ns": t.running_ns}))
        .collect();
    Ok(Json(json!({ "threads": list })))
}

fn parse_tids(p: &Params) -> Result<Option<Vec<i32>>, ApiError> {
    p.str("tids")
        .map(|s| {
            s.split(',')
                .map(|t| {
                    t.trim().parse::<i32>().map_err(|_| {
                        ApiError::bad(format!(
                            "tids: expected thread ids separated by commas, got {t:?}"
                        ))
                    })
                })
                .collect()
        })
        .transpose()
}

/// `GET /api/thread_states?start_ns&end_ns&resolution_ns&tids&limit`:
/// thread states over a window, reduced for drawing. Without `tids`, the
/// threads that ran the most in the window come first (`limit`, default 50).
pub async fn thread_states(State(st): State<Shared>, RawQuery(q): RawQuery) -> ApiResult {
    let p = Params::parse(q, &["start_ns", "end_ns", "resolution_ns", "tids", "limit"])?;
    let d = &st.data;
    let (from, to, res) = p.window(d.range)?;
    let limit = p.positive("limit")?.map_or(50, |v| v as usize);
    let tids: Vec<i32> = match parse_tids(&p)? {
        Some(t) => {
            if let Some(missing) = t
                .iter()
                .find(|&&t| d.history.lane(LaneKey::Thread(t)).is_none())
            {
                return Err(ApiError::not_found(format!(
                    "no thread {missing} in this run"
                )));
            }
            t
        }
        None if d
            .history
            .range()
            .is_none_or(|(start, end)| from <= start && to >= end) =>
        {
            // The whole run: the lanes know their time RUNNING, and no
            // interval need be read.
            let mut ranked: Vec<(i64, i32)> = thread_lanes(d)
                .filter(|(_, lane)| lane.running_ns > 0)
                .map(|(tid, lane)| (lane.running_ns, tid))
                .collect();
            ranked.sort_by_key(|(busy, tid)| (std::cmp::Reverse(*busy), *tid));
            ranked.into_iter().map(|(_, tid)| tid).collect()
        }
        None => {
            // Busiest in the window first: their time on the CPUs' lanes.
            let mut busy: HashMap<i32, i64> = HashMap::new();
            for cpu in cpu_numbers(d) {
                d.history
                    .visit(LaneKey::Cpu(cpu), from, to, |r| {
                        *busy.entry(r.tid).or_default() += r.end.min(to) - r.start.max(from);
                    })
                    .map_err(history_err)?;
            }
            let mut ranked: Vec<(i64, i32)> = busy
                .into_iter()
                .filter(|&(tid, ns)| ns > 0 && d.history.lane(LaneKey::Thread(tid)).is_some())
                .map(|(tid, ns)| (ns, tid))
                .collect();
            ranked.sort_by_key(|(busy, tid)| (std::cmp::Reverse(*busy), *tid));
            ranked.into_iter().map(|(_, tid)| tid).collect()
        }
    };
    let total = tids.len();
    let mut lanes = Vec::new();
    let mut truncated = false;
    let mut drawn_total = 0;
    for tid in tids.into_iter().take(limit) {
        let key = LaneKey::Thread(tid);
        let t = d.history.lane(key).expect("a thread found above");
        let (window, more) = d
            .history
            .coarse_window(key, from, to, res, WINDOW_LIMIT)
            .map_err(history_err)?;
        let window: Vec<LaneInterval> = window.into_iter().map(|c| LaneInterval(key, c)).collect();
        let (drawn, cut) = reduce(&window, from, to, res, LANE_LIMIT);
        truncated |= cut || more;
        drawn_total += drawn.len();
        let intervals: Vec<Value> = drawn
            .iter()
            .map(|dr| {
                let iv = &window[dr.index].1.record;
                if dr.merged == 1 {
                    json!({"start_ns": dr.start, "end_ns": dr.end, "state": hs(d, dr.category), "n": 1,
                           "cpu": (iv.cpu >= 0).then_some(iv.cpu), "waker_tid": (iv.tid >= 0).then_some(iv.tid),
                           "syscall": hs(d, iv.syscall), "detail": hs(d, iv.detail)})
                } else {
                    json!({"start_ns": dr.start, "end_ns": dr.end, "state": hs(d, dr.category), "n": dr.merged, "coverage": dr.coverage})
                }
            })
            .collect();
        lanes.push(json!({"tid": tid, "pid": t.pid, "comm": t.comm, "intervals": intervals}));
    }
    Ok(Json(json!({
        "start_ns": from, "end_ns": to, "resolution_ns": res,
        "total_threads": total, "lanes": lanes, "drawn": drawn_total, "truncated": truncated,
    })))
}

/// `GET /api/cpus?start_ns&end_ns&resolution_ns`: which thread ran on each
/// CPU over a window, reduced for drawing (a merged stretch shows the
/// thread that ran longest in it).
pub async fn cpus(State(st): State<Shared>, RawQuery(q): RawQuery) -> ApiResult {
    let p = Params::parse(q, &["start_ns", "end_ns", "resolution_ns"])?;
    let d = &st.data;
    let (from, to, res) = p.window(d.range)?;
    let mut seen: BTreeSet<i32> = BTreeSet::new();
    let mut out = Vec::new();
    for cpu in cpu_numbers(d) {
        let key = LaneKey::Cpu(cpu);
        let (window, _) = d
            .history
            .coarse_window(key, from, to, res, WINDOW_LIMIT)
            .map_err(history_err)?;
        let slices: Vec<LaneInterval> = window.into_iter().map(|c| LaneInterval(key, c)).collect();
        let (drawn, _) = reduce(&slices, from, to, res, LANE_LIMIT);
        let intervals: Vec<Value> = drawn
            .iter()
            .map(|dr| {
                let tid = dr.category as i32;
                seen.insert(tid);
                json!({"start_ns": dr.start, "end_ns": dr.end, "tid": tid, "n": dr.merged, "coverage": dr.coverage})
            })
            .collect();
        out.push(json!({"cpu": cpu, "intervals": intervals}));
    }
    let threads: serde_json::Map<String, Value> = seen
        .iter()
        .filter_map(|&tid| Some((tid, d.history.lane(LaneKey::Thread(tid))?)))
        .map(|(tid, t)| (tid.to_string(), json!({"pid": t.pid, "comm": t.comm})))
        .collect();
    Ok(Json(
        json!({"start_ns": from, "end_ns": to, "resolution_ns": res, "cpus": out, "threads": threads}),
    ))
}

/// Any other `/api/…` path.
pub async fn unknown_api(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("no API endpoint {}", uri.path()))
}
