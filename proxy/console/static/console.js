// Talaria operator console: a single page over the admin API (/admin). No build step: these
// ES modules are served as they are, with Chart.js (vendor/chart.umd.min.js, MIT) for the charts.
// Views: #/sessions (sessions.js), #/session/<id> (session.js, timeline.js), #/nodes (nodes.js),
// #/replay (replay.js); common.js holds what they share. docs/console.md describes them.

import { main, nextView, say } from "./common.js";
import { nodesView } from "./nodes.js";
import { replayView } from "./replay.js";
import { sessionView } from "./session.js";
import { sessionsView } from "./sessions.js";

/** Draw the view that the location's hash names (the sessions view by default). */
function route() {
  nextView();
  say("");
  const hash = window.location.hash || "#/sessions";
  const [path, query] = hash.slice(1).split("?");
  const parts = path.split("/").filter(Boolean);
  const view = parts[0] || "sessions";
  document.querySelectorAll("nav a").forEach((a) => {
    if (a.dataset.view === (view === "session" ? "sessions" : view)) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  });
  if (view === "session" && parts[1]) sessionView(decodeURIComponent(parts.slice(1).join("/")));
  else if (view === "nodes") nodesView();
  else if (view === "replay") replayView();
  else sessionsView(query || "");
  main.focus({ preventScroll: true });
}

window.addEventListener("hashchange", route);
route();
