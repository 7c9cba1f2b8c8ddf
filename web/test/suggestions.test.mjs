// The suggestion view of the editor page (issue 35) in real Chromium against a real Quire:
// two authors suggest on a branch, a reviewer sees their changes as tracked changes, accepts
// one author's and rejects the other's while a third person types on the parent, and the
// parent, read by a fresh client, holds exactly the accepted change plus its own typing.
//
//   web/build.sh   # or: node web/bundle.mjs
//   QUIRE_BIN=target/debug/quire node --test web/test/suggestions.test.mjs
//
// The server runs with an auth key: every tab has its own token, so the server attributes
// each tab's edits to the token's user (`sub`), and those names are the authors the page
// colours. Screenshots: target/screenshots/suggestions-*.png.

import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { mkdir, mkdtemp, rm } from 'node:fs/promises'
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
const TEST_TIMEOUT = 150_000
const ADMIN = 'admin-key-for-suggestion-tests'

const QUIRE_BIN = process.env.QUIRE_BIN
if (!QUIRE_BIN) {
  throw new Error('QUIRE_BIN is not set: point it at the quire binary, e.g. QUIRE_BIN=target/debug/quire node --test web/test/suggestions.test.mjs')
}
if (!existsSync(QUIRE_BIN)) throw new Error(`QUIRE_BIN=${QUIRE_BIN} does not exist`)
for (const f of ['index.html', 'assets/editor.js', 'assets/quire_client_bg.wasm']) {
  if (!existsSync(join(distDir, f))) throw new Error(`web/dist/${f} is missing: run \`node web/bundle.mjs\` first`)
}

let server = null
let serverLog = ''
let origin = ''
let dataDir = ''
let browser = null
const contexts = new Set()

function startServer () {
  return new Promise((resolvePromise, reject) => {
    let port = 0
    const child = spawn(resolve(QUIRE_BIN), [
      'serve',
      '--bind', '127.0.0.1:0',
      '--database', `sqlite://${join(dataDir, 'quire.db')}`,
      '--web-root', distDir,
      '--auth-key', 'k1:suggestion-test-secret-0123456789',
      '--admin-key', ADMIN
    ], { env: { ...process.env, QUIRE_LOG: 'warn' }, stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = ''
    const timer = setTimeout(() => reject(new Error(`quire did not print its address within 60 s:\n${serverLog}`)), 60_000)
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
    child.on('error', (e) => { clearTimeout(timer); reject(e) })
  })
}

before(async () => {
  await mkdir(shotsDir, { recursive: true })
  dataDir = await mkdtemp(join(tmpdir(), 'quire-suggestions-'))
  let port
  ;({ child: server, port } = await startServer())
  origin = `http://127.0.0.1:${port}`
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
function freshDoc (label) {
  docCounter++
  return `sugg-${label}-${Date.now().toString(36)}-${docCounter}`
}

/** A token for `user`, with write on the parent and every name under it (its branches). */
async function mint (user, parent) {
  const res = await fetch(`${origin}/api/v1/tokens`, {
    method: 'POST',
    headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' },
    body: JSON.stringify({ user, doc: `${parent}*`, permission: 'write', ttl_secs: 3600 })
  })
  const body = await res.text()
  assert.equal(res.status, 201, body)
  return JSON.parse(body).token
}

/** The REST API as the administrator (a client that is none of the tabs). */
async function api (path, init = {}) {
  const res = await fetch(`${origin}/api/v1${path}`, {
    ...init,
    headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json', ...(init.headers || {}) }
  })
  const body = await res.json().catch(() => null)
  return { status: res.status, body }
}

async function newPage (t) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 680 } })
  contexts.add(context)
  const page = await context.newPage()
  page.errors = []
  page.on('pageerror', (e) => page.errors.push(String(e && e.stack ? e.stack : e)))
  page.on('console', (msg) => {
    if (msg.type() !== 'error' && msg.type() !== 'warning') return
    const text = msg.text()
    t.diagnostic(`[browser ${msg.type()}] ${text}`)
    // The page's own 409 answers are expected (the dependency test provokes one).
    if (msg.type() === 'error' && !/^Failed to load resource/.test(text)) page.errors.push(text)
  })
  page.closeContext = async () => {
    contexts.delete(context)
    await context.close()
  }
  return page
}

/** Opens the editor page as `user` (its name and token) and waits until it is synced. */
async function openEditor (page, doc, user, token) {
  const q = new URLSearchParams({ doc, name: user, token })
  await page.goto(`${origin}/?${q}`)
  await waitEditorReady(page)
}

async function waitEditorReady (page) {
  await page.waitForFunction(() => window.quire && window.quire.client && window.quire.view, null, { timeout: WAIT })
  await page.waitForFunction(() => window.quire.client.status === 'connected' && window.quire.client.synced, null, { timeout: WAIT })
}

/** The model's text, the editor's, and what the DOM shows without widgets (carets, deletions). */
async function readTexts (page) {
  return page.evaluate(() => {
    const lines = [...document.querySelectorAll('.cm-content .cm-line')].map((line) => {
      const copy = line.cloneNode(true)
      for (const w of copy.querySelectorAll('.cm-quire-cursor, .cm-quire-suggest-del, .cm-widgetBuffer')) w.remove()
      return copy.textContent
    })
    return { model: window.quire.text.toString(), editor: window.quire.view.state.doc.toString(), dom: lines.join('\n') }
  })
}

/** Waits until every page's model, editor and visible text are `expected` exactly. */
async function waitText (pages, expected, timeout = WAIT) {
  const deadline = Date.now() + timeout
  let last = null
  while (Date.now() < deadline) {
    last = await Promise.all(pages.map(readTexts))
    if (last.every((r) => r.model === expected && r.editor === expected && r.dom === expected)) return
    await new Promise((r) => setTimeout(r, 100))
  }
  assert.fail(`pages did not converge on ${JSON.stringify(expected)} within ${timeout} ms:\n${JSON.stringify(last, null, 2)}`)
}

async function waitSaved (page) {
  await page.waitForFunction(() => {
    const el = document.getElementById('saved')
    return el != null && el.textContent === 'All changes saved' && el.dataset.saved === 'true'
  }, null, { timeout: WAIT })
}

async function caretAt (page, pos) {
  await page.evaluate((p) => {
    window.quire.view.focus()
    window.quire.view.dispatch({ selection: { anchor: p } })
  }, pos)
}

/** Selects the first occurrence of `what` in the editor. */
async function select (page, what) {
  await page.evaluate((w) => {
    const view = window.quire.view
    const at = view.state.doc.toString().indexOf(w)
    if (at < 0) throw new Error(`${w} is not in the editor`)
    view.focus()
    view.dispatch({ selection: { anchor: at, head: at + w.length } })
  }, what)
}

/** The tracked-change marks the editor shows: insertions and deleted-run widgets. */
async function readMarks (page) {
  return page.evaluate(() => {
    const one = (el) => {
      const s = getComputedStyle(el)
      return {
        text: el.textContent,
        author: el.dataset.author,
        state: el.dataset.state,
        change: el.dataset.change,
        color: s.color,
        background: s.backgroundColor,
        border: s.borderBottomColor,
        decoration: s.textDecorationLine,
        decorationColor: s.textDecorationColor,
        widget: el.closest('[contenteditable=false]') != null
      }
    }
    return {
      ins: [...document.querySelectorAll('.cm-content .cm-quire-suggest-ins')].map(one),
      del: [...document.querySelectorAll('.cm-content .cm-quire-suggest-del')].map(one)
    }
  })
}

/** The text `author` has marked as `kind` ('ins' or 'del'), its pieces joined (a mark can be
 *  split around a caret widget). */
function marked (marks, kind, author, state = 'open') {
  return marks[kind].filter((e) => e.author === author && e.state === state).map((e) => e.text).join('')
}

/** Waits until `predicate(marks)` holds on the page; fails with the last marks seen. */
async function waitMarks (page, predicate, what, timeout = WAIT) {
  const deadline = Date.now() + timeout
  let last = null
  while (Date.now() < deadline) {
    last = await readMarks(page)
    if (predicate(last)) return last
    await new Promise((r) => setTimeout(r, 100))
  }
  assert.fail(`${what}: not shown within ${timeout} ms; the editor shows ${JSON.stringify(last, null, 2)}`)
}

/** The side list: one entry per change. */
async function readList (page) {
  return page.$$eval('#change-list li.change', (els) => els.map((li) => ({
    id: Number(li.dataset.changeId),
    author: li.dataset.author,
    state: li.dataset.state,
    buttons: [...li.querySelectorAll('button')].map((b) => b.textContent),
    text: li.textContent
  })))
}

async function waitList (page, predicate, what, timeout = WAIT) {
  const deadline = Date.now() + timeout
  let last = null
  while (Date.now() < deadline) {
    last = await readList(page)
    if (predicate(last)) return last
    await new Promise((r) => setTimeout(r, 100))
  }
  assert.fail(`${what}: the list did not show it within ${timeout} ms: ${JSON.stringify(last, null, 2)}`)
}

/** Colour of `user`'s remote caret label on `page` (the editor's colour for that person). */
async function caretColor (page, user) {
  const handle = await page.waitForFunction((u) => {
    const label = [...document.querySelectorAll('.cm-quire-cursor-label')].find((e) => e.textContent === u)
    return label ? getComputedStyle(label).backgroundColor : null
  }, user, { timeout: WAIT })
  return handle.jsonValue()
}

async function shot (page, name) {
  await page.screenshot({ path: join(shotsDir, `suggestions-${name}.png`) })
}

function assertClean (pages) {
  for (const p of pages) assert.deepEqual(p.errors, [], 'uncaught errors in a page')
}

test('two authors suggest on a branch; the reviewer accepts one, rejects the other, while the parent is typed on', { timeout: TEST_TIMEOUT }, async (t) => {
  const parent = freshDoc('review')
  const original = 'The quick brown fox jumps over the lazy dog.'

  // Paula writes the parent.
  const paula = await newPage(t)
  await openEditor(paula, parent, 'paula', await mint('paula', parent))
  await caretAt(paula, 0)
  await paula.keyboard.type(original, { delay: 2 })
  await waitText([paula], original)
  await waitSaved(paula)
  // Not a branch: no suggestions panel, and a "Suggest changes" button.
  await paula.waitForSelector('#suggest-changes', { state: 'visible', timeout: WAIT })
  assert.equal(await paula.isVisible('#suggestions'), false)

  // Alice makes a branch from the parent with that button, which opens it in her tab.
  const alice = await newPage(t)
  await openEditor(alice, parent, 'alice', await mint('alice', parent))
  await alice.click('#suggest-changes')
  await alice.waitForURL((url) => url.searchParams.get('doc') !== parent, { timeout: WAIT })
  const branch = new URL(alice.url()).searchParams.get('doc')
  assert.ok(branch.startsWith(`${parent}/suggestion-`), branch)
  await waitEditorReady(alice)
  await waitText([alice], original)
  const info = await api(`/docs/${encodeURIComponent(branch)}/branch`)
  assert.equal(info.status, 200, JSON.stringify(info.body))
  assert.equal(info.body.parent, parent)
  // On the branch: the panel, and a link back to the parent.
  await alice.waitForSelector('#suggestions', { state: 'visible', timeout: WAIT })
  await alice.waitForSelector('#parent-link', { state: 'visible', timeout: WAIT })
  assert.ok((await alice.textContent('#parent-link')).includes(parent))

  const bob = await newPage(t)
  await openEditor(bob, branch, 'bob', await mint('bob', parent))
  await waitText([bob], original)

  // Alice inserts a word; then Bob deletes one (elsewhere: the two changes are independent).
  await caretAt(alice, 'The'.length)
  await alice.keyboard.type(' very', { delay: 20 })
  await waitText([alice, bob], 'The very quick brown fox jumps over the lazy dog.')
  await waitSaved(alice)
  await select(bob, 'lazy ')
  await bob.keyboard.press('Backspace')
  await waitText([alice, bob], 'The very quick brown fox jumps over the dog.')
  await waitSaved(bob)

  // The reviewer opens the branch: both changes marked in their authors' colours.
  const rita = await newPage(t)
  await openEditor(rita, branch, 'rita', await mint('rita', parent))
  await waitText([rita], 'The very quick brown fox jumps over the dog.')
  await rita.waitForSelector('#suggestions', { state: 'visible', timeout: WAIT })
  const marks = await waitMarks(rita, (m) =>
    marked(m, 'ins', 'alice') === ' very' && marked(m, 'del', 'bob') === 'lazy ',
  'alice\'s insertion and bob\'s deletion')
  // Live: Alice goes on typing on the branch; the reviewer's view follows.
  await caretAt(alice, 'The very quick'.length)
  await alice.keyboard.type(' nimble', { delay: 20 })
  const afterAlice = 'The very quick nimble brown fox jumps over the lazy dog.'
  const branchText = 'The very quick nimble brown fox jumps over the dog.'
  await waitText([alice, bob, rita], branchText)
  await waitMarks(rita, (m) => marked(m, 'ins', 'alice') === ' very nimble' && marked(m, 'del', 'bob') === 'lazy ',
    'alice\'s second insertion, made while the reviewer looks')
  const ins = marks.ins.find((e) => e.author === 'alice')
  const del = marks.del.find((e) => e.author === 'bob')
  assert.ok(marks.ins.every((e) => e.author === 'alice'), JSON.stringify(marks))
  assert.equal(marks.del.length, 1, JSON.stringify(marks))
  // The deletion is struck through in Bob's colour; it is a widget, not text of the document.
  assert.match(del.decoration, /line-through/)
  assert.equal(del.widget, true, 'the deleted run is a non-editable widget')
  // Each author's colour is the colour of their cursor in this editor.
  const aliceColor = await caretColor(rita, 'alice')
  const bobColor = await caretColor(rita, 'bob')
  assert.notEqual(aliceColor, bobColor, 'the two authors have different colours')
  assert.equal(ins.border, aliceColor, 'alice\'s insertion is underlined in her cursor colour')
  assert.equal(del.color, bobColor, 'bob\'s deletion is in his cursor colour')
  // The side list: both open changes, each with Accept and Reject.
  const list = await waitList(rita, (l) => l.length === 2 && l.every((c) => c.state === 'open'), 'two open changes')
  const aliceChange = list.find((c) => c.author === 'alice')
  const bobChange = list.find((c) => c.author === 'bob')
  assert.ok(aliceChange && bobChange, JSON.stringify(list))
  assert.deepEqual(aliceChange.buttons, ['Accept', 'Reject'])
  assert.ok(aliceChange.text.includes('very'), aliceChange.text)
  assert.ok(bobChange.text.includes('lazy'), bobChange.text)
  assert.equal(await rita.isEnabled('#accept-all'), true)
  // The authors' tabs show the same marks.
  await waitMarks(alice, (m) => marked(m, 'ins', 'alice') === ' very nimble' && marked(m, 'del', 'bob') === 'lazy ', 'the marks in alice\'s tab')
  await shot(rita, 'review')
  await shot(alice, 'author-alice')

  // Paula keeps typing on the parent while the reviewer decides.
  await caretAt(paula, original.length)
  const typed = '\nMeanwhile on the parent: one two three four five six seven eight nine ten.'
  const typing = paula.keyboard.type(typed, { delay: 35 })
  await rita.click(`#change-list li.change[data-change-id="${aliceChange.id}"] button.accept`)
  await waitList(rita, (l) => l.find((c) => c.id === aliceChange.id)?.state === 'merged', 'alice\'s change merged')
  await rita.click(`#change-list li.change[data-change-id="${bobChange.id}"] button.reject`)
  const after = await waitList(rita, (l) => l.find((c) => c.id === bobChange.id)?.state === 'rejected', 'bob\'s change rejected')
  // Each decision names who took it, and leaves no buttons.
  for (const c of after) {
    assert.ok(c.text.includes(`${c.state} by rita`), c.text)
    assert.deepEqual(c.buttons, [])
  }
  // Merged: unmarked. Rejected: greyed, no longer in Bob's colour.
  const decided = await waitMarks(rita, (m) => m.ins.length === 0 &&
    m.del.length === 1 && marked(m, 'del', 'bob', 'rejected') === 'lazy ', 'the decided changes')
  assert.notEqual(decided.del[0].color, bobColor, 'a rejected deletion is greyed')
  assert.equal(await rita.isEnabled('#accept-all'), false, 'nothing left to accept')
  await shot(rita, 'decided')
  await typing
  await paula.keyboard.type(' [end]', { delay: 10 })
  const parentText = `${afterAlice}${typed} [end]`

  // Every tab converges: the branch keeps its own text; the parent has the accepted change and
  // Paula's typing, and no trace of the rejected one.
  await waitText([alice, bob, rita], branchText)
  await waitText([paula], parentText)
  await waitSaved(paula)
  // The reviewer follows the link back to the parent and reads the same.
  await rita.click('#parent-link')
  await rita.waitForURL((url) => url.searchParams.get('doc') === parent, { timeout: WAIT })
  await waitEditorReady(rita)
  await waitText([paula, rita], parentText)
  await shot(rita, 'parent')
  await shot(paula, 'parent-typist')

  // A fresh client (this process, over REST) reads exactly that.
  const json = await api(`/docs/${encodeURIComponent(parent)}/json`)
  assert.equal(json.status, 200)
  assert.equal(json.body.content, parentText)
  const branchJson = await api(`/docs/${encodeURIComponent(branch)}/json`)
  assert.equal(branchJson.body.content, branchText)
  assertClean([paula, alice, bob, rita])
  for (const p of [paula, alice, bob, rita]) await p.closeContext()
})

test('accepting a change that builds on another shows what it needs, then accepts both', { timeout: TEST_TIMEOUT }, async (t) => {
  const parent = freshDoc('deps')
  const original = 'A fox.'
  // The parent and its branch made over the API.
  assert.equal((await api('/docs', { method: 'POST', body: JSON.stringify({ name: parent }) })).status, 201)
  const paula = await newPage(t)
  await openEditor(paula, parent, 'paula', await mint('paula', parent))
  await caretAt(paula, 0)
  await paula.keyboard.type(original, { delay: 2 })
  await waitSaved(paula)
  const branch = `${parent}/deps`
  const made = await api(`/docs/${encodeURIComponent(parent)}/branches`, { method: 'POST', body: JSON.stringify({ name: branch }) })
  assert.equal(made.status, 201, JSON.stringify(made.body))

  // Alice inserts a word; Bob then rewrites inside it, so his change depends on hers.
  const alice = await newPage(t)
  await openEditor(alice, branch, 'alice', await mint('alice', parent))
  await waitText([alice], original)
  await caretAt(alice, 'A'.length)
  await alice.keyboard.type(' red', { delay: 20 })
  await waitText([alice], 'A red fox.')
  await waitSaved(alice)
  const bob = await newPage(t)
  await openEditor(bob, branch, 'bob', await mint('bob', parent))
  await waitText([bob], 'A red fox.')
  await select(bob, 'red')
  await bob.keyboard.type('ruddy', { delay: 20 })
  await waitText([alice, bob], 'A ruddy fox.')
  await waitSaved(bob)

  const rita = await newPage(t)
  await openEditor(rita, branch, 'rita', await mint('rita', parent))
  const list = await waitList(rita, (l) => l.length === 2, 'two changes')
  const aliceChange = list.find((c) => c.author === 'alice')
  const bobChange = list.find((c) => c.author === 'bob')
  assert.ok(aliceChange && bobChange, JSON.stringify(list))
  // Alice's red was never in the parent: what shows is her space and Bob's word.
  await waitMarks(rita, (m) => marked(m, 'ins', 'bob') === 'ruddy' && marked(m, 'ins', 'alice') === ' ', 'bob\'s rewrite')

  // Accepting Bob's alone is refused: the page says which change it needs.
  await rita.click(`#change-list li.change[data-change-id="${bobChange.id}"] button.accept`)
  await rita.waitForSelector('#suggestions-note[data-kind=missing]', { timeout: WAIT })
  assert.equal(await rita.getAttribute('#suggestions-note', 'data-missing'), String(aliceChange.id))
  const noteText = await rita.textContent('#suggestions-note')
  assert.ok(noteText.includes(`#${aliceChange.id} (alice)`), noteText)
  await shot(rita, 'missing-dependency')
  assert.equal((await api(`/docs/${encodeURIComponent(parent)}/json`)).body.content, original, 'nothing merged')

  // "Accept together" takes both.
  await rita.click('#suggestions-note button.accept-with-dependencies')
  await waitList(rita, (l) => l.every((c) => c.state === 'merged'), 'both merged')
  await waitMarks(rita, (m) => m.ins.length === 0 && m.del.length === 0, 'no marks left')
  await waitText([paula], 'A ruddy fox.')
  assert.equal((await api(`/docs/${encodeURIComponent(parent)}/json`)).body.content, 'A ruddy fox.')
  assertClean([paula, alice, bob, rita])
  for (const p of [paula, alice, bob, rita]) await p.closeContext()
})
