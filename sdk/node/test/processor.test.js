'use strict';
// The processor on the real SDK (@opentelemetry/sdk-trace 3, which calls
// onEnding) and on the ended-span path of SDKs without onEnding; the tid on
// the main thread and on a worker thread, checked against what the kernel
// says (/proc/thread-self).

const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const { Worker } = require('node:worker_threads');
const { TracerProvider } = require('@opentelemetry/sdk-trace');
const {
  DeepspanSpanProcessor,
  ATTR_TID,
  ATTR_MONO_START,
  ATTR_MONO_END,
  ATTR_PID_NS,
} = require('..');

/** A processor after deepspan's that keeps the ended spans, as an
 * exporting one would see them. */
function collector() {
  const ended = [];
  return {
    ended,
    onStart() {},
    onEnd(span) {
      ended.push(span);
    },
    forceFlush: () => Promise.resolve(),
    shutdown: () => Promise.resolve(),
  };
}

function tidOfThisThread() {
  return Number(fs.readlinkSync('/proc/thread-self').split('/').pop());
}

test('a span carries its thread and its monotonic start and end', () => {
  const exported = collector();
  const provider = new TracerProvider({
    spanProcessors: [new DeepspanSpanProcessor(), exported],
  });
  const tracer = provider.getTracer('test');
  const before = process.hrtime.bigint();
  const span = tracer.startSpan('work');
  const inside = process.hrtime.bigint();
  span.end();
  const after = process.hrtime.bigint();
  const [done] = exported.ended;
  const a = done.attributes;
  assert.strictEqual(a[ATTR_TID], process.pid);
  assert.strictEqual(a[ATTR_TID], tidOfThisThread());
  assert.ok(Number.isInteger(a[ATTR_MONO_START]) && Number.isInteger(a[ATTR_MONO_END]));
  assert.ok(BigInt(a[ATTR_MONO_START]) >= before && BigInt(a[ATTR_MONO_START]) <= inside, JSON.stringify(a));
  assert.ok(BigInt(a[ATTR_MONO_END]) >= inside && BigInt(a[ATTR_MONO_END]) <= after, JSON.stringify(a));
  // This machine's tests run in the host's PID namespace.
  assert.strictEqual(a[ATTR_PID_NS], undefined);
});

test('a span started on a worker thread carries the worker thread\'s tid', async () => {
  const worker = new Worker(
    `
    const { parentPort } = require('node:worker_threads');
    const fs = require('node:fs');
    const { TracerProvider } = require(${JSON.stringify(require.resolve('@opentelemetry/sdk-trace'))});
    const { DeepspanSpanProcessor, ATTR_TID } = require(${JSON.stringify(require.resolve('..'))});
    const ended = [];
    const provider = new TracerProvider({
      spanProcessors: [
        new DeepspanSpanProcessor(),
        { onStart() {}, onEnd: (s) => ended.push(s), forceFlush: async () => {}, shutdown: async () => {} },
      ],
    });
    provider.getTracer('test').startSpan('in a worker').end();
    parentPort.postMessage({
      placed: ended[0].attributes[ATTR_TID],
      kernel: Number(fs.readlinkSync('/proc/thread-self').split('/').pop()),
    });
    `,
    { eval: true, workerData: null },
  );
  const { placed, kernel } = await new Promise((resolve, reject) => {
    worker.once('message', resolve);
    worker.once('error', reject);
  });
  await worker.terminate();
  assert.strictEqual(placed, kernel);
  assert.notStrictEqual(placed, process.pid);
});

test('an SDK without onEnding gets the end time in the ended span', () => {
  const processor = new DeepspanSpanProcessor();
  const attributes = {};
  const span = { attributes, setAttribute: (k, v) => (attributes[k] = v) };
  processor.onStart(span);
  const before = process.hrtime.bigint();
  processor.onEnd(span);
  assert.ok(BigInt(attributes[ATTR_MONO_END]) >= before);
  // With onEnding called first, onEnd keeps its time.
  const kept = attributes[ATTR_MONO_END];
  processor.onEnd(span);
  assert.strictEqual(attributes[ATTR_MONO_END], kept);
});
