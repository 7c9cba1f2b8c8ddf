// Each class of the WASM client on its own, without a server (web/build.sh makes web/pkg): a
// client whose server never answers still edits its document, so each class's contract is
// checked here apart from the network (wasm-node.test.mjs has the clients against a server).
// Run: node --test web/test/wasm-classes.test.mjs
import { test, before } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { join, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'
import * as Y from 'yjs'
import init, { QuireClient } from '../pkg/quire_client.js'

// A socket that never opens: the client stays offline and keeps its edits (the network is
// wasm-node.test.mjs's to test).
class NeverOpens {
  constructor (url) { this.url = url; this.readyState = 0; this.binaryType = 'blob' }
  send () { throw new Error('not open') }
  close () { this.readyState = 3 }
}
globalThis.WebSocket = NeverOpens
const here = dirname(fileURLToPath(import.meta.url))

function offline (doc = 'classes') {
  return new QuireClient('ws://quire.invalid', doc, { minBackoffMs: 1000, maxBackoffMs: 1000 })
}

before(async () => {
  await init({ module_or_path: readFileSync(join(here, '../pkg/quire_client_bg.wasm')) })
})

test('QuireText counts UTF-16 units, refuses what is out of range and changes nothing then', () => {
  const c = offline()
  const t = c.getText('t')
  t.insert(0, 'a😀b')
  assert.equal(t.length, 4, 'the emoji is two UTF-16 units, as in JavaScript')
  t.insert(3, '!')
  assert.equal(t.toString(), 'a😀!b')
  assert.throws(() => t.insert(6, 'x'), /index out of range/)
  assert.throws(() => t.delete(4, 2), /range out of bounds/)
  assert.equal(t.toString(), 'a😀!b')
  t.delete(1, 2)
  assert.equal(t.toString(), 'a!b')
  c.destroy()
})

test('QuireText observers get the delta after the transaction, local, until unobserved', () => {
  const c = offline()
  const t = c.getText('t')
  const seen = []
  const id = t.observe((delta, local) => seen.push({ delta, local, text: t.toString() }))
  t.insert(0, 'hello')
  t.delete(0, 1)
  t.unobserve(id)
  t.insert(0, 'x')
  assert.deepEqual(seen, [
    { delta: [{ insert: 'hello' }], local: true, text: 'hello' },
    { delta: [{ delete: 1 }], local: true, text: 'ello' }
  ])
  c.destroy()
})

test('QuireText sticky indices move with edits made before them', () => {
  const c = offline()
  const t = c.getText('t')
  t.insert(0, 'abc')
  const pos = t.stickyIndex(2, 0)
  t.insert(0, 'xy')
  assert.equal(t.resolveStickyIndex(pos), 4)
  assert.equal(t.resolveStickyIndex({ nonsense: true }), undefined)
  c.destroy()
})

test('QuireMap sets, reads, deletes JSON values and reports each key\'s action', () => {
  const c = offline()
  const m = c.getMap('m')
  const seen = []
  m.observe((changes, local) => seen.push(...changes.map((ch) => [ch.key, ch.action, local])))
  m.set('title', 'Notes')
  m.set('tags', ['a', { b: 1 }])
  m.set('title', 'Renamed')
  assert.equal(m.get('title'), 'Renamed')
  assert.deepEqual(m.get('tags'), ['a', { b: 1 }])
  assert.equal(m.get('missing'), undefined)
  assert.ok(m.has('tags') && !m.has('missing'))
  m.delete('tags')
  assert.deepEqual(m.keys(), ['title'])
  assert.deepEqual(m.toJSON(), { title: 'Renamed' })
  assert.deepEqual(seen, [
    ['title', 'add', true],
    ['tags', 'add', true],
    ['title', 'update', true],
    ['tags', 'delete', true]
  ])
  c.destroy()
})

test('QuireArray inserts, pushes and deletes, refusing ranges past its end', () => {
  const c = offline()
  const a = c.getArray('a')
  const deltas = []
  a.observe((delta) => deltas.push(delta))
  a.push([1, 2])
  a.insert(1, ['x'])
  assert.deepEqual(a.toJSON(), [1, 'x', 2])
  assert.equal(a.length, 3)
  assert.throws(() => a.insert(4, [0]))
  assert.throws(() => a.delete(2, 2))
  assert.deepEqual(a.toJSON(), [1, 'x', 2], 'a refused edit changes nothing')
  a.delete(0, 2)
  assert.deepEqual(a.toJSON(), [2])
  assert.equal(a.get(0), 2)
  assert.equal(a.get(5), undefined)
  assert.deepEqual(deltas[0], [{ insert: [1, 2] }])
  assert.deepEqual(deltas[1], [{ retain: 1 }, { insert: ['x'] }])
  assert.deepEqual(deltas[2], [{ delete: 2 }])
  c.destroy()
})

test('QuireClient exchanges its state as Yjs updates both ways, and counts edits not yet saved', () => {
  const a = offline('exchange')
  const b = offline('exchange')
  a.getText('t').insert(0, 'from the client')
  assert.ok(a.unsaved > 0, 'an edit made offline is not saved')
  // Its update is a Yjs v1 update Yjs reads...
  const ydoc = new Y.Doc()
  Y.applyUpdate(ydoc, a.encodeStateAsUpdate())
  assert.equal(ydoc.getText('t').toString(), 'from the client')
  // ... and one Yjs makes, the client applies.
  ydoc.getText('t').insert(0, '> ')
  b.applyUpdate(Y.encodeStateAsUpdate(ydoc))
  assert.equal(b.getText('t').toString(), '> from the client')
  assert.throws(() => b.applyUpdate(new Uint8Array([255, 255, 255])))
  assert.equal(b.getText('t').toString(), '> from the client', 'a bad update changes nothing')
  a.destroy()
  b.destroy()
})
