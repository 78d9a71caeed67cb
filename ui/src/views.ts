// The concurrent-requests view (Gelle et al. 2021, Fig. 2) and the resources
// view (CPUs and threads over time, Figs. 13, 14, 17).

import { Drawn, get, run } from "./api";
import { BLOCKED_BY_REQUEST, el, esc, fmtNs, fmtTid, hostsLegend, legend, stateColor, STATE_COLORS, threadColor } from "./format";
import { Lane, Timeline } from "./timeline";

interface ConcurrentResponse {
  total: number;
  requests: Array<{
    span_id: string;
    service: string;
    operation: string;
    start_ns: number;
    end_ns: number;
    anomalous?: boolean;
    cause?: string;
    intervals: Drawn[];
  }>;
  arrows: Array<{ from: string; to: string; at_ns: number }>;
}

function windowFromHash(params: URLSearchParams, start: number, end: number): [number, number] {
  const a = Number(params.get("start_ns") ?? NaN);
  const b = Number(params.get("end_ns") ?? NaN);
  return Number.isFinite(a) && Number.isFinite(b) && b > a ? [a, b] : [start, end];
}

export async function concurrentView(app: HTMLElement, params: URLSearchParams): Promise<void> {
  const info = await run();
  app.innerHTML = "";
  const panel = el("section", { class: "panel", id: "concurrent" });
  panel.innerHTML = `<h1>Concurrent requests</h1>
    <p class="muted">Every request in the window with its kernel critical path; arrows point from a request to the request it was blocked by.</p>`;
  panel.append(legend(Object.keys(STATE_COLORS), [["for a blocking request", `border:2px solid ${BLOCKED_BY_REQUEST};background:#fff`]]));
  const status = el("p", { class: "muted" });
  panel.append(status);
  app.append(panel);
  const range = windowFromHash(params, info.start_ns, info.end_ns);
  const names = new Map<string, string>();
  new Timeline(panel, {
    range,
    origin: info.start_ns,
    labelWidth: 240,
    load: async (start, end, res) => {
      const d = await get<ConcurrentResponse>("/api/concurrent", { start_ns: start, end_ns: end, resolution_ns: res, limit: 300 });
      status.textContent = `${d.requests.length} of ${d.total} requests overlapping the loaded window`;
      const lanes: Lane[] = d.requests.map((r) => {
        const label = `${r.anomalous ? "⚠ " : ""}[${r.service}] ${r.operation}`;
        names.set(r.span_id, label);
        return { key: r.span_id, label, intervals: r.intervals };
      });
      return { lanes, arrows: d.arrows.map((a) => ({ at_ns: a.at_ns, from: a.from, to: a.to, color: BLOCKED_BY_REQUEST })) };
    },
    color: (iv) => stateColor(iv.state),
    outline: (iv) => (iv.blocked_by_request ? BLOCKED_BY_REQUEST : null),
    tooltip: (iv, lane) =>
      `<b>${esc(lane.label)}</b><br><b style="color:${stateColor(iv.state)}">${esc(iv.state)}</b>${iv.n > 1 ? ` (dominant of ${iv.n})` : ""}
       on ${esc(iv.comm ?? "?")} ${esc(fmtTid(iv.tid))}<br>${fmtNs(iv.start_ns - info.start_ns)} → ${fmtNs(iv.end_ns - info.start_ns)} (${fmtNs(iv.end_ns - iv.start_ns)})
       ${iv.syscall ? `<br>system call: ${esc(iv.syscall)}` : ""}
       ${iv.blocked_by_request ? `<br>blocked by ${esc(names.get(String(iv.blocked_by_request)) ?? iv.blocked_by_request)}` : ""}`,
    onClick: (_iv, lane) => (location.hash = `#/request/${lane.key}`),
  });
}

interface StatesResponse {
  total_threads: number;
  lanes: Array<{ tid: number; pid: number | null; comm: string | null; intervals: Drawn[] }>;
  drawn: number;
}

interface CpusResponse {
  cpus: Array<{ cpu: number; intervals: Drawn[] }>;
  threads: Record<string, { pid: number | null; comm: string | null }>;
}

export async function resourcesView(app: HTMLElement, params: URLSearchParams): Promise<void> {
  const info = await run();
  app.innerHTML = "";
  const range = windowFromHash(params, info.start_ns, info.end_ns);
  const cpuPanel = el("section", { class: "panel", id: "cpus" });
  cpuPanel.innerHTML = `<h1>Resources</h1><h2>CPUs <small>(colour: the thread running; merged stretches show the thread that ran longest)</small></h2>`;
  app.append(cpuPanel);
  let threadNames: CpusResponse["threads"] = {};
  new Timeline(cpuPanel, {
    range,
    origin: info.start_ns,
    load: async (start, end, res) => {
      const d = await get<CpusResponse>("/api/cpus", { start_ns: start, end_ns: end, resolution_ns: res });
      threadNames = d.threads;
      return { lanes: d.cpus.map((c) => ({ key: String(c.cpu), label: `CPU ${c.cpu}`, intervals: c.intervals })) };
    },
    color: (iv) => threadColor(Number(iv.tid)),
    tooltip: (iv, lane) => {
      const t = threadNames[String(iv.tid)];
      return `<b>${esc(lane.label)}</b>: ${esc(t?.comm ?? "?")} tid ${esc(fmtTid(iv.tid))}${t?.pid ? ` pid ${esc(fmtTid(t.pid))}` : ""}${iv.n > 1 ? ` (longest of ${iv.n})` : ""}<br>
        ${fmtNs(iv.start_ns - info.start_ns)} → ${fmtNs(iv.end_ns - info.start_ns)} (${fmtNs(iv.end_ns - iv.start_ns)})`;
    },
  });

  const thrPanel = el("section", { class: "panel", id: "threads" });
  thrPanel.innerHTML = `<h2>Threads <small>(the 60 busiest in the loaded window)</small></h2>`;
  thrPanel.append(legend(Object.keys(STATE_COLORS)));
  const hosts = hostsLegend(info.hosts, info.hosts_error);
  if (hosts) thrPanel.append(hosts);
  const status = el("p", { class: "muted" });
  thrPanel.append(status);
  app.append(thrPanel);
  const tl = new Timeline(thrPanel, {
    range,
    origin: info.start_ns,
    load: async (start, end, res) => {
      const d = await get<StatesResponse>("/api/thread_states", { start_ns: start, end_ns: end, resolution_ns: res, limit: 60 });
      status.textContent = `${d.lanes.length} of ${d.total_threads} threads that ran; ${d.drawn} intervals drawn`;
      tl.root.dataset.drawn = String(d.drawn);
      return { lanes: d.lanes.map((l) => ({ key: String(l.tid), label: `${l.comm ?? "?"} ${fmtTid(l.tid)}`, intervals: l.intervals })) };
    },
    color: (iv) => stateColor(iv.state),
    tooltip: (iv, lane) =>
      `<b style="color:${stateColor(iv.state)}">${esc(iv.state)}</b>${iv.n > 1 ? ` (dominant of ${iv.n} intervals)` : ""} · ${esc(lane.label)}<br>
       ${fmtNs(iv.start_ns - info.start_ns)} → ${fmtNs(iv.end_ns - info.start_ns)} (${fmtNs(iv.end_ns - iv.start_ns)})
       ${iv.cpu != null ? `<br>CPU ${esc(iv.cpu)}` : ""}${iv.syscall ? `<br>system call: ${esc(iv.syscall)}` : ""}
       ${iv.waker_tid ? `<br>woken by thread ${esc(fmtTid(iv.waker_tid))}` : ""}${iv.detail ? `<br>${esc(iv.detail)}` : ""}`,
  });
}
