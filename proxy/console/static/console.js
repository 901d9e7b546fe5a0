// Talaria operator console: a single page over the admin API (/admin). No build step: this
// file is served as is, with Chart.js (vendor/chart.umd.min.js, MIT) for the charts.
// Views: #/sessions, #/session/<id>, #/nodes, #/replay. docs/console.md describes them.

const main = document.getElementById("main");
const statusLine = document.getElementById("status");
const csrf = document.querySelector('meta[name="csrf-token"]').content;

// Colours: one per KV source and segment kind; model colours for slots. Each is dark or light
// enough against its neighbours to be told apart, and text never sits on them.
const KV_COLOURS = { hbm: "#2e8b57", host: "#e08a00", recompute: "#c0392b", new: "#3b6fc4" };
const KIND_COLOURS = {
  slot_wait: "#7d5ba6",
  queue: "#9aa5b1",
  decode: "#14365d",
  gap: "#d9e2ec",
  reservation: "#c2185b",
  error: "#a4161a",
};
const MODEL_PALETTE = ["#3b6fc4", "#e08a00", "#2e8b57", "#c0392b", "#7d5ba6", "#00838f", "#8d6e63"];
const LIVE_SESSIONS_MS = 2000;
const LIVE_NODES_MS = 1000;
const MAX_CHILD_LANES = 20;

// The page's Content-Security-Policy forbids style attributes in markup; sizes and swatch
// colours are data attributes, applied here through the CSSOM as nodes are added.
function paint(root) {
  root.querySelectorAll("[data-swatch]").forEach((n) => n.style.setProperty("--swatch", n.dataset.swatch));
  root.querySelectorAll("[data-height]").forEach((n) => (n.style.height = `${n.dataset.height}px`));
}
new MutationObserver((records) => {
  for (const r of records) r.addedNodes.forEach((n) => n.nodeType === 1 && paint(n.parentElement || n));
}).observe(main, { childList: true, subtree: true });

let timers = [];
let charts = [];
let viewId = 0; // bumped on every navigation: a load that ends after it is dropped

function current(id) {
  return id === viewId;
}

function stopView() {
  timers.forEach((t) => clearInterval(t));
  timers = [];
  charts.forEach((c) => c.destroy());
  charts = [];
}

function every(ms, fn) {
  const t = setInterval(() => {
    if (!document.hidden) fn();
  }, ms);
  timers.push(t);
}

function say(text) {
  statusLine.textContent = text;
}

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function el(html) {
  const t = document.createElement("template");
  t.innerHTML = html.trim();
  return t.content.firstElementChild;
}

async function api(path, options = {}) {
  const headers = { accept: "application/json", ...(options.headers || {}) };
  if (options.method && options.method !== "GET") headers["x-csrf-token"] = csrf;
  const response = await fetch(path, { credentials: "same-origin", ...options, headers });
  if (response.status === 401) {
    window.location.assign("/console"); // signed out (or the sign-in expired): the form
    throw new Error("signed out");
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const message = body?.error?.message || `${response.status} ${response.statusText}`;
    throw new Error(message);
  }
  return body;
}

function seconds(s) {
  if (s === null || s === undefined || Number.isNaN(s)) return "—";
  if (s !== 0 && Math.abs(s) < 0.1) return `${(s * 1000).toFixed(1)} ms`;
  if (Math.abs(s) >= 3600) return `${(s / 3600).toFixed(1)} h`;
  if (Math.abs(s) >= 60) return `${(s / 60).toFixed(1)} min`;
  if (Math.abs(s) >= 10) return `${s.toFixed(0)} s`;
  return `${s.toFixed(2)} s`;
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "—";
}

function bytes(n) {
  if (!n) return "0 B";
  const units = ["B", "KB", "MB", "GB", "TB"];
  const i = Math.min(units.length - 1, Math.floor(Math.log10(n) / 3));
  return `${(n / 10 ** (3 * i)).toFixed(i ? 1 : 0)} ${units[i]}`;
}

function modelColour(models, name) {
  let i = models.indexOf(name);
  if (i < 0) {
    models.push(name);
    i = models.length - 1;
  }
  return MODEL_PALETTE[i % MODEL_PALETTE.length];
}

// An element built from its parts, never from markup: strings and numbers among the children
// become text nodes, attribute values are set as values. What a page shows from a file (the
// replay view) or from the admin API is text, whatever characters it holds.
function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  node.append(...children.flat().filter((c) => c != null).map((c) => (c instanceof Node ? c : String(c))));
  return node;
}

function legendNode(items) {
  return h("div", { class: "legend" }, items.map(([label, colour]) => h("span", { "data-swatch": colour }, label)));
}

function legend(items) {
  return legendNode(items).outerHTML;
}

function sctSoFar(s) {
  const end = s.ended_at ? new Date(s.ended_at) : s.state === "ended" ? new Date(s.last_call_at) : new Date();
  return (end - new Date(s.started_at)) / 1000;
}

// -- sessions ------------------------------------------------------------------------------

function sessionsView(query) {
  const view = viewId;
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
    <tr data-session="${esc(s.session_id)}">
      <td><a href="#/session/${encodeURIComponent(s.session_id)}">${esc(s.external_id || s.session_id)}</a>
        ${s.parent_session_id ? `<br><small>child of ${esc(s.parent_session_id)}</small>` : ""}</td>
      <td>${esc(s.tenant_id)}</td><td>${esc(s.model)}</td><td>${esc(s.instance ?? "—")}</td>
      <td><span class="badge ${esc(s.state)}">${esc(s.state)}</span></td>
      <td class="num">${s.calls}</td><td class="num">${seconds(sctSoFar(s))}</td>
      <td>${when(s.started_at)}</td>
      <td class="num">${s.prompt_tokens.toLocaleString()} / ${s.cached_tokens.toLocaleString()} / ${s.output_tokens.toLocaleString()}</td>
    </tr>`).join("");
}

// -- one session's timeline ---------------------------------------------------------------

async function sessionView(id) {
  const view = viewId;
  main.innerHTML = `<p>Loading session ${esc(id)}…</p>`;
  let doc;
  try {
    doc = await api(`/admin/sessions/${encodeURIComponent(id)}`);
  } catch (err) {
    if (!current(view)) return;
    main.innerHTML = `<h1>Session ${esc(id)}</h1><p class="error" role="alert">${esc(err.message)}</p>
      <p><a href="#/sessions">All sessions</a></p>`;
    return;
  }
  const children = [];
  for (const child of doc.children.slice(0, MAX_CHILD_LANES)) {
    try {
      children.push(await api(`/admin/sessions/${encodeURIComponent(child.session_id)}`));
    } catch (err) {
      say(`child ${child.session_id}: ${err.message}`);
    }
  }
  if (current(view)) renderSession(doc, children);
}

function renderSession(doc, children) {
  const s = doc.session;
  const calls = doc.calls;
  const totals = { queue: 0, slot: 0, prefill: 0, decode: 0, gaps: 0 };
  for (const c of calls) {
    totals.queue += c.queue_s || 0;
    totals.slot += c.slot_wait_s || 0;
    totals.prefill += c.prefill_s || 0;
    totals.decode += c.decode_s || 0;
  }
  for (const g of doc.tool_gaps) totals.gaps += g.gap_s;
  main.innerHTML = `
    <p><a href="#/sessions">← All sessions</a></p>
    <h1>Session ${esc(s.external_id)} <span class="badge ${esc(s.state)}" id="session-state">${esc(s.state)}</span></h1>
    <dl class="summary">
      <div><dt>Key</dt><dd>${esc(s.session_id)}</dd></div>
      <div><dt>Tenant</dt><dd>${esc(s.tenant_id)}</dd></div>
      <div><dt>Model</dt><dd>${esc(s.model)}</dd></div>
      <div><dt>Calls</dt><dd>${s.calls}</dd></div>
      <div><dt>SCT so far</dt><dd>${seconds(sctSoFar(s))}</dd></div>
      <div><dt>Queued (of which for a slot)</dt><dd>${seconds(totals.queue)} (${seconds(totals.slot)})</dd></div>
      <div><dt>Prefill / decode</dt><dd>${seconds(totals.prefill)} / ${seconds(totals.decode)}</dd></div>
      <div><dt>Tool gaps</dt><dd>${seconds(totals.gaps)}</dd></div>
      <div><dt>Tokens prompt / cached / output</dt><dd>${s.prompt_tokens.toLocaleString()} / ${s.cached_tokens.toLocaleString()} / ${s.output_tokens.toLocaleString()}</dd></div>
      <div><dt>Ended</dt><dd>${s.ended_at ? `${when(s.ended_at)} (${esc(s.end_reason)})` : "—"}</dd></div>
    </dl>
    <div class="toolbar">
      ${s.state !== "ended" ? `<button type="button" class="danger" id="end-session">End session</button>` : ""}
      <span class="error" id="end-error" role="alert"></span>
    </div>
    <h2>Timeline</h2>
    ${legend([
      ["waiting for the model's slot", KIND_COLOURS.slot_wait], ["queued", KIND_COLOURS.queue],
      ["prefill, KV in HBM", KV_COLOURS.hbm], ["prefill, KV restored from host", KV_COLOURS.host],
      ["prefill, KV recomputed", KV_COLOURS.recompute], ["prefill, new session", KV_COLOURS.new],
      ["decode", KIND_COLOURS.decode], ["tool gap", KIND_COLOURS.gap], ["reservation held", KIND_COLOURS.reservation],
      ["failed call", KIND_COLOURS.error],
    ])}
    <div class="toolbar" role="group" aria-label="Zoom the timeline">
      <button type="button" class="secondary" data-zoom="in">Zoom in</button>
      <button type="button" class="secondary" data-zoom="out">Zoom out</button>
      <button type="button" class="secondary" data-zoom="left">← Earlier</button>
      <button type="button" class="secondary" data-zoom="right">Later →</button>
      <button type="button" class="secondary" data-zoom="reset">Whole session</button>
    </div>
    <div class="chart-box" id="timeline-box"><canvas id="timeline" role="img"
      aria-label="Timeline of the session's calls and tool gaps; the table below lists the same calls"></canvas></div>
    <div class="panel" id="call-detail" aria-live="polite"><p>Click a call in the timeline or a row of the table for its details.</p></div>
    <h2>Why it waited</h2>
    <ul class="notes" id="notes"></ul>
    <h2>Calls</h2>
    <table id="calls-table">
      <thead><tr><th scope="col" class="num">#</th><th scope="col">Instance</th><th scope="col">Routing</th>
        <th scope="col">KV source</th><th scope="col" class="num">Queue (slot)</th><th scope="col" class="num">Prefill</th>
        <th scope="col" class="num">Decode</th><th scope="col" class="num">Tokens prompt / cached / output</th>
        <th scope="col">Finish</th><th scope="col" class="num">Tool gap after</th></tr></thead>
      <tbody></tbody>
    </table>`;
  const gapAfter = new Map(doc.tool_gaps.map((g) => [g.after_call, g]));
  const tbody = main.querySelector("#calls-table tbody");
  tbody.innerHTML = calls.map((c, i) => `
    <tr data-call="${i}" tabindex="0">
      <td class="num">${c.call_index}</td><td>${esc(c.instance ?? "—")}</td>
      <td>${esc(c.routing_reason ?? "—")}</td><td>${esc(c.kv_source ?? "—")}</td>
      <td class="num">${seconds(c.queue_s)}${c.slot_wait_s ? ` (${seconds(c.slot_wait_s)})` : ""}</td>
      <td class="num">${seconds(c.prefill_s)}</td><td class="num">${seconds(c.decode_s)}</td>
      <td class="num">${c.prompt_tokens} / ${c.cached_tokens} / ${c.output_tokens}</td>
      <td>${esc(c.status === "ok" ? c.finish_reason : `error: ${c.error ?? ""}`)}</td>
      <td class="num">${gapAfter.has(c.call_index) ? seconds(gapAfter.get(c.call_index).gap_s) : "—"}</td>
    </tr>`).join("");
  tbody.addEventListener("click", (e) => {
    const row = e.target.closest("tr[data-call]");
    if (row) showCall(doc, calls[Number(row.dataset.call)], true);
  });
  tbody.addEventListener("keydown", (e) => {
    const row = e.target.closest("tr[data-call]");
    if (row && (e.key === "Enter" || e.key === " ")) {
      e.preventDefault();
      showCall(doc, calls[Number(row.dataset.call)], true);
    }
  });
  document.getElementById("notes").innerHTML = waitNotes(doc).map((n) => `<li>${esc(n)}</li>`).join("") ||
    "<li>No call waited long enough to note (a second, or a tenth of the session).</li>";
  const end = document.getElementById("end-session");
  if (end) end.addEventListener("click", () => endSession(s.session_id));
  drawTimeline(doc, children);
}

// A wait is worth a note from a second on, or from a tenth of the session's time so far (so
// that a session on a fast simulated clock still gets its notes).
const WAIT_NOTE_S = 1.0;
const WAIT_NOTE_FRACTION = 0.1;

function waitNotes(doc) {
  const notes = [];
  const least = Math.max(0.01, Math.min(WAIT_NOTE_S, WAIT_NOTE_FRACTION * sctSoFar(doc.session)));
  for (const c of doc.calls) {
    const where = c.instance ? ` on ${c.instance}` : "";
    const slot = c.slot_wait_s || 0;
    if (slot >= least) notes.push(`Call ${c.call_index} waited ${seconds(slot)} for ${c.model}'s next slot${where}.`);
    const rest = (c.queue_s || 0) - slot;
    if (rest >= least) notes.push(`Call ${c.call_index} queued ${seconds(rest)}${where} while ${c.model} served: no room yet (batch or KV memory).`);
    if (c.kv_source === "host") notes.push(`Call ${c.call_index}: KV restored from host; prefill with the restore took ${seconds(c.prefill_s)}.`);
    if (c.kv_source === "recompute") notes.push(`Call ${c.call_index}: its KV was gone and ${c.prompt_tokens - c.cached_tokens} prompt tokens were recomputed (prefill ${seconds(c.prefill_s)}).`);
    if (c.status !== "ok") notes.push(`Call ${c.call_index} failed: ${c.error ?? "error"}.`);
  }
  return notes;
}

function showCall(doc, call, scroll) {
  const box = document.getElementById("call-detail");
  if (!box || !call) return;
  const scores = call.routing_scores || {};
  const names = Object.keys(scores);
  const terms = [...new Set(names.flatMap((n) => Object.keys(scores[n])))];
  const scoreTable = names.length
    ? `<table><thead><tr><th scope="col">Instance</th>${terms.map((t) => `<th scope="col" class="num">${esc(t)}</th>`).join("")}</tr></thead>
       <tbody>${names.map((n) => `<tr><td>${esc(n)}</td>${terms.map((t) => `<td class="num">${scores[n][t] !== undefined ? Number(scores[n][t]).toFixed(3) : ""}</td>`).join("")}</tr>`).join("")}</tbody></table>`
    : "<p>No scores recorded.</p>";
  box.innerHTML = `
    <h2>Call ${call.call_index} <small>${esc(call.request_id)}</small></h2>
    <dl class="summary">
      <div><dt>Model / instance</dt><dd>${esc(call.model)} / ${esc(call.instance ?? "—")}</dd></div>
      <div><dt>API</dt><dd>${esc(call.api ?? "—")}${call.stream ? " (stream)" : ""}</dd></div>
      <div><dt>Arrived</dt><dd>${when(call.arrived_at)}</dd></div>
      <div><dt>Queue (slot wait)</dt><dd>${seconds(call.queue_s)} (${seconds(call.slot_wait_s || 0)})</dd></div>
      <div><dt>Prefill / decode</dt><dd>${seconds(call.prefill_s)} / ${seconds(call.decode_s)}</dd></div>
      <div><dt>KV source</dt><dd>${esc(call.kv_source ?? "—")}</dd></div>
      <div><dt>Tokens prompt / cached / output</dt><dd>${call.prompt_tokens} / ${call.cached_tokens} / ${call.output_tokens}</dd></div>
      <div><dt>Finish</dt><dd>${esc(call.status === "ok" ? call.finish_reason : `error: ${call.error ?? ""}`)}</dd></div>
      <div><dt>Tool gap hint</dt><dd>${call.tool_gap_hint_s != null ? seconds(call.tool_gap_hint_s) : "—"}</dd></div>
      <div><dt>Router / reason</dt><dd>${esc(call.router ?? "—")} / ${esc(call.routing_reason ?? "—")}</dd></div>
    </dl>
    <h3>Routing scores</h3>${scoreTable}`;
  if (scroll) box.scrollIntoView({ block: "nearest" });
}

function segmentsOf(doc, lane, t0) {
  // One floating bar per segment: [start, end] in seconds since t0, on the session's lane.
  const out = [];
  const at = (iso) => (new Date(iso) - t0) / 1000;
  doc.calls.forEach((c, i) => {
    const a = at(c.arrived_at);
    const ref = { doc, call: c };
    if (c.status !== "ok" || c.queue_s == null || c.prefill_s == null || c.decode_s == null) {
      const e = c.finished_at ? at(c.finished_at) : a;
      out.push({ kind: "error", x: [a, Math.max(e, a + 0.05)], y: lane, ref });
      return;
    }
    const slot = Math.min(c.slot_wait_s || 0, c.queue_s);
    if (slot > 0) out.push({ kind: "slot_wait", x: [a, a + slot], y: lane, ref });
    if (c.queue_s > slot) out.push({ kind: "queue", x: [a + slot, a + c.queue_s], y: lane, ref });
    const p0 = a + c.queue_s;
    out.push({ kind: `kv_${c.kv_source || "new"}`, x: [p0, p0 + c.prefill_s], y: lane, ref });
    out.push({ kind: "decode", x: [p0 + c.prefill_s, p0 + c.prefill_s + c.decode_s], y: lane, ref });
  });
  doc.calls.forEach((c, i) => {
    const next = doc.calls[i + 1];
    if (next && c.finished_at) {
      const gap = doc.tool_gaps.find((g) => g.after_call === c.call_index);
      out.push({ kind: "gap", x: [at(c.finished_at), at(next.arrived_at)], y: lane, ref: { doc, gap } });
    }
  });
  for (const r of doc.reservations) {
    const end = r.released_at || r.expires_at;
    out.push({ kind: "reservation", x: [at(r.created_at), at(end)], y: lane, ref: { doc, reservation: r } });
  }
  return out;
}

const SEGMENT_STYLE = {
  slot_wait: ["waiting for the model's slot", KIND_COLOURS.slot_wait, 0.7],
  queue: ["queued", KIND_COLOURS.queue, 0.7],
  kv_hbm: ["prefill (KV in HBM)", KV_COLOURS.hbm, 0.7],
  kv_host: ["prefill (KV restored from host)", KV_COLOURS.host, 0.7],
  kv_recompute: ["prefill (KV recomputed)", KV_COLOURS.recompute, 0.7],
  kv_new: ["prefill (new session)", KV_COLOURS.new, 0.7],
  decode: ["decode", KIND_COLOURS.decode, 0.7],
  gap: ["tool gap", KIND_COLOURS.gap, 0.45],
  reservation: ["reservation held", KIND_COLOURS.reservation, 0.12],
  error: ["failed call", KIND_COLOURS.error, 0.7],
};

function segmentLabel(s) {
  const lines = [`${SEGMENT_STYLE[s.kind][0]}: ${seconds(s.x[1] - s.x[0])}`];
  const gap = s.ref.gap;
  if (gap) {
    const tools = gap.hints.map((h) => h.tool).filter(Boolean);
    if (gap.hinted_s != null) lines.push(`hinted: ${seconds(gap.hinted_s)}`);
    if (tools.length) lines.push(`tool: ${tools.join(", ")}`);
  }
  const r = s.ref.reservation;
  if (r) lines.push(`${bytes(r.held_bytes)} on ${r.instance}${r.release_reason ? `, ${r.release_reason}` : ""}`);
  return lines;
}

function drawTimeline(doc, children) {
  const docs = [doc, ...children];
  const t0 = new Date(Math.min(...docs.map((d) => new Date(d.session.started_at).getTime())));
  const lanes = docs.map((d, i) => (i === 0 ? `session ${d.session.external_id}` : `child ${d.session.external_id}`));
  const segments = docs.flatMap((d, i) => segmentsOf(d, lanes[i], t0));
  const kinds = Object.keys(SEGMENT_STYLE);
  const datasets = kinds.map((kind) => ({
    label: SEGMENT_STYLE[kind][0],
    data: segments.filter((s) => s.kind === kind),
    backgroundColor: SEGMENT_STYLE[kind][1],
    barPercentage: SEGMENT_STYLE[kind][2] / 0.8,
    categoryPercentage: 0.8,
    grouped: false,
    borderWidth: 0,
    minBarLength: 2,
  })).filter((d) => d.data.length);
  // the gaps first, under everything; reservations last, on top
  datasets.sort((a, b) => (a.label === "tool gap" ? -1 : b.label === "tool gap" ? 1 : 0));
  const ends = segments.map((s) => s.x[1]);
  const last = Math.max(0.001, ...ends);
  const full = { min: 0, max: last * 1.02 };
  const box = document.getElementById("timeline-box");
  box.style.height = `${Math.max(140, 70 * lanes.length + 70)}px`;
  const drawnCalls = new Set(segments.filter((s) => s.ref.call).map((s) => `${s.ref.doc.session.session_id}/${s.ref.call.request_id}`));
  box.dataset.calls = String(drawnCalls.size);
  box.dataset.mainCalls = String(new Set(segments.filter((s) => s.ref.call && s.ref.doc === doc).map((s) => s.ref.call.request_id)).size);
  const chart = new Chart(document.getElementById("timeline"), {
    type: "bar",
    data: { labels: lanes, datasets },
    options: {
      indexAxis: "y",
      animation: false,
      responsive: true,
      maintainAspectRatio: false,
      parsing: { xAxisKey: "x", yAxisKey: "y" },
      scales: {
        x: { type: "linear", min: full.min, max: full.max, title: { display: true, text: "seconds since the session started" } },
        y: { type: "category", labels: lanes },
      },
      plugins: {
        legend: { display: false },
        tooltip: {
          callbacks: {
            title: (items) => {
              const s = items[0].raw;
              return s.ref.call ? `call ${s.ref.call.call_index}` : SEGMENT_STYLE[s.kind][0];
            },
            label: (item) => segmentLabel(item.raw),
          },
        },
      },
      onClick: (event, elements) => {
        const hit = elements.find((e) => chart.data.datasets[e.datasetIndex].data[e.index].ref.call);
        if (hit) {
          const s = chart.data.datasets[hit.datasetIndex].data[hit.index];
          showCall(s.ref.doc, s.ref.call, false);
        }
      },
    },
  });
  charts.push(chart);
  main.querySelectorAll("[data-zoom]").forEach((b) => b.addEventListener("click", () => {
    const x = chart.options.scales.x;
    const span = x.max - x.min;
    const mid = (x.min + x.max) / 2;
    const action = b.dataset.zoom;
    if (action === "reset") Object.assign(x, full);
    else if (action === "in") Object.assign(x, { min: mid - span / 4, max: mid + span / 4 });
    else if (action === "out") Object.assign(x, { min: Math.max(full.min, mid - span), max: Math.min(full.max, mid + span) });
    else {
      const shift = (action === "left" ? -1 : 1) * span / 2;
      Object.assign(x, { min: x.min + shift, max: x.max + shift });
    }
    chart.update("none");
  }));
}

async function endSession(id) {
  const button = document.getElementById("end-session");
  button.disabled = true;
  try {
    await api(`/admin/sessions/${encodeURIComponent(id)}/end`, { method: "POST" });
    say(`Session ${id} ended.`);
    stopView();
    await sessionView(id);
  } catch (err) {
    const shown = document.getElementById("end-error");
    if (shown) shown.textContent = err.message;
    button.disabled = false;
  }
}

// -- nodes ---------------------------------------------------------------------------------

function nodesView() {
  main.innerHTML = `<h1>Nodes <span class="live">● live</span></h1><div class="cards" id="cards"></div>`;
  const cards = new Map();
  const models = [];
  const view = viewId;
  async function load() {
    let doc;
    try {
      doc = await api("/admin/instances");
    } catch (err) {
      if (current(view)) say(`Nodes: ${err.message}`);
      return;
    }
    if (!current(view)) return;
    for (const inst of doc.data) {
      if (!cards.has(inst.name)) cards.set(inst.name, nodeCard(inst.name));
      updateNode(cards.get(inst.name), inst, models);
    }
    say(`Nodes updated ${new Date().toLocaleTimeString()}`);
  }
  load();
  every(LIVE_NODES_MS, load);
}

function nodeCard(name) {
  const card = el(`
    <section class="card" data-instance="${esc(name)}" aria-labelledby="n-${esc(name)}">
      <h2 id="n-${esc(name)}">${esc(name)}</h2>
      <p class="error" role="alert" data-part="error"></p>
      <dl class="summary">
        <div><dt>Active model</dt><dd data-part="active"></dd></div>
        <div><dt>Waiting / running calls</dt><dd data-part="calls"></dd></div>
        <div><dt>Reserved sessions</dt><dd data-part="reserved"></dd></div>
      </dl>
      <h3>KV cache</h3>
      <div class="meter" role="meter" aria-label="KV memory used in HBM" aria-valuemin="0" aria-valuemax="100" data-part="kv-meter"><div></div></div>
      <p data-part="kv"></p>
      <h3>Models</h3>
      <table><thead><tr><th scope="col">Model</th><th scope="col">State</th><th scope="col" class="num">Waiting</th>
        <th scope="col" class="num">Next slot in</th><th scope="col" class="num">Switch</th><th scope="col" class="num">KV HBM / host tokens</th></tr></thead>
        <tbody data-part="models"></tbody></table>
      <h3>Slots</h3>
      <div data-part="slot-legend"></div>
      <div class="chart-box" data-height="110"><canvas role="img" aria-label="Recent model slots on ${esc(name)}; switches are the faded parts"></canvas></div>
      <details><summary>Reservations</summary><table><thead><tr><th scope="col">Session</th><th scope="col" class="num">Held</th></tr></thead><tbody data-part="reservations"></tbody></table></details>
    </section>`);
  document.getElementById("cards").append(card);
  return card;
}

function updateNode(card, inst, models) {
  const part = (name) => card.querySelector(`[data-part="${name}"]`);
  part("error").textContent = inst.error ? `unreachable: ${inst.error}` : "";
  if (inst.error) return;
  card.dataset.activeModel = inst.active_model ?? "";
  part("active").textContent = inst.active_model ?? "none";
  part("calls").textContent = `${inst.waiting_calls} / ${inst.running_calls}`;
  const reserved = Object.entries(inst.reserved || {});
  part("reserved").textContent = `${reserved.length} (${bytes(reserved.reduce((a, [, b]) => a + b, 0))})`;
  part("reservations").innerHTML = reserved.map(([sid, b]) => `<tr><td><a href="#/session/${encodeURIComponent(sid)}">${esc(sid)}</a></td><td class="num">${bytes(b)}</td></tr>`).join("") ||
    `<tr><td colspan="2">none</td></tr>`;
  const used = Math.round(100 * (inst.kv_utilization || 0));
  const meter = part("kv-meter");
  meter.setAttribute("aria-valuenow", String(used));
  meter.firstElementChild.style.width = `${used}%`;
  const kv = inst.kv_tokens || {};
  const hbm = Object.values(kv).reduce((a, t) => a + (t.hbm || 0), 0);
  const host = Object.values(kv).reduce((a, t) => a + (t.host || 0), 0);
  part("kv").textContent = `HBM ${used}% used by KV · ${hbm.toLocaleString()} tokens in HBM, ${host.toLocaleString()} in the host tier · ${inst.sessions_with_kv} sessions`;
  part("models").innerHTML = Object.values(inst.residency || {}).map((m) => `
    <tr data-model="${esc(m.model)}"><td>${esc(m.model)}</td>
      <td>${esc(m.state)}${m.state === "staged" ? ` ${Math.round(100 * m.staged_fraction)}%` : ""}</td>
      <td class="num">${m.waiting_calls ?? "—"}</td><td class="num">${seconds(m.next_slot_in_s)}</td>
      <td class="num">${seconds(m.switch_s)}</td>
      <td class="num">${(kv[m.model]?.hbm || 0).toLocaleString()} / ${(kv[m.model]?.host || 0).toLocaleString()}</td></tr>`).join("");
  drawSlots(card, inst, models);
}

function slotBars(slots, nowS, lane, models) {
  // A slot is its switch (faded) then its serving time, in seconds relative to now.
  const bars = [];
  for (const s of slots) {
    const colour = modelColour(models, s.model);
    const start = s.start_s - nowS;
    const serving = start + s.switch_s;
    const end = (s.end_s ?? nowS) - nowS;
    if (s.switch_s > 0) bars.push({ x: [start, serving], y: lane, slot: s, part: "switch", colour: `${colour}66` });
    if (end > serving) bars.push({ x: [serving, end], y: lane, slot: s, part: "serving", colour });
  }
  return bars;
}

function drawSlots(card, inst, models) {
  const slots = inst.recent_slots || [];
  const bars = slotBars(slots, inst.now_s, "slots", models);
  const used = [...new Set(slots.map((s) => s.model))];
  part(card, "slot-legend").replaceChildren(legendNode([...used.map((m) => [m, modelColour(models, m)]), ["switch (faded)", "#9aa5b1"]]));
  card.dataset.slots = String(slots.length);
  const minX = Math.min(-60, ...bars.map((b) => b.x[0]));
  let chart = card._chart;
  if (!chart) {
    chart = new Chart(card.querySelector("canvas"), {
      type: "bar",
      data: { labels: ["slots"], datasets: [{ data: bars, grouped: false, borderWidth: 0, minBarLength: 2, backgroundColor: (c) => c.raw?.colour }] },
      options: {
        indexAxis: "y", animation: false, responsive: true, maintainAspectRatio: false,
        parsing: { xAxisKey: "x", yAxisKey: "y" },
        scales: { x: { type: "linear", min: minX, max: 0, title: { display: true, text: "seconds before now (node clock)" } }, y: { display: false } },
        plugins: {
          legend: { display: false },
          tooltip: { callbacks: { label: (item) => `${item.raw.slot.model} ${item.raw.part}: ${seconds(item.raw.x[1] - item.raw.x[0])}` } },
        },
      },
    });
    card._chart = chart;
    charts.push(chart);
  } else {
    chart.data.datasets[0].data = bars;
    chart.options.scales.x.min = minX;
    chart.update("none");
  }
}

function part(card, name) {
  return card.querySelector(`[data-part="${name}"]`);
}

// -- replay results ------------------------------------------------------------------------

function replayView() {
  main.innerHTML = `
    <h1>Replay results</h1>
    <p>Open the document written by <code>talaria replay --json PATH</code>. It is read in this
    browser only; nothing is uploaded.</p>
    <label for="replay-file">Results document (JSON)</label>
    <input id="replay-file" type="file" accept="application/json,.json">
    <p class="error" role="alert" id="replay-error"></p>
    <div id="replay"></div>`;
  document.getElementById("replay-file").addEventListener("change", async (e) => {
    const file = e.target.files[0];
    if (!file) return;
    try {
      const doc = JSON.parse(await file.text());
      if (!doc.policies) throw new Error("not a talaria replay document (no \"policies\")");
      document.getElementById("replay-error").textContent = "";
      charts.forEach((c) => c.destroy());
      charts = [];
      renderReplay(doc, file.name);
    } catch (err) {
      document.getElementById("replay-error").textContent = `Cannot open ${file.name}: ${err.message}`;
    }
  });
}

const REFERENCES = { oracle: [6, 3], dedicated: [2, 2] };

// The document is a local file, anyone's: everything in it is shown as text (h()).
function renderReplay(doc, name) {
  const box = document.getElementById("replay");
  const rows = Object.entries(doc.policies);
  for (const ref of Object.keys(REFERENCES)) if (doc[ref]) rows.push([ref, doc[ref]]);
  const about = `${doc.preset ? `preset ${doc.preset}` : ""}${doc.seed != null ? `, seed ${doc.seed}` : ""}${doc.trace ? `trace ${doc.trace}` : ""}`;
  const num = (text) => h("td", { class: "num" }, text);
  const heads = ["p50 SCT", "p95 SCT", "Mean SCT", "Switches"].map((t) => h("th", { scope: "col", class: "num" }, t));
  box.replaceChildren(
    h("h2", {}, name),
    h("p", {}, `${about} · ${doc.sessions} sessions, ${doc.calls} calls`),
    h("table", { id: "replay-table" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Policy"), heads)),
      h("tbody", {}, rows.map(([p, s]) => h("tr", {}, h("td", {}, p), num(seconds(s.p50_sct_s)), num(seconds(s.p95_sct_s)),
        num(seconds(s.mean_sct_s)), num(s.switches ?? "—"))))),
    h("h2", {}, "Session completion time (CDF)"),
    h("div", { class: "chart-box", "data-height": 380 },
      h("canvas", { id: "cdf", role: "img", "aria-label": "CDF of session completion time per policy; the table above gives p50 and p95" })),
    h("div", { id: "timelines" }));
  const curves = rows.map(([p, s], i) => {
    const xs = Object.values(s.sct_s || {}).map(Number).sort((a, b) => a - b);
    return {
      label: `${p} (p50 ${seconds(s.p50_sct_s)})`,
      data: xs.map((x, j) => ({ x, y: (j + 1) / xs.length })),
      borderColor: MODEL_PALETTE[i % MODEL_PALETTE.length],
      backgroundColor: MODEL_PALETTE[i % MODEL_PALETTE.length],
      borderDash: REFERENCES[p] || [],
      borderWidth: p === "talaria" || p === "round" ? 3 : 1.5,
      pointRadius: 0,
      stepped: "before",
    };
  });
  const all = curves.flatMap((c) => c.data.map((d) => d.x)).filter((x) => x > 0);
  const logScale = all.length && Math.max(...all) / Math.min(...all) > 20;
  charts.push(new Chart(document.getElementById("cdf"), {
    type: "line",
    data: { datasets: curves },
    options: {
      animation: false, responsive: true, maintainAspectRatio: false, parsing: false,
      scales: {
        x: { type: logScale ? "logarithmic" : "linear", title: { display: true, text: "session completion time (s)" } },
        y: { min: 0, max: 1, title: { display: true, text: "fraction of sessions" } },
      },
      plugins: { legend: { position: "bottom" } },
    },
  }));
  document.getElementById("cdf").parentElement.dataset.curves = String(curves.length);
  const models = [];
  const holder = document.getElementById("timelines");
  for (const [p, s] of Object.entries(doc.policies)) {
    if (!s.timeline?.length) continue;
    const nodes = [...new Set(s.timeline.map((t) => String(t.node)))];
    const bars = nodes.flatMap((n) => slotBars(s.timeline.filter((t) => String(t.node) === n), 0, n, models));
    const switching = s.timeline.reduce((a, t) => a + t.switch_s, 0);
    const section = h("section", {},
      h("h2", {}, `${p}: ${s.timeline.length} model slots, ${seconds(switching)} switching`),
      legendNode([...new Set(s.timeline.map((t) => t.model))].map((m) => [m, modelColour(models, m)]).concat([["switch (faded)", "#9aa5b1"]])),
      h("div", { class: "chart-box", "data-height": 60 + 40 * nodes.length }, h("canvas", { role: "img", "aria-label": `Model slots of ${p} per node` })));
    holder.append(section);
    charts.push(new Chart(section.querySelector("canvas"), {
      type: "bar",
      data: { labels: nodes, datasets: [{ data: bars, grouped: false, borderWidth: 0, minBarLength: 1, backgroundColor: (c) => c.raw?.colour }] },
      options: {
        indexAxis: "y", animation: false, responsive: true, maintainAspectRatio: false,
        parsing: { xAxisKey: "x", yAxisKey: "y" },
        scales: { x: { type: "linear", min: 0, title: { display: true, text: "time (s)" } } },
        plugins: {
          legend: { display: false },
          tooltip: { callbacks: { label: (item) => `${item.raw.slot.model} ${item.raw.part}: ${seconds(item.raw.x[1] - item.raw.x[0])}` } },
        },
      },
    }));
  }
}

// -- routing -------------------------------------------------------------------------------

function route() {
  stopView();
  viewId += 1;
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
