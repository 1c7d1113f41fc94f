// The tablecast console: one page over the node's own HTTP API. Every value shown is set with
// textContent (never innerHTML), so keys and values from the tables cannot inject markup.

const TOKEN_KEY = "tablecast.token";
const $ = (sel) => document.querySelector(sel);

// -- HTTP --------------------------------------------------------------------------------
function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { authorization: `Bearer ${token}` } : {};
}

class HttpError extends Error {
  constructor(status, code, message) {
    super(`${status} ${code}: ${message}`);
    this.status = status;
    this.code = code;
  }
}

async function api(path, { raw = false } = {}) {
  const r = await fetch(path, { headers: authHeaders() });
  if (r.status === 401) {
    askToken("This node needs a bearer token.");
  }
  if (!r.ok) {
    let code = "error", message = r.statusText;
    try {
      const body = await r.json();
      code = body.error?.code ?? code;
      message = body.error?.message ?? message;
    } catch (_) { /* not JSON */ }
    throw new HttpError(r.status, code, message);
  }
  return raw ? r : r.json();
}

function showError(err) {
  const banner = $("#banner");
  if (!err) {
    banner.hidden = true;
    return;
  }
  banner.textContent = err.message ?? String(err);
  banner.hidden = false;
}

// -- small DOM helpers ---------------------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function rows(tbody, items, render) {
  tbody.replaceChildren(...items.map(render));
}

function json(v) {
  return v === undefined ? "" : JSON.stringify(v);
}

function ago(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  return `${(ms / 1000).toFixed(1)} s`;
}

function time(ms) {
  return ms ? new Date(ms).toLocaleTimeString() : "";
}

// A sparkline: the last values of a series as an SVG polyline.
function spark(values, width = 120, height = 24, cls = "spark") {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", cls);
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("role", "img");
  const nums = values.filter((v) => Number.isFinite(v));
  if (nums.length > 1) {
    const lo = Math.min(...nums), hi = Math.max(...nums), span = hi - lo || 1;
    const step = width / (nums.length - 1);
    const pts = nums.map((v, i) => `${(i * step).toFixed(1)},${(height - 2 - ((v - lo) / span) * (height - 4)).toFixed(1)}`);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts.join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", "#3b6fb6");
    line.setAttribute("stroke-width", "1.5");
    svg.append(line);
    svg.setAttribute("aria-label", `from ${lo} to ${hi}, last ${nums[nums.length - 1]}`);
  }
  return svg;
}

// -- the token -----------------------------------------------------------------------------
function askToken(why) {
  const dialog = $("#token-dialog");
  if (why) showError(new Error(why));
  if (!dialog.open) dialog.showModal();
}

function setupToken() {
  $("#token-button").addEventListener("click", () => askToken());
  $("#token-dialog").addEventListener("close", () => {
    const dialog = $("#token-dialog");
    if (dialog.returnValue === "save") {
      const token = $("#token-input").value.trim();
      if (token) sessionStorage.setItem(TOKEN_KEY, token);
    } else if (dialog.returnValue === "clear") {
      sessionStorage.removeItem(TOKEN_KEY);
    }
    $("#token-input").value = "";
    showError(null);
    refreshNow();
  });
}

// -- tabs ------------------------------------------------------------------------------------
const refreshers = {};
let current = "cluster";

function show(tab) {
  current = tab;
  for (const s of document.querySelectorAll("[data-section]")) s.hidden = s.id !== tab;
  for (const b of document.querySelectorAll("nav button")) {
    if (b.dataset.tab === tab) b.setAttribute("aria-current", "page");
    else b.removeAttribute("aria-current");
  }
  if (location.hash !== `#${tab}`) history.replaceState(null, "", `#${tab}`);
  refreshNow();
}

function refreshNow() {
  const fn = refreshers[current];
  if (fn) fn().then(() => showError(null), showError);
}

function setupTabs() {
  for (const b of document.querySelectorAll("nav button")) {
    b.addEventListener("click", () => show(b.dataset.tab));
  }
  document.addEventListener("keydown", (e) => {
    if (e.target.closest("input, textarea, select") || e.altKey || e.ctrlKey || e.metaKey) return;
    const tabs = ["cluster", "tables", "live", "pipeline", "deadletters"];
    const i = Number(e.key) - 1;
    if (i >= 0 && i < tabs.length) show(tabs[i]);
  });
  const start = location.hash.slice(1);
  show(["cluster", "tables", "live", "pipeline", "deadletters"].includes(start) ? start : "cluster");
}

// -- cluster map ------------------------------------------------------------------------------
const seenNodes = new Map(); // id -> url: a node that vanishes from /v1/cluster shows as down
let nodeDetails = new Map();
let lastDetails = new Map();
let selectedNode = null;

async function refreshCluster() {
  const [cluster, details] = await Promise.all([
    api("/v1/cluster"),
    api("/ui/api/nodes").catch(() => ({ nodes: [] })),
  ]);
  lastDetails = nodeDetails;
  nodeDetails = new Map(details.nodes.map((d) => [d.id, { ...d, at: performance.now() }]));
  const live = new Map(cluster.nodes.map((n) => [n.id, n]));
  for (const n of cluster.nodes) seenNodes.set(n.id, n.url);
  const slots = new Map(); // table -> max partition + 1
  for (const n of cluster.nodes) {
    for (const r of n.replicas) slots.set(r.table, Math.max(slots.get(r.table) ?? 0, r.partition + 1));
  }
  const tables = [...slots.keys()].sort();
  const head = el("tr", {}, el("th", { class: "node", text: "node" }), el("th", { text: "state" }),
    el("th", { text: "kafka" }), el("th", { text: "heartbeat" }));
  for (const t of tables) {
    for (let p = 0; p < slots.get(t); p++) head.append(el("th", { text: `${t}/${p}`, title: `table ${t}, partition ${p}` }));
  }
  const body = [];
  for (const [id, url] of [...seenNodes.entries()].sort()) {
    const n = live.get(id);
    const tr = el("tr", { class: n ? "clickable" : "node-down", tabindex: "0", "data-node": id });
    tr.append(el("td", { class: "node", text: id, title: url }));
    if (!n) {
      tr.append(el("td", {}, el("span", { class: "cell down", text: "down" })), el("td", { text: "" }), el("td", { text: "" }));
      for (const t of tables) for (let p = 0; p < slots.get(t); p++) tr.append(el("td", {}, el("span", { class: "cell down", text: "" })));
      body.push(tr);
      continue;
    }
    tr.append(
      el("td", {}, el("span", { class: `badge ${n.state === "ready" ? "ok" : "bad"}`, text: n.state })),
      el("td", {}, el("span", { class: `badge ${n.kafka === "reachable" ? "ok" : "bad"}`, text: n.kafka })),
      el("td", { text: ago(n.heartbeat_age_ms) }),
    );
    const held = new Map(n.replicas.map((r) => [`${r.table}/${r.partition}`, r]));
    for (const t of tables) {
      for (let p = 0; p < slots.get(t); p++) {
        const r = held.get(`${t}/${p}`);
        if (!r) { tr.append(el("td", {}, el("span", { class: "cell none", text: "·" }))); continue; }
        const bad = r.state === "failed" || r.state === "stale";
        const cls = bad ? "failed" : r.role;
        const label = r.role === "active" ? "A" : r.role === "standby" ? "S" : "W";
        tr.append(el("td", {}, el("span", {
          class: `cell ${cls}`, text: label,
          title: `${r.role}, ${r.state}, offset ${r.offset}, lag ${r.lag}`
            + (r.freshness_ms != null ? `, newest record ${ago(r.freshness_ms)} old` : "")
            + (r.error ? `, error: ${r.error}` : ""),
        })));
      }
    }
    tr.addEventListener("click", () => { selectedNode = id; renderNodeDetail(); });
    tr.addEventListener("keydown", (e) => { if (e.key === "Enter") { selectedNode = id; renderNodeDetail(); } });
    body.push(tr);
  }
  // how old the newest record each partition's active replica applied is (by its timestamp)
  const fresh = el("tr", { class: "freshness" }, el("td", { class: "node", text: "freshness", colspan: "4",
    title: "age of the newest record the active replica applied, by the record's timestamp" }));
  const actives = new Map(cluster.nodes.flatMap((n) => n.replicas)
    .filter((r) => r.role === "active").map((r) => [`${r.table}/${r.partition}`, r]));
  for (const t of tables) {
    for (let p = 0; p < slots.get(t); p++) {
      const active = actives.get(`${t}/${p}`);
      fresh.append(el("td", { class: "muted", "data-partition": `${t}/${p}`, text: ago(active?.freshness_ms) }));
    }
  }
  const table = el("table", { class: "grid map" }, el("thead", {}, head), el("tbody", {}, ...body),
    el("tfoot", {}, fresh));
  $("#cluster-map").replaceChildren(table);
  const down = [...seenNodes.keys()].filter((id) => !live.has(id)).length;
  $("#cluster-summary").textContent =
    `${cluster.nodes.length} node(s) live${down ? `, ${down} down` : ""}; ${tables.length} table(s); Kafka ${cluster.kafka} from this node`;
  renderNodeDetail();
}

function renderNodeDetail() {
  const panel = $("#node-detail");
  const d = selectedNode && nodeDetails.get(selectedNode);
  if (!d) { panel.hidden = true; return; }
  const before = lastDetails.get(selectedNode);
  let rate = "–";
  if (before && d.requests !== undefined && before.requests !== undefined && d.at > before.at) {
    rate = `${((d.requests - before.requests) / ((d.at - before.at) / 1000)).toFixed(1)} req/s`;
  }
  const facts = d.unreachable ? [["unreachable", d.unreachable]] : [
    ["url", d.url], ["version", d.version], ["uptime", `${d.uptime_s} s`], ["ready", String(d.ready)],
    ["kafka", d.kafka], ["replicas", d.replicas], ["requests", `${d.requests} (${rate})`],
    ["read latency", `p50 ≤ ${d.read_latency_ms.p50 ?? "–"} ms, p99 ≤ ${d.read_latency_ms.p99 ?? "–"} ms`],
    ["cache hit rate", d.cache.hit_rate === null ? "–" : `${(d.cache.hit_rate * 100).toFixed(1)} %`],
    ["records applied", d.records_applied], ["5xx answers", d.errors],
  ];
  const dl = el("dl", { class: "facts" });
  for (const [k, v] of facts) dl.append(el("dt", { text: k }), el("dd", { text: String(v) }));
  panel.replaceChildren(el("h3", { text: `Node ${selectedNode}` }), dl);
  panel.hidden = false;
}

// -- tables and the key browser ------------------------------------------------------------
let tableInfo = new Map();
let browsing = null;
let nextPage = null;

async function refreshTables() {
  const { tables } = await api("/v1/tables");
  tableInfo = new Map(tables.map((t) => [t.name, t]));
  const counts = await Promise.all(tables.map((t) =>
    api(`/v1/tables/${encodeURIComponent(t.name)}/count`).then((c) => c.count, () => "–")));
  rows($("#tables-list tbody"), tables, (t, i) => {
    const tr = el("tr", { class: "clickable", tabindex: "0" },
      el("td", { text: t.name }), el("td", { text: t.kind }), el("td", { text: String(t.partitions) }),
      el("td", { text: t.key_format }), el("td", { text: t.value_format }), el("td", { text: String(t.global) }),
      el("td", { text: String(counts[i]) }), el("td", { class: "muted", text: t.topic }));
    tr.addEventListener("click", () => browse(t.name));
    tr.addEventListener("keydown", (e) => { if (e.key === "Enter") browse(t.name); });
    return tr;
  });
  fillTableSelect($("#watch-table"), tables);
}

function browse(name) {
  browsing = name;
  const t = tableInfo.get(name);
  $("#browser-table").textContent = name;
  $("#window-form").hidden = t.kind !== "window";
  $("#as-of-field").hidden = !t.history_ms;
  const indexes = t.indexes ?? [];
  $("#index-form").hidden = indexes.length === 0;
  $("#index-name").replaceChildren(...indexes.map((n) => el("option", { value: n, text: n })));
  $("#result").replaceChildren();
  $("#next-page").hidden = true;
  $("#browser").hidden = false;
  $("#key-input").focus();
}

function tablePath(suffix) {
  return `/v1/tables/${encodeURIComponent(browsing)}${suffix}`;
}

async function getKey(e) {
  e.preventDefault();
  const key = $("#key-input").value;
  const asOf = $("#as-of-input").value.trim();
  const params = new URLSearchParams({ key });
  if (asOf) params.set("as_of", asOf);
  try {
    const r = await fetch(tablePath(`/keys?${params}`), { headers: authHeaders() });
    const body = await r.json();
    const facts = [
      ["status", String(r.status)],
      ["answered by", r.headers.get("x-tablecast-node") ?? "–"],
      ["lag", r.headers.get("x-tablecast-lag") ?? "–"],
      ["staleness", `${r.headers.get("x-tablecast-staleness-ms") ?? "–"} ms`],
      ["position", r.headers.get("x-tablecast-position") ?? "–"],
    ];
    const dl = el("dl", { class: "facts" });
    for (const [k, v] of facts) dl.append(el("dt", { text: k }), el("dd", { text: v }));
    $("#result").replaceChildren(dl, el("pre", { class: "value", text: JSON.stringify(body, null, 2) }));
    $("#next-page").hidden = true;
  } catch (err) {
    showError(err);
  }
}

async function scan(e, cursor = null) {
  if (e) e.preventDefault();
  const params = new URLSearchParams({ limit: "50" });
  const prefix = $("#scan-prefix").value, from = $("#scan-from").value, to = $("#scan-to").value;
  if (prefix) params.set("prefix", prefix);
  if (from) params.set("from", from);
  if (to) params.set("to", to);
  if (cursor) params.set("cursor", cursor);
  await showItems(tablePath(`/range?${params}`), (c) => scan(null, c));
}

async function indexLookup(e, cursor = null) {
  if (e) e.preventDefault();
  const name = $("#index-name").value, value = $("#index-value").value;
  const params = new URLSearchParams({ limit: "50" });
  if (cursor) params.set("cursor", cursor);
  await showItems(tablePath(`/index/${encodeURIComponent(name)}/${encodeURIComponent(value)}?${params}`),
    (c) => indexLookup(null, c));
}

async function windowsOf(e) {
  e.preventDefault();
  const params = new URLSearchParams({ key: $("#key-input").value });
  if ($("#window-from").value) params.set("from", $("#window-from").value);
  if ($("#window-to").value) params.set("to", $("#window-to").value);
  try {
    const { items } = await api(tablePath(`/windows?${params}`));
    const table = el("table", { class: "grid" }, el("thead", {}, el("tr", {},
      el("th", { text: "start" }), el("th", { text: "end" }), el("th", { text: "value" }))));
    const tbody = el("tbody");
    rows(tbody, items, (w) => el("tr", {}, el("td", { text: new Date(w.start).toISOString() }),
      el("td", { text: new Date(w.end).toISOString() }), el("td", { class: "value", text: json(w.value) })));
    table.append(tbody);
    $("#result").replaceChildren(table);
    $("#next-page").hidden = true;
  } catch (err) {
    showError(err);
  }
}

async function showItems(path, more) {
  try {
    const page = await api(path);
    const table = el("table", { class: "grid" }, el("thead", {}, el("tr", {},
      el("th", { text: "key" }), el("th", { text: "value" }))));
    const tbody = el("tbody");
    rows(tbody, page.items, (it) => el("tr", {}, el("td", { class: "value", text: json(it.key) }),
      el("td", { class: "value", text: json(it.value) })));
    table.append(tbody);
    $("#result").replaceChildren(el("p", { class: "muted", text: `${page.items.length} row(s)` }), table);
    nextPage = page.next_cursor ? () => more(page.next_cursor) : null;
    $("#next-page").hidden = !nextPage;
  } catch (err) {
    showError(err);
  }
}

function setupBrowser() {
  $("#key-form").addEventListener("submit", getKey);
  $("#scan-form").addEventListener("submit", (e) => scan(e));
  $("#index-form").addEventListener("submit", (e) => indexLookup(e));
  $("#window-form").addEventListener("submit", windowsOf);
  $("#next-page").addEventListener("click", () => nextPage && nextPage());
}

function fillTableSelect(select, tables) {
  const keep = select.value;
  select.replaceChildren(...tables.filter((t) => t.kind === "kv").map((t) => el("option", { value: t.name, text: t.name })));
  if (keep) select.value = keep;
}

// -- live: a watch over the node's event stream --------------------------------------------
let watching = null; // AbortController of the running watch
const watched = new Map(); // key text -> {tr, history}

function numeric(value) {
  if (typeof value === "number") return value;
  if (value && typeof value === "object") {
    for (const v of Object.values(value)) {
      const n = numeric(v);
      if (n !== null) return n;
    }
  }
  return null;
}

function applyEvent(kind, data) {
  const key = json(data.key);
  let row = watched.get(key);
  if (!row) {
    const tr = el("tr", { "data-key": key });
    tr.append(el("td", { class: "value", text: key }), el("td", { class: "value" }), el("td"), el("td"), el("td"), el("td"));
    $("#watch-rows tbody").append(tr);
    row = { tr, history: [] };
    watched.set(key, row);
  }
  const cells = row.tr.children;
  cells[1].textContent = data.value === null ? "(deleted)" : json(data.value);
  cells[2].textContent = String(data.partition ?? "");
  cells[3].textContent = String(data.offset ?? "");
  cells[4].textContent = kind === "snapshot" ? "snapshot" : new Date().toLocaleTimeString();
  const n = numeric(data.value);
  if (n !== null) row.history.push(n);
  if (row.history.length > 60) row.history.shift();
  cells[5].replaceChildren(spark(row.history));
  if (kind === "change") {
    row.tr.classList.remove("flash");
    void row.tr.offsetWidth; // restart the animation
    row.tr.classList.add("flash");
  }
}

async function watch(e) {
  e.preventDefault();
  stopWatch();
  const table = $("#watch-table").value, what = $("#watch-what").value, input = $("#watch-input").value;
  const params = new URLSearchParams({ [what]: input });
  watched.clear();
  $("#watch-rows tbody").replaceChildren();
  const controller = new AbortController();
  watching = controller;
  $("#watch-stop").disabled = false;
  let lastId = null;
  // the stream ends when a node stops or fails: go on from the last event's id
  while (watching === controller) {
    try {
      const headers = authHeaders();
      if (lastId) headers["last-event-id"] = lastId;
      const r = await fetch(`/v1/tables/${encodeURIComponent(table)}/watch?${params}`,
        { headers, signal: controller.signal });
      if (!r.ok) {
        const body = await r.json().catch(() => ({}));
        throw new HttpError(r.status, body.error?.code ?? "error", body.error?.message ?? r.statusText);
      }
      $("#watch-status").textContent = `watching ${what} ${input} of ${table}`;
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          let event = "message", data = "", id = null;
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) event = line.slice(6).trim();
            else if (line.startsWith("data:")) data += line.slice(5).trim();
            else if (line.startsWith("id:")) id = line.slice(3).trim();
          }
          if (id) lastId = id;
          if (event === "ready") $("#watch-status").textContent = `watching ${what} ${input} of ${table}: live`;
          else if ((event === "snapshot" || event === "change") && data) applyEvent(event, JSON.parse(data));
        }
      }
    } catch (err) {
      if (watching !== controller) return;
      if (err instanceof HttpError && err.status < 500) { showError(err); stopWatch(); return; }
      $("#watch-status").textContent = `stream interrupted (${err.message}); resuming…`;
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

function stopWatch() {
  if (watching) watching.abort();
  watching = null;
  $("#watch-stop").disabled = true;
}

function setupLive() {
  $("#watch-form").addEventListener("submit", watch);
  $("#watch-stop").addEventListener("click", () => { stopWatch(); $("#watch-status").textContent = "stopped"; });
}

async function refreshLive() {
  const { tables } = await api("/v1/tables");
  fillTableSelect($("#watch-table"), tables);
}

// -- the pipeline --------------------------------------------------------------------------
function plot(points, field, label) {
  const values = points.map((p) => p[field]).filter((v) => Number.isFinite(v));
  const last = values.length ? values[values.length - 1] : null;
  return el("figure", {}, spark(values, 260, 60, "plot"),
    el("figcaption", { text: `${label}: ${last === null ? "–" : Math.round(last).toLocaleString()}` }));
}

async function refreshPipeline() {
  const { queries, topic } = await api("/ui/api/pipeline");
  const names = Object.keys(queries).sort();
  $("#pipeline-summary").textContent = names.length
    ? `${names.length} quer${names.length === 1 ? "y" : "ies"}, from ${topic}`
    : `no progress on ${topic} yet (is the pipeline running?)`;
  const blocks = names.map((name) => {
    const points = queries[name];
    const p = points[points.length - 1];
    const dl = el("dl", { class: "facts" });
    const facts = [
      ["batch", p.batch], ["at", time(p.timestamp)], ["trigger", p.trigger ?? "–"],
      ["input rows/s", Math.round(p.input_rows_per_s ?? 0)], ["processed rows/s", Math.round(p.processed_rows_per_s ?? 0)],
      ["batch duration", `${p.batch_ms ?? "–"} ms`], ["watermark", p.watermark ?? "–"],
      ["state rows", p.state_rows ?? "–"], ["input lag", p.input_lag ?? "–"], ["dead letters", p.dead_letters ?? 0],
    ];
    for (const [k, v] of facts) dl.append(el("dt", { text: k }), el("dd", { text: String(v) }));
    return el("div", { class: "panel", "data-query": name }, el("h3", { text: name }), dl,
      el("div", { class: "plots" }, plot(points, "input_rows_per_s", "input rows/s"),
        plot(points, "processed_rows_per_s", "processed rows/s"), plot(points, "batch_ms", "batch ms"),
        plot(points, "input_lag", "input lag")));
  });
  $("#pipeline-queries").replaceChildren(...blocks);
}

// -- dead letters -----------------------------------------------------------------------------
async function refreshDeadLetters() {
  const d = await api("/ui/api/deadletters");
  $("#dlq-summary").textContent = `${d.counted} dead letter(s) read from ${d.topic}; the latest ${d.items.length} below`;
  rows($("#dlq-counts tbody"), Object.entries(d.counts), ([reason, n]) =>
    el("tr", {}, el("td", { text: reason }), el("td", { text: String(n) })));
  rows($("#dlq-items tbody"), d.items, (it) => el("tr", {},
    el("td", { text: time(it.seen) }), el("td", { text: it.reason }),
    el("td", { text: `${it.source.topic ?? "?"}/${it.source.partition ?? "?"}@${it.source.offset ?? "?"}` }),
    el("td", { class: "value", text: it.key ?? "" }), el("td", { class: "value", text: it.value ?? "" }),
    el("td", { class: "value", text: it.error })));
}

// -- start -------------------------------------------------------------------------------------
Object.assign(refreshers, {
  cluster: refreshCluster,
  tables: refreshTables,
  live: refreshLive,
  pipeline: refreshPipeline,
  deadletters: refreshDeadLetters,
});
const EVERY_MS = { cluster: 1000, pipeline: 2000, deadletters: 3000 };

function poll() {
  const wait = EVERY_MS[current];
  if (wait && document.visibilityState === "visible") refreshNow();
  setTimeout(poll, wait ?? 1000);
}

$("#where").textContent = location.host;
setupToken();
setupBrowser();
setupLive();
setupTabs();
setTimeout(poll, 1000);
