// One session's view (#/session/<id>): its summary, the timeline, why its calls waited, the
// table of its calls, and the button that ends it.

import { KIND_COLOURS, KV_COLOURS, api, current, esc, legend, main, say, sctSoFar, seconds, stopView, thisView, when } from "./common.js";
import { drawTimeline, showCall } from "./timeline.js";

const MAX_CHILD_LANES = 20;

/** Load session ``id`` and its first child sessions, then draw them. */
export async function sessionView(id) {
  const view = thisView();
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
      children.push(await api(`/admin/sessions/${encodeURIComponent(child.session_key)}`));
    } catch (err) {
      say(`child ${child.session_key}: ${err.message}`);
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
    <h1>Session ${esc(s.session_id)} <span class="badge ${esc(s.state)}" id="session-state">${esc(s.state)}</span></h1>
    <dl class="summary">
      <div><dt>Key</dt><dd>${esc(s.session_key)}</dd></div>
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
  if (end) end.addEventListener("click", () => endSession(s.session_key));
  drawTimeline(doc, children);
}

// A wait is worth a note from a second on, or from a tenth of the session's time up to its
// last call (so that a session on a fast simulated clock still gets its notes). Up to its last
// call, not up to now: a note must not vanish while the session sits in a tool gap.
const WAIT_NOTE_S = 1.0;
const WAIT_NOTE_FRACTION = 0.1;

function callsSpanS(s) {
  return (new Date(s.last_call_at) - new Date(s.started_at)) / 1000;
}

function waitNotes(doc) {
  const notes = [];
  const least = Math.max(0.01, Math.min(WAIT_NOTE_S, WAIT_NOTE_FRACTION * callsSpanS(doc.session)));
  for (const c of doc.calls) {
    const where = c.instance ? ` on ${c.instance}` : "";
    const slot = c.slot_wait_s || 0;
    if (slot >= least) notes.push(`Call ${c.call_index} waited ${seconds(slot)} for ${c.model}'s next slot${where}.`);
    const rest = (c.queue_s || 0) - slot;
    if (rest >= least) notes.push(`Call ${c.call_index} queued ${seconds(rest)}${where} while ${c.model} served: no room yet (batch or KV memory).`);
    if (c.kv_source === "host") notes.push(`Call ${c.call_index}: KV restored from host; prefill with the restore took ${seconds(c.prefill_s)}.`);
    if (c.kv_source === "recompute") notes.push(`Call ${c.call_index}: its KV was gone and ${c.prompt_tokens - c.cached_tokens} prompt tokens were recomputed (prefill ${seconds(c.prefill_s)}).`);
    if (c.how === "drifted") notes.push(`Call ${c.call_index}: prefix changed at message ${c.drift_at}: ${c.cached_tokens.toLocaleString()} of ${c.prompt_tokens.toLocaleString()} tokens reused (the client rewrote that message: a volatile line in its system prompt, or a re-rendered tool result).`);
    if (c.status !== "ok") notes.push(`Call ${c.call_index} failed: ${c.error ?? "error"}.`);
  }
  return notes;
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
