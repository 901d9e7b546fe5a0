// The sessions view (#/sessions?filters): the filter form and the live, paged table.

import { api, current, esc, every, main, say, sctSoFar, seconds, thisView, when } from "./common.js";

const LIVE_SESSIONS_MS = 2000;

/** Draw the sessions view for the filters in ``query`` (a URL query string). */
export function sessionsView(query) {
  const view = thisView();
  const f = new URLSearchParams(query);
  main.innerHTML = `
    <h1>Sessions <span class="live" id="live"></span></h1>
    <form class="filters" id="filters">
      <div><label for="f-state">State</label>
        <select id="f-state" name="state">
          <option value="">any</option><option>active</option><option>in_tool</option><option>ended</option>
        </select></div>
      <div><label for="f-model">Model</label><input id="f-model" name="model" list="models" size="16"></div>
      <datalist id="models"></datalist>
      <div><label for="f-tenant">Tenant (id or name)</label><input id="f-tenant" name="tenant" size="14"></div>
      <div><label for="f-after">Started after</label><input id="f-after" name="started_after" type="datetime-local"></div>
      <div><label for="f-before">Started before</label><input id="f-before" name="started_before" type="datetime-local"></div>
      <button type="submit">Filter</button>
      <button type="button" class="secondary" id="f-clear">Clear</button>
    </form>
    <table aria-describedby="sessions-caption">
      <caption id="sessions-caption" class="visually-hidden">Sessions, newest first</caption>
      <thead><tr><th scope="col">Session</th><th scope="col">Tenant</th><th scope="col">Model</th>
        <th scope="col">Instance</th><th scope="col">State</th><th scope="col" class="num">Calls</th>
        <th scope="col" class="num">SCT so far</th><th scope="col">Started</th>
        <th scope="col" class="num">Tokens (prompt / cached / output)</th></tr></thead>
      <tbody id="sessions"></tbody>
    </table>
    <div class="pager">
      <button type="button" class="secondary" id="prev" disabled>Newer</button>
      <button type="button" class="secondary" id="next" disabled>Older</button>
      <span id="page-label"></span>
    </div>`;
  const form = document.getElementById("filters");
  for (const name of ["state", "model", "tenant"]) form.elements[name].value = f.get(name) || "";
  for (const name of ["started_after", "started_before"]) {
    const v = f.get(name);
    if (v) form.elements[name].value = toLocalInput(v);
  }
  api("/admin/instances").then((doc) => {
    if (!current(view)) return;
    const models = new Set(doc.data.flatMap((i) => i.models || []));
    document.getElementById("models").innerHTML = [...models].map((m) => `<option value="${esc(m)}">`).join("");
  }).catch(() => {});

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const name of ["state", "model", "tenant"]) if (form.elements[name].value) q.set(name, form.elements[name].value.trim());
    for (const name of ["started_after", "started_before"]) {
      const v = form.elements[name].value;
      if (v) q.set(name, new Date(v).toISOString());
    }
    window.location.hash = `#/sessions?${q}`;
  });
  document.getElementById("f-clear").addEventListener("click", () => (window.location.hash = "#/sessions"));

  const cursors = [null];
  let page = 0;
  async function load() {
    const q = new URLSearchParams(f);
    q.set("limit", "50");
    if (cursors[page]) q.set("cursor", cursors[page]);
    let doc;
    try {
      doc = await api(`/admin/sessions?${q}`);
    } catch (err) {
      if (current(view)) say(`Sessions: ${err.message}`);
      return;
    }
    if (!current(view)) return;
    cursors[page + 1] = doc.next_cursor;
    renderRows(doc.data);
    document.getElementById("prev").disabled = page === 0;
    document.getElementById("next").disabled = !doc.next_cursor;
    document.getElementById("page-label").textContent = `page ${page + 1}`;
    document.getElementById("live").textContent = page === 0 ? "● live" : "";
    say(`Sessions updated ${new Date().toLocaleTimeString()}`);
  }
  document.getElementById("prev").addEventListener("click", () => { page -= 1; load(); });
  document.getElementById("next").addEventListener("click", () => { page += 1; load(); });
  load();
  every(LIVE_SESSIONS_MS, () => { if (page === 0) load(); });
}

function toLocalInput(iso) {
  const d = new Date(iso);
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

function renderRows(sessions) {
  const body = document.getElementById("sessions");
  if (!body) return;
  if (!sessions.length) {
    body.innerHTML = `<tr><td colspan="9">No sessions match.</td></tr>`;
    return;
  }
  body.innerHTML = sessions.map((s) => `
    <tr data-session="${esc(s.session_key)}">
      <td><a href="#/session/${encodeURIComponent(s.session_key)}">${esc(s.session_id || s.session_key)}</a>
        ${s.parent_session_key ? `<br><small>child of ${esc(s.parent_session_key)}</small>` : ""}
        ${s.children ? `<br><small>${s.children} sub-agent session${s.children > 1 ? "s" : ""}: ${s.family.calls} calls in all</small>` : ""}</td>
      <td>${esc(s.tenant_id)}</td><td>${esc(s.model)}</td><td>${esc(s.instance ?? "—")}</td>
      <td><span class="badge ${esc(s.state)}">${esc(s.state)}</span></td>
      <td class="num">${s.calls}</td><td class="num">${seconds(sctSoFar(s))}</td>
      <td>${when(s.started_at)}</td>
      <td class="num">${s.prompt_tokens.toLocaleString()} / ${s.cached_tokens.toLocaleString()} / ${s.output_tokens.toLocaleString()}</td>
    </tr>`).join("");
}
