//! deepspan's kernel analysis: from kernel events to per-thread critical
//! paths.
//!
//! - [`StateBuilder`] consumes [`deepspan_model::Event`]s in time order (one
//!   pass, memory proportional to the state intervals) and produces a
//!   [`KernelModel`]: per-thread state intervals with block reasons and
//!   system calls, thread names over time, CPU timelines, lost-event ranges,
//!   and the execution [`Graph`] (docs/analysis.md, "Kernel state model").
//! - [`critical_path`] computes a thread's critical path over a time range
//!   on that graph: the bounded algorithm of Giraldeau and Dagenais 2016,
//!   with Trace Compass' behaviour (docs/analysis.md, "Critical paths").
//! - [`merge_paths`] merges critical paths so states shared by several
//!   paths are shared nodes (Gelle et al. 2021, Alg. 2).
//! - [`analyze_requests`] gives every request (span) its kernel critical
//!   path, each piece attributed to the request or to the request it was
//!   blocked by (Gelle et al. 2021, §3.4); [`summarize`] and [`aggregate`]
//!   tell where the time went, per request and per operation (§3.5).
//! - [`arrivals`] finds when each request reached its host, so that its
//!   time queued before its server span started gets a path too.
//! - [`infer_placements`] places spans without deepspan fields on the
//!   process and thread that served them, from the kernel trace alone.
//! - [`diagnose`] names the cause of a request's waiting, with evidence and
//!   culprits (Ezzati-Jivan et al. 2021, top-down); [`baselines`] and
//!   [`is_anomalous`] flag the outliers of each operation, and
//!   [`usual_durations`] the requests held up that others waited for.

mod containers;
mod critical;
mod diagnosis;
mod distributed;
mod graph;
mod held;
mod input;
mod merge;
mod placement;
mod queue;
mod record;
mod request;
mod root_cause;
mod state;
mod summary;
mod syscalls;

pub use containers::Containers;
pub use critical::{critical_path_of, CriticalPath, Piece};
pub use diagnosis::{
    baselines, diagnose, is_anomalous, usual_durations, Cause, Culprit, CulpritKind, Diagnosis,
    DiagnosisContext, HEADLINE_MAX,
};
pub use distributed::distributed_graph;
pub use graph::{Direction, Edge, EdgeType, Graph, GraphAnomalies, VertexId, Worker};
pub use held::HeldBack;
pub use input::{build_model, Input, LostEvents};
pub use merge::{join_adjacent, merge_paths, MergedGraph, MergedNode};
pub use placement::{
    clock_offset_bound, infer_placements, OffsetBound, Placement, PlacementMethod, PlacementSpan,
    Processes, ScannedProcess,
};
pub use queue::{arrivals, Arrival, ArrivalBy};
pub use record::{QueueRecord, RequestRecord, RequestTotals};
pub use request::{
    analyze_requests, is_request, syscall_label, ActivationInput, CpuWait, HomeSegment,
    InferredPlace, RequestAnalysis, RequestPath, RequestPiece, SpanIdx, SpanInput, SyncSource,
    SyscallLabelKey, ThreadWork, WorkInterval,
};
pub use root_cause::{ChainIndex, RootCause};
pub use state::{
    host_tid, softirq_name, split_host_tid, tid_label, BlockIo, BlockPhase, BlockReason,
    CgroupMove, CpuHistory, CpuInterval, InitialStatus, Interrupt, InterruptInterval, KernelModel,
    LostRange, ModelStats, NetworkEnds, PacketDirection, ReadChars, RemoteCall, StateBuilder,
    StateInterval, SwitchOut, SyscallInterval, ThreadHistory, ThreadInfo, ThreadState,
    HOST_TID_SHIFT, MAX_CPUS, MAX_HOSTS, NO_CPU, SEGMENT_WAKE_NS,
};
pub use summary::{
    aggregate, group_causes, summarize, CauseGroup, OperationRow, OperationSummary, RequestSummary,
    SummaryRow,
};
pub use syscalls::{syscall_name, Arch};

use deepspan_model::Tid;

/// The critical path of thread `tid` over `[start, end]`: which threads, in
/// which states, the thread's progress depended on. Pieces are clipped to
/// the range and flagged when they overlap lost events; the path graph is
/// left whole (it may reach before `start` where a blocking began earlier),
/// but a blocking that began before `start` is only explained from `start`
/// on: what is clipped away is not computed.
///
/// Empty when the thread has no vertex in the execution graph (or the model
/// was built without one, [`StateBuilder::without_graph`]).
pub fn critical_path(model: &KernelModel, tid: Tid, start: u64, end: u64) -> CriticalPath {
    let g = model.graph();
    let Some(worker) = g.worker_of(tid) else {
        return CriticalPath::default();
    };
    let Some(first) = g
        .vertex_at_or_before(worker, start)
        .or_else(|| g.head(worker))
    else {
        return CriticalPath::default();
    };
    let mut path = critical::compute(g, first, critical::Stop::Covering { start, end });
    path.pieces.retain_mut(|p| {
        p.start = p.start.max(start);
        p.end = p.end.min(end);
        p.lost = model.overlaps_lost(p.start, p.end);
        p.end > p.start
    });
    path
}
