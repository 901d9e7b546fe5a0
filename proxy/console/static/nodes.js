// The nodes view (#/nodes): each tenant's share of the service and its queue now, then one live
// card per instance with its model residency, KV cache and recent model slots.

import { api, bytes, current, el, esc, every, keepChart, legendNode, modelColour, main, say, seconds, slotBars, thisView } from "./common.js";

const LIVE_NODES_MS = 1000;

/** Draw the nodes view: its cards, updated every LIVE_NODES_MS. */
export function nodesView() {
  main.innerHTML = `<h1>Nodes <span class="live">● live</span></h1>
    <section class="card" aria-labelledby="tenants-title"><h2 id="tenants-title">Tenants</h2>
      <table id="tenants"><thead><tr><th scope="col">Tenant</th><th scope="col" class="num">Share of service</th>
        <th scope="col" class="num">Served</th><th scope="col" class="num">Waiting / running calls</th>
        <th scope="col" class="num">Oldest wait</th></tr></thead><tbody></tbody></table></section>
    <div class="cards" id="cards"></div>`;
  const cards = new Map();
  const models = [];
  const view = thisView();
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
    try {
      showTenants((await api("/admin/tenants")).data);
    } catch (err) {
      if (current(view)) say(`Tenants: ${err.message}`);
    }
    say(`Nodes updated ${new Date().toLocaleTimeString()}`);
  }
  load();
  every(LIVE_NODES_MS, load);
}

/** One row per tenant, most served first (proxy/api/tenants.py). */
function showTenants(rows) {
  const body = document.querySelector("#tenants tbody");
  if (!body) return;
  body.innerHTML = rows.map((t) => `
    <tr data-tenant="${esc(t.tenant)}"><td>${esc(t.tenant)}</td><td class="num">${Math.round(100 * t.share)}%</td>
      <td class="num">${seconds(t.served_s)}</td><td class="num">${t.waiting_calls} / ${t.running_calls}</td>
      <td class="num">${seconds(t.oldest_wait_s)}</td></tr>`).join("") || `<tr><td colspan="5">no calls yet</td></tr>`;
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
    keepChart(chart);
  } else {
    chart.data.datasets[0].data = bars;
    chart.options.scales.x.min = minX;
    chart.update("none");
  }
}

function part(card, name) {
  return card.querySelector(`[data-part="${name}"]`);
}
