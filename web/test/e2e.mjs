// End-to-end tests of the editor pages in real Chromium against a real Quire server.
//
//   node web/bundle.mjs
//   QUIRE_BIN=target/debug/quire node --test web/test/e2e.mjs
//
// The test starts `$QUIRE_BIN serve` on a free port with a fresh SQLite database and
// `--web-root web/dist`, drives headless Chromium (/usr/bin/chromium, or $CHROMIUM) with
// playwright-core, and leaves screenshots in target/screenshots/.

import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { mkdir, mkdtemp, rm } from 'node:fs/promises'
import net from 'node:net'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { chromium } from 'playwright-core'

const here = dirname(fileURLToPath(import.meta.url))
const webDir = resolve(here, '..')
const repoDir = resolve(webDir, '..')
const distDir = join(webDir, 'dist')
const shotsDir = join(repoDir, 'target', 'screenshots')
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium'
const WAIT = 20_000
const TEST_TIMEOUT = 120_000

const QUIRE_BIN = process.env.QUIRE_BIN
if (!QUIRE_BIN) {
  throw new Error('QUIRE_BIN is not set: point it at the quire binary, e.g. QUIRE_BIN=target/debug/quire node --test web/test/e2e.mjs')
}
if (!existsSync(QUIRE_BIN)) throw new Error(`QUIRE_BIN=${QUIRE_BIN} does not exist`)
for (const f of ['index.html', 'stock.html', 'tiptap.html', 'assets/editor.js', 'assets/stock.js', 'assets/tiptap.js', 'assets/quire_client_bg.wasm']) {
  if (!existsSync(join(distDir, f))) throw new Error(`web/dist/${f} is missing: run \`node web/bundle.mjs\` first`)
}

let server = null
let serverLog = ''
let base = ''
let port = 0
let dataDir = ''
let browser = null
const contexts = new Set()

// ---------------------------------------------------------------------------------------------
// The server and the browser

/** Starts `quire serve` on `db` (a file in the test's data directory) with `extra` flags;
 *  resolves to `{ child, port }`. */
function startServer (db = 'quire.db', extra = []) {
  return new Promise((resolvePromise, reject) => {
    let port = 0
    const child = spawn(resolve(QUIRE_BIN), [
      'serve',
      '--bind', '127.0.0.1:0',
      '--database', `sqlite://${join(dataDir, db)}`,
      '--web-root', distDir,
      ...extra
    ], { env: { ...process.env, QUIRE_LOG: 'warn' }, stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = ''
    const timer = setTimeout(() => {
      reject(new Error(`quire did not print its address within 60 s; output:\n${serverLog}`))
    }, 60_000)
    child.stdout.setEncoding('utf8')
    child.stderr.setEncoding('utf8')
    child.stdout.on('data', (chunk) => {
      serverLog += chunk
      stdout += chunk
      const m = /quire listening on (127\.0\.0\.1):(\d+)/.exec(stdout)
      if (m && !port) {
        clearTimeout(timer)
        port = Number(m[2])
        resolvePromise({ child, port })
      }
    })
    child.stderr.on('data', (chunk) => { serverLog += chunk })
    child.on('exit', (code, signal) => {
      clearTimeout(timer)
      if (!port) reject(new Error(`quire exited (code ${code}, signal ${signal}) before listening:\n${serverLog}`))
    })
    child.on('error', (e) => {
      clearTimeout(timer)
      reject(e)
    })
  })
}

before(async () => {
  await mkdir(shotsDir, { recursive: true })
  dataDir = await mkdtemp(join(tmpdir(), 'quire-e2e-'))
  ;({ child: server, port } = await startServer())
  base = `http://127.0.0.1:${port}`
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run']
  })
})

after(async () => {
  for (const c of contexts) await c.close().catch(() => {})
  if (browser) await browser.close().catch(() => {})
  if (server && server.exitCode === null) {
    const exited = new Promise((r) => server.once('exit', r))
    server.kill('SIGTERM')
    const timer = setTimeout(() => server.kill('SIGKILL'), 5_000)
    await exited
    clearTimeout(timer)
  }
  if (dataDir) await rm(dataDir, { recursive: true, force: true })
})

let docCounter = 0
/** A document name no other test (or earlier run) uses. */
function freshDoc (label) {
  docCounter++
  return `e2e-${label}-${Date.now().toString(36)}-${docCounter}`
}

/** A browser context (a separate "person": own storage, own focus) with one page. */
async function newPage (t) {
  const context = await browser.newContext({ viewport: { width: 1100, height: 640 } })
  contexts.add(context)
  const page = await context.newPage()
  page.errors = []
  page.on('pageerror', (e) => page.errors.push(String(e && e.stack ? e.stack : e)))
  page.on('console', (msg) => {
    if (msg.type() !== 'error' && msg.type() !== 'warning') return
    const text = msg.text()
    t.diagnostic(`[browser ${msg.type()}] ${text}`)
    // Refused reconnections are expected while a test keeps a page offline; CodeMirror
    // reports a crashed plugin (and other code its errors) with console.error.
    if (msg.type() === 'error' && !/^WebSocket connection to .* failed|^Failed to load resource/.test(text)) {
      page.errors.push(text)
    }
  })
  page.closeContext = async () => {
    contexts.delete(context)
    await context.close()
  }
  return page
}

function wasmUrl (origin, doc, name, extra = {}) {
  const q = new URLSearchParams({ doc, name, ...extra })
  return `${origin}/?${q}`
}

function stockUrl (origin, doc, name) {
  const q = new URLSearchParams({ doc, name })
  return `${origin}/stock.html?${q}`
}

/** Opens the WASM editor page and waits until it is connected and synced. */
async function openWasm (page, origin, doc, name, extra) {
  await page.goto(wasmUrl(origin, doc, name, extra))
  await page.waitForFunction(() => window.quire && window.quire.client && window.quire.view, null, { timeout: WAIT })
  await page.waitForFunction(() => window.quire.client.status === 'connected' && window.quire.client.synced, null, { timeout: WAIT })
  await waitForText(page, '#status', 'connected')
}

/** Opens the stock y-websocket page and waits until it is synced. */
async function openStock (page, origin, doc, name) {
  await page.goto(stockUrl(origin, doc, name))
  await page.waitForFunction(() => window.quire && window.quire.provider && window.quire.provider.synced, null, { timeout: WAIT })
  await waitForText(page, '#status', 'connected')
}

/** Opens the Tiptap page (@hocuspocus/provider on /hocuspocus) and waits until it is
 *  authenticated and synced. */
async function openTiptap (page, origin, doc, name) {
  const q = new URLSearchParams({ doc, name })
  await page.goto(`${origin}/tiptap.html?${q}`)
  await page.waitForFunction(() => window.quire && window.quire.editor && window.quire.provider, null, { timeout: WAIT })
  await page.waitForFunction(() => window.quire.provider.isAuthenticated && window.quire.provider.isSynced, null, { timeout: WAIT })
  await waitForText(page, '#status', 'connected')
}

/** A Tiptap page's document: the editor's text, and its paragraphs as the DOM shows them
 *  (caret widgets removed). */
async function readTiptap (page) {
  return page.evaluate(() => {
    const paragraphs = [...document.querySelectorAll('.tiptap-content > p')].map((p) => {
      const copy = p.cloneNode(true)
      for (const w of copy.querySelectorAll('.collaboration-carets__caret')) w.remove()
      return copy.textContent
    })
    return { editor: window.quire.editor.getText({ blockSeparator: '\n' }), dom: paragraphs.join('\n') }
  })
}

/** Waits until every Tiptap page shows the same text, containing `parts`. */
async function waitTiptapConverged (pages, parts, timeout = WAIT) {
  const deadline = Date.now() + timeout
  let last = null
  while (Date.now() < deadline) {
    last = await Promise.all(pages.map(readTiptap))
    const first = last[0].editor
    if (last.every((r) => r.editor === first && r.dom === first) && parts.every((p) => first.includes(p))) return first
    await new Promise((r) => setTimeout(r, 100))
  }
  assert.fail(`Tiptap pages did not converge on ${JSON.stringify(parts)} within ${timeout} ms:\n${JSON.stringify(last, null, 2)}`)
}

async function waitForText (page, selector, expected, timeout = WAIT) {
  await page.waitForFunction(([sel, want]) => {
    const el = document.querySelector(sel)
    return el != null && el.textContent === want
  }, [selector, expected], { timeout })
}

/** The document as the model holds it and as the editor shows it (cursor widgets removed). */
async function readTexts (page) {
  return page.evaluate(() => {
    const lines = [...document.querySelectorAll('.cm-content .cm-line')].map((line) => {
      const copy = line.cloneNode(true)
      for (const w of copy.querySelectorAll('.cm-quire-cursor, .cm-ySelectionCaret, .cm-widgetBuffer')) w.remove()
      return copy.textContent
    })
    return {
      model: window.quire.text.toString(),
      editor: window.quire.view.state.doc.toString(),
      dom: lines.join('\n')
    }
  })
}

/** Waits until every page's model, editor state and visible text are equal and contain `parts`. */
async function waitConverged (pages, parts, timeout = WAIT) {
  const deadline = Date.now() + timeout
  let last = null
  while (Date.now() < deadline) {
    last = await Promise.all(pages.map(readTexts))
    const first = last[0].model
    const same = last.every((r) => r.model === first && r.editor === first && r.dom === first)
    if (same && parts.every((p) => first.includes(p))) return first
    await new Promise((r) => setTimeout(r, 100))
  }
  assert.fail(`pages did not converge on a text containing ${JSON.stringify(parts)} within ${timeout} ms:\n${JSON.stringify(last, null, 2)}`)
}

/** Waits until the page shows everything saved: the label and its `data-saved` together, in
 *  one look (a page whose token expires reconnects right after, and is briefly unsynced). */
async function waitSaved (page) {
  await page.waitForFunction(() => {
    const el = document.getElementById('saved')
    return el != null && el.textContent === 'All changes saved' && el.dataset.saved === 'true'
  }, null, { timeout: WAIT })
}

/** Puts the caret at the end of line `line` (1-based) of the editor. */
async function caretAtLineEnd (page, line) {
  await page.evaluate((n) => {
    const view = window.quire.view
    const pos = view.state.doc.line(n).to
    view.focus()
    view.dispatch({ selection: { anchor: pos } })
  }, line)
}

/** Puts the caret at document position `pos` (UTF-16 code units). */
async function caretAt (page, pos) {
  await page.evaluate((p) => {
    const view = window.quire.view
    view.focus()
    view.dispatch({ selection: { anchor: p } })
  }, pos)
}

/** The binding never had to fall back to rebuilding the editor from the text. */
async function assertBindingClean (page) {
  const stats = await page.evaluate(() => window.quire.stats)
  assert.equal(stats.resyncs, 0, `the CodeMirror binding had to resynchronise: ${JSON.stringify(stats)}`)
  assert.deepEqual(page.errors, [], 'uncaught errors in the page')
}

async function shot (page, name) {
  await page.screenshot({ path: join(shotsDir, `${name}.png`) })
}

// ---------------------------------------------------------------------------------------------
// A TCP proxy between one browser context and the server, to take it offline for real.

class CutProxy {
  constructor (targetPort) {
    this.targetPort = targetPort
    this.port = 0
    this.server = null
    this.sockets = new Set()
  }

  track (socket) {
    this.sockets.add(socket)
    socket.on('close', () => this.sockets.delete(socket))
    socket.on('error', () => socket.destroy())
  }

  listen () {
    return new Promise((resolvePromise, reject) => {
      const server = net.createServer((client) => {
        const upstream = net.connect(this.targetPort, '127.0.0.1')
        this.track(client)
        this.track(upstream)
        client.on('close', () => upstream.destroy())
        upstream.on('close', () => client.destroy())
        client.pipe(upstream)
        upstream.pipe(client)
      })
      server.once('error', reject)
      server.listen(this.port, '127.0.0.1', () => {
        server.off('error', reject)
        this.port = server.address().port
        this.server = server
        resolvePromise()
      })
    })
  }

  /** Stops listening (new connections are refused) and kills every open connection. */
  async cut () {
    const server = this.server
    this.server = null
    const closed = server ? new Promise((r) => server.close(r)) : Promise.resolve()
    for (const s of this.sockets) s.destroy()
    await closed
  }

  /** Listens again on the same port. */
  async restore () {
    await this.listen()
  }
}

// ---------------------------------------------------------------------------------------------
// The tests

test('two WASM editors typing at the same time converge and are saved', { timeout: TEST_TIMEOUT }, async (t) => {
  const doc = freshDoc('concurrent')
  const alice = await newPage(t)
  const bob = await newPage(t)
  await openWasm(alice, base, doc, 'Alice')
  await openWasm(bob, base, doc, 'Bob')

  // Two lines, so each person types at a place of their own.
  await caretAtLineEnd(alice, 1)
  await alice.keyboard.type('first line\nsecond line', { delay: 5 })
  await waitConverged([alice, bob], ['first line\nsecond line'])

  await caretAtLineEnd(alice, 1)
  await caretAtLineEnd(bob, 2)
  const fromAlice = ' - Alice was here'
  const fromBob = ' - Bob typed this'
  await Promise.all([
    alice.keyboard.type(fromAlice, { delay: 40 }),
    bob.keyboard.type(fromBob, { delay: 35 })
  ])
  const text = await waitConverged([alice, bob], [fromAlice, fromBob])
  assert.equal(text, `first line${fromAlice}\nsecond line${fromBob}`)
  await Promise.all([waitSaved(alice), waitSaved(bob)])

  // Each sees the other in the people list.
  await alice.waitForFunction(() => document.getElementById('peers').textContent.includes('Bob'), null, { timeout: WAIT })
  await bob.waitForFunction(() => document.getElementById('peers').textContent.includes('Alice'), null, { timeout: WAIT })

  await shot(alice, 'a-concurrent-alice')
  await shot(bob, 'a-concurrent-bob')
  await assertBindingClean(alice)
  await assertBindingClean(bob)
  await alice.closeContext()
  await bob.closeContext()
})

test('an editor that goes offline keeps editing and catches up when it is back', { timeout: TEST_TIMEOUT }, async (t) => {
  const doc = freshDoc('offline')
  const proxy = new CutProxy(port)
  await proxy.listen()
  try {
    const alice = await newPage(t)
    const bob = await newPage(t)
    const fast = { minBackoffMs: '100', maxBackoffMs: '1000' }
    await openWasm(alice, `http://127.0.0.1:${proxy.port}`, doc, 'Alice', fast)
    await openWasm(bob, base, doc, 'Bob', fast)
    await assertBannerHidden(alice)

    await caretAtLineEnd(alice, 1)
    await alice.keyboard.type('online start\nbob line', { delay: 5 })
    await waitConverged([alice, bob], ['online start\nbob line'])
    await waitSaved(alice)

    // Cut Alice off.
    await proxy.cut()
    await waitForText(alice, '#status', 'offline')
    assert.equal(await alice.getAttribute('#status', 'data-status'), 'offline')
    await alice.waitForSelector('#offline-banner', { state: 'visible', timeout: WAIT })
    assert.equal(await alice.getAttribute('#offline-banner', 'hidden'), null)

    // Both keep typing; Alice's edits stay local.
    await caretAtLineEnd(alice, 1)
    await caretAtLineEnd(bob, 2)
    const offlineText = ' + written offline'
    const onlineText = ' + written online'
    await Promise.all([
      alice.keyboard.type(offlineText, { delay: 30 }),
      bob.keyboard.type(onlineText, { delay: 30 })
    ])
    await bob.waitForFunction((s) => window.quire.text.toString().includes(s), onlineText, { timeout: WAIT })
    assert.ok(!(await readTexts(bob)).model.includes(offlineText), 'an offline edit reached the other editor')
    assert.ok(!(await readTexts(alice)).model.includes(onlineText), 'an online edit reached the offline editor')
    await alice.waitForFunction(() => /^Not saved \(offline, [1-9]\d* unsaved\)$/.test(document.getElementById('saved').textContent), null, { timeout: WAIT })
    assert.equal(await alice.getAttribute('#saved', 'data-saved'), 'false')
    await shot(alice, 'b-offline-alice')

    // Back online: everything converges and is saved.
    await proxy.restore()
    await waitForText(alice, '#status', 'connected')
    const text = await waitConverged([alice, bob], [offlineText, onlineText])
    assert.equal(text, `online start${offlineText}\nbob line${onlineText}`)
    await alice.waitForSelector('#offline-banner', { state: 'hidden', timeout: WAIT })
    await assertBannerHidden(alice)
    await Promise.all([waitSaved(alice), waitSaved(bob)])

    await shot(alice, 'b-reconnected-alice')
    await shot(bob, 'b-reconnected-bob')
    await assertBindingClean(alice)
    await assertBindingClean(bob)
    await alice.closeContext()
    await bob.closeContext()
  } finally {
    await proxy.cut()
  }
})

async function assertBannerHidden (page) {
  assert.notEqual(await page.getAttribute('#offline-banner', 'hidden'), null, 'the offline banner is shown')
}

test('unsaved work survives a reload while offline and is saved once back', { timeout: TEST_TIMEOUT }, async (t) => {
  const doc = freshDoc('reload')
  const proxy = new CutProxy(port)
  await proxy.listen()
  try {
    const alice = await newPage(t)
    const bob = await newPage(t)
    // The page comes from the server itself; only its sync connection goes through the proxy,
    // so the page can be reloaded while the document is unreachable.
    const viaProxy = { server: `ws://127.0.0.1:${proxy.port}`, minBackoffMs: '100', maxBackoffMs: '1000' }
    await openWasm(alice, base, doc, 'Alice', viaProxy)
    await openWasm(bob, base, doc, 'Bob')
    await caretAtLineEnd(alice, 1)
    await alice.keyboard.type('saved part', { delay: 5 })
    await waitConverged([alice, bob], ['saved part'])
    await waitSaved(alice)

    await proxy.cut()
    await waitForText(alice, '#status', 'offline')
    await caretAtLineEnd(alice, 1)
    const kept = ' + typed offline, kept across a reload'
    await alice.keyboard.type(kept, { delay: 5 })
    await alice.waitForFunction(() => window.quire.client.unsaved > 0, null, { timeout: WAIT })
    await alice.reload()
    await alice.waitForFunction(() => window.quire && window.quire.view, null, { timeout: WAIT })
    await waitForText(alice, '#status', 'offline')
    const reloaded = await readTexts(alice)
    assert.equal(reloaded.model, `saved part${kept}`, 'the offline edit is back after the reload')
    assert.equal(reloaded.editor, reloaded.model)
    assert.ok(!(await readTexts(bob)).model.includes(kept))
    await shot(alice, 'g-reloaded-offline-alice')

    await proxy.restore()
    await waitForText(alice, '#status', 'connected')
    await waitConverged([alice, bob], [kept])
    await waitSaved(alice)
    await alice.waitForFunction(() => Object.keys(window.localStorage).every((k) => !k.startsWith('quire:unsaved:')), null, { timeout: WAIT })
    await assertBindingClean(alice)
    await alice.closeContext()
    await bob.closeContext()
  } finally {
    await proxy.cut()
  }
})

test('the WASM editor and the stock y-websocket editor converge', { timeout: TEST_TIMEOUT }, async (t) => {
  const doc = freshDoc('stock')
  const wasm = await newPage(t)
  const stock = await newPage(t)
  await openWasm(wasm, base, doc, 'Wendy')
  await openStock(stock, base, doc, 'Stan')

  await caretAtLineEnd(wasm, 1)
  await wasm.keyboard.type('from wasm\nfrom stock', { delay: 5 })
  await waitConverged([wasm, stock], ['from wasm\nfrom stock'])

  await caretAtLineEnd(wasm, 1)
  await caretAtLineEnd(stock, 2)
  const a = ' (WASM client typing)'
  const b = ' (y-websocket typing)'
  await Promise.all([
    wasm.keyboard.type(a, { delay: 35 }),
    stock.keyboard.type(b, { delay: 40 })
  ])
  const text = await waitConverged([wasm, stock], [a, b])
  assert.equal(text, `from wasm${a}\nfrom stock${b}`)

  // Deleting on the stock side shows up on the WASM side too.
  await caretAtLineEnd(stock, 2)
  for (let i = 0; i < ' typing)'.length; i++) await stock.keyboard.press('Backspace')
  await stock.keyboard.type(')', { delay: 10 })
  const trimmed = await waitConverged([wasm, stock], ['(y-websocket)'])
  assert.equal(trimmed, `from wasm${a}\nfrom stock (y-websocket)`)
  await waitSaved(wasm)

  // The pages link to each other for the same document.
  const link = await wasm.getAttribute('#other-page', 'href')
  assert.ok(link.startsWith('/stock.html?') && new URL(link, base).searchParams.get('doc') === doc, link)
  const back = await stock.getAttribute('#other-page', 'href')
  assert.ok(back.startsWith('/?') && new URL(back, base).searchParams.get('doc') === doc, back)

  await shot(wasm, 'c-mixed-wasm')
  await shot(stock, 'c-mixed-stock')
  await assertBindingClean(wasm)
  assert.deepEqual(stock.errors, [])
  await wasm.closeContext()
  await stock.closeContext()
})

test('text beyond ASCII (UTF-16 positions) stays consistent across both clients', { timeout: TEST_TIMEOUT }, async (t) => {
  const doc = freshDoc('unicode')
  const wasm = await newPage(t)
  const stock = await newPage(t)
  await openWasm(wasm, base, doc, 'Uma')
  await openStock(stock, base, doc, 'Vic')

  await caretAtLineEnd(wasm, 1)
  await wasm.keyboard.type('naïve 😀 café\n日本語 text', { delay: 5 })
  await waitConverged([wasm, stock], ['naïve 😀 café\n日本語 text'])

  // Edits right after the astral character (two UTF-16 code units) and after CJK text.
  const afterEmoji = 'naïve 😀'.length
  await caretAt(stock, afterEmoji)
  await stock.keyboard.type('!', { delay: 5 })
  await caretAtLineEnd(wasm, 2)
  await wasm.keyboard.type(' ✓', { delay: 5 })
  let text = await waitConverged([wasm, stock], ['😀!', 'text ✓'])
  assert.equal(text, 'naïve 😀! café\n日本語 text ✓')

  // The WASM side deletes the emoji (one Backspace removes both code units) ...
  await caretAt(wasm, afterEmoji)
  await wasm.keyboard.press('Backspace')
  text = await waitConverged([wasm, stock], ['naïve ! café'])
  assert.equal(text, 'naïve ! café\n日本語 text ✓')
  // ... and the stock side the CJK word.
  await caretAt(stock, text.indexOf(' text'))
  for (let i = 0; i < 3; i++) await stock.keyboard.press('Backspace')
  text = await waitConverged([wasm, stock], ['\n text ✓'])
  assert.equal(text, 'naïve ! café\n text ✓')
  assert.equal(await wasm.evaluate(() => window.quire.text.length), text.length)
  await waitSaved(wasm)

  await shot(wasm, 'f-unicode-wasm')
  await assertBindingClean(wasm)
  assert.deepEqual(stock.errors, [])
  await wasm.closeContext()
  await stock.closeContext()
})

/** Where (document position) the remote caret labelled `name` is drawn, or null. */
async function remoteCaretPos (page, name, caretSelector, labelSelector) {
  return page.evaluate(([who, caretSel, labelSel]) => {
    for (const label of document.querySelectorAll(labelSel)) {
      if (label.textContent !== who) continue
      const caret = label.closest(caretSel)
      return window.quire.view.posAtDOM(caret)
    }
    return null
  }, [name, caretSelector, labelSelector])
}

async function waitRemoteCaret (page, name, pos, { caret = '.cm-quire-cursor', label = '.cm-quire-cursor-label' } = {}) {
  const deadline = Date.now() + WAIT
  let got = null
  while (Date.now() < deadline) {
    got = await remoteCaretPos(page, name, caret, label)
    if (got !== null && (pos === undefined || got === pos)) return got
    await new Promise((r) => setTimeout(r, 100))
  }
  assert.fail(`no remote caret labelled ${name}${pos === undefined ? '' : ` at ${pos}`} (last seen at ${got})`)
}

test('remote cursors and selections are shown, across both clients', { timeout: TEST_TIMEOUT }, async (t) => {
  const doc = freshDoc('cursors')
  const alice = await newPage(t)
  const bob = await newPage(t)
  await openWasm(alice, base, doc, 'Alice')
  await openWasm(bob, base, doc, 'Bob')

  await caretAtLineEnd(alice, 1)
  await alice.keyboard.type('hello world\nsecond line', { delay: 5 })
  await waitConverged([alice, bob], ['hello world\nsecond line'])

  // Alice's caret after "hello".
  await alice.keyboard.press('Control+Home')
  for (let i = 0; i < 5; i++) await alice.keyboard.press('ArrowRight')
  await waitRemoteCaret(bob, 'Alice', 5)
  const label = bob.locator('.cm-quire-cursor-label', { hasText: 'Alice' })
  await label.waitFor({ state: 'visible', timeout: WAIT })

  // Alice selects "world": Bob sees the selection in Alice's light colour.
  await alice.keyboard.press('ArrowRight')
  await alice.keyboard.press('Shift+End')
  await bob.waitForFunction(() => [...document.querySelectorAll('.cm-quire-selection')].map((e) => e.textContent).join('') === 'world', null, { timeout: WAIT })
  await waitRemoteCaret(bob, 'Alice', 11)

  // Bob moves to the second line and types before Alice's selection: her caret moves along.
  await bob.keyboard.press('Control+End')
  await waitRemoteCaret(alice, 'Bob', 23)
  await bob.keyboard.press('Control+Home')
  await bob.keyboard.type('>> ', { delay: 10 })
  await waitConverged([alice, bob], ['>> hello world'])
  await waitRemoteCaret(bob, 'Alice', 14)
  await waitRemoteCaret(alice, 'Bob', 3)
  await bob.waitForFunction(() => [...document.querySelectorAll('.cm-quire-selection')].map((e) => e.textContent).join('') === 'world', null, { timeout: WAIT })
  await shot(bob, 'd-cursors-bob-sees-alice')
  await shot(alice, 'd-cursors-alice-sees-bob')

  // A stock y-codemirror.next editor joins: cursors go both ways.
  const carol = await newPage(t)
  await openStock(carol, base, doc, 'Carol')
  await caretAtLineEnd(carol, 2)
  await waitRemoteCaret(alice, 'Carol', 26)
  await waitRemoteCaret(bob, 'Carol', 26)
  // Alice's selection ("world") as y-codemirror.next draws it: caret at its head, 14.
  await waitRemoteCaret(carol, 'Alice', 14, { caret: '.cm-ySelectionCaret', label: '.cm-ySelectionInfo' })
  await waitRemoteCaret(carol, 'Bob', 3, { caret: '.cm-ySelectionCaret', label: '.cm-ySelectionInfo' })
  await carol.waitForFunction(() => [...document.querySelectorAll('.cm-ySelection')].map((e) => e.textContent).join('') === 'world', null, { timeout: WAIT })
  // And Carol's selection on the WASM page.
  await carol.keyboard.press('Shift+Home')
  await alice.waitForFunction(() => [...document.querySelectorAll('.cm-quire-selection')].map((e) => e.textContent).includes('second line'), null, { timeout: WAIT })
  await waitRemoteCaret(alice, 'Carol', 15)

  // Everyone is in everyone's people list.
  for (const page of [alice, bob, carol]) {
    await page.waitForFunction(() => {
      const s = document.getElementById('peers').textContent
      return s.includes('Alice') && s.includes('Bob') && s.includes('Carol')
    }, null, { timeout: WAIT })
  }

  // When Carol leaves, her caret goes away.
  await shot(alice, 'd-cursors-alice-sees-bob-and-carol')
  await shot(carol, 'd-cursors-stock-sees-alice-and-bob')
  assert.deepEqual(carol.errors, [])
  await carol.closeContext()
  await alice.waitForFunction(() => ![...document.querySelectorAll('.cm-quire-cursor-label')].some((e) => e.textContent === 'Carol'), null, { timeout: WAIT })

  await assertBindingClean(alice)
  await assertBindingClean(bob)
  await alice.closeContext()
  await bob.closeContext()
})

test('the document picker lists documents and opens one by name', { timeout: TEST_TIMEOUT }, async (t) => {
  const doc = freshDoc('picker')
  // Create the document first by opening it.
  const first = await newPage(t)
  await openWasm(first, base, doc, 'Paula')
  await caretAtLineEnd(first, 1)
  await first.keyboard.type('listed', { delay: 5 })
  await waitSaved(first)
  await first.closeContext()

  const page = await newPage(t)
  await page.goto(`${base}/`)
  await page.waitForSelector('#open-name', { state: 'visible', timeout: WAIT })
  await page.waitForSelector(`#doc-list a:text-is("${doc}")`, { timeout: WAIT })
  await shot(page, 'e-picker')

  const name = freshDoc('picked')
  await page.fill('#open-name', name)
  await page.click('#open-form button')
  await page.waitForURL((url) => url.searchParams.get('doc') === name, { timeout: WAIT })
  await page.waitForFunction(() => window.quire && window.quire.client.synced, null, { timeout: WAIT })
  assert.deepEqual(page.errors, [])
  await page.closeContext()
})

test('an editor on expiring tokens keeps editing: a fresh token per connection, nothing lost', { timeout: TEST_TIMEOUT }, async (t) => {
  const ADMIN = 'admin-key-for-e2e-tests'
  const secured = await startServer('secured.db', ['--auth-key', 'k1:e2e-test-secret-0123456789', '--admin-key', ADMIN])
  const origin = `http://127.0.0.1:${secured.port}`
  try {
    const doc = freshDoc('expiring')
    // Tokens live one to two seconds (`exp` counts whole seconds); the page's token
    // endpoint (`?tokenUrl=`) is played by the test, which asks the server for each one.
    let issued = 0
    const mint = async (ttl) => {
      const res = await fetch(`${origin}/api/v1/tokens`, {
        method: 'POST',
        headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' },
        body: JSON.stringify({ user: 'ada', doc, permission: 'write', ttl_secs: ttl })
      })
      assert.equal(res.status, 201)
      return (await res.json()).token
    }
    const page = await newPage(t)
    await page.route('**/test-token', async (route) => {
      issued++
      await route.fulfill({ json: { token: await mint(2) } })
    })
    await openWasm(page, origin, doc, 'Ada', { tokenUrl: '/test-token', minBackoffMs: '20', maxBackoffMs: '200' })
    await caretAtLineEnd(page, 1)
    const typed = 'typing across token expiries, one key every 40 ms, and every key must arrive.'
    await page.keyboard.type(typed, { delay: 40 })
    await waitSaved(page)
    const metrics = await (await fetch(`${origin}/metrics`)).text()
    const expired = Number(/^quire_tokens_expired_total (\S+)$/m.exec(metrics)?.[1] ?? 0)
    assert.ok(expired >= 1, `the server closed the page's socket for an expired token (${expired})`)
    assert.ok(issued >= 2, `a new token per connection (${issued})`)
    // A second page, with a long token, sees every character.
    const reader = await newPage(t)
    await openWasm(reader, origin, doc, 'Reader', { token: await mint(3600) })
    const text = await waitConverged([page, reader], [typed])
    assert.equal(text, typed)
    await shot(page, 'g-expiring-tokens')
    await assertBindingClean(page)
    await page.closeContext()
    await reader.closeContext()
  } finally {
    secured.child.kill('SIGKILL')
  }
})

test('the history panel saves, previews and restores a version while another tab types', { timeout: TEST_TIMEOUT }, async (t) => {
  const ADMIN = 'admin-key-for-e2e-history'
  const secured = await startServer('history.db', ['--auth-key', 'k1:e2e-history-secret-0123456789', '--admin-key', ADMIN])
  const origin = `http://127.0.0.1:${secured.port}`
  try {
    const doc = freshDoc('history')
    const mint = async (user) => {
      const res = await fetch(`${origin}/api/v1/tokens`, {
        method: 'POST',
        headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' },
        body: JSON.stringify({ user, doc, permission: 'write', ttl_secs: 3600 })
      })
      assert.equal(res.status, 201)
      return (await res.json()).token
    }
    const alice = await newPage(t)
    const bob = await newPage(t)
    await openWasm(alice, origin, doc, 'Alice', { token: await mint('alice') })
    await openWasm(bob, origin, doc, 'Bob', { token: await mint('bob') })

    // Alice writes and saves a version from the panel.
    await caretAtLineEnd(alice, 1)
    await alice.keyboard.type('The cat sat.', { delay: 5 })
    await waitConverged([alice, bob], ['The cat sat.'])
    await waitSaved(alice)
    await alice.fill('#version-label', 'first draft')
    await alice.click('#save-version button[type=submit]')
    await alice.waitForSelector('#timeline li.version[data-kind=named]', { timeout: WAIT })

    // Bob adds a sentence; both tabs' timelines show the sessions with both authors.
    await caretAtLineEnd(bob, 1)
    await bob.keyboard.type(' It purred.', { delay: 5 })
    await waitConverged([alice, bob], ['The cat sat. It purred.'])
    await waitSaved(bob)
    await alice.evaluate(() => window.quire.history.refresh())
    await alice.waitForFunction(() => {
      const names = [...document.querySelectorAll('#timeline li.session .author')].map((e) => e.textContent)
      return names.includes('alice') && names.includes('bob')
    }, null, { timeout: WAIT })
    await shot(alice, 'h-history-timeline')

    // The preview: the version's text, and Bob's sentence highlighted as his insertion.
    await alice.click('#timeline li.version[data-kind=named] .open-version')
    await alice.waitForFunction(() => {
      const ins = document.querySelector('#preview-diff ins[data-author="bob"]')
      return ins != null && ins.textContent === ' It purred.'
    }, null, { timeout: WAIT })
    assert.equal(await alice.textContent('#preview-text'), 'The cat sat.')
    const bobColor = await alice.evaluate(() => document.querySelector('#preview-diff ins').style.borderBottomColor)
    const aliceChip = await alice.evaluate(() => [...document.querySelectorAll('#timeline .author')].find((e) => e.textContent === 'alice').style.backgroundColor)
    assert.notEqual(bobColor, aliceChip, 'authors have their own colours')
    await shot(alice, 'h-history-preview')

    // Restore while Bob types on a new line; what he types after the restore stays.
    await caretAtLineEnd(bob, 1)
    const typing = bob.keyboard.type('\nbob keeps typing', { delay: 30 })
    await alice.click('#restore-version')
    await alice.waitForFunction(() => document.getElementById('history-note').textContent.startsWith('Restored'), null, { timeout: WAIT })
    await typing
    await bob.keyboard.type(' [after]', { delay: 10 })
    const text = await waitConverged([alice, bob], ['The cat sat.', '[after]'])
    assert.ok(text.startsWith('The cat sat.'), text)
    assert.ok(!text.includes('purred'), `the restore removed what came after the version: ${text}`)
    await Promise.all([waitSaved(alice), waitSaved(bob)])
    for (const p of [alice, bob]) {
      await p.evaluate(() => window.quire.history.refresh())
      await p.waitForSelector('#timeline li.version[data-kind=restore]', { timeout: WAIT })
    }
    await shot(alice, 'h-history-restored-alice')
    await shot(bob, 'h-history-restored-bob')
    // A fresh tab reads the same.
    const fresh = await newPage(t)
    await openWasm(fresh, origin, doc, 'Fresh', { token: await mint('fresh') })
    assert.equal(await waitConverged([fresh], ['[after]']), text)
    await assertBindingClean(alice)
    await assertBindingClean(bob)
    for (const p of [alice, bob, fresh]) await p.closeContext()
  } finally {
    secured.child.kill('SIGKILL')
  }
})

test('Tiptap on @hocuspocus/provider: two tabs converge with carets and are saved, beside a CodeMirror editor', { timeout: TEST_TIMEOUT }, async (t) => {
  const doc = freshDoc('tiptap')
  const other = freshDoc('tiptap-cm')
  const tina = await newPage(t)
  const theo = await newPage(t)
  const carla = await newPage(t)
  await openTiptap(tina, base, doc, 'Tina')
  await openTiptap(theo, base, doc, 'Theo')
  await openWasm(carla, base, other, 'Carla')

  await tina.evaluate(() => window.quire.editor.commands.focus('end'))
  await tina.keyboard.type('Hello from Tina.', { delay: 5 })
  await tina.keyboard.press('Enter')
  await tina.keyboard.type('Second line.', { delay: 5 })
  await waitTiptapConverged([tina, theo], ['Hello from Tina.\nSecond line.'])

  // All three type at once: both Tiptap tabs in their own paragraphs, the CodeMirror page on
  // its own document over the y-websocket endpoint.
  await tina.evaluate(() => window.quire.editor.commands.focus('end'))
  await theo.evaluate(() => window.quire.editor.commands.setTextSelection(1))
  await theo.evaluate(() => window.quire.editor.commands.focus())
  await caretAtLineEnd(carla, 1)
  const a = ' Tina keeps typing.'
  const b = 'Theo was here. '
  const c = 'CodeMirror, meanwhile.'
  await Promise.all([
    tina.keyboard.type(a, { delay: 30 }),
    theo.keyboard.type(b, { delay: 35 }),
    carla.keyboard.type(c, { delay: 25 })
  ])
  const text = await waitTiptapConverged([tina, theo], [a, b])
  assert.equal(text, `${b}Hello from Tina.\nSecond line.${a}`)
  await waitConverged([carla], [c])

  // Carets with names, and both people listed, on each Tiptap tab.
  await tina.waitForFunction(() => [...document.querySelectorAll('.collaboration-carets__label')].some((l) => l.textContent === 'Theo'), null, { timeout: WAIT })
  await theo.waitForFunction(() => [...document.querySelectorAll('.collaboration-carets__label')].some((l) => l.textContent === 'Tina'), null, { timeout: WAIT })
  for (const page of [tina, theo]) {
    const names = await page.$$eval('#peers .peer-name', (els) => els.map((e) => e.textContent).sort())
    assert.equal(names.length, 2, JSON.stringify(names))
  }
  // Saved means committed: Quire sends the provider's SyncStatus after the commit.
  await waitSaved(tina)
  await waitSaved(theo)
  await waitSaved(carla)
  await shot(tina, 'i-tiptap-tina')
  await shot(theo, 'i-tiptap-theo')
  await shot(carla, 'i-tiptap-beside-codemirror')

  // The server holds it: the stored document as JSON, and a fresh Tiptap tab.
  const json = await (await fetch(`${base}/api/v1/docs/${encodeURIComponent(doc)}/json`)).json()
  assert.ok(JSON.stringify(json.default).includes('Theo was here.'), JSON.stringify(json))
  for (const p of [tina, theo, carla]) assert.deepEqual(p.errors, [], 'uncaught errors in the page')
  await tina.closeContext()
  await theo.closeContext()
  const fresh = await newPage(t)
  await openTiptap(fresh, base, doc, 'Fay')
  assert.equal((await readTiptap(fresh)).editor, text)
  await carla.closeContext()
  await fresh.closeContext()
})
