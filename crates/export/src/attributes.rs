//! The attribute, event and scope names `deepspan export` writes. The list
//! and what each means is documented in `docs/otel-attributes.md`; keep the
//! two in step. OpenTelemetry's names are used where a convention exists
//! (`process.pid`); the rest is under `deepspan.*` (`thread.id` is a
//! *managed* thread id in OpenTelemetry, and there is no convention for the
//! OS thread id).

/// Instrumentation scope of the spans deepspan adds.
pub const SCOPE_NAME: &str = "deepspan.kernel";

// On a request span: the diagnosis.
pub const CAUSE: &str = "deepspan.cause";
pub const HEADLINE: &str = "deepspan.headline";
pub const SHARE: &str = "deepspan.share";
pub const CAUSE_NS: &str = "deepspan.cause_ns";
/// Prefix of one attribute per evidence number (`deepspan.evidence.futex_uaddr`).
pub const EVIDENCE_PREFIX: &str = "deepspan.evidence.";
pub const CULPRITS: &str = "deepspan.culprits";
pub const CULPRITS_JSON: &str = "deepspan.culprits_json";
/// OpenTelemetry's `container.*` and `k8s.*` resource names, of the largest
/// culprit that ran in a container.
pub const CULPRIT_CONTAINER_ID: &str = "deepspan.culprit.container.id";
pub const CULPRIT_CONTAINER_NAME: &str = "deepspan.culprit.container.name";
pub const CULPRIT_POD_UID: &str = "deepspan.culprit.k8s.pod.uid";
pub const CULPRIT_POD_NAME: &str = "deepspan.culprit.k8s.pod.name";
pub const CULPRIT_NAMESPACE_NAME: &str = "deepspan.culprit.k8s.namespace.name";
pub const ROOT_CAUSE: &str = "deepspan.root_cause";
pub const ROOT_CAUSE_JSON: &str = "deepspan.root_cause_json";
pub const ROOT_HEADLINE: &str = "deepspan.root_headline";
pub const ROOT_CHAIN: &str = "deepspan.root_chain";
pub const ANOMALOUS: &str = "deepspan.anomalous";
pub const BASELINE_NS: &str = "deepspan.baseline_ns";
pub const TOP_CAUSE: &str = "deepspan.top_cause";
pub const SYNC: &str = "deepspan.kernel.sync";
pub const LOST_EVENTS: &str = "deepspan.kernel.lost_events";
pub const TRUNCATED: &str = "deepspan.kernel.truncated";
pub const PATH_PIECES: &str = "deepspan.kernel.path_pieces";
pub const CHILD_SPANS: &str = "deepspan.kernel.child_spans";
pub const FOLD_THRESHOLD_NS: &str = "deepspan.kernel.fold_threshold_ns";
pub const EVENTS_DROPPED: &str = "deepspan.kernel.events_dropped";
/// The request's time queued at its host before its span started, what
/// says when it arrived (`client_send`, `server_receive`), and its largest
/// cause (`queued behind 3 requests of [node] GET /slow`).
pub const QUEUE_NS: &str = "deepspan.queue_ns";
pub const QUEUE_ARRIVAL_BY: &str = "deepspan.queue.arrival_by";
pub const QUEUE_CAUSE: &str = "deepspan.queue.cause";

// On a kernel child span (and partly on its events).
pub const KIND: &str = "deepspan.kernel.kind";
pub const STATE: &str = "deepspan.kernel.state";
pub const TID: &str = "deepspan.kernel.tid";
pub const COMM: &str = "deepspan.kernel.comm";
/// OpenTelemetry's process id attribute.
pub const PID: &str = "process.pid";
/// The container and pod of the piece's process, under OpenTelemetry's
/// `container.*` and `k8s.*` names.
pub const THREAD_CONTAINER_ID: &str = "deepspan.thread.container.id";
pub const THREAD_CONTAINER_NAME: &str = "deepspan.thread.container.name";
pub const THREAD_POD_UID: &str = "deepspan.thread.k8s.pod.uid";
pub const THREAD_POD_NAME: &str = "deepspan.thread.k8s.pod.name";
pub const THREAD_NAMESPACE_NAME: &str = "deepspan.thread.k8s.namespace.name";
pub const SYSCALL: &str = "deepspan.kernel.syscall";
pub const WAITING_IN: &str = "deepspan.kernel.waiting_in";
pub const DETAIL: &str = "deepspan.kernel.detail";
pub const THROTTLED_NS: &str = "deepspan.kernel.throttled_ns";
pub const CONTENDED_NS: &str = "deepspan.kernel.contended_ns";
pub const WAKEUP_NS: &str = "deepspan.kernel.wakeup_ns";
pub const PREEMPTED_BY_TID: &str = "deepspan.kernel.preempted_by_tid";
pub const PREEMPTED_BY_COMM: &str = "deepspan.kernel.preempted_by_comm";
pub const BLOCKED_BY_TRACE_ID: &str = "deepspan.kernel.blocked_by_trace_id";
pub const BLOCKED_BY_SPAN_ID: &str = "deepspan.kernel.blocked_by_span_id";
pub const BLOCKED_BY_OPERATION: &str = "deepspan.kernel.blocked_by_operation";
pub const LOST: &str = "deepspan.kernel.lost";
pub const PIECES: &str = "deepspan.kernel.pieces";
pub const FOLDED_PIECES: &str = "deepspan.kernel.folded_pieces";
pub const FOLDED_NS: &str = "deepspan.kernel.folded_ns";
/// Prefix of the per-state time of a group of short pieces (`deepspan.kernel.ns.RUNNING`).
pub const STATE_NS_PREFIX: &str = "deepspan.kernel.ns.";
pub const MONO_START_NS: &str = "deepspan.kernel.mono_start_ns";
pub const MONO_END_NS: &str = "deepspan.kernel.mono_end_ns";
pub const SYSCALL_NR: &str = "deepspan.kernel.syscall_nr";
pub const SYSCALL_RET: &str = "deepspan.kernel.syscall_ret";
/// On a link: why it was made (`blocked_by_request`).
pub const LINK_REASON: &str = "deepspan.link.reason";

/// Values of [`KIND`].
pub const KIND_PATH: &str = "path";
pub const KIND_FOLDED: &str = "folded";
pub const KIND_SYSCALL: &str = "syscall";
pub const KIND_QUEUE: &str = "queue";

// Span events on a request span.
pub const EVENT_WOKEN_BY_REQUEST: &str = "deepspan.kernel.woken_by_request";
pub const EVENT_THROTTLE_START: &str = "deepspan.kernel.throttle_start";
pub const EVENT_THROTTLE_END: &str = "deepspan.kernel.throttle_end";
pub const EVENT_LOST: &str = "deepspan.kernel.events_lost";
