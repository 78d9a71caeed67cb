// Colours and number formats shared by every view.

/** Kernel state colours (seed 000's figures: RUNNING green, PREEMPTED orange, BLOCKED grey …). */
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

export function fmtNs(ns: number): string {
  const a = Math.abs(ns);
  if (a >= 1e9) return `${(ns / 1e9).toFixed(a >= 1e10 ? 1 : 2)} s`;
  if (a >= 1e6) return `${(ns / 1e6).toFixed(a >= 1e7 ? 1 : 2)} ms`;
  if (a >= 1e3) return `${(ns / 1e3).toFixed(a >= 1e4 ? 1 : 2)} µs`;
  return `${Math.round(ns)} ns`;
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
