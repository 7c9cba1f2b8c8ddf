// The WASM client's own tests: the wasm32 build (web/pkg, made by web/build.sh) loaded in Node
// against a real Quire server. Node 20 has no WebSocket global; the `ws` package stands in for
// the browser's. Run: QUIRE_BIN=target/debug/quire node --test web/test/wasm-node.test.mjs
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { readFileSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, dirname } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'
import { WebSocket } from 'ws'
import * as Y from 'yjs'
import { WebsocketProvider } from 'y-websocket'
import { HocuspocusProvider } from '@hocuspocus/provider'
import init, { QuireClient } from '../pkg/quire_client.js'

globalThis.WebSocket = WebSocket
const here = dirname(fileURLToPath(import.meta.url))
const PATIENCE = 20_000

let server
let dir
let docCounter = 0
const fresh = (label) => `wasm-${label}-${process.pid}-${++docCounter}`

// A `quire serve` child process; `restart()` brings it back on the same port.
class Server {
  constructor (db, args = []) { this.db = db; this.args = args; this.port = 0 }
  async start () {
    const bin = process.env.QUIRE_BIN
    if (!bin) throw new Error('set QUIRE_BIN to the quire binary (e.g. target/debug/quire)')
    const bind = `127.0.0.1:${this.port}`
    this.child = spawn(bin, ['serve', '--bind', bind, '--database', `sqlite://${join(dir, this.db)}`, ...this.args], {
      env: { ...process.env, QUIRE_LOG: 'warn' },
      stdio: ['ignore', 'pipe', 'inherit']
    })
    const lines = createInterface({ input: this.child.stdout })
    const addr = await new Promise((resolve, reject) => {
      this.child.once('exit', (code) => reject(new Error(`quire exited (${code}) before listening`)))
      lines.on('line', (line) => {
        const m = line.match(/^quire listening on (.*)$/)
        if (m) resolve(m[1])
      })
    })
    this.port = Number(addr.split(':').pop())
    this.url = `ws://${addr}`
  }

  async kill () {
    const exited = new Promise((resolve) => this.child.once('exit', resolve))
    this.child.kill('SIGKILL')
    await exited
  }
}

async function until (what, done) {
  const deadline = Date.now() + PATIENCE
  while (!done()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

async function within (what, promise) {
  let timer
  const timeout = new Promise((resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out: ${what}`)), PATIENCE)
  })
  try {
    return await Promise.race([promise, timeout])
  } finally {
    clearTimeout(timer)
  }
}

function client (doc, url = server.url) {
  return new QuireClient(url, doc, { minBackoffMs: 20, maxBackoffMs: 200 })
}

before(async () => {
  await init({ module_or_path: readFileSync(join(here, '../pkg/quire_client_bg.wasm')) })
  dir = mkdtempSync(join(tmpdir(), 'quire-wasm-'))
  server = new Server('quire.db')
  await server.start()
})

after(async () => {
  await server?.kill()
  rmSync(dir, { recursive: true, force: true })
})

test('two clients converge on concurrent edits and report them saved', async () => {
  const doc = fresh('converge')
  const a = client(doc)
  const b = client(doc)
  await within('both synced', Promise.all([a.whenSynced(), b.whenSynced()]))
  const ta = a.getText('content')
  const tb = b.getText('content')
  const saved = []
  a.on('saved', (n) => saved.push(n))
  for (let i = 0; i < 20; i++) {
    ta.insert(0, 'a')
    tb.insert(tb.length, 'b')
  }
  // UTF-16 indices: an emoji counts two, as in JavaScript.
  ta.insert(0, '😀')
  assert.equal(ta.toString().indexOf('😀'), 0)
  ta.insert(2, '!')
  assert.equal(ta.toString().slice(0, 3), '😀!')
  await until('convergence', () => ta.toString() === tb.toString() && ta.length === 42 + 1)
  await within('a saved', a.whenSaved())
  await within('b saved', b.whenSaved())
  assert.equal(a.unsaved, 0)
  assert.ok(saved.some((n) => n > 0), `'saved' reported unsaved changes first: ${saved}`)
  assert.equal(saved.at(-1), 0)
  // A stock Yjs client sees the same text.
  const ydoc = new Y.Doc()
  const provider = new WebsocketProvider(server.url, doc, ydoc, { WebSocketPolyfill: WebSocket })
  await until('yjs sync', () => provider.synced)
  assert.equal(ydoc.getText('content').toString(), ta.toString())
  provider.destroy()
  ydoc.destroy() // stops the awareness timer the provider started
  a.destroy()
  b.destroy()
})

test('observers get deltas after the transaction, flagged local or remote', async () => {
  const doc = fresh('observe')
  const a = client(doc)
  const b = client(doc)
  await within('synced', Promise.all([a.whenSynced(), b.whenSynced()]))
  const ta = a.getText('content')
  const tb = b.getText('content')
  const seenA = []
  const seenB = []
  ta.observe((delta, local) => seenA.push({ delta, local, text: ta.toString() }))
  tb.observe((delta, local) => seenB.push({ delta, local, text: tb.toString() }))
  ta.insert(0, 'hello')
  assert.deepEqual(seenA, [{ delta: [{ insert: 'hello' }], local: true, text: 'hello' }])
  await until('remote delta', () => seenB.length === 1)
  assert.deepEqual(seenB[0], { delta: [{ insert: 'hello' }], local: false, text: 'hello' })
  tb.delete(1, 3)
  await until('remote delete', () => seenA.length === 2)
  assert.deepEqual(seenA[1], { delta: [{ retain: 1 }, { delete: 3 }], local: false, text: 'ho' })
  // An observer may edit the document (it runs after the transaction, as in Yjs).
  const echo = ta.observe((delta, local) => { if (!local && !ta.toString().endsWith('!')) ta.insert(ta.length, '!') })
  tb.insert(2, 'la')
  await until('the observer\'s edit reaches b', () => tb.toString() === 'hola!')
  ta.unobserve(echo)
  tb.insert(0, '¡')
  await until('no echo after unobserve', () => ta.toString() === '¡hola!')
  a.destroy()
  b.destroy()
})

test('maps and arrays replicate JSON values', async () => {
  const doc = fresh('types')
  const a = client(doc)
  const b = client(doc)
  await within('synced', Promise.all([a.whenSynced(), b.whenSynced()]))
  const ma = a.getMap('meta')
  const mb = b.getMap('meta')
  const changes = []
  mb.observe((keys, local) => changes.push({ keys, local }))
  ma.set('title', 'Notes')
  ma.set('tags', ['x', 'y'])
  ma.set('n', 3)
  await until('map', () => mb.size === 3)
  assert.deepEqual(mb.toJSON(), { title: 'Notes', tags: ['x', 'y'], n: 3 })
  assert.equal(mb.get('title'), 'Notes')
  assert.ok(mb.has('n'))
  assert.deepEqual(mb.keys().sort(), ['n', 'tags', 'title'])
  assert.ok(changes.every((c) => c.local === false))
  mb.delete('n')
  await until('delete', () => !ma.has('n'))
  const aa = a.getArray('items')
  const ab = b.getArray('items')
  aa.push([1, 'two', { three: 3 }])
  await until('push at b', () => ab.length === 3)
  ab.insert(0, [0])
  await until('array', () => aa.length === 4 && ab.length === 4)
  assert.deepEqual(aa.toJSON(), ab.toJSON())
  aa.delete(0, 1)
  await until('array delete', () => ab.length === 3)
  assert.deepEqual(ab.get(2), { three: 3 })
  a.destroy()
  b.destroy()
})

test('awareness: states reach peers and are removed when a client leaves', async () => {
  const doc = fresh('awareness')
  const a = client(doc)
  const b = client(doc)
  await within('synced', Promise.all([a.whenSynced(), b.whenSynced()]))
  const events = []
  b.on('awareness', (change, origin) => events.push({ change, origin }))
  a.setLocalState({ user: { name: 'Alice', color: '#e91e63' } })
  await until('state at b', () => b.getStates().get(a.clientId)?.user?.name === 'Alice')
  assert.ok(events.some((e) => e.origin === 'remote' && e.change.added.includes(a.clientId)))
  a.setLocalStateField('cursor', { anchor: 1, head: 2 })
  await until('field at b', () => b.getStates().get(a.clientId)?.cursor?.head === 2)
  assert.deepEqual(a.getLocalState(), { user: { name: 'Alice', color: '#e91e63' }, cursor: { anchor: 1, head: 2 } })
  a.destroy()
  assert.equal(a.status, 'closed')
  await until('removal at b', () => !b.getStates().has(a.clientId))
  assert.ok(events.some((e) => e.change.removed.includes(a.clientId)))
  b.destroy()
})

test('the WASM client and a Hocuspocus provider on one document see each other\'s edits and presence', async () => {
  const doc = fresh('hocuspocus')
  const a = client(doc)
  await within('wasm synced', a.whenSynced())
  const ydoc = new Y.Doc()
  const provider = new HocuspocusProvider({
    url: `${server.url}/hocuspocus`, name: doc, document: ydoc, WebSocketPolyfill: WebSocket
  })
  await until('provider synced', () => provider.isSynced && !provider.hasUnsyncedChanges)
  const text = ydoc.getText('content')
  a.getText('content').insert(0, 'from wasm ')
  await until('the provider sees the WASM edit', () => text.toString() === 'from wasm ')
  text.insert(text.length, 'from hocuspocus')
  await until('the WASM client sees the provider\'s edit', () => a.getText('content').toString() === 'from wasm from hocuspocus')
  await until('the provider\'s edit committed', () => !provider.hasUnsyncedChanges)
  await within('the WASM edit saved', a.whenSaved())
  a.setLocalState({ user: { name: 'Wasm' } })
  provider.setAwarenessField('user', { name: 'Hocus' })
  await until('presence at the provider', () => [...provider.awareness.getStates().values()].some((s) => s.user?.name === 'Wasm'))
  await until('presence at the WASM client', () => [...a.getStates().values()].some((s) => s?.user?.name === 'Hocus'))
  provider.destroy()
  ydoc.destroy()
  a.destroy()
})

test('edits made offline are kept and merged on reconnect', async () => {
  const doc = fresh('offline')
  const a = client(doc)
  const b = client(doc)
  await within('synced', Promise.all([a.whenSynced(), b.whenSynced()]))
  const ta = a.getText('content')
  const tb = b.getText('content')
  ta.insert(0, 'base ')
  await until('base at b', () => tb.toString() === 'base ')
  const statuses = []
  a.on('status', (s) => statuses.push(s))
  a.disconnect()
  assert.equal(a.status, 'offline')
  ta.insert(ta.length, 'offline-a ')
  assert.ok(a.unsaved > 0, 'offline edits are unsaved')
  tb.insert(tb.length, 'online-b ')
  a.connect()
  await until('convergence', () => ta.toString() === tb.toString() && ta.toString().includes('offline-a') && ta.toString().includes('online-b'))
  await within('saved', a.whenSaved())
  assert.deepEqual(statuses.slice(0, 3), ['offline', 'connecting', 'connected'])
  a.destroy()
  b.destroy()
})

test('a server restart: clients go offline, keep editing, reconnect and converge', async () => {
  const doc = fresh('restart')
  const a = client(doc)
  const b = client(doc)
  await within('synced', Promise.all([a.whenSynced(), b.whenSynced()]))
  const ta = a.getText('content')
  const tb = b.getText('content')
  ta.insert(0, 'before ')
  await within('saved', a.whenSaved())
  await server.kill()
  await until('offline', () => a.status !== 'connected' && b.status !== 'connected')
  ta.insert(ta.length, 'while-down-a ')
  tb.insert(0, 'while-down-b ')
  assert.ok(a.unsaved > 0 && b.unsaved > 0)
  await server.start()
  await within('a saved', a.whenSaved())
  await within('b saved', b.whenSaved())
  await until('convergence', () => ta.toString() === tb.toString())
  for (const part of ['before', 'while-down-a', 'while-down-b']) assert.ok(ta.toString().includes(part), part)
  // What was acknowledged is on the server: a new client gets it.
  const c = client(doc)
  await within('c synced', c.whenSynced())
  assert.equal(c.getText('content').toString(), ta.toString())
  for (const x of [a, b, c]) x.destroy()
})

test('an edit made just before destroy() still reaches the server', async () => {
  const doc = fresh('destroy')
  const a = client(doc)
  await within('synced', a.whenSynced())
  a.getText('content').insert(0, 'last words')
  a.destroy()
  assert.equal(a.status, 'closed')
  const b = client(doc)
  await within('b synced', b.whenSynced())
  await until('b has it', () => b.getText('content').toString() === 'last words')
  b.destroy()
})

test('unsaved work exported from one client is sent by another (a reload while offline)', async () => {
  const doc = fresh('export')
  const a = client(doc)
  await within('synced', a.whenSynced())
  a.disconnect()
  a.getText('content').insert(0, 'typed offline, then the tab reloaded')
  assert.equal(a.unsaved, 1)
  const kept = a.encodeStateAsUpdate()
  assert.ok(kept instanceof Uint8Array && kept.length > 0)
  a.destroy()
  const b = client(doc)
  b.applyUpdate(kept)
  assert.equal(b.getText('content').toString(), 'typed offline, then the tab reloaded')
  assert.ok(b.unsaved > 0)
  await within('saved', b.whenSaved())
  const c = client(doc)
  await within('c synced', c.whenSynced())
  assert.equal(c.getText('content').toString(), 'typed offline, then the tab reloaded')
  assert.throws(() => c.applyUpdate(new Uint8Array([1, 2, 3])))
  b.destroy()
  c.destroy()
})

test('sticky indices follow the text and read Yjs relative positions', async () => {
  const doc = fresh('sticky')
  const a = client(doc)
  await within('synced', a.whenSynced())
  const t = a.getText('content')
  t.insert(0, 'hello world')
  const pos = t.stickyIndex(6, 0)
  t.insert(0, '>> ')
  assert.equal(t.resolveStickyIndex(pos), 9)
  // The same position made by Yjs (the format y-codemirror.next shares in awareness).
  const ydoc = new Y.Doc()
  const provider = new WebsocketProvider(server.url, doc, ydoc, { WebSocketPolyfill: WebSocket })
  await until('yjs has the text', () => ydoc.getText('content').toString() === '>> hello world')
  const rel = Y.relativePositionToJSON(Y.createRelativePositionFromTypeIndex(ydoc.getText('content'), 3))
  assert.equal(t.resolveStickyIndex(rel), 3)
  const ours = t.stickyIndex(9, 0)
  const back = Y.createAbsolutePositionFromRelativePosition(Y.createRelativePositionFromJSON(ours), ydoc)
  assert.equal(back.index, 9)
  assert.equal(t.resolveStickyIndex({ nonsense: true }), undefined)
  // The end of the text is a position too, and every key is there (y-codemirror.next reads
  // Y.RelativePosition objects without defaults).
  const end = t.stickyIndex(t.length, 0)
  assert.deepEqual(Object.keys(end).sort(), ['assoc', 'item', 'tname', 'type'])
  assert.equal(end.tname, 'content')
  t.insert(t.length, '!')
  assert.equal(t.resolveStickyIndex(end), t.length)
  await until('yjs has the !', () => ydoc.getText('content').length === t.length)
  assert.equal(Y.createAbsolutePositionFromRelativePosition(end, ydoc).index, t.length)
  provider.destroy()
  ydoc.destroy() // stops the awareness timer the provider started
  a.destroy()
})

test('tokens: without one the client keeps retrying; setToken() and connect() get it in', async () => {
  const ADMIN = 'admin-key-for-wasm-tests'
  const secured = new Server('secured.db', ['--auth-key', 'k1:wasm-test-secret-0123456789', '--admin-key', ADMIN])
  await secured.start()
  try {
    const doc = fresh('token')
    const http = secured.url.replace('ws://', 'http://')
    const issued = await fetch(`${http}/api/v1/tokens`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' },
      body: JSON.stringify({ user: 'ada', doc, permission: 'write' })
    })
    assert.equal(issued.status, 201)
    const { token } = await issued.json()
    const a = client(doc, secured.url)
    const statuses = []
    a.on('status', (st) => statuses.push(st))
    // The refused upgrade looks like a network failure to a browser client: it retries.
    await until('two refused attempts', () => statuses.filter((st) => st === 'offline').length >= 2)
    assert.ok(!a.synced)
    a.getText('content').insert(0, 'written before the token')
    a.setToken(token)
    a.connect()
    await within('saved with the token', a.whenSaved())
    const b = new QuireClient(secured.url, doc, { token })
    await within('b synced', b.whenSynced())
    assert.equal(b.getText('content').toString(), 'written before the token')
    a.destroy()
    b.destroy()
  } finally {
    await secured.kill()
  }
})

test('a permanent close code stops the client', async () => {
  const small = new Server('small.db', ['--max-doc-size', '2000'])
  await small.start()
  try {
    const a = client(fresh('limit'), small.url)
    await within('synced', a.whenSynced())
    let closed
    a.on('closed', (info) => { closed = info })
    a.getText('content').insert(0, 'x'.repeat(5000))
    await until('closed', () => closed !== undefined)
    assert.equal(closed.code, 4413)
    assert.equal(a.status, 'closed')
    assert.ok(a.unsaved > 0, 'the refused change is not reported saved')
    await assert.rejects(a.whenSaved(), /closed/)
  } finally {
    await small.kill()
  }
})
