// One request: diagnosis, span Gantt chart with the span-level critical
// path, kernel critical path per thread (arrows where it moves to another
// thread, pieces spent for a blocking request outlined; its queue before
// its span, hatched), summary chart, and the flame graph of its CPU
// samples when the run was recorded with --profile.

import { ApiError, CauseGroup, CauseObject, Drawn, get, RequestRow, Diagnosis } from "./api";
import { FLAME_LEGEND, FlameGraph, ProfileResponse } from "./flame";
import { BLOCKED_BY_REQUEST, containerLabel, el, esc, fmtEvidence, fmtNs, fmtShare, fmtTid, legend, stateColor, STATE_COLORS } from "./format";
import { arrivalLabel, hasQueue, queueBand, queueLabel, withQueue } from "./queue";
import { Band, Lane, Timeline } from "./timeline";

interface SummaryRow {
  state: string;
  tid: number | null;
  comm: string | null;
  blocked_by_request: string | null;
  ns: number;
  share: number;
  throttled_ns: number;
  contended_ns: number;
  wakeup_ns: number;
}

interface Blocker {
  span_id: string;
  service?: string;
  operation?: string;
}

/** How a span without deepspan fields was placed (analysis/placements.json). */
interface Placement {
  sync: string;
  pid: number;
  tid: number | null;
  confidence: number;
  evidence: string[];
}

/** The request's queue: its time at its host before its span started (`/api/requests/{id}`'s `queue`). */
interface QueueView {
  arrival_ns: number;
  arrival_by: string;
  ns: number;
  /** The span's start: the queue is `[arrival_ns, start_ns)`. */
  start_ns: number;
  /** Its largest group's label; null when nothing is known of where the time went. */
  label: string | null;
  cause_groups: CauseGroup[];
  diagnosis: Diagnosis | null;
  /** Pieces of its queue path (none in analyses made before queues). */
  pieces: number;
  /** The requests it was queued behind. */
  blockers: Blocker[];
}

/** Swatch of what is drawn hatched: the queue before the span. */
const HATCH_STYLE = "background:repeating-linear-gradient(135deg,#bbb 0 2px,#fff 2px 4px)";

interface RequestDetail {
  request: RequestRow;
  /** Null when the SDK placed the request, or nothing did. */
  placement: Placement | null;
  diagnosis: Diagnosis | null;
  summary: SummaryRow[];
  syscalls: Array<{ syscall: string; ns: number }> | null;
  pieces: number;
  threads: Array<{ tid: number; comm: string | null; ns: number; home: boolean }>;
  blockers: Blocker[];
  /** Null when its arrival is not known (or in analyses made before queues). */
  queue: QueueView | null;
}

interface GanttSpan {
  span_id: string;
  parent_span_id: string | null;
  service: string;
  operation: string;
  start_ns: number;
  end_ns: number;
  exact: boolean;
  depth: number;
  tid: number | null;
}

interface TraceView {
  trace_id: string;
  spans: GanttSpan[];
  critical_path: Array<{ span_id: string; start_ns: number; end_ns: number }>;
}

interface TimelineResponse {
  lanes: Array<{ tid: number; comm: string | null; intervals: Drawn[] }>;
  arrows: Array<{ at_ns: number; from_tid: number | null; to_tid: number | null; blocked_by_request: string | null }>;
  drawn_states: Record<string, number>;
}

/** How the request was placed on kernel threads (its `sync`), for people. */
function placementLabel(sync: string): string {
  switch (sync) {
    case "exact":
      return "the deepspan SDK (exact)";
    case "clock_mapped":
      return "its thread id, wall clock mapped (clock_mapped)";
    case "inferred":
      return "inference from the kernel trace (inferred)";
    case "process":
      return "its process as a whole: no single thread credible (process)";
    case "none":
      return "nothing: no thread known (none)";
    default:
      return sync;
  }
}

export async function requestView(app: HTMLElement, id: string): Promise<void> {
  const detail = await get<RequestDetail>(`/api/requests/${encodeURIComponent(id)}`);
  const r = detail.request;
  app.innerHTML = "";
  const queue = hasQueue(detail.queue) ? detail.queue : null;
  const blockerName = new Map(
    [...detail.blockers, ...(queue?.blockers ?? [])].map((b) => [b.span_id, b.operation ? `[${b.service}] ${b.operation}` : b.span_id]),
  );

  const head = el("section", { class: "panel", id: "request-head" });
  head.innerHTML = `<h1>[${esc(r.service)}] ${esc(r.operation)} ${r.anomalous ? '<span class="badge">anomalous</span>' : ""}</h1>
    <p class="muted">duration <b>${fmtNs(r.duration_ns)}</b>${r.baseline_ns ? ` (median of its operation ${fmtNs(r.baseline_ns)})` : ""}
    ${queue ? ` · <span class="queued">queued <b>${fmtNs(queue.ns)}</b> before it started (arrival: ${esc(arrivalLabel(queue.arrival_by))})</span>` : ""}
    · trace ${esc(r.trace_id)} · span ${esc(r.span_id)} · placed on threads by ${esc(placementLabel(r.sync))}
    ${r.lost_events ? ` · <span class="warn">${r.lost_events} kernel events lost during it</span>` : ""}
    ${r.truncated ? ' · <span class="warn">path truncated</span>' : ""}</p>`;
  if (detail.placement) head.append(placementBox(detail.placement));
  head.append(diagnosisBox(detail.diagnosis, blockerName));
  app.append(head);

  // Span Gantt.
  const spansPanel = el("section", { class: "panel" }, "<h2>Spans of the trace <small>(dark: span-level critical path)</small></h2>");
  app.append(spansPanel);
  const spans = await get<{ request_span_id: string; trace: TraceView | null }>(`/api/requests/${encodeURIComponent(id)}/spans`);
  if (spans.trace && spans.trace.spans.length) gantt(spansPanel, spans.trace, r, queue);
  else spansPanel.append(el("p", { class: "muted" }, "The run has no spans of this trace."));

  // Kernel critical path.
  const cp = el("section", { class: "panel", id: "kernel-path" });
  cp.innerHTML = `<h2>Kernel critical path <small>(${detail.pieces} pieces on ${detail.threads.length} threads${queue?.pieces ? `, ${queue.pieces} before it, queued (hatched)` : ""}; arrows: the path moves to another thread; red outline: time spent for a blocking request)</small></h2>`;
  app.append(cp);
  const extra: Array<[string, string]> = [["for a blocking request", `border:2px solid ${BLOCKED_BY_REQUEST};background:#fff`]];
  if (queue) extra.push(["queued before the span", HATCH_STYLE]);
  cp.append(legend(Object.keys(STATE_COLORS), extra));
  if (queue) cp.append(queueLine(queue, blockerName));
  const order = new Map(detail.threads.map((t, i) => [t.tid, i]));
  const bands: Band[] = [{ start: r.start_ns, end: r.end_ns, color: "rgba(31,119,180,0.05)" }];
  const band = queueBand(queue, r.start_ns);
  if (band) bands.push({ ...band, color: "rgba(0,0,0,0.03)", hatch: true, label: queueLabel(queue, fmtNs) ?? undefined });
  const tl = new Timeline(cp, {
    range: withQueue([r.start_ns, r.end_ns], queue, r.start_ns),
    origin: r.start_ns,
    bands,
    load: async (start, end, res) => {
      const d = await get<TimelineResponse>(`/api/requests/${encodeURIComponent(id)}/timeline`, {
        start_ns: start,
        end_ns: end,
        resolution_ns: res,
      });
      tl.root.dataset.states = JSON.stringify(d.drawn_states);
      const lanes: Lane[] = d.lanes
        .map((l) => ({ key: String(l.tid), label: `${l.comm ?? "?"} ${l.tid >= 0 ? fmtTid(l.tid) : ""}`, intervals: l.intervals }))
        .sort((a, b) => (order.get(+a.key) ?? 1e9) - (order.get(+b.key) ?? 1e9));
      return {
        lanes,
        arrows: d.arrows.map((a) => ({
          at_ns: a.at_ns,
          from: String(a.from_tid ?? -1),
          to: String(a.to_tid ?? -1),
          color: a.blocked_by_request ? BLOCKED_BY_REQUEST : "#333",
        })),
      };
    },
    color: (iv) => stateColor(iv.state),
    outline: (iv) => (iv.blocked_by_request ? BLOCKED_BY_REQUEST : null),
    hatch: (iv) => iv.queue === true,
    tooltip: (iv, lane) => pieceTooltip(iv, lane, r.start_ns, blockerName),
    onClick: (iv) => {
      if (typeof iv.blocked_by_request === "string") location.hash = `#/request/${iv.blocked_by_request}`;
    },
  });

  // Summary.
  const sum = el("section", { class: "panel", id: "summary" });
  sum.innerHTML = "<h2>Where the time went</h2>";
  app.append(sum);
  summaryChart(sum, detail, blockerName);

  // Flame graph: only for runs recorded with --profile (404 otherwise).
  const flame = el("section", { class: "panel", id: "flame" });
  flame.hidden = true;
  app.append(flame);
  await flameGraph(flame, id);
}

async function flameGraph(panel: HTMLElement, id: string): Promise<void> {
  let p: ProfileResponse;
  try {
    p = await get<ProfileResponse>(`/api/requests/${encodeURIComponent(id)}/profile`);
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) return;
    panel.hidden = false;
    panel.innerHTML = `<h2>Which code</h2><p class="error">${esc((e as Error).message)}</p>`;
    return;
  }
  panel.hidden = false;
  if (!p.tree.value_ns) {
    panel.innerHTML = `<h2>Which code</h2><p class="muted">This request has no kernel critical path, so no flame graph.</p>`;
    return;
  }
  const total = p.tree.value_ns;
  const pct = (ns: number) => fmtShare(ns / total);
  panel.innerHTML = `<h2>Which code: flame graph <small>(widths: wall time on the kernel critical path; on-CPU time shared among the samples taken in it)</small></h2>
    <p class="muted">on the CPU <b>${fmtNs(p.on_cpu_ns)}</b> (${pct(p.on_cpu_ns)}; ${p.samples} samples at ${p.hz} Hz${p.unsampled_ns ? `, ${fmtNs(p.unsampled_ns)} on threads no sample fell on` : ""})
    · off the CPU <b>${fmtNs(p.off_cpu_ns)}</b> (${pct(p.off_cpu_ns)})
    ${p.notes.map((n) => ` · <span class="warn">${esc(n)}</span>`).join("")}</p>`;
  panel.append(legend([], FLAME_LEGEND));
  panel.dataset.onNs = String(p.on_cpu_ns);
  panel.dataset.offNs = String(p.off_cpu_ns);
  const graph = new FlameGraph(panel, p);
  graph.root.id = "flame-graph";
  graph.root.dataset.ready = "1";
}

/**
 * The queue in one line over the kernel path: `queued 148.2 ms · queued behind 3 requests of [svc] op`, each
 * group's requests one click away (as the summary's blocking requests), then its other groups.
 */
function queueLine(q: QueueView, blockerName: Map<string, string>): HTMLElement {
  const line = el("div", { class: "queue", id: "queue" });
  line.dataset.ns = String(q.ns);
  line.dataset.pieces = String(q.pieces);
  const groups = q.cause_groups.map((g) => {
    const ids = g.blocked_by_requests ?? [];
    const label = `${esc(g.label)} <span class="muted">${fmtNs(g.ns)}</span>`;
    if (ids.length === 1) return `<a href="#/request/${esc(ids[0])}" title="${esc(blockerName.get(ids[0]) ?? ids[0])}">${esc(g.label)}</a> <span class="muted">${fmtNs(g.ns)}</span>`;
    if (!ids.length) return label;
    const list = ids.map((id) => `<a href="#/request/${esc(id)}">${esc(id)}</a>`).join("<br>");
    return `<details class="group"><summary>${label}</summary>${list}</details>`;
  });
  line.innerHTML = `<i class="sw" style="${HATCH_STYLE}"></i> queued <b>${fmtNs(q.ns)}</b> before the span
    <span class="muted">(arrival: ${esc(arrivalLabel(q.arrival_by))}${q.pieces ? "" : "; no path of it in this analysis"})</span>
    ${groups.map((g) => ` · ${g}`).join("")}`;
  return line;
}

/** Where the kernel trace put the request, how sure, and why. */
function placementBox(p: Placement): HTMLElement {
  const box = el("details", { class: "placement", id: "placement" });
  const on = p.tid !== null ? `thread ${fmtTid(p.tid)} of process ${fmtTid(p.pid)}` : `process ${fmtTid(p.pid)} as a whole`;
  box.innerHTML = `<summary>placed from the kernel trace (${esc(p.sync)}) on ${esc(on)},
    confidence <b>${p.confidence.toFixed(2)}</b></summary>
    <ul>${p.evidence.map((e) => `<li>${esc(e)}</li>`).join("")}</ul>`;
  return box;
}

function diagnosisBox(d: Diagnosis | null, blockerName: Map<string, string>): HTMLElement {
  const box = el("div", { class: "diagnosis", id: "diagnosis" });
  if (!d) {
    box.innerHTML = '<span class="muted">No diagnosis in this analysis.</span>';
    return box;
  }
  box.dataset.cause = d.cause;
  box.innerHTML = causeHtml(d, blockerName);
  const root = d.root_cause;
  if (root?.chain) {
    box.dataset.rootCause = root.cause;
    const r = el("div", { class: "root-cause", id: "root-cause" });
    r.innerHTML = `<h3>Root cause, through the requests it waited for</h3>
      <div class="chain">${esc(root.chain)}</div>${causeHtml(root, blockerName)}`;
    box.append(r);
  }
  return box;
}

/** Headline, evidence and culprits; request culprits grouped by `[service] operation`, each request one click away. */
function causeHtml(d: CauseObject, blockerName: Map<string, string>): string {
  const requestName = (c: Record<string, string | number>) =>
    blockerName.get(String(c.span_id)) ?? `[${c.service ?? "?"}] ${c.operation ?? c.span_id}`;
  const groups = new Map<string, Array<Record<string, string | number>>>();
  const items: Array<{ ns: number; html: string }> = [];
  for (const c of d.culprits ?? []) {
    if (c.kind === "request" && c.span_id) {
      const key = requestName(c);
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key)!.push(c);
      continue;
    }
    const container = containerLabel(c);
    const who = esc([c.comm ?? c.name ?? c.operation, c.pid ? `pid ${fmtTid(c.pid)}` : "", c.tid ? `tid ${fmtTid(c.tid)}` : "", container ? `in ${container}` : ""].filter(Boolean).join(" "));
    items.push({ ns: Number(c.ns ?? 0), html: `${esc(c.kind)}: ${who} — ${fmtNs(Number(c.ns ?? 0))}` });
  }
  for (const [name, cs] of groups) {
    const ns = cs.reduce((a, c) => a + Number(c.ns ?? 0), 0);
    const link = (c: Record<string, string | number>) => `<a href="#/request/${esc(c.span_id)}">${esc(c.span_id)}</a> ${fmtNs(Number(c.ns ?? 0))}`;
    items.push({
      ns,
      html:
        cs.length === 1
          ? `request: <a href="#/request/${esc(cs[0].span_id)}">${esc(name)}</a> — ${fmtNs(ns)}`
          : `<details class="group"><summary>requests: ${cs.length} requests of ${esc(name)} — ${fmtNs(ns)}</summary>${cs.map(link).join("<br>")}</details>`,
    });
  }
  items.sort((a, b) => b.ns - a.ns);
  const culprits = items.map((i) => `<li>${i.html}</li>`).join("");
  const evidence = Object.entries(d.evidence ?? {})
    .map(([k, v]) => `<code>${esc(fmtEvidence(k, v))}</code>`)
    .join(" ");
  return `<div><span class="cause">${esc(d.cause)}</span> ${esc(d.headline)}</div>
    ${evidence ? `<div class="evidence">${evidence}</div>` : ""}
    ${culprits ? `<ul class="culprits">${culprits}</ul>` : ""}`;
}

function pieceTooltip(iv: Drawn, lane: Lane, origin: number, blockers: Map<string, string>): string {
  const rows: string[] = [];
  if (iv.queue === true) rows.push("<i>queued: before the span started</i>");
  rows.push(`<b style="color:${stateColor(iv.state)}">${esc(iv.state)}</b>${iv.n > 1 ? ` <span class="muted">(dominant of ${iv.n} pieces)</span>` : ""}`);
  rows.push(`thread ${esc(lane.label)}`);
  rows.push(`${fmtNs(iv.start_ns - origin)} → ${fmtNs(iv.end_ns - origin)} (${fmtNs(iv.end_ns - iv.start_ns)})`);
  if (iv.syscall) rows.push(`system call: ${esc(iv.syscall)}`);
  if (iv.waiting_in) rows.push(`request's thread waiting in: ${esc(iv.waiting_in)}`);
  if (iv.detail) rows.push(`detail: ${esc(iv.detail)}`);
  if (iv.blocked_by_request) rows.push(`for blocking request: ${esc(blockers.get(String(iv.blocked_by_request)) ?? iv.blocked_by_request)} (click to open)`);
  if (iv.preempted_by_tid) rows.push(`CPU taken by: ${esc(iv.preempted_by_comm ?? "")} ${esc(fmtTid(iv.preempted_by_tid))}`);
  if (Number(iv.throttled_ns)) rows.push(`throttled (CPU held back): ${fmtNs(Number(iv.throttled_ns))}`);
  if (Number(iv.contended_ns)) rows.push(`contended: ${fmtNs(Number(iv.contended_ns))}`);
  if (Number(iv.shared)) rows.push(`shared with ${esc(iv.shared)} other request path(s)`);
  if (iv.lost) rows.push('<span class="warn">kernel events lost here</span>');
  return rows.join("<br>");
}

function gantt(parent: HTMLElement, trace: TraceView, r: RequestRow, queue: QueueView | null): void {
  const byId = new Map(trace.spans.map((s) => [s.span_id, s]));
  const sections = new Map<string, Array<[number, number]>>();
  for (const c of trace.critical_path) {
    if (!sections.has(c.span_id)) sections.set(c.span_id, []);
    sections.get(c.span_id)!.push([c.start_ns, c.end_ns]);
  }
  // Depth-first order, children by start, like a trace viewer.
  const children = new Map<string | null, GanttSpan[]>();
  for (const s of trace.spans) {
    const p = s.parent_span_id && byId.has(s.parent_span_id) ? s.parent_span_id : null;
    if (!children.has(p)) children.set(p, []);
    children.get(p)!.push(s);
  }
  const ordered: GanttSpan[] = [];
  const visit = (p: string | null, guard: number) => {
    if (guard > 200) return;
    for (const s of (children.get(p) ?? []).sort((a, b) => a.start_ns - b.start_ns)) {
      ordered.push(s);
      visit(s.span_id, guard + 1);
    }
  };
  visit(null, 0);
  const lanes: Lane[] = ordered.map((s) => {
    // The span cut into on-path (dark) and off-path (light) stretches.
    const on = (sections.get(s.span_id) ?? []).sort((a, b) => a[0] - b[0]);
    const ivs: Drawn[] = [];
    let t = s.start_ns;
    for (const [a, b] of on) {
      if (a > t) ivs.push({ start_ns: t, end_ns: a, n: 1, on: false, span: s });
      ivs.push({ start_ns: Math.max(a, t), end_ns: b, n: 1, on: true, span: s });
      t = Math.max(t, b);
    }
    if (t < s.end_ns) ivs.push({ start_ns: t, end_ns: s.end_ns, n: 1, on: false, span: s });
    // The request's queue, immediately before its span.
    const band = s.span_id === r.span_id ? queueBand(queue, s.start_ns) : null;
    if (band) ivs.unshift({ start_ns: band.start, end_ns: band.end, n: 1, queue: true, span: s });
    return { key: s.span_id, label: `${"  ".repeat(Math.min(s.depth, 8))}[${s.service}] ${s.operation}`, intervals: ivs };
  });
  const start = Math.min(...ordered.map((s) => s.start_ns));
  const end = Math.max(...ordered.map((s) => s.end_ns));
  const keys: Array<[string, string]> = [["on the span critical path", "background:#1f4e79"], ["off it", "background:#9ecae1"], ["this request", "background:#fdd49e"]];
  if (queue) keys.push(["queued before it", HATCH_STYLE]);
  parent.append(legend([], keys));
  const bands: Band[] = [{ start: r.start_ns, end: r.end_ns, color: "rgba(253,212,158,0.35)" }];
  const band = queueBand(queue, r.start_ns);
  if (band) bands.push({ ...band, color: "rgba(0,0,0,0.03)", hatch: true });
  new Timeline(parent, {
    range: withQueue([start, end], queue, r.start_ns),
    origin: r.start_ns,
    labelWidth: 260,
    bands,
    load: async () => ({ lanes }),
    color: (iv) => (iv.queue ? "#bbbbbb" : iv.on ? "#1f4e79" : "#9ecae1"),
    hatch: (iv) => iv.queue === true,
    tooltip: (iv) => {
      const s = iv.span as GanttSpan;
      if (iv.queue)
        return `<b>${esc(queueLabel(queue, fmtNs) ?? "queued")}</b><br>${fmtNs(iv.start_ns - r.start_ns)} → ${fmtNs(iv.end_ns - r.start_ns)} (${fmtNs(iv.end_ns - iv.start_ns)}), before [${esc(s.service)}] ${esc(s.operation)} started
          <br>arrival: ${esc(arrivalLabel(queue?.arrival_by ?? ""))}`;
      return `<b>[${esc(s.service)}] ${esc(s.operation)}</b><br>${fmtNs(s.start_ns - r.start_ns)} → ${fmtNs(s.end_ns - r.start_ns)} (${fmtNs(s.end_ns - s.start_ns)})<br>
        ${iv.on ? "on the span critical path" : "not on the span critical path"}: ${fmtNs(iv.end_ns - iv.start_ns)}<br>
        span ${esc(s.span_id)}${s.tid ? ` · thread ${esc(fmtTid(s.tid))}` : ""}${s.exact ? "" : " · times mapped from the wall clock"}`;
    },
  }).root.id = "gantt";
}

function summaryChart(parent: HTMLElement, d: RequestDetail, blockerName: Map<string, string>): void {
  // Gelle et al. 2021, Fig. 16: the request's time by state, the blocking
  // requests apart with their own parts, grouped by their [service]
  // operation ("blocked by 5 requests of [pricing] GET /price: PREEMPTED");
  // the requests of a group are listed under its row.
  const byState = new Map<string, number>();
  const byGroup = new Map<string, { parts: Map<string, number>; requests: Map<string, number> }>();
  let total = 0;
  for (const row of d.summary) {
    total += row.ns;
    if (row.blocked_by_request) {
      const name = blockerName.get(row.blocked_by_request) ?? row.blocked_by_request;
      const g = byGroup.get(name) ?? { parts: new Map<string, number>(), requests: new Map<string, number>() };
      g.parts.set(row.state, (g.parts.get(row.state) ?? 0) + row.ns);
      g.requests.set(row.blocked_by_request, (g.requests.get(row.blocked_by_request) ?? 0) + row.ns);
      byGroup.set(name, g);
    } else byState.set(row.state, (byState.get(row.state) ?? 0) + row.ns);
  }
  const slices: Array<{ label: string; ns: number; color: string; state: string; blockers?: Array<[string, number]> }> = [];
  for (const [s, ns] of [...byState].sort((a, b) => b[1] - a[1])) slices.push({ label: s, ns, color: stateColor(s), state: s });
  for (const [name, g] of byGroup) {
    const blockers = [...g.requests].sort((a, b) => b[1] - a[1]);
    const who = blockers.length === 1 ? name : `${blockers.length} requests of ${name}`;
    for (const [s, ns] of [...g.parts].sort((a, b) => b[1] - a[1]))
      slices.push({ label: `blocked by ${who}: ${s}`, ns, color: stateColor(s), state: s, blockers });
  }
  const wrap = el("div", { class: "summary" });
  const canvas = el("canvas", { width: "220", height: "220", id: "summary-pie" });
  wrap.append(canvas);
  const ctx = canvas.getContext("2d")!;
  let a = -Math.PI / 2;
  for (const s of slices) {
    const da = total ? (s.ns / total) * Math.PI * 2 : 0;
    ctx.beginPath();
    ctx.moveTo(110, 110);
    ctx.arc(110, 110, 100, a, a + da);
    ctx.closePath();
    ctx.fillStyle = s.color;
    ctx.fill();
    if (s.blockers) {
      ctx.strokeStyle = BLOCKED_BY_REQUEST;
      ctx.lineWidth = 2;
      ctx.stroke();
    }
    a += da;
  }
  const table = el("table", { class: "breakdown" });
  table.innerHTML = slices
    .map(
      (s) => `<tr data-state="${esc(s.state)}"><td><i class="sw" style="background:${s.color};${s.blockers ? `outline:2px solid ${BLOCKED_BY_REQUEST}` : ""}"></i>
        ${blockerCell(s.label, s.blockers)}</td>
        <td class="num">${fmtNs(s.ns)}</td><td class="num">${fmtShare(total ? s.ns / total : 0)}</td></tr>`,
    )
    .join("");
  wrap.append(table);
  if (d.syscalls?.length) {
    const sc = el("table", { class: "breakdown" });
    sc.innerHTML = `<tr><th>System call (request's threads)</th><th class="num">time</th></tr>` +
      d.syscalls.slice(0, 10).map((s) => `<tr><td><code>${esc(s.syscall)}</code></td><td class="num">${fmtNs(s.ns)}</td></tr>`).join("");
    wrap.append(sc);
  }
  const states: Record<string, number> = {};
  for (const s of slices) states[s.state] = (states[s.state] ?? 0) + s.ns;
  parent.dataset.states = JSON.stringify(states);
  parent.append(wrap);
}

/** A summary row's label: a link to its one blocking request, or the group with its requests one click away. */
function blockerCell(label: string, blockers: Array<[string, number]> | undefined): string {
  if (!blockers) return esc(label);
  if (blockers.length === 1) return `<a href="#/request/${esc(blockers[0][0])}">${esc(label)}</a>`;
  const list = blockers.map(([id, ns]) => `<a href="#/request/${esc(id)}">${esc(id)}</a> ${fmtNs(ns)}`).join("<br>");
  return `<details class="group"><summary>${esc(label)}</summary>${list}</details>`;
}
