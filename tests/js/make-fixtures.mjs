// Writes byte fixtures produced by the real JavaScript y-protocols encoders to
// server/tests/fixtures/y-protocols.json. The Rust tests decode them with Quire's codec and
// re-encode them, expecting the same bytes. Run: node make-fixtures.mjs (output is committed).
import * as Y from 'yjs'
import * as syncProtocol from 'y-protocols/sync'
import * as awarenessProtocol from 'y-protocols/awareness'
import * as authProtocol from 'y-protocols/auth'
import * as encoding from 'lib0/encoding'
import { writeFileSync, mkdirSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const hex = (u8) => Buffer.from(u8).toString('hex')
const frame = (fn) => { const e = encoding.createEncoder(); fn(e); return encoding.toUint8Array(e) }

const doc = new Y.Doc()
doc.clientID = 4242
doc.getText('text').insert(0, 'hello from yjs')
doc.getMap('map').set('k', 'v')
const other = new Y.Doc()
other.clientID = 77
Y.applyUpdate(other, Y.encodeStateAsUpdate(doc))
let lastUpdate = null
other.on('update', (u) => { lastUpdate = u })
other.getText('text').insert(5, ' again')

const awareness = new awarenessProtocol.Awareness(doc)
awareness.setLocalState({ user: { name: 'Ann', color: '#30bced' } })

const fixtures = [
  { name: 'sync-step1', kind: 'step1', text: null,
    bytes: frame(e => { encoding.writeVarUint(e, 0); syncProtocol.writeSyncStep1(e, doc) }) },
  { name: 'sync-step1-empty-doc', kind: 'step1', text: null,
    bytes: frame(e => { encoding.writeVarUint(e, 0); syncProtocol.writeSyncStep1(e, new Y.Doc()) }) },
  { name: 'sync-step2', kind: 'step2', text: 'hello from yjs',
    bytes: frame(e => { encoding.writeVarUint(e, 0); syncProtocol.writeSyncStep2(e, doc, new Uint8Array([0])) }) },
  { name: 'sync-update', kind: 'update', text: null,
    bytes: frame(e => { encoding.writeVarUint(e, 0); syncProtocol.writeUpdate(e, lastUpdate) }) },
  { name: 'awareness', kind: 'awareness', text: JSON.stringify(awareness.getLocalState()),
    bytes: frame(e => { encoding.writeVarUint(e, 1); encoding.writeVarUint8Array(e, awarenessProtocol.encodeAwarenessUpdate(awareness, [doc.clientID])) }) },
  { name: 'query-awareness', kind: 'query-awareness', text: null,
    bytes: frame(e => { encoding.writeVarUint(e, 3) }) },
  { name: 'auth-permission-denied', kind: 'auth-denied', text: 'read-only document',
    bytes: frame(e => { encoding.writeVarUint(e, 2); authProtocol.writePermissionDenied(e, 'read-only document') }) },
]
const out = fixtures.map(f => ({ ...f, bytes: hex(f.bytes) }))
// Several messages in one frame, as y/hub batches them.
out.push({ name: 'batched', kind: 'batch', text: null, bytes: out[0].bytes + out[3].bytes + out[4].bytes })

const here = dirname(fileURLToPath(import.meta.url))
const target = join(here, '..', '..', 'server', 'tests', 'fixtures', 'y-protocols.json')
mkdirSync(dirname(target), { recursive: true })
writeFileSync(target, JSON.stringify({ generator: 'tests/js/make-fixtures.mjs', yjs: '13.6.33', 'y-protocols': '1.0.7', fixtures: out }, null, 2) + '\n')
awareness.destroy()
console.log(`wrote ${out.length} fixtures to ${target}`)
