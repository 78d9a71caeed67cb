// deepspan's web UI: a hash router over four views.

import "./style.css";
import { run } from "./api";
import { esc } from "./format";
import { listView } from "./list";
import { requestView } from "./request";
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
    if (parts[0] === "request" && parts[1]) await requestView(app, decodeURIComponent(parts[1]));
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
    name.textContent = info.run;
  })
  .catch(() => {});
window.addEventListener("hashchange", () => void route());
void route();
