// The server's JSON API (crates/ui-server/src/api.rs).

export interface Cause {
  label: string;
  state: string;
  ns: number;
  share: number;
}

export interface CauseObject {
  cause: string;
  headline: string;
  evidence?: Record<string, number>;
  culprits?: Array<Record<string, string | number>>;
}

/** The proximate cause, and the root cause through the requests it waited for (`chain` null when it waited for none). */
export interface Diagnosis extends CauseObject {
  root_cause?: (CauseObject & { chain: string | null }) | null;
}

/** A request's time with its blocking requests grouped by `[service] operation`. */
export interface CauseGroup {
  label: string;
  blocked_by_operation: string | null;
  blocked_by_requests: string[];
  state: string;
  ns: number;
  share: number;
  parts: Array<{ label: string; state: string; ns: number }>;
}

/** A request's time at its host before its span started (requests.json's `queue`). */
export interface QueueDoc {
  /** When it reached the host (CLOCK_MONOTONIC ns, as `start_ns`). */
  arrival_ns: number;
  /** What says so: `client_send` or `server_receive`. */
  arrival_by: string;
  /** `start_ns - arrival_ns`. */
  ns: number;
  /** Where the time went, the requests it was queued behind grouped by `[service] operation`, largest first. */
  cause_groups: CauseGroup[];
  diagnosis?: Diagnosis | null;
}

export interface RequestRow {
  trace_id: string;
  span_id: string;
  parent_span_id: string | null;
  service: string;
  operation: string;
  kind: string;
  start_ns: number;
  end_ns: number;
  duration_ns: number;
  sync: string;
  tid: number | null;
  lost_events: number;
  truncated: boolean;
  causes: Cause[];
  cause_groups?: CauseGroup[];
  anomalous?: boolean;
  baseline_ns?: number | null;
  diagnosis?: Diagnosis | null;
  /** Null (or absent, in analyses made before queues) when its arrival is not known. */
  queue?: QueueDoc | null;
}

/** One drawn interval: an original one (n = 1) or merged by the server's level of detail. */
export interface Drawn {
  start_ns: number;
  end_ns: number;
  state?: string;
  tid?: number | null;
  n: number;
  coverage?: number;
  [key: string]: unknown;
}

/** A host of a merged run (its `hosts.json`); `index` is the N of its threads' `hN:` ids. */
export interface HostInfo {
  index: number;
  host: string;
  reference: boolean;
  quality: string;
  matched: number;
  slope: number;
  offset_ns: number;
  run: string;
}

export interface RunInfo {
  /** "snapshots" when the server serves a folder of agent snapshots (then only `run` is set). */
  kind?: "snapshots";
  run: string;
  requests: number;
  threads: number;
  cpus: number[];
  intervals: number;
  start_ns: number;
  end_ns: number;
  services: string[];
  causes: string[];
  root_causes?: string[];
  has_diagnosis: boolean;
  notes: string[];
  /** The hosts of a merged run; null (or absent) for a run of one host. */
  hosts?: HostInfo[] | null;
  /** What is wrong with the run's hosts.json, when it is unreadable. */
  hosts_error?: string | null;
}

export class ApiError extends Error {
  constructor(
    message: string,
    /** The HTTP status (404: no such thing, 400: bad parameters). */
    readonly status = 0,
  ) {
    super(message);
  }
}

/** A snapshot of the live agent, as `/api/snapshots` lists it (`snapshot.json` plus the folder's id). */
export interface SnapshotRow {
  id: string;
  taken_unix_ns: number | null;
  window_mono_ns?: [number, number];
  window_ns: number | null;
  status: string;
  error: string | null;
  analysed: boolean;
  triggers: Array<{
    trace_id: string;
    span_id: string;
    service: string;
    operation: string;
    duration_ns: number;
    baseline_ns?: number | null;
    cause?: string | null;
    headline?: string | null;
  }> | null;
}

/**
 * The snapshot this page shows (`/s/<id>/`, under `deepspan ui` of a snapshot folder), or null. Its
 * API calls go under the same prefix.
 */
export function snapshotId(): string | null {
  const m = /^\/s\/([^/]+)/.exec(location.pathname);
  return m ? decodeURIComponent(m[1]) : null;
}

function apiPrefix(): string {
  const id = snapshotId();
  return id === null ? "" : `/s/${encodeURIComponent(id)}`;
}

export async function get<T>(path: string, params: Record<string, string | number | undefined> = {}): Promise<T> {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== "") q.set(k, String(v));
  const url = apiPrefix() + (q.toString() ? `${path}?${q}` : path);
  const res = await fetch(url);
  const body = await res.json().catch(() => ({ error: `${res.status} ${res.statusText}` }));
  if (!res.ok) throw new ApiError(body.error ?? `${res.status} ${res.statusText}`, res.status);
  return body as T;
}

let runInfo: Promise<RunInfo> | null = null;
export function run(): Promise<RunInfo> {
  runInfo ??= get<RunInfo>("/api/run");
  return runInfo;
}
