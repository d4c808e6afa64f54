// Splash web UI: a chat page over /v1/chat/completions (streamed), with the server's model, memory plan and live
// stats from /v1/models and /status. No dependencies, no network access beyond this server. Conversations and
// settings live in localStorage; the API key (asked for on a 401) lives in sessionStorage, for this tab only.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = "splash.conversations.v1";
const SETTINGS = "splash.settings.v1";
const KEY = "splash.apiKey";

let conversations = load(STORE, []);
let currentId = null;
let model = null;
let controller = null;
let live = { tokens: 0, firstAt: 0, lastAt: 0 };

function load(name, fallback) {
  try { return JSON.parse(localStorage.getItem(name)) ?? fallback; } catch { return fallback; }
}
function save() {
  try { localStorage.setItem(STORE, JSON.stringify(conversations)); } catch (e) { console.warn("not saved", e); }
}

// ---------- HTTP ----------

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  const key = sessionStorage.getItem(KEY);
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

let keyPrompt = null;
/** Asks for the API key once (concurrent 401s share the dialog). */
function askKey(refused) {
  if (!keyPrompt) {
    keyPrompt = new Promise((resolve) => {
      const d = $("key-dialog");
      $("key-error").hidden = !refused;
      $("key-input").value = "";
      d.addEventListener("close", function done() {
        d.removeEventListener("close", done);
        const v = $("key-input").value.trim();
        if (v) sessionStorage.setItem(KEY, v);
        keyPrompt = null;
        resolve(Boolean(v));
      });
      d.showModal();
    });
  }
  return keyPrompt;
}

/** fetch() that asks for the key on 401 and retries. */
async function api(path, opts = {}) {
  for (let attempt = 0; ; attempt++) {
    const r = await fetch(path, { ...opts, headers: headers(Boolean(opts.body)) });
    if (r.status !== 401 || attempt >= 3) return r;
    if (!(await askKey(attempt > 0 || Boolean(sessionStorage.getItem(KEY))))) return r;
  }
}

async function errorText(r) {
  try {
    const j = await r.json();
    return (j.error && (j.error.message || j.error)) || JSON.stringify(j);
  } catch { return `HTTP ${r.status}`; }
}

// ---------- markdown ----------

function esc(s) {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

const KEYWORDS = new Set(("as async await break case catch class const continue def default del do elif else enum " +
  "export extends false fn for from func function go if impl import in interface is lambda let loop match mod mut " +
  "new nil none null or and not package pass pub raise return self static struct super switch this throw trait " +
  "true try type typeof use var void where while with yield True False None").split(" "));

/** Escaped, highlighted code: comments, strings, numbers, keywords, calls. */
function highlight(code, lang) {
  const hashComments = /^(py|python|sh|bash|shell|zsh|rb|ruby|toml|yaml|yml|r|perl|make|dockerfile)$/i.test(lang || "");
  const re = new RegExp(
    [
      hashComments ? "(#[^\\n]*)" : "(\\/\\/[^\\n]*|\\/\\*[\\s\\S]*?\\*\\/|--(?= )[^\\n]*)",
      "(\"\"\"[\\s\\S]*?\"\"\"|'''[\\s\\S]*?'''|\"(?:\\\\.|[^\"\\\\\\n])*\"|'(?:\\\\.|[^'\\\\\\n])*'|`(?:\\\\.|[^`\\\\])*`)",
      "(\\b\\d[\\d_]*(?:\\.\\d+)?(?:e[+-]?\\d+)?\\b|\\b0x[0-9a-f]+\\b)",
      "([A-Za-z_][A-Za-z0-9_]*)(?=\\s*\\()",
      "([A-Za-z_][A-Za-z0-9_]*)",
    ].join("|"), "gi");
  let out = "", last = 0, m;
  while ((m = re.exec(code))) {
    out += esc(code.slice(last, m.index));
    const [t, c, s, n, f, w] = m;
    if (c) out += `<span class="tok-c">${esc(c)}</span>`;
    else if (s) out += `<span class="tok-s">${esc(s)}</span>`;
    else if (n) out += `<span class="tok-n">${esc(n)}</span>`;
    else if (f) out += KEYWORDS.has(f) ? `<span class="tok-k">${esc(f)}</span>` : `<span class="tok-f">${esc(f)}</span>`;
    else if (w) out += KEYWORDS.has(w) ? `<span class="tok-k">${esc(w)}</span>` : esc(w);
    else out += esc(t);
    last = m.index + t.length;
  }
  return out + esc(code.slice(last));
}

/** Inline markdown on escaped text: code, bold, italics, links. */
function inline(text) {
  const parts = text.split(/(`[^`\n]+`)/);
  return parts.map((p, i) => {
    if (i % 2) return `<code>${esc(p.slice(1, -1))}</code>`;
    return esc(p)
      .replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>")
      .replace(/(^|[\s(])\*([^*\n]+)\*(?=[\s).,!?:;]|$)/g, "$1<em>$2</em>")
      .replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" target="_blank" rel="noopener noreferrer">$1</a>');
  }).join("");
}

/** Markdown subset → HTML. Everything from the model is escaped; an unclosed code fence (while streaming) renders. */
function markdown(src) {
  const lines = src.replace(/\r\n/g, "\n").split("\n");
  let html = "", para = [], list = null;
  const flushPara = () => { if (para.length) { html += `<p>${inline(para.join("\n")).replace(/\n/g, "<br>")}</p>`; para = []; } };
  const flushList = () => { if (list) { html += `<${list.tag}>${list.items.map((i) => `<li>${inline(i)}</li>`).join("")}</${list.tag}>`; list = null; } };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*```\s*([\w+#.-]*)/);
    if (fence) {
      flushPara(); flushList();
      const body = [];
      for (i++; i < lines.length && !/^\s*```\s*$/.test(lines[i]); i++) body.push(lines[i]);
      const lang = fence[1] || "";
      html += `<pre>${lang ? `<span class="lang">${esc(lang)}</span>` : ""}<code>${highlight(body.join("\n"), lang)}</code>` +
        `<button class="copy" type="button">Copy</button></pre>`;
      continue;
    }
    const h = line.match(/^(#{1,6})\s+(.*)/);
    const li = line.match(/^\s*(?:([-*+])|(\d+)[.)])\s+(.*)/);
    if (h) { flushPara(); flushList(); const n = Math.min(h[1].length + 2, 6); html += `<h${n}>${inline(h[2])}</h${n}>`; }
    else if (li) {
      flushPara();
      const tag = li[1] ? "ul" : "ol";
      if (!list || list.tag !== tag) { flushList(); list = { tag, items: [] }; }
      list.items.push(li[3]);
    } else if (!line.trim()) { flushPara(); flushList(); }
    else { flushList(); para.push(line); }
  }
  flushPara(); flushList();
  return html;
}

// ---------- conversations ----------

function current() { return conversations.find((c) => c.id === currentId); }

function newConversation() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "New chat", messages: [], created: Date.now() };
  conversations.unshift(c);
  currentId = c.id;
  save();
  render();
  $("input").focus();
}

function renderList() {
  const ul = $("conversations");
  ul.replaceChildren();
  for (const c of conversations) {
    const li = document.createElement("li");
    if (c.id === currentId) li.className = "active";
    const open = document.createElement("button");
    open.className = "open"; open.type = "button"; open.textContent = c.title; open.title = c.title;
    open.onclick = () => { if (controller) return; currentId = c.id; render(); $("sidebar").classList.remove("open"); };
    const del = document.createElement("button");
    del.className = "icon del"; del.type = "button"; del.textContent = "✕"; del.setAttribute("aria-label", "Delete " + c.title);
    del.onclick = () => {
      if (controller && c.id === currentId) return;
      conversations = conversations.filter((x) => x.id !== c.id);
      if (currentId === c.id) currentId = conversations[0]?.id ?? null;
      save(); render();
    };
    li.append(open, del);
    ul.append(li);
  }
}

function messageEl(m) {
  const div = document.createElement("div");
  div.className = "msg " + m.role;
  const who = document.createElement("div");
  who.className = "who"; who.textContent = m.role === "user" ? "You" : (m.model || "Assistant");
  const body = document.createElement("div");
  body.className = "body";
  if (m.role === "user") body.textContent = m.content; else body.innerHTML = markdown(m.content || "");
  div.append(who, body);
  const meta = document.createElement("div");
  meta.className = "meta";
  if (m.error) { const e = document.createElement("span"); e.className = "error"; e.textContent = m.error; meta.append(e); }
  if (m.stats) meta.append(document.createTextNode((m.error ? " · " : "") + m.stats));
  div.append(meta);
  return div;
}

function renderMessages() {
  const box = $("messages");
  box.replaceChildren();
  const c = current();
  if (!c || !c.messages.length) {
    const e = document.createElement("div");
    e.className = "empty";
    e.innerHTML = `<h2>Chat with <span></span></h2><p>Everything runs on this machine. Conversations are kept in this browser.</p>`;
    e.querySelector("span").textContent = model?.id || "the local model";
    box.append(e);
    return;
  }
  for (const m of c.messages) box.append(messageEl(m));
  box.scrollTop = box.scrollHeight;
}

function render() { renderList(); renderMessages(); }

// ---------- settings ----------

const FIELDS = ["system-prompt", "temperature", "top-p", "top-k", "max-tokens", "seed"];
function loadSettings() {
  const s = load(SETTINGS, {});
  for (const f of FIELDS) $(f).value = s[f] ?? "";
}
function saveSettings() {
  const s = {};
  for (const f of FIELDS) s[f] = $(f).value;
  localStorage.setItem(SETTINGS, JSON.stringify(s));
}
function num(id, int) {
  const v = $(id).value.trim();
  if (v === "") return undefined;
  const n = int ? parseInt(v, 10) : parseFloat(v);
  return Number.isFinite(n) ? n : undefined;
}

// ---------- chat ----------

async function send(text) {
  let c = current();
  if (!c) { newConversation(); c = current(); }
  c.messages.push({ role: "user", content: text });
  if (c.title === "New chat") c.title = text.slice(0, 48).replace(/\s+/g, " ");
  const reply = { role: "assistant", content: "", model: model?.id };
  c.messages.push(reply);
  save(); render();

  const box = $("messages");
  const el = box.lastElementChild;
  el.classList.add("streaming");
  const bodyEl = el.querySelector(".body");
  const metaEl = el.querySelector(".meta");

  const messages = [];
  const system = $("system-prompt").value.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of c.messages.slice(0, -1)) if (m.content) messages.push({ role: m.role, content: m.content });
  const body = { model: model?.id, messages, stream: true, stream_options: { include_usage: true } };
  const opt = { temperature: num("temperature"), top_p: num("top-p"), top_k: num("top-k", true), max_tokens: num("max-tokens", true), seed: num("seed", true) };
  for (const [k, v] of Object.entries(opt)) if (v !== undefined) body[k] = v;

  controller = new AbortController();
  setBusy(true);
  const t0 = performance.now();
  live = { tokens: 0, firstAt: 0, lastAt: 0 };
  let usage = null, finish = null, pending = false;
  const paint = () => {
    pending = false;
    bodyEl.innerHTML = markdown(reply.content);
    const nearBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 120;
    if (nearBottom) box.scrollTop = box.scrollHeight;
    showSpeed();
  };
  try {
    const r = await api("/v1/chat/completions", { method: "POST", body: JSON.stringify(body), signal: controller.signal });
    if (!r.ok) throw new Error(await errorText(r));
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") continue;
        let j;
        try { j = JSON.parse(data); } catch { continue; }
        if (j.error) throw new Error(j.error.message || JSON.stringify(j.error));
        if (j.usage) usage = j.usage;
        for (const ch of j.choices || []) {
          const piece = ch.delta?.content || "";
          if (piece) {
            const now = performance.now();
            if (!live.firstAt) live.firstAt = now;
            live.lastAt = now;
            live.tokens++;
            reply.content += piece;
            if (!pending) { pending = true; requestAnimationFrame(paint); }
          }
          if (ch.finish_reason) finish = ch.finish_reason;
        }
      }
    }
  } catch (e) {
    if (e.name === "AbortError") finish = "stopped";
    else reply.error = e.message || String(e);
  } finally {
    controller = null;
    setBusy(false);
    el.classList.remove("streaming");
    const ttft = live.firstAt ? (live.firstAt - t0) / 1000 : null;
    const gen = usage?.completion_tokens ?? live.tokens;
    const decodeS = live.firstAt && live.lastAt > live.firstAt ? (live.lastAt - live.firstAt) / 1000 : 0;
    const tps = decodeS > 0 && gen > 1 ? (gen - 1) / decodeS : null;
    const parts = [];
    if (usage) parts.push(`${usage.prompt_tokens} prompt tokens` +
      (usage.prompt_tokens_details?.cached_tokens != null ? ` (${usage.prompt_tokens_details.cached_tokens} cached)` : ""));
    parts.push(`${gen} tokens`);
    if (ttft != null) parts.push(`first token ${ttft.toFixed(2)} s`);
    if (tps) parts.push(`${tps.toFixed(1)} tok/s`);
    if (finish && finish !== "stop") parts.push(finish === "length" ? "stopped at the token limit" : finish);
    reply.stats = parts.join(" · ");
    lastTurn = { ttft, tps, gen, usage };
    paint();
    metaEl.replaceWith(messageEl(reply).querySelector(".meta"));
    save();
    showSpeed();
    refreshStatus();
  }
}

let lastTurn = null;
function showSpeed() {
  const s = $("speed");
  if (controller && live.firstAt && live.lastAt > live.firstAt && live.tokens > 1) {
    s.textContent = `${((live.tokens - 1) / ((live.lastAt - live.firstAt) / 1000)).toFixed(1)} tok/s · ${live.tokens} tokens`;
  } else if (controller) {
    s.textContent = "reading the prompt…";
  } else if (lastTurn?.tps) {
    s.textContent = `last: ${lastTurn.tps.toFixed(1)} tok/s`;
  } else s.textContent = "";
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  $("new-chat").disabled = busy;
}

// ---------- server info ----------

function dl(el, rows) {
  el.replaceChildren();
  for (const [k, v] of rows) {
    if (v === undefined || v === null || v === "") continue;
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v;
    el.append(dt, dd);
  }
}
const fmtInt = (n) => (typeof n === "number" ? n.toLocaleString("en-US") : n);
function bytes(n) {
  if (typeof n !== "number") return undefined;
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}

async function loadModel() {
  const r = await api("/v1/models");
  if (!r.ok) { $("model-name").textContent = await errorText(r); return; }
  const j = await r.json();
  model = j.data?.[0] || null;
  const badge = $("model-badge");
  badge.textContent = model ? model.id : "no model";
  if (model) {
    const ctx = document.createElement("span");
    ctx.className = "ctx";
    ctx.textContent = ` · ${fmtInt(model.context_length)} ctx`;
    badge.append(ctx);
  }
  renderMessages();
}

/** Extra numbers the server may report (speculation, prefix cache), shown when present. */
function extras(status) {
  const rows = [];
  const walk = (obj, prefix) => {
    for (const [k, v] of Object.entries(obj || {})) {
      if (v !== null && typeof v === "object" && !Array.isArray(v)) walk(v, prefix + k + " ");
      else if (typeof v === "number" || typeof v === "string" || typeof v === "boolean")
        rows.push([(prefix + k).replace(/_/g, " "), typeof v === "number" && !Number.isInteger(v) ? v.toFixed(3) : fmtInt(v)]);
    }
  };
  for (const k of ["speculation", "prefix_cache", "cache"]) if (status[k]) walk(status[k], k.replace(/_/g, " ") + ": ");
  for (const [k, v] of Object.entries(status.engine || {}))
    if (/cache|accept|draft|spec/i.test(k) && typeof v === "number") rows.push([k.replace(/_/g, " "), fmtInt(v)]);
  return rows;
}

async function refreshStatus() {
  let s;
  try {
    const r = await api("/status");
    if (!r.ok) return;
    s = await r.json();
  } catch { dl($("live-info"), [["server", "unreachable"]]); return; }
  const p = s.memory_plan || {};
  const b = p.breakdown || {};
  dl($("server-info"), [
    ["Model", s.model],
    ["Aliases", (s.aliases || []).join(", ")],
    ["Context", fmtInt(s.limits?.max_context_tokens) + " tokens"],
    ["Sequences", s.limits?.max_running_requests],
  ]);
  dl($("plan-info"), [
    ["Context", p.max_context && `${fmtInt(p.max_context)} tokens`],
    ["Sequences", p.max_sequences],
    ["Batch", p.max_batch_tokens && `${fmtInt(p.max_batch_tokens)} tokens`],
    ["KV pages", p.num_kv_pages && `${fmtInt(p.num_kv_pages)} × ${p.page_tokens}`],
    ["Budget", bytes(b.budget_bytes)],
    ["Available", bytes(b.available_bytes)],
  ]);
  const e = s.engine || {};
  const q = s.queue || {};
  const rq = s.requests || {};
  dl($("live-info"), [
    ["Decode", lastTurn?.tps ? `${lastTurn.tps.toFixed(1)} tok/s (last reply)` : "–"],
    ["Running", `${q.num_running ?? 0} (waiting ${q.num_waiting ?? 0})`],
    ["Requests", `${fmtInt(rq.num_finished ?? 0)} done, ${fmtInt(rq.num_aborted ?? 0)} stopped`],
    ["Generated", `${fmtInt(e.num_generated_tokens ?? 0)} tokens`],
    ["Throughput", e.generated_tokens_per_busy_second ? `${e.generated_tokens_per_busy_second.toFixed(1)} tok/s busy` : "–"],
    ["Cached (last)", lastTurn?.usage?.prompt_tokens_details?.cached_tokens != null
      ? `${fmtInt(lastTurn.usage.prompt_tokens_details.cached_tokens)} of ${fmtInt(lastTurn.usage.prompt_tokens)} prompt tokens` : undefined],
    ...extras(s),
    ["Uptime", s.uptime_s != null ? `${Math.floor(s.uptime_s / 60)} min` : undefined],
  ]);
}

// ---------- wiring ----------

function autosize() { const t = $("input"); t.style.height = "auto"; t.style.height = Math.min(t.scrollHeight, window.innerHeight * 0.4) + "px"; }

$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("input").value.trim();
  if (!text || controller) return;
  $("input").value = ""; autosize();
  send(text);
});
$("input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); $("composer").requestSubmit(); }
});
$("input").addEventListener("input", autosize);
$("stop").addEventListener("click", () => controller?.abort());
$("new-chat").addEventListener("click", () => { newConversation(); $("sidebar").classList.remove("open"); });
$("open-side").addEventListener("click", () => $("sidebar").classList.add("open"));
$("close-side").addEventListener("click", () => $("sidebar").classList.remove("open"));
$("open-settings").addEventListener("click", () => {
  const s = $("settings");
  s.hidden = !s.hidden;
  $("open-settings").setAttribute("aria-expanded", String(!s.hidden));
});
for (const f of FIELDS) $(f).addEventListener("change", saveSettings);
$("messages").addEventListener("click", (ev) => {
  const b = ev.target.closest("button.copy");
  if (!b) return;
  const code = b.parentElement.querySelector("code").textContent;
  navigator.clipboard?.writeText(code).then(() => { b.textContent = "Copied"; setTimeout(() => (b.textContent = "Copy"), 1200); });
});

loadSettings();
currentId = conversations[0]?.id ?? null;
render();
loadModel().then(refreshStatus);
setInterval(() => { if (!document.hidden) refreshStatus(); }, 2000);
setInterval(() => { if (controller) showSpeed(); }, 250);
