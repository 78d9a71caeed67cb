// A request's flame graph (icicle: the request on top, callees below),
// from /api/requests/{id}/profile: widths are wall time, so on-CPU code
// (warm colours) and off-CPU waits (cool colours) share one picture whose
// width is the request's duration. Click a frame to zoom into it, click
// a frame above the zoomed one (or double-click) to zoom back out.

import { esc, fmtNs, fmtShare } from "./format";

/** A node of the server's flame tree (deepspan_profile::FlameNode). */
export interface FlameNode {
  name: string;
  module: string;
  /** All of its time on the CPU. */
  on_cpu: boolean;
  value_ns: number;
  on_cpu_ns: number;
  samples: number;
  children: FlameNode[];
}

export interface ProfileResponse {
  span_id: string;
  duration_ns: number;
  hz: number;
  on_cpu_ns: number;
  off_cpu_ns: number;
  samples: number;
  unsampled_ns: number;
  notes: string[];
  tree: FlameNode;
}

type Kind = "on" | "off" | "mixed";

/** On, off, or holding both (the request and its threads). */
export function frameKind(n: FlameNode): Kind {
  if (n.value_ns > 0 && n.on_cpu_ns >= n.value_ns) return "on";
  if (n.on_cpu_ns <= 0) return "off";
  return "mixed";
}

function hash(s: string): number {
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 16777619);
  return h >>> 0;
}

/** Warm (red → yellow) on the CPU, cool (blue → violet) off it, grey for both. */
export function frameColor(n: FlameNode): string {
  const h = hash(n.name);
  switch (frameKind(n)) {
    case "on":
      if (n.samples === 0) return "hsl(38 70% 84%)"; // on the CPU, not sampled
      return `hsl(${h % 50} ${70 + (h >> 8) % 20}% ${52 + (h >> 16) % 14}%)`;
    case "off":
      return `hsl(${200 + (h % 60)} ${45 + (h >> 8) % 20}% ${58 + (h >> 16) % 14}%)`;
    default:
      return "#c9ccd1";
  }
}

export const FLAME_LEGEND: Array<[string, string]> = [
  ["on-CPU code (sampled)", "background:hsl(20 80% 58%)"],
  ["on-CPU, no sample fell in it", "background:hsl(38 70% 84%)"],
  ["off-CPU wait (state, system call)", "background:hsl(225 55% 64%)"],
  ["request / thread (both)", "background:#c9ccd1"],
];

interface Placed {
  node: FlameNode;
  parent: Placed | null;
}

interface Rect {
  x: number;
  y: number;
  w: number;
  p: Placed;
  /** Above the zoomed frame: clicking it zooms out to it. */
  ancestor: boolean;
}

const ROW = 18;
const MAX_ROWS = 80;

export class FlameGraph {
  readonly root: HTMLElement;
  private canvas: HTMLCanvasElement;
  private ctx: CanvasRenderingContext2D;
  private tip: HTMLElement;
  private width = 800;
  private focus: Placed;
  private top: Placed;
  private rects: Rect[] = [];

  constructor(parent: HTMLElement, private profile: ProfileResponse) {
    this.top = { node: profile.tree, parent: null };
    this.focus = this.top;
    this.root = document.createElement("div");
    this.root.className = "flame";
    this.root.dataset.focus = profile.tree.name;
    this.canvas = document.createElement("canvas");
    this.root.append(this.canvas);
    const hint = document.createElement("div");
    hint.className = "hint";
    hint.textContent = "click: zoom into a frame · click a frame above, or double-click: zoom out";
    this.root.append(hint);
    parent.append(this.root);
    this.ctx = this.canvas.getContext("2d")!;
    this.tip = document.getElementById("tooltip")!;
    this.bind();
    new ResizeObserver(() => this.resize()).observe(this.root);
    this.resize();
  }

  /** Zooms into the first frame named `name` (depth first), for tests and links. */
  zoomTo(name: string): boolean {
    const find = (p: Placed): Placed | null => {
      if (p.node.name === name) return p;
      for (const c of p.node.children) {
        const f = find({ node: c, parent: p });
        if (f) return f;
      }
      return null;
    };
    const f = find(this.top);
    if (f) this.setFocus(f);
    return f !== null;
  }

  private setFocus(p: Placed): void {
    this.focus = p;
    this.root.dataset.focus = p.node.name;
    this.layout();
  }

  private resize(): void {
    this.width = Math.max(300, this.root.clientWidth);
    this.layout();
  }

  private ancestors(): Placed[] {
    const list: Placed[] = [];
    for (let p: Placed | null = this.focus; p; p = p.parent) list.unshift(p);
    return list;
  }

  /** Rows of the zoomed frame's subtree that are at least half a pixel wide. */
  private depth(n: FlameNode, scale: number, d: number): number {
    if (d >= MAX_ROWS) return d;
    let max = d;
    for (const c of n.children) if (c.value_ns * scale >= 0.5) max = Math.max(max, this.depth(c, scale, d + 1));
    return max;
  }

  private layout(): void {
    const above = this.ancestors().length;
    const scale = this.width / Math.max(1, this.focus.node.value_ns);
    const rows = Math.min(MAX_ROWS, above + this.depth(this.focus.node, scale, 0));
    const h = rows * ROW + 2;
    const dpr = window.devicePixelRatio || 1;
    this.canvas.style.width = `${this.width}px`;
    this.canvas.style.height = `${h}px`;
    this.canvas.width = Math.round(this.width * dpr);
    this.canvas.height = Math.round(h * dpr);
    this.ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    this.draw();
  }

  private draw(): void {
    const ctx = this.ctx;
    ctx.clearRect(0, 0, this.width, this.canvas.height);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    this.rects = [];
    const chain = this.ancestors();
    chain.forEach((p, row) => this.frame(p, 0, row * ROW, this.width, row < chain.length - 1));
    const scale = this.width / Math.max(1, this.focus.node.value_ns);
    const walk = (p: Placed, x: number, row: number) => {
      if (row >= MAX_ROWS) return;
      let cx = x;
      for (const c of p.node.children) {
        const w = c.value_ns * scale;
        if (w >= 0.5) {
          const child = { node: c, parent: p };
          this.frame(child, cx, row * ROW, w, false);
          walk(child, cx, row + 1);
        }
        cx += w;
      }
    };
    walk(this.focus, 0, chain.length);
    this.root.dataset.frames = String(this.rects.length);
  }

  private frame(p: Placed, x: number, y: number, w: number, ancestor: boolean): void {
    const ctx = this.ctx;
    ctx.globalAlpha = ancestor ? 0.55 : 1;
    ctx.fillStyle = frameColor(p.node);
    ctx.fillRect(x, y, Math.max(w - 1, 0.5), ROW - 1);
    ctx.globalAlpha = 1;
    if (w > 30) {
      ctx.fillStyle = "#1b1b1b";
      const label = this.fit(p.node.name, w - 6);
      if (label) ctx.fillText(label, x + 3, y + ROW / 2);
    }
    this.rects.push({ x, y, w, p, ancestor });
  }

  /** `text` cut to `room` pixels with an ellipsis; empty when not even 3 characters fit. */
  private fit(text: string, room: number): string {
    if (this.ctx.measureText(text).width <= room) return text;
    const perChar = this.ctx.measureText("m").width * 0.8;
    let n = Math.floor(room / perChar);
    while (n >= 3 && this.ctx.measureText(text.slice(0, n) + "…").width > room) n--;
    return n >= 3 ? text.slice(0, n) + "…" : "";
  }

  private hit(ev: MouseEvent): Rect | null {
    const r = this.canvas.getBoundingClientRect();
    const x = ev.clientX - r.left;
    const y = ev.clientY - r.top;
    return this.rects.find((q) => y >= q.y && y < q.y + ROW && x >= q.x && x < q.x + Math.max(q.w, 1)) ?? null;
  }

  private tooltip(q: Rect): string {
    const n = q.p.node;
    const total = this.profile.tree.value_ns || 1;
    const focus = this.focus.node;
    const kind = frameKind(n);
    const rows = [`<b>${esc(n.name)}</b>`];
    if (n.module) rows.push(`<span class="muted">${esc(n.module)}</span>`);
    rows.push(`${fmtNs(n.value_ns)} · ${fmtShare(n.value_ns / total)} of the request`);
    if (focus !== this.profile.tree && !q.ancestor)
      rows.push(`${fmtShare(n.value_ns / Math.max(1, focus.value_ns))} of ${esc(focus.name)}`);
    if (kind === "on") rows.push(n.samples ? `on the CPU · ${n.samples} sample${n.samples === 1 ? "" : "s"}` : "on the CPU · no sample fell in it");
    else if (kind === "off") rows.push("off the CPU (waiting)");
    else rows.push(`on the CPU ${fmtNs(n.on_cpu_ns)} (${n.samples} samples) · off the CPU ${fmtNs(n.value_ns - n.on_cpu_ns)}`);
    rows.push(`<span class="muted">click: ${q.ancestor || q.p === this.focus ? "zoom out" : "zoom in"}</span>`);
    return rows.join("<br>");
  }

  private bind(): void {
    const c = this.canvas;
    c.addEventListener("mousemove", (ev) => {
      const q = this.hit(ev);
      if (!q) {
        this.tip.hidden = true;
        return;
      }
      this.tip.innerHTML = this.tooltip(q);
      this.tip.hidden = false;
      const tw = this.tip.offsetWidth;
      this.tip.style.left = `${Math.min(ev.clientX + 12, window.innerWidth - tw - 8)}px`;
      this.tip.style.top = `${ev.clientY + 14}px`;
    });
    c.addEventListener("mouseleave", () => (this.tip.hidden = true));
    c.addEventListener("click", (ev) => {
      const q = this.hit(ev);
      if (!q) return;
      // The zoomed frame itself zooms out one level; any other, to it.
      if (q.p === this.focus) this.setFocus(this.focus.parent ?? this.top);
      else this.setFocus(q.p);
      this.tip.hidden = true;
    });
    c.addEventListener("dblclick", () => this.setFocus(this.top));
  }
}
