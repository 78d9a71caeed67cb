// deepspan's web UI: a hash router over four views; over a folder of agent snapshots, the snapshot
// list at / and each snapshot's views under /s/<id>/.

import "./style.css";
import { run, snapshotId } from "./api";
import { esc } from "./format";
import { listView } from "./list";
import { requestView } from "./request";
import { snapshotsView } from "./snapshots";
import { concurrentView, resourcesView } from "./views";

const app = document.getElementById("app")!;

async function route(): Promise<void> {
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(query ?? "");
  const parts = (path || "/").split("/").filter(Boolean);
  document.getElementById("tooltip")!.hidden = true;
  app.dataset.view = parts[0] ?? "list";
  app.innerHTML = '<p class="muted">loading…</p>';
  try {
    if ((await run()).kind === "snapshots") {
      app.dataset.view = "snapshots";
      await snapshotsView(app);
    } else if (parts[0] === "request" && parts[1]) await requestView(app, decodeURIComponent(parts[1]));
    else if (parts[0] === "concurrent") await concurrentView(app, params);
    else if (parts[0] === "resources") await resourcesView(app, params);
    else await listView(app);
  } catch (e) {
    app.innerHTML = `<p class="error">${esc(e instanceof Error ? e.message : e)}</p>`;
  }
}

run()
  .then((info) => {
    const name = document.getElementById("run-name")!;
    const snapshot = snapshotId();
    name.textContent = snapshot === null ? info.run : `snapshot ${snapshot}`;
    if (info.hosts?.length) name.textContent += ` · merged run of ${info.hosts.length} hosts`;
    // A snapshot's pages link back to the list; the list has no run views.
    document.getElementById("snapshots-link")!.hidden = snapshot === null;
    if (info.kind === "snapshots") document.querySelector<HTMLElement>("#top nav")!.hidden = true;
  })
  .catch(() => {});
window.addEventListener("hashchange", () => void route());
void route();
