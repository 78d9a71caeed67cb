// Durations, shares, diagnosis evidence and containers as people read them:
// the rules of deepspan_model::human and ::container, checked against the same
// examples, docs/format-vectors.json (ui/test/units.test.mjs). No imports, so
// the test can compile this file alone.

/** `850 ns`, `9.88 µs`, `237.3 µs`, `2.91 ms`, `1.88 s`: the largest unit reached, two decimals below 10 of it, one above. */
export function fmtNs(ns: number): string {
  const a = Math.abs(ns);
  if (a >= 1e9) return `${(ns / 1e9).toFixed(a >= 1e10 ? 1 : 2)} s`;
  if (a >= 1e6) return `${(ns / 1e6).toFixed(a >= 1e7 ? 1 : 2)} ms`;
  if (a >= 1e3) return `${(ns / 1e3).toFixed(a >= 1e4 ? 1 : 2)} µs`;
  return `${Math.round(ns)} ns`;
}

/** A fraction as a percentage: `0.995` → `99.5 %`. */
export function fmtShare(fraction: number): string {
  return `${(fraction * 100).toFixed(1)} %`;
}

/** One item of a diagnosis's evidence by its key's suffix: `blocked_ns=1.88 s`, `blocked_share=99.5 %`. */
export function fmtEvidence(key: string, value: unknown): string {
  if (typeof value !== "number") return `${key}=${String(value)}`;
  let text: string;
  if (key === "ns" || key.endsWith("_ns")) text = fmtNs(Math.trunc(Math.max(0, value)));
  else if (key.endsWith("share") || key.endsWith("_ratio")) text = fmtShare(value);
  else if (key === "futex_uaddr") text = `0x${Math.trunc(value).toString(16)}`;
  else if (Number.isInteger(value)) text = String(value);
  else text = value.toFixed(2);
  return `${key}=${text}`;
}

/** A culprit's container and pod (its `culprits_json` fields): `container shop-hog, pod shop/checkout-7d9f`; ids stand for names the host did not give. */
export function containerLabel(c: Record<string, unknown>): string {
  const str = (k: string) => (typeof c[k] === "string" ? (c[k] as string) : undefined);
  const [id, name, uid, pod, ns] = ["container_id", "container_name", "pod_uid", "pod_name", "pod_namespace"].map(str);
  const parts: string[] = [];
  if (name ?? id) parts.push(`container ${name ?? id!.slice(0, 12)}`);
  if (pod) parts.push(`pod ${ns ? `${ns}/` : ""}${pod}`);
  else if (uid) parts.push(`pod ${uid.slice(0, 8)}`);
  return parts.join(", ");
}
