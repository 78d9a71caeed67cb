// Browser half of bench/ui_bench.py: node bench/ui_bench.mjs URL SPAN_ID LOADS
// Prints one JSON line of timings: the first page (the requests list), the
// request page, and panning. Headless Debian Chromium only.

import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const { chromium } = createRequire(join(repo, "ui/package.json"))("playwright-core");
const [url, span, loads = "5"] = process.argv.slice(2);

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] : NaN;
};

async function pan(page, selector, steps) {
  const box = await page.$eval(`${selector} canvas`, (c) => {
    const r = c.getBoundingClientRect();
    return { x: r.left, y: r.top, w: r.width, h: r.height };
  });
  await page.evaluate(() => {
    window.__timelineFrames = [];
    window.__raf = [];
    let last = performance.now();
    const tick = (t) => {
      window.__raf.push(t - last);
      last = t;
      if (!window.__stopRaf) requestAnimationFrame(tick);
    };
    window.__stopRaf = false;
    requestAnimationFrame(tick);
  });
  const y = box.y + Math.min(box.h - 4, 22 + 9);
  // Zoom in a little first, so that panning moves through data.
  await page.mouse.move(box.x + box.w / 2, y);
  for (let i = 0; i < 5; i++) {
    await page.mouse.wheel(0, -200);
    await page.waitForTimeout(30);
  }
  await page.waitForTimeout(400);
  for (let round = 0; round < 2; round++) {
    await page.mouse.move(box.x + box.w * 0.8, y);
    await page.mouse.down();
    for (let i = 1; i <= steps; i++) {
      await page.mouse.move(box.x + box.w * (0.8 - (0.6 * i) / steps), y);
      await page.waitForTimeout(16);
    }
    await page.mouse.up();
    await page.waitForTimeout(300);
    await page.mouse.move(box.x + box.w * 0.2, y);
    await page.mouse.down();
    for (let i = 1; i <= steps; i++) {
      await page.mouse.move(box.x + box.w * (0.2 + (0.6 * i) / steps), y);
      await page.waitForTimeout(16);
    }
    await page.mouse.up();
    await page.waitForTimeout(300);
  }
  const { draws, raf } = await page.evaluate(() => {
    window.__stopRaf = true;
    return { draws: window.__timelineFrames, raf: window.__raf.slice(1) };
  });
  return {
    draws: draws.length,
    draw_median_ms: pct(draws, 50),
    draw_p95_ms: pct(draws, 95),
    draw_max_ms: Math.max(...draws),
    frame_median_ms: pct(raf, 50),
    frame_p95_ms: pct(raf, 95),
    frame_max_ms: Math.max(...raf),
  };
}

const profile = mkdtempSync(join(tmpdir(), "deepspan-chromium-"));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1600, height: 1000 },
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage();
  // The first page (the requests list), first on the fresh server.
  const listed = [];
  for (let i = 0; i < Number(loads); i++) {
    await page.goto("about:blank");
    const t0 = Date.now();
    await page.goto(url);
    await page.waitForSelector("#requests[data-rows]", { timeout: 120_000 });
    listed.push(Date.now() - t0);
  }
  const first_page = { samples_ms: listed, cold_ms: listed[0], median_ms: pct(listed, 50) };
  const samples = [];
  for (let i = 0; i < Number(loads); i++) {
    await page.goto("about:blank");
    const t0 = Date.now();
    await page.goto(`${url}#/request/${span}`);
    await page.waitForSelector("#kernel-path .timeline[data-ready='1']", { timeout: 120_000 });
    await page.waitForSelector("#summary[data-states]", { timeout: 120_000 });
    samples.push(Date.now() - t0);
  }
  const request_page = { samples_ms: samples, median_ms: pct(samples, 50), min_ms: Math.min(...samples), max_ms: Math.max(...samples) };
  const pan_request_path = await pan(page, "#kernel-path", 40);

  await page.goto(`${url}#/resources`);
  await page.waitForSelector("#threads .timeline[data-ready='1']", { timeout: 120_000 });
  const drawn = Number(await page.$eval("#threads .timeline", (e) => e.dataset.drawn));
  const inView = await page.evaluate(async () => {
    const run = await (await fetch("/api/run")).json();
    return run.intervals;
  });
  const pan_resources = { ...(await pan(page, "#threads", 40)), intervals_in_view: inView, drawn };
  console.log(JSON.stringify({ first_page, request_page, pan_request_path, pan_resources }));
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
