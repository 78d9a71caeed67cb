'use strict';
/**
 * deepspan-otel for Node.js: a span processor that lets deepspan place each
 * span on its OS thread and in the kernel trace's time, exactly.
 *
 * Every span started while it is installed carries, in plain OTLP:
 * - `deepspan.tid`: the kernel thread id of the thread that started it. A
 *   Node.js process runs JavaScript on its main thread, whose tid is the
 *   process id, and on worker threads (`node:worker_threads`), each of
 *   which reads its own tid once from `/proc/thread-self`;
 * - `deepspan.pid_ns`, only in a container with a PID namespace of its
 *   own: that namespace's inode number. The ids above are then the
 *   namespace's, and deepspan maps them to the kernel's through its /proc
 *   scans;
 * - `deepspan.mono_start_ns` / `deepspan.mono_end_ns`: CLOCK_MONOTONIC at
 *   start and end, the clock of the kernel trace (`process.hrtime.bigint()`
 *   reads it on Linux). The SDK's own times are wall clock, which deepspan
 *   would have to map, only to the microsecond.
 *
 * The end time is taken in `onEnding`, which the SDK calls while the span
 * can still take attributes (@opentelemetry/sdk-trace-base 2.1 and later,
 * sdk-trace 3); with an older SDK, `onEnd` writes it into the ended span's
 * attributes before any exporter reads them (install this processor
 * before the exporting one).
 *
 * Cost: one clock read and one attribute write at start and at end; no
 * system call per span.
 *
 * Interleaved requests on the event loop are told apart by deepspan from
 * the kernel trace (their times and socket I/O); this processor does not
 * follow async context switches.
 */

const fs = require('node:fs');

const ATTR_TID = 'deepspan.tid';
const ATTR_PID_NS = 'deepspan.pid_ns';
const ATTR_MONO_START = 'deepspan.mono_start_ns';
const ATTR_MONO_END = 'deepspan.mono_end_ns';

/** The inode of the host's (the initial) PID namespace. */
const INITIAL_PID_NS = 0xeffffffc;

/**
 * This thread's kernel tid: the process id on the main thread, else the
 * last component of /proc/thread-self (`PID/task/TID`). Read once per
 * thread: a module is loaded once per thread.
 */
function currentTid() {
  const { isMainThread } = require('node:worker_threads');
  if (isMainThread) {
    return process.pid;
  }
  const link = fs.readlinkSync('/proc/thread-self');
  const tid = Number(link.split('/').pop());
  if (!Number.isInteger(tid) || tid <= 0) {
    throw new Error(`deepspan-otel: /proc/thread-self is ${JSON.stringify(link)}, not PID/task/TID`);
  }
  return tid;
}

/** The PID namespace's inode when it is not the host's, else undefined. */
function pidNamespace() {
  let link;
  try {
    link = fs.readlinkSync('/proc/self/ns/pid');
  } catch {
    return undefined;
  }
  const m = /^pid:\[(\d+)\]$/.exec(link);
  const inode = m ? Number(m[1]) : undefined;
  return inode === INITIAL_PID_NS ? undefined : inode;
}

const TID = currentTid();
const PID_NS = pidNamespace();

/** CLOCK_MONOTONIC in ns, as a number (exact below 2^53 ns: 104 days of uptime). */
function monoNs() {
  return Number(process.hrtime.bigint());
}

/**
 * A span processor for any OpenTelemetry JS tracer provider
 * (`NodeSDK({ spanProcessors: [new DeepspanSpanProcessor(), ...] })`). It
 * exports nothing itself.
 */
class DeepspanSpanProcessor {
  onStart(span) {
    span.setAttribute(ATTR_TID, TID);
    if (PID_NS !== undefined) {
      span.setAttribute(ATTR_PID_NS, PID_NS);
    }
    span.setAttribute(ATTR_MONO_START, monoNs());
  }

  onEnding(span) {
    span.setAttribute(ATTR_MONO_END, monoNs());
  }

  onEnd(span) {
    // An SDK without onEnding: the ended span's attributes are a plain
    // object, read by the exporters after every processor's onEnd.
    if (span.attributes && span.attributes[ATTR_MONO_END] === undefined) {
      span.attributes[ATTR_MONO_END] = monoNs();
    }
  }

  forceFlush() {
    return Promise.resolve();
  }

  shutdown() {
    return Promise.resolve();
  }
}

module.exports = {
  DeepspanSpanProcessor,
  ATTR_TID,
  ATTR_PID_NS,
  ATTR_MONO_START,
  ATTR_MONO_END,
};
