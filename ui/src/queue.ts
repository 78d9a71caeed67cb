// A request's queue (its time at its host before its span started: an
// event loop busy with another request, a full thread pool) as the request
// page and the list show it: where its band goes on a timeline and what it
// says. No imports, so a test can compile this file alone (as
// ui/test/units.test.mjs does units.ts): durations are formatted by the
// caller's `fmtNs`.

/** Shorter queues are not shown (clock rounding, not waiting). */
export const QUEUE_MIN_NS = 1000;

/** What of a queue these functions read (requests.json's `queue`, `/api/requests/{id}`'s). */
export interface QueueLike {
  arrival_ns: number;
  ns: number;
  cause_groups?: Array<{ label: string }>;
}

/** Whether a request has a queue to show: one of at least 1 µs. */
export function hasQueue(q: QueueLike | null | undefined): q is QueueLike {
  return !!q && q.ns >= QUEUE_MIN_NS;
}

/** The queue's band on a timeline, `[arrival, span start)`, immediately before the span; null without a queue to show. */
export function queueBand(q: QueueLike | null | undefined, spanStart: number): { start: number; end: number } | null {
  if (!hasQueue(q)) return null;
  return { start: Math.min(q.arrival_ns, spanStart - q.ns), end: spanStart };
}

/** A timeline's range `[start, end]` widened to show the queue before the span at `spanStart`. */
export function withQueue(range: [number, number], q: QueueLike | null | undefined, spanStart: number): [number, number] {
  const band = queueBand(q, spanStart);
  return band ? [Math.min(range[0], band.start), range[1]] : range;
}

/** `queued 148.2 ms · queued behind 3 requests of [svc] op` (its largest group), text to escape; null without a queue to show. */
export function queueLabel(q: QueueLike | null | undefined, fmtNs: (ns: number) => string): string | null {
  if (!hasQueue(q)) return null;
  const top = q.cause_groups?.[0]?.label;
  return top ? `queued ${fmtNs(q.ns)} · ${top}` : `queued ${fmtNs(q.ns)}`;
}

/** What the arrival was taken from (the queue's `arrival_by`), for people. */
export function arrivalLabel(by: string): string {
  switch (by) {
    case "client_send":
      return "the client's send";
    case "server_receive":
      return "the server's first receive";
    default:
      return by;
  }
}
