// The requests list: sortable, filterable, anomalous requests marked.

import { get, run, RequestRow } from "./api";
import { el, esc, fmtNs, hostsLegend } from "./format";
import { hasQueue, queueLabel } from "./queue";

interface ListState {
  sort: "duration" | "start";
  order: "asc" | "desc";
  service: string;
  operation: string;
  cause: string;
  root_cause: string;
  anomalous: string;
}

const state: ListState = { sort: "duration", order: "desc", service: "", operation: "", cause: "", root_cause: "", anomalous: "" };

export async function listView(app: HTMLElement): Promise<void> {
  const info = await run();
  app.innerHTML = "";
  const head = el("section", { class: "panel" });
  head.innerHTML = `<h1>Requests</h1>
    <p class="muted">${esc(info.requests)} requests · ${esc(info.threads)} threads · ${esc(info.intervals)} thread-state intervals · trace ${fmtNs(info.end_ns - info.start_ns)}</p>
    ${info.notes?.length ? `<details><summary>${info.notes.length} note(s) from the analysis</summary><ul>${info.notes.map((n) => `<li>${esc(n)}</li>`).join("")}</ul></details>` : ""}`;
  const hosts = hostsLegend(info.hosts, info.hosts_error);
  if (hosts) head.append(hosts);
  const filters = el("div", { class: "filters" });
  const operations = [...new Set((await get<{ requests: RequestRow[] }>("/api/requests")).requests.map((r) => r.operation))].sort();
  filters.append(
    select("service", "Service", info.services),
    select("operation", "Operation", operations),
    select("cause", "Diagnosis", info.causes),
    select("root_cause", "Root cause", info.root_causes ?? []),
    select("anomalous", "Anomalous", ["true", "false"]),
  );
  if (!info.has_diagnosis) filters.append(el("span", { class: "muted" }, "(this analysis has no diagnosis)"));
  head.append(filters);
  app.append(head);
  const table = el("table", { class: "requests", id: "requests" });
  app.append(table);

  const render = async () => {
    const res = await get<{ total: number; requests: RequestRow[] }>("/api/requests", {
      sort: state.sort,
      order: state.order,
      service: state.service,
      operation: state.operation,
      cause: state.cause,
      root_cause: state.root_cause,
      anomalous: state.anomalous,
      limit: 2000,
    });
    const arrow = (k: string) => (state.sort === k ? (state.order === "desc" ? " ▼" : " ▲") : "");
    table.innerHTML = `<thead><tr>
        <th></th><th>Service</th><th>Operation</th>
        <th class="sortable num" data-sort="start">Start${arrow("start")}</th>
        <th class="sortable num" data-sort="duration">Duration${arrow("duration")}</th>
        <th>Top cause</th><th>Diagnosis</th></tr></thead>`;
    const body = el("tbody");
    for (const r of res.requests) {
      const tr = el("tr", { "data-span-id": r.span_id, class: r.anomalous ? "anomalous" : "" });
      // Blocking requests grouped by operation: "blocked by 5 requests of [pricing] GET /price".
      const top = r.cause_groups?.[0] ?? r.causes?.[0];
      const root = r.diagnosis?.root_cause;
      tr.innerHTML = `<td>${r.anomalous ? '<span class="badge" title="well above its operation\'s median">anomalous</span>' : ""}</td>
        <td>${esc(r.service)}</td>
        <td><a href="#/request/${esc(r.span_id)}">${esc(r.operation)}</a></td>
        <td class="num">${fmtNs(r.start_ns - info.start_ns)}</td>
        <td class="num">${fmtNs(r.duration_ns)}${r.baseline_ns ? ` <span class="muted">(median ${fmtNs(r.baseline_ns)})</span>` : ""}${queued(r)}</td>
        <td>${top ? `${esc(top.label)} <span class="muted">${Math.round(top.share * 100)}%</span>` : ""}</td>
        <td>${r.diagnosis ? `<span class="cause">${esc(r.diagnosis.cause)}</span>${root?.chain ? ` → root <span class="cause root" title="${esc(root.chain)}">${esc(root.cause)}</span>` : ""} ${esc(r.diagnosis.headline)}` : ""}</td>`;
      tr.addEventListener("click", (ev) => {
        if ((ev.target as HTMLElement).tagName !== "A") location.hash = `#/request/${r.span_id}`;
      });
      body.append(tr);
    }
    table.append(body);
    table.dataset.rows = String(res.requests.length);
    table.querySelectorAll<HTMLElement>("th.sortable").forEach((th) =>
      th.addEventListener("click", () => {
        const k = th.dataset.sort as ListState["sort"];
        if (state.sort === k) state.order = state.order === "desc" ? "asc" : "desc";
        else {
          state.sort = k;
          state.order = k === "duration" ? "desc" : "asc";
        }
        void render();
      }),
    );
  };

  /** The time it queued at its host before its span started, when it did (≥ 1 µs). */
  function queued(r: RequestRow): string {
    if (!hasQueue(r.queue)) return "";
    return ` <span class="queued" title="${esc(queueLabel(r.queue, fmtNs))} (before its span started)">queued ${fmtNs(r.queue.ns)}</span>`;
  }

  function select(key: keyof ListState, label: string, values: string[]): HTMLElement {
    const box = el("label", {}, `${esc(label)} `);
    const s = el("select", { name: key });
    s.append(el("option", { value: "" }, "all"));
    for (const v of values) {
      const o = el("option", { value: v }, esc(v));
      if (state[key] === v) o.selected = true;
      s.append(o);
    }
    s.addEventListener("change", () => {
      (state as unknown as Record<string, string>)[key] = s.value;
      void render();
    });
    box.append(s);
    return box;
  }

  await render();
}
