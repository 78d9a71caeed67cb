// The live agent's snapshots (`deepspan ui DIR` of its snapshot folder): newest first, each with
// the span that triggered it and its diagnosis; a row opens the snapshot's own run views.

import { get, SnapshotRow } from "./api";
import { el, esc, fmtNs } from "./format";

function when(ns: number | null): string {
  if (ns === null) return "";
  return new Date(ns / 1e6).toISOString().replace("T", " ").replace("Z", " UTC");
}

export async function snapshotsView(app: HTMLElement): Promise<void> {
  const { snapshots } = await get<{ snapshots: SnapshotRow[] }>("/api/snapshots");
  app.innerHTML = "";
  const head = el("section", { class: "panel" });
  head.innerHTML = `<h1>Snapshots</h1>
    <p class="muted">${snapshots.length} kernel snapshot(s) the agent took when a span was much slower than its operation's norm, newest first. Open one to see its requests and kernel critical paths.</p>`;
  app.append(head);
  const table = el("table", { class: "requests", id: "snapshots" });
  table.innerHTML = `<thead><tr><th>Snapshot</th><th>Taken</th><th class="num">Window</th>
    <th>Trigger</th><th class="num">Duration</th><th>Diagnosis</th><th>Status</th></tr></thead>`;
  const body = el("tbody");
  for (const s of snapshots) {
    const href = `/s/${encodeURIComponent(s.id)}/`;
    const triggers = s.triggers ?? [];
    const first = triggers[0];
    const more = triggers.length > 1 ? ` <span class="muted">+${triggers.length - 1} more</span>` : "";
    const tr = el("tr", { "data-snapshot-id": s.id, class: s.status === "analysed" ? "" : "failed" });
    tr.innerHTML = `<td>${s.analysed ? `<a href="${esc(href)}">${esc(s.id)}</a>` : esc(s.id)}</td>
      <td>${esc(when(s.taken_unix_ns))}</td>
      <td class="num">${s.window_ns === null ? "" : fmtNs(s.window_ns)}</td>
      <td>${first ? `[${esc(first.service)}] ${esc(first.operation)} <span class="muted" title="trace ${esc(first.trace_id)}">${esc(first.trace_id.slice(0, 8))}…</span>${more}` : ""}</td>
      <td class="num">${first ? `${fmtNs(first.duration_ns)}${first.baseline_ns ? ` <span class="muted">(median ${fmtNs(first.baseline_ns)})</span>` : ""}` : ""}</td>
      <td>${first?.cause ? `<span class="cause">${esc(first.cause)}</span> ${esc(first.headline ?? "")}` : ""}</td>
      <td>${s.status === "analysed" ? esc(s.status) : `<span class="error">${esc(s.status)}</span>${s.error ? ` ${esc(s.error)}` : ""}`}</td>`;
    if (s.analysed)
      tr.addEventListener("click", (ev) => {
        if ((ev.target as HTMLElement).tagName !== "A") location.href = href;
      });
    body.append(tr);
  }
  table.append(body);
  table.dataset.rows = String(snapshots.length);
  app.append(table);
}
