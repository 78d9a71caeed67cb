// Colours and number formats shared by every view.

import type { HostInfo } from "./api";
import { fmtNs } from "./units";

/** Kernel state colours (Gelle et al. 2021's figures: RUNNING green, PREEMPTED orange, BLOCKED grey …). */
export const STATE_COLORS: Record<string, string> = {
  RUNNING: "#2ca02c",
  PREEMPTED: "#ff7f0e",
  WAIT_CPU: "#ffbb78",
  BLOCKED: "#8c8c8c",
  TIMER: "#1f77b4",
  BLOCK_DEVICE: "#9467bd",
  NETWORK: "#17becf",
  INTERRUPTED: "#e377c2",
  IPI: "#bcbd22",
  USER_INPUT: "#8c564b",
  UNKNOWN: "#e0e0e0",
  DEAD: "#444444",
};

/** Outline of critical-path pieces spent for another (blocking) request. */
export const BLOCKED_BY_REQUEST = "#d62728";

export function stateColor(state: string | undefined | null): string {
  return (state && STATE_COLORS[state]) || "#bbbbbb";
}

/** A stable colour per thread (CPU view). */
export function threadColor(tid: number): string {
  if (tid === 0) return "#f4f4f4";
  const h = (Math.imul(tid, 2654435761) >>> 0) % 360;
  return `hsl(${h} 55% 55%)`;
}

export { containerLabel, fmtEvidence, fmtNs, fmtShare } from "./units";

/**
 * Thread ids of a merged run carry their host's number above bit 22 (`host << 22 | tid`,
 * crates/analysis `HOST_TID_SHIFT`); process ids too, as a process is its first thread.
 */
export const HOST_TID_SHIFT = 22;
const LOCAL_TID_MASK = (1 << HOST_TID_SHIFT) - 1;

/**
 * A thread (or process) id as people read it: `h1:5123` for thread 5123 of host 1 of a merged run,
 * plain for host 0's and for an ordinary run's; "" for none. Text, to be escaped with `esc`.
 */
export function fmtTid(tid: unknown): string {
  if (tid === null || tid === undefined || tid === "") return "";
  const n = Number(tid);
  if (!Number.isInteger(n) || n < 1 << HOST_TID_SHIFT) return String(tid);
  return `h${Math.floor(n / (1 << HOST_TID_SHIFT))}:${n & LOCAL_TID_MASK}`;
}

/**
 * The hosts of a merged run, one line: `h0 alpha — reference clock; h1 beta — clock aligned accurate
 * (4801 messages)`, with each host's transform and run folder on hover; or what is wrong with its
 * hosts.json. Null for a run of one host.
 */
export function hostsLegend(hosts: HostInfo[] | null | undefined, error?: string | null): HTMLElement | null {
  if (error) return el("p", { class: "warn hosts", id: "hosts" }, `The hosts of this merged run cannot be shown: ${esc(error)}`);
  if (!hosts?.length) return null;
  const items = hosts.map((h) => {
    const clock = h.reference ? "reference clock" : `clock aligned ${esc(h.quality)} (${esc(h.matched)} messages)`;
    const title = `${h.run}\nclock: ${h.slope} · t ${h.offset_ns < 0 ? "−" : "+"} ${fmtNs(Math.abs(h.offset_ns))}`;
    return `<span class="host" data-host="${esc(h.index)}" title="${esc(title)}"><b>h${esc(h.index)}</b> ${esc(h.host)} — ${clock}</span>`;
  });
  return el("p", { class: "hosts muted", id: "hosts" }, `Merged run of ${hosts.length} hosts: ${items.join("; ")}`);
}

export function esc(s: unknown): string {
  return String(s ?? "").replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  html = "",
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (html) e.innerHTML = html;
  return e;
}

export function legend(states: string[], extra: Array<[string, string]> = []): HTMLElement {
  const box = el("div", { class: "legend" });
  for (const s of states) box.append(el("span", { class: "key" }, `<i style="background:${stateColor(s)}"></i>${esc(s)}`));
  for (const [label, style] of extra) box.append(el("span", { class: "key" }, `<i style="${style}"></i>${esc(label)}`));
  return box;
}
