// The admin dashboard (/admin) in real Chromium against a real Quire server with keys and a
// webhook receiver, while a load of stock y-websocket clients edits three documents:
// sign-in keeps the credential in session storage only, the plots move with the load, the
// rooms and documents tables show it, a dead webhook event is retried from the page and
// delivered, a screenshot is taken of every panel, and neither the addresses the page asked
// for nor the server's log hold the credential.
//
//   QUIRE_BIN=target/debug/quire node --test web/test/admin.test.mjs
//
// Screenshots go to target/screenshots/admin-*.png.

import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { mkdir, mkdtemp, rm } from 'node:fs/promises'
import http from 'node:http'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { chromium } from 'playwright-core'
import * as Y from 'yjs'
import { WebsocketProvider } from 'y-websocket'
import WebSocket from 'ws'

const here = dirname(fileURLToPath(import.meta.url))
const repoDir = resolve(here, '..', '..')
const shotsDir = join(repoDir, 'target', 'screenshots')
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium'
const WAIT = 30_000
const ADMIN_KEY = 'admin-key-for-the-dashboard-test-7c1e9a'
const SIGNING_KEY = 'k1:dashboard-test-signing-secret-0123456789'
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

const QUIRE_BIN = process.env.QUIRE_BIN
if (!QUIRE_BIN) throw new Error('QUIRE_BIN is not set: point it at the quire binary')
if (!existsSync(QUIRE_BIN)) throw new Error(`QUIRE_BIN=${QUIRE_BIN} does not exist`)

let server = null
let serverLog = ''
let base = ''
let dataDir = ''
let browser = null
let receiver = null
let accepting = false
const received = [] // { id, accepted }

function startReceiver () {
  return new Promise((resolvePromise) => {
    const s = http.createServer((req, res) => {
      let body = ''
      req.on('data', (c) => { body += c })
      req.on('end', () => {
        received.push({ id: req.headers['idempotency-key'], accepted: accepting, body })
        res.writeHead(accepting ? 204 : 500)
        res.end()
      })
    })
    s.listen(0, '127.0.0.1', () => resolvePromise(s))
  })
}

function startServer (hookPort) {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(resolve(QUIRE_BIN), [
      'serve',
      '--bind', '127.0.0.1:0',
      '--database', `sqlite://${join(dataDir, 'quire.db')}`,
      '--auth-key', SIGNING_KEY,
      '--admin-key', ADMIN_KEY,
      '--admin-sample-every', '500ms',
      '--webhook-url', `http://127.0.0.1:${hookPort}/hook`,
      '--webhook-max-attempts', '1',
      '--webhook-debounce', '100ms',
      '--snapshot-updates', '40'
    ], {
      // Everything the server logs, down to debug, is searched for the credential.
      env: { ...process.env, QUIRE_LOG: 'debug', NO_COLOR: '1' },
      stdio: ['ignore', 'pipe', 'pipe']
    })
    let port = 0
    const timer = setTimeout(() => reject(new Error(`quire did not start:\n${serverLog}`)), 60_000)
    const onData = (chunk) => {
      serverLog += chunk
      const m = /quire listening on 127\.0\.0\.1:(\d+)/.exec(serverLog)
      if (m && !port) {
        port = Number(m[1])
        clearTimeout(timer)
        resolvePromise({ child, port })
      }
    }
    child.stdout.setEncoding('utf8')
    child.stderr.setEncoding('utf8')
    child.stdout.on('data', onData)
    child.stderr.on('data', onData)
    child.on('exit', (code) => {
      clearTimeout(timer)
      if (!port) reject(new Error(`quire exited (${code}) before listening:\n${serverLog}`))
    })
  })
}

before(async () => {
  await mkdir(shotsDir, { recursive: true })
  dataDir = await mkdtemp(join(tmpdir(), 'quire-admin-'))
  receiver = await startReceiver()
  const { child, port } = await startServer(receiver.address().port)
  server = child
  base = `http://127.0.0.1:${port}`
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run']
  })
})

after(async () => {
  if (browser) await browser.close().catch(() => {})
  if (server && server.exitCode === null) {
    const exited = new Promise((r) => server.once('exit', r))
    server.kill('SIGTERM')
    const timer = setTimeout(() => server.kill('SIGKILL'), 5_000)
    await exited
    clearTimeout(timer)
  }
  if (receiver) {
    // Quire's webhook client keeps its connection open: close it, or the process waits on it.
    receiver.closeAllConnections()
    receiver.close()
  }
  if (dataDir) await rm(dataDir, { recursive: true, force: true })
})

async function apiAsAdmin (path, options = {}) {
  const res = await fetch(`${base}/api/v1${path}`, {
    ...options,
    headers: { 'content-type': 'application/json', authorization: `Bearer ${ADMIN_KEY}`, ...(options.headers || {}) }
  })
  assert.ok(res.ok, `${path}: ${res.status} ${await res.clone().text()}`)
  return res.json()
}

// A bounded load: in each of `docs`, one writer types a few characters every 40 ms and a
// reader follows, all stock y-websocket clients with tokens the admin issued.
async function startLoad (docs, ms) {
  const clients = []
  for (const name of docs) {
    const { token } = await apiAsAdmin('/tokens', {
      method: 'POST',
      body: JSON.stringify({ user: `load-${name}`, doc: name, permission: 'write', ttl_secs: 600 })
    })
    for (let i = 0; i < 2; i++) {
      const doc = new Y.Doc()
      const provider = new WebsocketProvider(base.replace('http', 'ws'), name, doc, {
        WebSocketPolyfill: WebSocket,
        disableBc: true,
        params: { token }
      })
      clients.push({ doc, provider, writer: i === 0 })
    }
  }
  const stopAt = Date.now() + ms
  const timer = setInterval(() => {
    if (Date.now() > stopAt) return
    for (const c of clients) {
      if (c.writer && c.provider.synced) c.doc.getText('text').insert(0, 'abc ')
    }
  }, 40)
  return {
    clients,
    stop: () => {
      clearInterval(timer)
      // The document too: its awareness keeps a timer until the document is destroyed.
      for (const c of clients) {
        c.provider.destroy()
        c.doc.destroy()
      }
    }
  }
}

test('the dashboard signs in, moves with a load, retries a dead event, and leaks no credential', { timeout: 180_000 }, async (t) => {
  const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } })
  const page = await context.newPage()
  const urls = []
  const errors = []
  page.on('request', (r) => urls.push(r.url()))
  const refused = []
  page.on('response', (r) => { if (r.status() === 401 || r.status() === 403) refused.push(`${r.status()} ${r.url()} ${r.request().headers().authorization ? 'with' : 'without'} credential`) })
  page.on('pageerror', (e) => errors.push(String(e)))
  // Refused requests are counted from the responses (`refused`), not from the console.
  page.on('console', (m) => { if (m.type() === 'error' && !/^Failed to load resource/.test(m.text())) errors.push(m.text()) })

  // A wrong credential: refused, nothing kept.
  await page.goto(`${base}/admin`)
  await page.locator('#login').waitFor({ state: 'visible' })
  await page.fill('#credential', 'not-the-key')
  await page.click('#login button[type=submit]')
  await page.locator('#login-error').filter({ hasText: 'Not accepted' }).waitFor({ timeout: WAIT })
  assert.equal(await page.evaluate(() => sessionStorage.length), 0)
  // Refused attempts count against the address: the wrong key above is one of them.

  await page.fill('#credential', ADMIN_KEY)
  await page.click('#login button[type=submit]')
  await page.locator('#dashboard').waitFor({ state: 'visible', timeout: WAIT })
  await page.locator('#status.live').waitFor({ timeout: WAIT })
  assert.equal(await page.evaluate(() => sessionStorage.getItem('quire.admin.credential')), ADMIN_KEY)
  assert.equal(await page.evaluate(() => localStorage.length), 0, 'nothing in local storage')
  assert.equal(await page.evaluate(() => document.cookie), '', 'no cookie')

  // Documents whose creation events die (the receiver refuses, one attempt allowed).
  const docs = ['load-alpha', 'load-beta', 'load-gamma']
  for (const name of docs) {
    await apiAsAdmin('/docs', { method: 'POST', body: JSON.stringify({ name, title: name }) })
  }

  const load = await startLoad(docs, 12_000)
  try {
    // The plots move: the number of samples drawn grows, and updates in rise above zero.
    const points = () => page.$eval('#plot-updates', (s) => Number(s.dataset.points))
    await page.waitForFunction(() => Number(document.getElementById('plot-updates').dataset.last) > 0, null, { timeout: WAIT })
    const before = await points()
    const pathBefore = await page.$eval('#plot-updates path.series', (p) => p.getAttribute('d'))
    await sleep(2_000)
    assert.ok(await points() > before, 'new samples are drawn while the load runs')
    assert.notEqual(await page.$eval('#plot-updates path.series', (p) => p.getAttribute('d')), pathBefore)
    await page.waitForFunction(() => Number(document.getElementById('plot-latency').dataset.last) > 0, null, { timeout: WAIT })
    await page.waitForFunction(() => Number(document.getElementById('plot-connections').dataset.last) === 6, null, { timeout: WAIT })
    assert.ok(Number(await page.$eval('#plot-memory', (s) => s.dataset.last)) > 1 << 20, 'resident memory is plotted')

    // The live rooms and the documents table show the load.
    for (const name of docs) {
      await page.waitForFunction((n) => [...document.querySelectorAll('#rooms tbody tr')]
        .some((tr) => tr.cells[0].textContent === n && tr.cells[1].textContent.trim() === '2'), name, { timeout: WAIT })
    }
    await page.locator('#docs tbody tr', { hasText: 'load-alpha' }).locator('.badge', { hasText: 'live' }).waitFor({ timeout: WAIT })

    // The dead letters: one per document, each with a Retry button.
    await page.waitForFunction((n) => document.querySelectorAll('#dead button[data-id]').length >= n, docs.length, { timeout: WAIT })
    for (const [panel, name] of [['overview', 'overview'], ['plots', 'plots'], ['rooms', 'rooms'], ['docs', 'documents'], ['outbox', 'outbox'], ['cluster', 'cluster']]) {
      await page.locator(`#panel-${panel}`).screenshot({ path: join(shotsDir, `admin-${name}.png`) })
    }
    await page.screenshot({ path: join(shotsDir, 'admin-dashboard.png') })
  } finally {
    load.stop()
  }

  // Retry one from the page once the receiver accepts: it is delivered with its event id and
  // leaves the dead letters.
  accepting = true
  const deadId = await page.locator('#dead button[data-id]').first().getAttribute('data-id')
  // By its id: the table is redrawn every few seconds.
  const button = page.locator(`#dead button[data-id="${deadId}"]`)
  const outbox = await apiAsAdmin('/admin/outbox')
  const dead = outbox.dead.find((d) => String(d.id) === deadId)
  assert.ok(dead, `dead event ${deadId} is listed`)
  await button.click()
  const deadline = Date.now() + WAIT
  while (!received.some((r) => r.id === dead.event_id && r.accepted)) {
    assert.ok(Date.now() < deadline, `the retried event ${dead.event_id} was never delivered`)
    await sleep(50)
  }
  await page.waitForFunction((id) => !document.querySelector(`#dead button[data-id="${id}"]`), deadId, { timeout: WAIT })
  await page.locator('#outbox tbody tr', { hasText: 'delivered' }).first().waitFor({ timeout: WAIT })

  // The cluster panel on one SQLite node: this node, alive.
  await page.locator('#nodes tbody tr', { hasText: 'this node' }).locator('.badge', { hasText: 'alive' }).waitFor({ timeout: WAIT })

  // Sign out: the credential is gone from the tab.
  await page.click('#logout')
  await page.locator('#login').waitFor({ state: 'visible' })
  assert.equal(await page.evaluate(() => sessionStorage.length), 0)

  // A reload after signing out asks again; a new tab never had it.
  await page.reload()
  await page.locator('#login').waitFor({ state: 'visible' })

  assert.equal(refused.length, 1, `only the wrong key was refused: ${refused.join('; ')}`)
  assert.deepEqual(errors, [], 'no errors in the page (CSP violations included)')
  const leaked = urls.filter((u) => u.includes(ADMIN_KEY) || u.includes(encodeURIComponent(ADMIN_KEY)))
  assert.deepEqual(leaked, [], 'no address the page asked for holds the credential')
  assert.ok(!serverLog.includes(ADMIN_KEY), 'the server log never holds the admin key')
  assert.ok(serverLog.length > 0)
  t.diagnostic(`screenshots in ${shotsDir}; ${urls.length} requests checked; ${serverLog.split('\n').length} log lines checked`)
  await context.close()
})
