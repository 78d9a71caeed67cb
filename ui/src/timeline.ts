// A canvas timeline: lanes of intervals over time, zoom (wheel), pan (drag),
// tooltips and arrows between lanes. While the view moves, what is already
// loaded is redrawn at once (every frame); the server is asked for the new
// window, at the new resolution, once the view rests for a moment. Loaded
// data covers a margin around the view, so panning shows no holes.

import { Drawn } from "./api";
import { fmtNs } from "./format";

export interface Lane {
  key: string;
  label: string;
  intervals: Drawn[];
}

export interface Arrow {
  at_ns: number;
  from: string; // lane key
  to: string; // lane key
  color?: string;
}

export interface Loaded {
  lanes: Lane[];
  arrows?: Arrow[];
}

export interface TimelineOptions {
  range: [number, number];
  /** Times on the axis are shown relative to this instant. */
  origin: number;
  load: (start: number, end: number, resolution: number) => Promise<Loaded>;
  color: (iv: Drawn, lane: Lane) => string;
  /** Outline colour, if any (e.g. pieces spent for a blocking request). */
  outline?: (iv: Drawn, lane: Lane) => string | null;
  /** Intervals drawn muted and hatched (e.g. a request's queue, before its span). */
  hatch?: (iv: Drawn, lane: Lane) => boolean;
  tooltip: (iv: Drawn, lane: Lane) => string;
  onClick?: (iv: Drawn, lane: Lane) => void;
  onLoaded?: (data: Loaded) => void;
  laneHeight?: number;
  labelWidth?: number;
  /** Extra time bands drawn behind the lanes (e.g. the request's span), hatched or not, labelled in the axis row or not. */
  bands?: Band[];
}

export interface Band {
  start: number;
  end: number;
  color: string;
  hatch?: boolean;
  label?: string;
}

const AXIS = 22;

declare global {
  interface Window {
    /** Every timeline's draw times (ms), for bench/ui_bench. */
    __timelineFrames?: number[];
  }
}

export class Timeline {
  readonly root: HTMLElement;
  private canvas: HTMLCanvasElement;
  private ctx: CanvasRenderingContext2D;
  private view: [number, number];
  private data: Loaded = { lanes: [] };
  private loadedWindow: [number, number, number] = [0, 0, 0];
  private pending = 0;
  private timer = 0;
  private frame = 0;
  private width = 800;
  private drag: { x: number; view: [number, number] } | null = null;
  private laneH: number;
  private labelW: number;
  private tip: HTMLElement;
  private hatches = new Map<string, CanvasPattern | null>();
  /** Frame times (ms) of the last draws, read by the benchmark. */
  readonly frameTimes: number[] = [];

  constructor(parent: HTMLElement, private opts: TimelineOptions) {
    this.view = [...opts.range];
    this.laneH = opts.laneHeight ?? 18;
    this.labelW = opts.labelWidth ?? 170;
    this.root = document.createElement("div");
    this.root.className = "timeline";
    this.canvas = document.createElement("canvas");
    this.root.append(this.canvas);
    const hint = document.createElement("div");
    hint.className = "hint";
    hint.textContent = "wheel: zoom · drag: pan · double-click: reset";
    this.root.append(hint);
    parent.append(this.root);
    this.ctx = this.canvas.getContext("2d")!;
    this.tip = document.getElementById("tooltip")!;
    this.bind();
    new ResizeObserver(() => this.resize()).observe(this.root);
    this.resize();
    this.reload(0);
  }

  /** The visible window. */
  get window(): [number, number] {
    return [...this.view];
  }

  setView(start: number, end: number): void {
    const [r0, r1] = this.opts.range;
    const span = Math.max(end - start, 1000);
    start = Math.max(r0 - (r1 - r0) * 0.05, start);
    this.view = [start, start + span];
    this.schedule();
  }

  private resize(): void {
    this.width = Math.max(300, this.root.clientWidth);
    this.layout();
  }

  private layout(): void {
    const dpr = window.devicePixelRatio || 1;
    const h = AXIS + Math.max(1, this.data.lanes.length) * this.laneH + 4;
    this.canvas.style.width = `${this.width}px`;
    this.canvas.style.height = `${h}px`;
    this.canvas.width = Math.round(this.width * dpr);
    this.canvas.height = Math.round(h * dpr);
    this.ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    this.draw();
  }

  private plotWidth(): number {
    return this.width - this.labelW - 8;
  }

  private x(t: number): number {
    const [a, b] = this.view;
    return this.labelW + ((t - a) / (b - a)) * this.plotWidth();
  }

  private t(x: number): number {
    const [a, b] = this.view;
    return a + ((x - this.labelW) / this.plotWidth()) * (b - a);
  }

  private schedule(): void {
    if (!this.frame) this.frame = requestAnimationFrame(() => ((this.frame = 0), this.draw()));
    const [a, b] = this.view;
    const [la, lb, lres] = this.loadedWindow;
    const res = (b - a) / this.plotWidth();
    // Ask the server again when the view leaves the loaded margin or the
    // zoom changed enough for the level of detail to matter.
    if (a < la || b > lb || res < lres / 1.5 || res > lres * 3) this.reload(120);
  }

  private reload(delay: number): void {
    clearTimeout(this.timer);
    this.timer = window.setTimeout(async () => {
      const [a, b] = this.view;
      const span = b - a;
      const start = Math.max(0, Math.floor(a - span * 0.5));
      const end = Math.ceil(b + span * 0.5);
      const res = Math.max(1, Math.floor(span / this.plotWidth()));
      const ticket = ++this.pending;
      try {
        const d = await this.opts.load(start, end, res);
        if (ticket !== this.pending) return;
        const relayout = d.lanes.length !== this.data.lanes.length;
        this.data = d;
        this.loadedWindow = [start, end, res];
        this.opts.onLoaded?.(d);
        if (relayout) this.layout();
        else this.draw();
        this.root.dataset.ready = "1";
      } catch (e) {
        this.root.dataset.error = String(e);
        this.root.querySelector(".error")?.remove();
        const msg = document.createElement("div");
        msg.className = "error";
        msg.textContent = `cannot load: ${e}`;
        this.root.append(msg);
      }
    }, delay);
  }

  private draw(): void {
    const t0 = performance.now();
    const ctx = this.ctx;
    const W = this.width;
    const lanes = this.data.lanes;
    ctx.clearRect(0, 0, W, this.canvas.height);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    const left = this.labelW;
    const right = W - 8;
    // Bands.
    for (const band of this.opts.bands ?? []) {
      const x0 = Math.max(left, this.x(band.start));
      const x1 = Math.min(right, this.x(band.end));
      if (x1 > x0) {
        ctx.fillStyle = band.color;
        ctx.fillRect(x0, AXIS, x1 - x0, lanes.length * this.laneH);
        const hatch = band.hatch ? this.hatch("rgba(0,0,0,0.13)") : null;
        if (hatch) {
          ctx.fillStyle = hatch;
          ctx.fillRect(x0, AXIS, x1 - x0, lanes.length * this.laneH);
        }
      }
    }
    this.drawAxis();
    this.drawBandLabels();
    // Lanes.
    const [va, vb] = this.view;
    const scale = this.plotWidth() / (vb - va);
    lanes.forEach((lane, i) => {
      const y = AXIS + i * this.laneH;
      if (i % 2 === 1) {
        ctx.fillStyle = "rgba(0,0,0,0.03)";
        ctx.fillRect(0, y, W, this.laneH);
      }
      ctx.fillStyle = "#222";
      ctx.fillText(clip(ctx, lane.label, left - 8), 4, y + this.laneH / 2);
      const ivs = lane.intervals;
      // Intervals are in time order: start at the first visible one.
      let lo = 0;
      let hi = ivs.length;
      while (lo < hi) {
        const m = (lo + hi) >> 1;
        if (ivs[m].end_ns < va) lo = m + 1;
        else hi = m;
      }
      for (let k = lo; k < ivs.length; k++) {
        const iv = ivs[k];
        if (iv.start_ns > vb) break;
        let x0 = left + (iv.start_ns - va) * scale;
        let x1 = left + (iv.end_ns - va) * scale;
        if (x0 < left) x0 = left;
        if (x1 > right) x1 = right;
        const w = Math.max(1, x1 - x0);
        const hatched = this.opts.hatch?.(iv, lane) ?? false;
        ctx.globalAlpha = (iv.n > 1 ? 0.45 + 0.55 * (iv.coverage ?? 1) : 1) * (hatched ? 0.6 : 1);
        ctx.fillStyle = this.opts.color(iv, lane);
        ctx.fillRect(x0, y + 2, w, this.laneH - 4);
        const stripes = hatched ? this.hatch("rgba(255,255,255,0.85)") : null;
        if (stripes) {
          ctx.globalAlpha = 1;
          ctx.fillStyle = stripes;
          ctx.fillRect(x0, y + 2, w, this.laneH - 4);
        }
        const outline = this.opts.outline?.(iv, lane);
        if (outline && w >= 2) {
          ctx.globalAlpha = 1;
          ctx.strokeStyle = outline;
          ctx.lineWidth = 1.5;
          ctx.strokeRect(x0 + 0.75, y + 2.75, w - 1.5, this.laneH - 5.5);
        }
      }
      ctx.globalAlpha = 1;
    });
    this.drawArrows();
    const dt = performance.now() - t0;
    this.frameTimes.push(dt);
    if (this.frameTimes.length > 600) this.frameTimes.splice(0, 300);
    (window.__timelineFrames ??= []).push(dt);
    if (window.__timelineFrames.length > 10_000) window.__timelineFrames.splice(0, 5_000);
  }

  private drawAxis(): void {
    const ctx = this.ctx;
    const [a, b] = this.view;
    const span = b - a;
    const step = niceStep(span / 8);
    ctx.strokeStyle = "#ccc";
    ctx.fillStyle = "#555";
    ctx.lineWidth = 1;
    const origin = this.opts.origin;
    const first = Math.ceil((a - origin) / step) * step + origin;
    const h = AXIS + this.data.lanes.length * this.laneH;
    for (let t = first; t <= b; t += step) {
      const x = Math.round(this.x(t)) + 0.5;
      if (x < this.labelW) continue;
      ctx.beginPath();
      ctx.moveTo(x, AXIS - 4);
      ctx.lineTo(x, h);
      ctx.stroke();
      ctx.fillText(fmtNs(t - origin), x + 2, 9);
    }
  }

  /** Band labels in the axis row, over the ticks, clipped to their band. */
  private drawBandLabels(): void {
    const ctx = this.ctx;
    for (const band of this.opts.bands ?? []) {
      if (!band.label) continue;
      const x0 = Math.max(this.labelW, this.x(band.start));
      const x1 = Math.min(this.width - 8, this.x(band.end));
      if (x1 - x0 < 24) continue;
      const text = clip(ctx, band.label, x1 - x0 - 6);
      ctx.fillStyle = "#fff";
      ctx.fillRect(x0, 0, Math.min(x1 - x0, ctx.measureText(text).width + 6), AXIS - 5);
      ctx.fillStyle = "#555";
      ctx.fillText(text, x0 + 3, 9);
    }
  }

  /** Diagonal stripes of `color`, made once per colour. */
  private hatch(color: string): CanvasPattern | null {
    let p = this.hatches.get(color);
    if (p === undefined) {
      const tile = document.createElement("canvas");
      tile.width = tile.height = 6;
      const g = tile.getContext("2d");
      p = null;
      if (g) {
        g.strokeStyle = color;
        g.lineWidth = 1.5;
        g.beginPath();
        for (const d of [-6, 0, 6]) {
          g.moveTo(d, 6);
          g.lineTo(d + 6, 0);
        }
        g.stroke();
        p = this.ctx.createPattern(tile, "repeat");
      }
      this.hatches.set(color, p);
    }
    return p;
  }

  private drawArrows(): void {
    const arrows = this.data.arrows;
    if (!arrows?.length) return;
    const index = new Map(this.data.lanes.map((l, i) => [l.key, i]));
    const ctx = this.ctx;
    const [va, vb] = this.view;
    for (const ar of arrows) {
      if (ar.at_ns < va || ar.at_ns > vb) continue;
      const i = index.get(ar.from);
      const j = index.get(ar.to);
      if (i === undefined || j === undefined || i === j) continue;
      const x = this.x(ar.at_ns);
      const y0 = AXIS + i * this.laneH + this.laneH / 2;
      const y1 = AXIS + j * this.laneH + this.laneH / 2;
      ctx.strokeStyle = ar.color ?? "#000";
      ctx.fillStyle = ar.color ?? "#000";
      ctx.lineWidth = 1.2;
      ctx.beginPath();
      ctx.moveTo(x, y0);
      ctx.lineTo(x, y1);
      ctx.stroke();
      const dir = y1 > y0 ? 1 : -1;
      ctx.beginPath();
      ctx.moveTo(x, y1);
      ctx.lineTo(x - 3.5, y1 - dir * 6);
      ctx.lineTo(x + 3.5, y1 - dir * 6);
      ctx.closePath();
      ctx.fill();
    }
  }

  private hit(ev: MouseEvent): { iv: Drawn; lane: Lane } | null {
    const r = this.canvas.getBoundingClientRect();
    const x = ev.clientX - r.left;
    const y = ev.clientY - r.top;
    if (x < this.labelW || y < AXIS) return null;
    const lane = this.data.lanes[Math.floor((y - AXIS) / this.laneH)];
    if (!lane) return null;
    const t = this.t(x);
    const slack = (this.view[1] - this.view[0]) / this.plotWidth(); // one pixel
    const ivs = lane.intervals;
    let lo = 0;
    let hi = ivs.length;
    while (lo < hi) {
      const m = (lo + hi) >> 1;
      if (ivs[m].end_ns + slack < t) lo = m + 1;
      else hi = m;
    }
    const iv = ivs[lo];
    return iv && iv.start_ns - slack <= t ? { iv, lane } : null;
  }

  private bind(): void {
    const c = this.canvas;
    c.addEventListener(
      "wheel",
      (ev) => {
        ev.preventDefault();
        const r = c.getBoundingClientRect();
        const at = this.t(ev.clientX - r.left);
        const k = Math.exp(ev.deltaY * 0.0015);
        const [a, b] = this.view;
        this.setView(at - (at - a) * k, at + (b - at) * k);
      },
      { passive: false },
    );
    c.addEventListener("mousedown", (ev) => {
      this.drag = { x: ev.clientX, view: [...this.view] };
    });
    window.addEventListener("mouseup", () => (this.drag = null));
    window.addEventListener("mousemove", (ev) => {
      if (!this.drag) return;
      const dx = ev.clientX - this.drag.x;
      const [a, b] = this.drag.view;
      const dt = (dx / this.plotWidth()) * (b - a);
      this.setView(a - dt, b - dt);
    });
    c.addEventListener("mousemove", (ev) => {
      if (this.drag) {
        this.tip.hidden = true;
        return;
      }
      const h = this.hit(ev);
      if (!h) {
        this.tip.hidden = true;
        return;
      }
      this.tip.innerHTML = this.opts.tooltip(h.iv, h.lane);
      this.tip.hidden = false;
      const tw = this.tip.offsetWidth;
      this.tip.style.left = `${Math.min(ev.clientX + 12, window.innerWidth - tw - 8)}px`;
      this.tip.style.top = `${ev.clientY + 14}px`;
    });
    c.addEventListener("mouseleave", () => (this.tip.hidden = true));
    c.addEventListener("dblclick", () => this.setView(...this.opts.range));
    c.addEventListener("click", (ev) => {
      const h = this.hit(ev);
      if (h && this.opts.onClick && Math.abs(ev.movementX) < 2) this.opts.onClick(h.iv, h.lane);
    });
  }
}

function niceStep(x: number): number {
  const p = Math.pow(10, Math.floor(Math.log10(Math.max(x, 1))));
  for (const m of [1, 2, 5, 10]) if (m * p >= x) return m * p;
  return 10 * p;
}

function clip(ctx: CanvasRenderingContext2D, s: string, w: number): string {
  if (ctx.measureText(s).width <= w) return s;
  let lo = 0;
  let hi = s.length;
  while (lo < hi) {
    const m = (lo + hi + 1) >> 1;
    if (ctx.measureText(s.slice(0, m) + "…").width <= w) lo = m;
    else hi = m - 1;
  }
  return s.slice(0, lo) + "…";
}
