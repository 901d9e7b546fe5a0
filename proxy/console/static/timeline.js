// The timeline of one session's view: a floating bar per call phase, tool gap and reservation,
// one lane per thread of the session (its conversations), then one per child; and the call detail panel.

import { KIND_COLOURS, KV_COLOURS, bytes, esc, keepChart, main, seconds, when } from "./common.js";

/** Show ``call`` of ``doc`` in the call detail panel (scrolled into view when ``scroll``). */
export function showCall(doc, call, scroll) {
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

function segmentsOf(doc, laneOf, t0) {
  // One floating bar per segment: [start, end] in seconds since t0, on its thread's lane
  // (laneOf(call); laneOf(null): the session's first lane).
  const out = [];
  const at = (iso) => (new Date(iso) - t0) / 1000;
  doc.calls.forEach((c, i) => {
    const a = at(c.arrived_at);
    const ref = { doc, call: c };
    const lane = laneOf(c);
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
      out.push({ kind: "gap", x: [at(c.finished_at), at(next.arrived_at)], y: laneOf(c), ref: { doc, gap } });
    }
  });
  for (const r of doc.reservations) {
    const end = r.released_at || r.expires_at;
    out.push({ kind: "reservation", x: [at(r.created_at), at(end)], y: laneOf(null), ref: { doc, reservation: r } });
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

/** The lanes of one session: one per thread (its conversations), named after ``name``. */
function threadLanes(doc, name) {
  const threads = [...new Set(doc.calls.map((c) => c.thread ?? 0))].sort((a, b) => a - b);
  if (threads.length < 2) return new Map([[threads[0] ?? 0, name]]);
  return new Map(threads.map((t) => [t, `${name} · thread ${t}`]));
}

/** Draw the timeline chart of session ``doc`` (a lane per thread) with its ``children`` as more lanes, and its zoom buttons. */
export function drawTimeline(doc, children) {
  const docs = [doc, ...children];
  const t0 = new Date(Math.min(...docs.map((d) => new Date(d.session.started_at).getTime())));
  const perDoc = docs.map((d, i) => threadLanes(d, i === 0 ? `session ${d.session.session_id}` : `child ${d.session.session_id}`));
  const lanes = perDoc.flatMap((m) => [...m.values()]);
  const segments = docs.flatMap((d, i) => {
    const m = perDoc[i];
    const first = [...m.values()][0];
    return segmentsOf(d, (c) => (c ? m.get(c.thread ?? 0) ?? first : first), t0);
  });
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
  const drawnCalls = new Set(segments.filter((s) => s.ref.call).map((s) => `${s.ref.doc.session.session_key}/${s.ref.call.request_id}`));
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
  keepChart(chart);
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
