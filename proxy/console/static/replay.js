// The replay results view (#/replay): a `talaria replay --json` document opened from a local
// file, shown as a table, SCT CDFs and per-policy slot timelines.

import { MODEL_PALETTE, destroyCharts, h, keepChart, legendNode, main, modelColour, seconds, slotBars } from "./common.js";

/** Draw the replay view: the file picker; a chosen document is drawn below it. */
export function replayView() {
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
      destroyCharts();
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
  keepChart(new Chart(document.getElementById("cdf"), {
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
    keepChart(new Chart(section.querySelector("canvas"), {
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
