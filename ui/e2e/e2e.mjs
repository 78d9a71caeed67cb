// End-to-end test of `deepspan ui` in headless Debian Chromium (never a
// downloaded browser): records a real run (two Python requests contending
// on a lock, crates/cli/tests/analyze/cases.py), analyses it, serves it,
// and checks that the list, the slowest request's kernel critical path and
// its summary render with the states the recording must have, and (the
// run is recorded with --profile) that its flame graph adds up to the
// path, shows the wait off the CPU and zooms. Then the same run as the one
// snapshot of an agent's snapshot folder: the list, and the snapshot opening
// in the run views under /s/<id>/. Screenshots go to --out.
//
//   node ui/e2e/e2e.mjs --deepspan target/release/deepspan --out target/ui-e2e [--run RUN]
//
// With --run, an existing analysed run is served instead of recording one.

import { spawn, spawnSync } from "node:child_process";
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, existsSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []),
);
const deepspan = resolve(args.deepspan ?? join(repo, "target/release/deepspan"));
const out = resolve(args.out ?? join(repo, "target/ui-e2e"));
const CHROMIUM = "/usr/bin/chromium";

function fail(msg) {
  console.error(`ui e2e: FAILED: ${msg}`);
  process.exitCode = 1;
  throw new Error(msg);
}

function check(cond, msg) {
  if (!cond) fail(msg);
}

function sh(cmd, argv, env = {}) {
  const r = spawnSync(cmd, argv, { encoding: "utf8", env: { ...process.env, ...env }, maxBuffer: 64 << 20 });
  if (r.status !== 0) fail(`${cmd} ${argv.join(" ")} exited ${r.status}:\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

async function startServer(run) {
  const child = spawn(deepspan, ["ui", run, "--port", "0"], { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (d) => (stderr += d));
  const url = await new Promise((ok, ko) => {
    let buf = "";
    const timer = setTimeout(() => ko(new Error(`deepspan ui printed no URL in 60 s: ${stderr}`)), 60_000);
    child.stdout.on("data", (d) => {
      buf += d;
      const m = buf.match(/http:\/\/[^\s]+/);
      if (m) {
        clearTimeout(timer);
        ok(m[0]);
      }
    });
    child.on("exit", (code) => ko(new Error(`deepspan ui exited ${code}: ${stderr}`)));
  });
  return { child, url };
}

async function main() {
  check(existsSync(deepspan), `no deepspan binary at ${deepspan} (build it first)`);
  check(existsSync(CHROMIUM), `no ${CHROMIUM}: install the Debian package chromium (scripts/setup.sh test)`);
  mkdirSync(out, { recursive: true });
  const work = mkdtempSync(join(args.tmp ?? "/var/tmp", "deepspan-ui-e2e-"));
  let run = args.run;
  let ids = null;
  if (!run) {
    run = join(work, "run");
    const caseOut = join(work, "out");
    mkdirSync(caseOut);
    console.log("ui e2e: recording the lock case");
    sh(deepspan, ["record", "-o", run, "--profile", "--otlp-grpc-port", "0", "--otlp-http-port", "0", "--", "python3", join(repo, "crates/cli/tests/analyze/cases.py"), "lock", caseOut], {
      PYTHONPATH: join(repo, "sdk/python"),
    });
    sh(deepspan, ["analyze", run]);
    ids = JSON.parse(readFileSync(join(caseOut, "ids.json"), "utf8"));
  }
  const { child, url } = await startServer(run);
  const profile = mkdtempSync(join(tmpdir(), "deepspan-chromium-"));
  // A persistent context is how playwright takes a fresh --user-data-dir.
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1400, height: 1000 },
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  try {
    const page = await browser.newPage();
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    page.on("console", (m) => m.type() === "error" && errors.push(m.text()));

    // 1. The list, slowest first.
    await page.goto(url);
    await page.waitForSelector("#requests tbody tr", { timeout: 30_000 });
    const rows = await page.$$eval("#requests tbody tr", (trs) => trs.map((tr) => tr.getAttribute("data-span-id")));
    check(rows.length >= 2, `the list shows ${rows.length} requests, expected the holder and the waiter`);
    if (ids) check(rows.includes(ids.holder) && rows.includes(ids.waiter), `the list ${rows} lacks ${JSON.stringify(ids)}`);
    const durations = await page.$$eval("#requests tbody tr td:nth-child(5)", (tds) => tds.map((t) => t.textContent));
    await page.screenshot({ path: join(out, "requests.png"), fullPage: true });
    console.log(`ui e2e: list ok (${rows.length} requests, slowest ${durations[0]})`);

    // 2. The slowest request (the first row): the holder, sleeping 300 ms with the lock.
    await page.click("#requests tbody tr:first-child td:nth-child(3) a");
    await page.waitForSelector("#kernel-path .timeline[data-ready='1']", { timeout: 30_000 });
    await page.waitForSelector("#summary[data-states]", { timeout: 30_000 });
    const drawn = JSON.parse(await page.$eval("#kernel-path .timeline", (e) => e.dataset.states));
    const summary = JSON.parse(await page.$eval("#summary", (e) => e.dataset.states));
    const total = Object.values(summary).reduce((a, b) => a + b, 0);
    console.log(`ui e2e: slowest request: timeline states ${JSON.stringify(drawn)}, summary ${JSON.stringify(summary)}`);
    // The holder and the waiter both last about 300 ms: either may be the
    // slowest, and both paths are mostly the holder sleeping with the lock.
    if (ids) check([ids.holder, ids.waiter].includes(rows[0]), `the slowest request is ${rows[0]}, not the holder or the waiter`);
    for (const s of ["RUNNING", "TIMER"]) check(drawn[s] > 0, `the kernel critical path draws no ${s} piece: ${JSON.stringify(drawn)}`);
    check(summary.TIMER > 0.5 * total, `TIMER is ${summary.TIMER} of ${total} ns in the summary; the holder sleeps 300 ms`);
    check(summary.TIMER > 150e6, `TIMER is only ${summary.TIMER} ns`);
    check((await page.$$("#summary table.breakdown tr")).length >= 2, "the summary table has fewer than 2 rows");
    check((await page.$("#gantt[data-ready='1']")) !== null, "the span Gantt chart did not render");
    // A tooltip on the path: hover the lanes until a piece is under the mouse.
    const box = await page.$eval("#kernel-path canvas", (c) => {
      const r = c.getBoundingClientRect();
      return { x: r.left, y: r.top, w: r.width, h: r.height };
    });
    let tip = "";
    for (let lane = 0; !tip && 22 + lane * 18 < box.h; lane++) {
      for (const f of [0.5, 0.25, 0.75, 0.02, 0.98]) {
        await page.mouse.move(box.x + 170 + (box.w - 178) * f, box.y + 22 + lane * 18 + 9);
        if (await page.$("#tooltip:not([hidden])")) {
          tip = await page.$eval("#tooltip", (e) => e.textContent);
          break;
        }
      }
    }
    check(/RUNNING|TIMER|PREEMPTED|BLOCKED/.test(tip) && /thread/.test(tip), `the tooltip says ${JSON.stringify(tip)}`);
    await page.screenshot({ path: join(out, "slowest-request.png"), fullPage: true });

    // 2b. Its flame graph (the recording above samples CPUs): on- plus
    // off-CPU time is the path's, the sleep is an off-CPU frame, a click zooms.
    if (ids || (await page.$("#flame:not([hidden])"))) {
      await page.waitForSelector("#flame-graph[data-ready='1']", { timeout: 30_000 });
      const on = Number(await page.$eval("#flame", (e) => e.dataset.onNs));
      const off = Number(await page.$eval("#flame", (e) => e.dataset.offNs));
      console.log(`ui e2e: flame graph: on-CPU ${on} ns, off-CPU ${off} ns, path ${total} ns`);
      check(on > 0 && off > 0.5 * total, `the flame graph has on-CPU ${on} ns and off-CPU ${off} ns of a ${total} ns path that mostly sleeps`);
      check(Math.abs(on + off - total) <= 0.01 * total, `the flame graph's ${on + off} ns are not the summary's ${total} ns`);
      // Where the flame graph is now: sections of the page above it may
      // still be laid out, so it is measured again before each use.
      const flameBox = async () => {
        await page.$eval("#flame", (e) => e.scrollIntoView());
        return page.$eval("#flame-graph canvas", (c) => {
          const r = c.getBoundingClientRect();
          return { x: r.left, y: r.top, w: r.width };
        });
      };
      let fb = await flameBox();
      // Row 2, leftmost: the widest frame under the request's thread, its sleep (or its wait for the holder's).
      await page.mouse.move(fb.x + fb.w * 0.05, fb.y + 2 * 18 + 9);
      const ftip = (await page.$("#tooltip:not([hidden])")) ? await page.$eval("#tooltip", (e) => e.textContent) : "";
      check(/off the CPU/.test(ftip) && /% of the request/.test(ftip), `the flame graph's tooltip says ${JSON.stringify(ftip)}`);
      const top = await page.$eval("#flame-graph", (e) => e.dataset.focus);
      fb = await flameBox();
      await page.mouse.click(fb.x + fb.w * 0.05, fb.y + 2 * 18 + 9);
      const focus = await page.$eval("#flame-graph", (e) => e.dataset.focus);
      check(focus?.startsWith("[off-CPU"), `a click zoomed into ${JSON.stringify(focus)}, not the off-CPU frame`);
      await page.$eval("#flame", (e) => e.scrollIntoView());
      await page.screenshot({ path: join(out, "flame-zoomed.png") });
      fb = await flameBox();
      await page.mouse.dblclick(fb.x + fb.w * 0.5, fb.y + 9);
      const back = await page.$eval("#flame-graph", (e) => e.dataset.focus);
      check(back === top, `a double-click zoomed to ${JSON.stringify(back)}, not back out to ${JSON.stringify(top)}`);
      await page.$eval("#flame", (e) => e.scrollIntoView());
      await page.screenshot({ path: join(out, "flame.png") });
    }

    // 3. The waiter: blocked by the holder, through the holder's thread.
    if (ids) {
      await page.goto(`${url}#/request/${ids.waiter}`);
      await page.waitForSelector("#kernel-path .timeline[data-ready='1']", { timeout: 30_000 });
      await page.waitForSelector("#summary[data-states]", { timeout: 30_000 });
      const links = await page.$$eval("#summary table.breakdown a", (as) => as.map((a) => a.getAttribute("href")));
      check(links.includes(`#/request/${ids.holder}`), `the waiter's summary links no blocking holder: ${links}`);
      const lanes = await page.$eval("#kernel-path canvas", (c) => c.height);
      check(lanes > 0, "no kernel timeline for the waiter");
      await page.screenshot({ path: join(out, "waiter.png"), fullPage: true });
      console.log("ui e2e: waiter ok (blocked by the holder)");
    }

    // 4. The concurrent and resources views render lanes.
    await page.goto(`${url}#/concurrent`);
    await page.waitForSelector("#concurrent .timeline[data-ready='1']", { timeout: 30_000 });
    await page.screenshot({ path: join(out, "concurrent.png"), fullPage: true });
    await page.goto(`${url}#/resources`);
    await page.waitForSelector("#threads .timeline[data-ready='1']", { timeout: 30_000 });
    const drawnThreads = Number(await page.$eval("#threads .timeline", (e) => e.dataset.drawn));
    check(drawnThreads > 0, "the resources view draws no thread state");
    await page.screenshot({ path: join(out, "resources.png"), fullPage: true });

    // 5. A folder of agent snapshots holding this run: the list, then the
    // snapshot's own request list and request page under /s/<id>/.
    const snapshots = join(work, "snapshots");
    const snapshotId = "20261125T071500.123Z-0001";
    cpSync(run, join(snapshots, snapshotId), { recursive: true });
    writeFileSync(
      join(snapshots, snapshotId, "snapshot.json"),
      JSON.stringify({
        id: snapshotId,
        taken_unix_ns: 1764054900123000000,
        window_mono_ns: [0, 2e9],
        status: "analysed",
        error: null,
        triggers: [{ trace_id: "0".repeat(32), span_id: rows[0], service: "cases", operation: "lock", duration_ns: 3e8, baseline_ns: 1e8, cause: "lock_contention", headline: "e2e trigger" }],
      }),
    );
    const snapServer = await startServer(snapshots);
    try {
      await page.goto(snapServer.url);
      await page.waitForSelector("#snapshots tbody tr", { timeout: 30_000 });
      const listed = await page.$$eval("#snapshots tbody tr", (trs) => trs.map((tr) => tr.getAttribute("data-snapshot-id")));
      check(listed.length === 1 && listed[0] === snapshotId, `the snapshot list shows ${listed}`);
      check((await page.textContent("#snapshots")).includes("e2e trigger"), "the snapshot list lacks the trigger's headline");
      await page.screenshot({ path: join(out, "snapshots.png"), fullPage: true });
      await page.click(`#snapshots tbody tr td:first-child a`);
      await page.waitForSelector("#requests tbody tr", { timeout: 30_000 });
      check(new URL(page.url()).pathname === `/s/${snapshotId}/`, `the snapshot opened at ${page.url()}`);
      const snapRows = await page.$$eval("#requests tbody tr", (trs) => trs.map((tr) => tr.getAttribute("data-span-id")));
      check(snapRows.length === rows.length, `the snapshot lists ${snapRows.length} requests, the run ${rows.length}`);
      await page.click("#requests tbody tr:first-child td:nth-child(3) a");
      await page.waitForSelector("#kernel-path .timeline[data-ready='1']", { timeout: 30_000 });
      await page.screenshot({ path: join(out, "snapshot-request.png"), fullPage: true });
      console.log("ui e2e: snapshot folder ok (list, requests, request page)");
    } finally {
      snapServer.child.kill("SIGTERM");
    }
    check(errors.length === 0, `the page logged errors: ${errors.join("\n")}`);
    console.log(`ui e2e: ok; screenshots in ${out}`);
  } finally {
    await browser.close();
    child.kill("SIGTERM");
    rmSync(profile, { recursive: true, force: true });
    if (!args.keep) rmSync(work, { recursive: true, force: true });
  }
}

main().catch((e) => {
  if (!process.exitCode) console.error(`ui e2e: FAILED: ${e.stack ?? e}`);
  process.exitCode = 1;
});
