// Browser test of the Splash web UI with playwright-core and the system Chromium (scripts/e2e/webui.sh sets it up).
// Opens the page of a running `splash serve` that requires an API key, enters the key when asked, sends a message
// and watches the reply stream in, stops a second generation, checks that the stats update and that the conversation
// survives a reload, and saves desktop and phone screenshots to SPLASH_WEBUI_SHOTS (printed).
// Env: SPLASH_URL, SPLASH_KEY, SPLASH_MODEL, PLAYWRIGHT_DIR (where playwright-core is installed), CHROMIUM,
// SPLASH_WEBUI_SHOTS. Prints "N passed, M failed".
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const require = createRequire(path.join(process.env.PLAYWRIGHT_DIR, "node_modules") + "/");
const { chromium } = require("playwright-core");
const url = process.env.SPLASH_URL;
const key = process.env.SPLASH_KEY;
const modelId = process.env.SPLASH_MODEL;
const shots = process.env.SPLASH_WEBUI_SHOTS;
fs.mkdirSync(shots, { recursive: true });

let passed = 0, failed = 0;
function check(name, ok, detail = "") {
  if (ok) { passed++; console.log(`ok    ${name}`); } else { failed++; console.log(`FAIL  ${name} ${detail}`); }
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function status() {
  const r = await fetch(url + "/status", { headers: { Authorization: "Bearer " + key } });
  return r.json();
}

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM, args: ["--no-sandbox"] });
const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
const page = await context.newPage();
const consoleErrors = [];
page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text()); });
page.on("pageerror", (e) => consoleErrors.push(String(e)));
const external = [];
page.on("request", (r) => { if (!r.url().startsWith(url) && !r.url().startsWith("data:")) external.push(r.url()); });

try {
  await page.goto(url + "/");
  // The server has a key: the page asks for it (401 from /v1/models).
  await page.waitForSelector("#key-dialog[open]", { timeout: 10000 });
  check("asks for the API key on 401", true);
  await page.fill("#key-input", key);
  await page.click("#key-form button.primary");
  await page.waitForFunction((id) => document.querySelector("#model-badge").textContent.includes(id), modelId, { timeout: 10000 });
  const badge = await page.textContent("#model-badge");
  check("shows the model and its context", badge.includes(modelId) && /ctx/.test(badge), badge);
  await page.click("#open-settings");
  await page.fill("#max-tokens", "160");
  await page.dispatchEvent("#max-tokens", "change");
  await page.fill("#temperature", "0");
  await page.dispatchEvent("#temperature", "change");
  await page.click("#open-settings");
  await page.waitForFunction(() => document.querySelector("#plan-info").children.length > 0, null, { timeout: 10000 });
  const plan = await page.textContent("#plan-info");
  check("shows the memory plan", /Context/.test(plan) && /tokens/.test(plan), plan);
  const generatedBefore = (await status()).engine.num_generated_tokens;

  // 1. A reply streams in.
  await page.fill("#input", "Write a Python function that returns the sum of a list, in a code block.");
  await page.keyboard.press("Enter");
  await page.waitForSelector(".msg.assistant.streaming", { timeout: 5000 });
  const lengths = [];
  let sawSpeed = "";
  const t0 = Date.now();
  while (Date.now() - t0 < 180000) {
    const still = await page.$(".msg.assistant.streaming");
    const len = await page.evaluate(() => document.querySelector(".msg.assistant:last-child .body").textContent.length);
    lengths.push(len);
    const speed = await page.textContent("#speed");
    if (/tok\/s/.test(speed) && still) sawSpeed = speed;
    if (!still) break;
    await sleep(150);
  }
  const growing = new Set(lengths.filter((l) => l > 0)).size;
  check("the reply streams (text grew in several steps)", growing >= 3, `distinct lengths ${growing}`);
  check("live decode tok/s shown while streaming", Boolean(sawSpeed), sawSpeed);
  const meta = await page.textContent(".msg.assistant:last-child .meta");
  check("finished reply shows tokens, first-token time and tok/s", /tokens/.test(meta) && /first token/.test(meta) && /tok\/s/.test(meta), meta);
  const highlighted = await page.$$eval(".msg.assistant:last-child pre code span[class^=tok-]", (s) => s.length);
  check("code block rendered and highlighted", highlighted > 0, `highlighted spans ${highlighted}`);
  await page.screenshot({ path: path.join(shots, "desktop.png") });

  // 2. Stop a generation.
  const abortedBefore = (await status()).requests.num_aborted;
  await page.click("#open-settings");
  await page.fill("#max-tokens", "2000");
  await page.dispatchEvent("#max-tokens", "change");
  await page.click("#open-settings");
  await page.fill("#input", "Count from 1 to 400, one number per line.");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => {
    const b = document.querySelector(".msg.assistant.streaming .body");
    return b && b.textContent.length > 20;
  }, null, { timeout: 120000 });
  const tStop = Date.now();
  await page.click("#stop");
  await page.waitForSelector(".msg.assistant.streaming", { state: "detached", timeout: 5000 });
  const stopMs = Date.now() - tStop;
  const stoppedMeta = await page.textContent(".msg.assistant:last-child .meta");
  const sendVisible = await page.isVisible("#send");
  check("stop ends the generation", stoppedMeta.includes("stopped") && sendVisible && stopMs < 3000, `${stopMs} ms, ${stoppedMeta}`);
  let aborted = abortedBefore;
  for (let i = 0; i < 20 && aborted === abortedBefore; i++) { await sleep(250); aborted = (await status()).requests.num_aborted; }
  check("the server saw the request stopped", aborted > abortedBefore, `${abortedBefore} -> ${aborted}`);

  // 3. Stats update.
  await sleep(2500);
  const live = await page.textContent("#live-info");
  const generatedAfter = (await status()).engine.num_generated_tokens;
  const m = live.match(/Generated([\d,]+) tokens/);
  const shown = m ? Number(m[1].replace(/,/g, "")) : -1;
  check("stats panel updates from /status", shown > generatedBefore && shown <= generatedAfter, `${generatedBefore} < ${shown} <= ${generatedAfter}: ${live}`);

  // 4. Conversations survive a reload (localStorage); the key is kept for the tab (sessionStorage).
  await page.reload();
  await page.waitForSelector(".msg.assistant", { timeout: 10000 });
  const n = await page.$$eval(".msg", (e) => e.length);
  const dialogOpen = await page.$("#key-dialog[open]");
  check("conversation kept after reload, no second key prompt", n === 4 && !dialogOpen, `${n} messages`);

  // 5. Phone width.
  await page.setViewportSize({ width: 390, height: 844 });
  await sleep(300);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check("no horizontal overflow at phone width", overflow <= 0, `${overflow}px`);
  await page.screenshot({ path: path.join(shots, "phone.png") });
  await page.click("#open-side");
  await sleep(300);
  await page.screenshot({ path: path.join(shots, "phone-sidebar.png") });
  check("no requests outside the server", external.length === 0, external.join(" "));
  check("no console errors", consoleErrors.filter((e) => !/401/.test(e)).length === 0, consoleErrors.join(" | "));
} catch (e) {
  check("browser run", false, e.stack || String(e));
  await page.screenshot({ path: path.join(shots, "failure.png") }).catch(() => {});
} finally {
  await browser.close();
}
console.log(`screenshots: ${shots}/desktop.png ${shots}/phone.png ${shots}/phone-sidebar.png`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
