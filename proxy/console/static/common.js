// What every view of the console shares: the page's fixed elements, the view's timers and
// charts (dropped at each navigation), the admin API client, formatting, and element builders.

export const main = document.getElementById("main");
const statusLine = document.getElementById("status");
const csrf = document.querySelector('meta[name="csrf-token"]').content;

// Colours: one per KV source and segment kind; model colours for slots. Each is dark or light
// enough against its neighbours to be told apart, and text never sits on them.
export const KV_COLOURS = { hbm: "#2e8b57", host: "#e08a00", recompute: "#c0392b", new: "#3b6fc4" };
export const KIND_COLOURS = {
  slot_wait: "#7d5ba6",
  queue: "#9aa5b1",
  decode: "#14365d",
  gap: "#d9e2ec",
  reservation: "#c2185b",
  error: "#a4161a",
};
export const MODEL_PALETTE = ["#3b6fc4", "#e08a00", "#2e8b57", "#c0392b", "#7d5ba6", "#00838f", "#8d6e63"];

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

/** The id of the view on screen; a load keeps it and checks it with current() when it ends. */
export function thisView() {
  return viewId;
}

/** Whether the view ``id`` is still the one on screen. */
export function current(id) {
  return id === viewId;
}

/** Stop the view on screen (its timers and charts) and start counting a new one. */
export function nextView() {
  stopView();
  viewId += 1;
}

/** Clear the view's timers and destroy its charts. */
export function stopView() {
  timers.forEach((t) => clearInterval(t));
  timers = [];
  destroyCharts();
}

/** Destroy the view's charts (before it draws new ones in their place). */
export function destroyCharts() {
  charts.forEach((c) => c.destroy());
  charts = [];
}

/** Keep ``chart`` with the view, so that leaving the view destroys it; returns it. */
export function keepChart(chart) {
  charts.push(chart);
  return chart;
}

/** Run ``fn`` every ``ms`` while the page is visible, until the view is left. */
export function every(ms, fn) {
  const t = setInterval(() => {
    if (!document.hidden) fn();
  }, ms);
  timers.push(t);
}

/** Show ``text`` in the status line. */
export function say(text) {
  statusLine.textContent = text;
}

/** ``value`` as HTML text: & < > " ' escaped. */
export function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

/** The element that ``html`` (markup with one root element) describes. */
export function el(html) {
  const t = document.createElement("template");
  t.innerHTML = html.trim();
  return t.content.firstElementChild;
}

/** The JSON body of the admin API's answer to ``path``; a state change carries the CSRF token. */
export async function api(path, options = {}) {
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

/** A duration in seconds as text, in ms, s, min or h by its size; "—" when unknown. */
export function seconds(s) {
  if (s === null || s === undefined || Number.isNaN(s)) return "—";
  if (s !== 0 && Math.abs(s) < 0.1) return `${(s * 1000).toFixed(1)} ms`;
  if (Math.abs(s) >= 3600) return `${(s / 3600).toFixed(1)} h`;
  if (Math.abs(s) >= 60) return `${(s / 60).toFixed(1)} min`;
  if (Math.abs(s) >= 10) return `${s.toFixed(0)} s`;
  return `${s.toFixed(2)} s`;
}

/** An ISO time in the browser's locale; "—" when there is none. */
export function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "—";
}

/** A byte count in decimal units (B, KB = 10³ B, ... TB). */
export function bytes(n) {
  if (!n) return "0 B";
  const units = ["B", "KB", "MB", "GB", "TB"];
  const i = Math.min(units.length - 1, Math.floor(Math.log10(n) / 3));
  return `${(n / 10 ** (3 * i)).toFixed(i ? 1 : 0)} ${units[i]}`;
}

/** The colour of model ``name``: its place in ``models`` (added there if new) in the palette. */
export function modelColour(models, name) {
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
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  node.append(...children.flat().filter((c) => c != null).map((c) => (c instanceof Node ? c : String(c))));
  return node;
}

/** A legend: one swatch per [label, colour] of ``items``. */
export function legendNode(items) {
  return h("div", { class: "legend" }, items.map(([label, colour]) => h("span", { "data-swatch": colour }, label)));
}

/** The markup of legendNode(items). */
export function legend(items) {
  return legendNode(items).outerHTML;
}

/** A session's completion time so far, in seconds: to its end, its last call, or now. */
export function sctSoFar(s) {
  const end = s.ended_at ? new Date(s.ended_at) : s.state === "ended" ? new Date(s.last_call_at) : new Date();
  return (end - new Date(s.started_at)) / 1000;
}

/** Floating bars of model slots on ``lane``, shared by the nodes and replay views. */
export function slotBars(slots, nowS, lane, models) {
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
