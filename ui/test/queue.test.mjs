// ui/src/queue.ts: where a request's queue band goes on a timeline and what
// its label says. Compiles queue.ts alone with the UI's TypeScript compiler
// (as units.test.mjs does units.ts), then imports it with units.ts's fmtNs.
// `node ui/test/queue.test.mjs`.
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import assert from "node:assert/strict";

const ui = join(dirname(fileURLToPath(import.meta.url)), "..");
const out = mkdtempSync(join(tmpdir(), "deepspan-queue-"));
try {
  execFileSync(join(ui, "node_modules", ".bin", "tsc"), [
    "--ignoreConfig", join(ui, "src", "queue.ts"), join(ui, "src", "units.ts"), "--outDir", out, "--target", "ES2022", "--module", "ESNext", "--strict",
  ], { stdio: "inherit" });
  const q = await import(pathToFileURL(join(out, "queue.js")).href);
  const { fmtNs } = await import(pathToFileURL(join(out, "units.js")).href);

  const start = 5_000_000_000;
  const queue = {
    arrival_ns: start - 148_200_000,
    ns: 148_200_000,
    cause_groups: [
      { label: "queued behind 3 requests of [node-blocked] GET /slow" },
      { label: "RUNNING on node 412" },
    ],
  };
  // The band is [arrival, span start), immediately before the span.
  assert.deepEqual(q.queueBand(queue, start), { start: start - 148_200_000, end: start });
  // A timeline's range widens to the arrival, never narrows.
  assert.deepEqual(q.withQueue([start, start + 10], queue, start), [start - 148_200_000, start + 10]);
  assert.deepEqual(q.withQueue([start - 200_000_000, start + 10], queue, start), [start - 200_000_000, start + 10]);
  // The label: its time, then its largest group.
  assert.equal(q.queueLabel(queue, fmtNs), "queued 148.2 ms · queued behind 3 requests of [node-blocked] GET /slow");
  assert.equal(q.queueLabel({ ...queue, cause_groups: [] }, fmtNs), "queued 148.2 ms");
  assert.equal(q.queueLabel({ arrival_ns: start - 2500, ns: 2500 }, fmtNs), "queued 2.50 µs");
  // No queue, or one under 1 µs: nothing shown.
  for (const none of [null, undefined, { arrival_ns: start - 999, ns: 999, cause_groups: [] }]) {
    assert.equal(q.hasQueue(none), false);
    assert.equal(q.queueBand(none, start), null);
    assert.equal(q.queueLabel(none, fmtNs), null);
    assert.deepEqual(q.withQueue([start, start + 10], none, start), [start, start + 10]);
  }
  assert.equal(q.hasQueue({ arrival_ns: start - 1000, ns: 1000 }), true);
  assert.equal(q.arrivalLabel("client_send"), "the client's send");
  assert.equal(q.arrivalLabel("server_receive"), "the server's first receive");
  console.log("ui queue: band and label ok");
} finally {
  rmSync(out, { recursive: true, force: true });
}
