// Opens `pttrace view`'s pictures in headless Chromium (Debian's, driven by playwright-core)
// and checks that they rendered:
//  1. flamegraph.svg: the function names are in the SVG's DOM (the frames' <title>s), the
//     frame of the first name zooms on a click and then every name is drawn as the text of
//     a frame; no console errors, no page errors; screenshots before and after the zoom.
//  2. timeline.json in speedscope (the npm package's offline build, served with the file
//     from 127.0.0.1 since speedscope fetches `#profileURL=`, which file:// blocks): no
//     error page, no alert, no console errors; the thread's profile is named; the time-order
//     flame chart (a WebGL canvas) is not blank in its screenshot; the Sandwich view's DOM
//     table lists the function names; screenshots of both views.
//
// usage: node render.mjs --view DIR --out DIR --names main,a,b,c --profile NAME
//                        [--chromium PATH]
// Writes DIR/*.png and DIR/result.json (what was found); exits 1 with `render: FAIL: ...`
// lines on stderr when a check fails, 2 on a usage or set-up error.

import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));

function usage(msg) {
  console.error(`render: ${msg}`);
  console.error(
    'usage: node render.mjs --view DIR --out DIR --names main,a,b,c --profile NAME [--select NAME] [--chromium PATH]',
  );
  process.exit(2);
}

const opts = { chromium: '/usr/bin/chromium' };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i += 2) {
  const key = argv[i].replace(/^--/, '');
  if (!['view', 'out', 'names', 'profile', 'select', 'chromium'].includes(key) || argv[i + 1] === undefined) {
    usage(`bad argument ${argv[i]}`);
  }
  opts[key] = argv[i + 1];
}
for (const k of ['view', 'out', 'names', 'profile']) {
  if (!opts[k]) usage(`--${k} is missing`);
}
const names = opts.names.split(',');
opts.select ??= names[names.length - 1];
const speedscopeDir = path.join(here, 'node_modules/speedscope/dist/release');
if (!fs.existsSync(path.join(speedscopeDir, 'index.html'))) {
  usage(`${speedscopeDir}/index.html is missing: run scripts/setup.sh (npm ci in tests/browser)`);
}
if (!fs.existsSync(opts.chromium)) {
  usage(`${opts.chromium} is missing: run scripts/setup.sh (apt-get install chromium)`);
}
let chromium;
try {
  ({ chromium } = await import('playwright-core'));
} catch (e) {
  usage(`playwright-core cannot be loaded (${e.message}): run scripts/setup.sh`);
}
fs.mkdirSync(opts.out, { recursive: true });

const failures = [];
function check(ok, what) {
  if (!ok) {
    failures.push(what);
    console.error(`render: FAIL: ${what}`);
  }
  return ok;
}

// ---- PNG reading (8-bit RGB/RGBA, not interlaced: what Chromium's screenshots are) ----

function paeth(a, b, c) {
  const p = a + b - c;
  const pa = Math.abs(p - a);
  const pb = Math.abs(p - b);
  const pc = Math.abs(p - c);
  return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

/** {width, height, channels, pixels} of a PNG file's bytes. */
function readPng(buf) {
  const sig = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  if (!buf.subarray(0, 8).equals(sig)) throw new Error('not a PNG file');
  let pos = 8;
  let width = 0;
  let height = 0;
  let channels = 0;
  const idat = [];
  while (pos + 8 <= buf.length) {
    const len = buf.readUInt32BE(pos);
    const type = buf.toString('latin1', pos + 4, pos + 8);
    const data = buf.subarray(pos + 8, pos + 8 + len);
    if (type === 'IHDR') {
      width = data.readUInt32BE(0);
      height = data.readUInt32BE(4);
      const [depth, colour, , , interlace] = data.subarray(8, 13);
      channels = { 2: 3, 6: 4 }[colour];
      if (depth !== 8 || !channels || interlace !== 0) {
        throw new Error(`unsupported PNG: depth ${depth}, colour type ${colour}, interlace ${interlace}`);
      }
    } else if (type === 'IDAT') {
      idat.push(data);
    } else if (type === 'IEND') {
      break;
    }
    pos += 12 + len;
  }
  const raw = zlib.inflateSync(Buffer.concat(idat));
  const stride = width * channels;
  const pixels = Buffer.alloc(stride * height);
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)];
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    const out = pixels.subarray(y * stride, (y + 1) * stride);
    const prev = y > 0 ? pixels.subarray((y - 1) * stride, y * stride) : null;
    for (let x = 0; x < stride; x++) {
      const a = x >= channels ? out[x - channels] : 0;
      const b = prev ? prev[x] : 0;
      const c = prev && x >= channels ? prev[x - channels] : 0;
      const v = line[x];
      out[x] =
        filter === 0 ? v
        : filter === 1 ? v + a
        : filter === 2 ? v + b
        : filter === 3 ? v + ((a + b) >> 1)
        : filter === 4 ? v + paeth(a, b, c)
        : (() => { throw new Error(`bad PNG filter ${filter}`); })();
    }
  }
  return { width, height, channels, pixels };
}

/** Distinct colours and the share of pixels unlike the most common one (the background). */
function inkOf(file) {
  const { width, height, channels, pixels } = readPng(fs.readFileSync(file));
  const counts = new Map();
  for (let i = 0; i < pixels.length; i += channels) {
    const rgb = (pixels[i] << 16) | (pixels[i + 1] << 8) | pixels[i + 2];
    counts.set(rgb, (counts.get(rgb) || 0) + 1);
  }
  const background = Math.max(...counts.values());
  const total = width * height;
  return { width, height, colours: counts.size, ink: (total - background) / total };
}

// ---- a server for the view directory and speedscope ----

const types = {
  '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.json': 'application/json',
  '.svg': 'image/svg+xml', '.wasm': 'application/wasm', '.woff2': 'font/woff2', '.png': 'image/png',
  '.ico': 'image/x-icon', '.txt': 'text/plain', '.folded': 'text/plain',
};
const roots = { view: path.resolve(opts.view), speedscope: speedscopeDir };
const served = [];
const server = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://127.0.0.1');
  if (url.pathname === '/favicon.ico') {
    // Chromium asks every page's origin for one (the SVG has none)
    res.writeHead(204);
    res.end();
    return;
  }
  const [, root, ...rest] = decodeURIComponent(url.pathname).split('/');
  const base = roots[root];
  const file = base && path.resolve(base, rest.join('/'));
  if (!file || !file.startsWith(base + path.sep) || !fs.existsSync(file) || !fs.statSync(file).isFile()) {
    served.push(`404 ${url.pathname}`);
    res.writeHead(404, { 'content-type': 'text/plain' });
    res.end('not found');
    return;
  }
  served.push(`200 ${url.pathname}`);
  res.writeHead(200, { 'content-type': types[path.extname(file)] || 'application/octet-stream' });
  fs.createReadStream(file).pipe(res);
});
await new Promise((ok) => server.listen(0, '127.0.0.1', ok));
const origin = `http://127.0.0.1:${server.address().port}`;

// ---- the browser ----

const result = { names, screenshots: {} };
const browser = await chromium.launch({
  executablePath: opts.chromium,
  headless: true,
  // root in containers has no user namespaces for Chromium's sandbox
  args: ['--no-sandbox', '--disable-dev-shm-usage', '--enable-unsafe-swiftshader'],
  timeout: 120_000,
});
result.browser = `${browser.browserType().name()} ${browser.version()}`;

/** A page whose console errors, page errors, failed requests and dialogs are collected. */
async function newPage(width, height) {
  const page = await browser.newPage({ viewport: { width, height } });
  page.setDefaultTimeout(60_000);
  const problems = [];
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(`console error: ${m.text()}`);
  });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('requestfailed', (r) => problems.push(`request failed: ${r.url()}: ${r.failure()?.errorText}`));
  page.on('response', (r) => {
    if (r.status() >= 400) problems.push(`HTTP ${r.status()}: ${r.url()}`);
  });
  page.on('dialog', async (d) => {
    problems.push(`dialog (${d.type()}): ${d.message()}`);
    await d.dismiss();
  });
  return { page, problems };
}

async function shot(page, name, options = {}) {
  const file = path.join(opts.out, `${name}.png`);
  await page.screenshot({ path: file, ...options });
  const ink = inkOf(file);
  result.screenshots[name] = { file, ...ink };
  return ink;
}

async function flamegraph() {
  const { page, problems } = await newPage(1200, 800);
  const r = (result.flamegraph = {});
  await page.goto(`${origin}/view/flamegraph.svg`, { waitUntil: 'load' });
  r.root = await page.evaluate(() => document.documentElement.tagName);
  // the picture's own size (inferno's height grows with the deepest stack)
  r.size = await page.evaluate(() => {
    const b = document.documentElement.getBoundingClientRect();
    return [Math.ceil(b.width), Math.ceil(b.height)];
  });
  if (r.size[0] > 0 && r.size[1] > 0) {
    await page.setViewportSize({ width: r.size[0], height: r.size[1] });
  }
  check(r.root === 'svg', `flamegraph.svg: the document is <${r.root}>, not an SVG`);
  // Each frame is a <g> with a <title> "name (N instructions, P%)" and a <rect> and <text>.
  const frames = () =>
    page.$$eval('svg g', (gs) =>
      gs
        .filter((g) => g.querySelector(':scope > title') && g.querySelector(':scope > rect'))
        .map((g) => ({
          title: g.querySelector(':scope > title').textContent,
          text: g.querySelector(':scope > text')?.textContent ?? '',
        })),
    );
  const before = await frames();
  r.frames = before.length;
  r.titled = names.filter((n) => before.some((f) => f.title.startsWith(`${n} (`)));
  check(r.titled.length === names.length, `flamegraph.svg: frames titled ${names} expected, found ${r.titled}`);
  r.drawnBefore = names.filter((n) => before.some((f) => f.text.trim() === n));
  await shot(page, 'flamegraph');
  // inferno's script zooms on a click: the first name's frame then fills the width and
  // every frame above it is wide enough for its name.
  const n = await page.evaluate((name) => {
    const hits = [...document.querySelectorAll('svg g')].filter((g) =>
      g.querySelector(':scope > title')?.textContent.startsWith(`${name} (`),
    );
    hits.forEach((g) => g.setAttribute('data-render-target', ''));
    return hits.length;
  }, names[0]);
  if (check(n === 1, `flamegraph.svg: ${n} frames titled "${names[0]} (...)", expected 1`)) {
    await page.locator('[data-render-target]').click();
    await page.waitForFunction(
      () => !document.getElementById('unzoom')?.classList.contains('hide'),
      null,
      { timeout: 10_000 },
    ).catch(() => check(false, 'flamegraph.svg: "Reset Zoom" did not appear after the click'));
    const after = await frames();
    r.drawnZoomed = names.filter((nm) => after.some((f) => f.text.trim() === nm));
    check(
      r.drawnZoomed.length === names.length,
      `flamegraph.svg: after zooming on ${names[0]}, frames drawn with the names ${names} expected, found ${r.drawnZoomed}`,
    );
    await shot(page, `flamegraph-zoom-${names[0]}`);
  }
  r.problems = problems;
  check(problems.length === 0, `flamegraph.svg: ${problems.join('; ')}`);
  const ink = result.screenshots.flamegraph;
  check(ink.colours > 10 && ink.ink > 0.1, `flamegraph.png looks blank: ${JSON.stringify(ink)}`);
  await page.close();
}

async function speedscope() {
  const { page, problems } = await newPage(1400, 800);
  const r = (result.speedscope = {});
  const profileURL = `${origin}/view/timeline.json`;
  await page.goto(`${origin}/speedscope/index.html#profileURL=${encodeURIComponent(profileURL)}`, {
    waitUntil: 'load',
  });
  // Loaded: the profile's name is in the toolbar; or an error page, an alert ("Unrecognized
  // format!"), a console or page error shows: then stop here.
  const loaded = page.getByText(opts.profile, { exact: false }).first();
  const failed = page.getByText('Something went wrong').first();
  const until = Date.now() + 60_000;
  while (Date.now() < until && problems.length === 0) {
    if ((await loaded.isVisible()) || (await failed.isVisible())) break;
    await page.waitForTimeout(200);
  }
  r.error = await failed.isVisible();
  check(!r.error, 'speedscope: "Something went wrong" (it could not import timeline.json)');
  r.toolbar = (await page.locator('body').innerText()).split('\n').filter((l) => l.trim()).slice(0, 12);
  r.profileShown = r.toolbar.some((l) => l.includes(opts.profile));
  check(r.profileShown, `speedscope: profile "${opts.profile}" not shown; the page says: ${r.toolbar}`);
  if (!r.profileShown || r.error) {
    await shot(page, 'speedscope-failed');
    r.problems = problems;
    check(problems.length === 0, `speedscope: ${problems.join('; ')}`);
    await page.close();
    return;
  }
  const canvas = page.locator('canvas').first();
  r.canvases = await page.locator('canvas').count();
  if (check(r.canvases > 0, 'speedscope: no canvas (no flame chart)')) {
    await page.waitForTimeout(1000); // a frame or two for WebGL
    await shot(page, 'speedscope-time-order');
    const box = await canvas.boundingBox();
    // The flame chart's area only: its upper part (the frames start at the top).
    const ink = await shot(page, 'speedscope-time-order-chart', {
      clip: { x: box.x, y: box.y, width: box.width, height: Math.min(box.height, 300) },
    });
    check(
      ink.colours >= 8 && ink.ink > 0.05,
      `speedscope: the time-order flame chart looks blank: ${JSON.stringify(ink)}`,
    );
  }
  // Sandwich: a DOM table of every function, drawn a screenful of rows at a time: scroll
  // it through, reading the rows (total, self, name), and select --select on the way.
  await page.getByText('Sandwich').first().click();
  // (the rows' scrolling box; the other tables are the hidden list of profiles and the
  // Sandwich view's header)
  const found = await page
    .waitForFunction(
      () => {
        const box = [...document.querySelectorAll('div')].find((e) => {
          const o = getComputedStyle(e).overflowY;
          return (o === 'auto' || o === 'scroll') && e.clientHeight > 0 && e.querySelector('table tr td');
        });
        box?.setAttribute('data-render-rows', '');
        return !!box;
      },
      null,
      { timeout: 30_000 },
    )
    .then(() => true)
    .catch(() => check(false, 'speedscope: no rows in the Sandwich view'));
  await shot(page, 'speedscope-sandwich');
  const rows = new Map();
  let selected = false;
  for (let step = 0; found && step < 10_000; step++) {
    const seen = await page.$$eval('[data-render-rows] tr', (trs) =>
      trs
        .map((tr) => [...tr.querySelectorAll('td')].map((c) => c.textContent.trim()))
        .filter((cells) => cells.length >= 3),
    );
    for (const [total, self, name] of seen) rows.set(name, { total, self });
    if (!selected && rows.has(opts.select)) {
      const row = page
        .locator('[data-render-rows] tr', { has: page.locator(`td:text-is("${opts.select}")`) })
        .first();
      await row.scrollIntoViewIfNeeded();
      await row.click();
      selected = true;
      await page.waitForTimeout(1000);
      await shot(page, `speedscope-sandwich-${opts.select}`);
    }
    const moved = await page.evaluate(() => {
      const box = document.querySelector('[data-render-rows]');
      const before = box.scrollTop;
      box.scrollTop = before + box.clientHeight / 2;
      return box.scrollTop > before;
    });
    if (!moved) break;
    await page.waitForTimeout(50);
  }
  r.sandwich = Object.fromEntries(rows);
  r.listed = names.filter((n) => rows.has(n));
  check(r.listed.length === names.length, `speedscope: the Sandwich table lists ${r.listed} of ${names} (${rows.size} rows)`);
  check(selected, `speedscope: no Sandwich row "${opts.select}" to select`);
  r.problems = problems;
  check(problems.length === 0, `speedscope: ${problems.join('; ')}`);
  await page.close();
}

let crashed = null;
try {
  await flamegraph();
  await speedscope();
} catch (e) {
  crashed = e;
  check(false, `crashed: ${e.stack || e}`);
} finally {
  await browser.close();
  server.close();
}
result.served = served;
result.failures = failures;
fs.writeFileSync(path.join(opts.out, 'result.json'), JSON.stringify(result, null, 1));
for (const [name, s] of Object.entries(result.screenshots)) {
  console.log(`screenshot ${name}: ${s.file} (${s.width}x${s.height}, ${s.colours} colours, ${(s.ink * 100).toFixed(1)}% ink)`);
}
if (failures.length > 0) {
  console.error(`render: ${failures.length} checks failed${crashed ? ' (crashed)' : ''}`);
  process.exit(1);
}
console.log('render: ok');
