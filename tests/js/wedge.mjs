// The two wedges against stock clients (docs/durability.md, "Only updates that integrate"),
// run by server/tests/js_interop.rs. pat (y-websocket) and hugo (Hocuspocus) edit a document;
// an attacker on a raw socket sends the second of two updates of its own and never the first,
// then a delete set naming pat's and hugo's clocks that do not exist yet. Then pat and hugo
// type on. The attacker is closed (1013) once its held update times out; a fresh y-websocket
// client reads every edit pat and hugo typed, and nothing of the attacker's.
// Usage: node wedge.mjs --url ws://HOST:PORT [--doc NAME]
import * as Y from 'yjs'
import * as encoding from 'lib0/encoding'
import WebSocket from 'ws'
import { args, connect, connectHp, sleep, waitSynced, waitConverged, destroy } from './lib.mjs'

const a = args()
const docName = a.doc ?? 'wedge'

function check (ok, what) {
  if (!ok) throw new Error(`failed: ${what}`)
  console.log(`ok - ${what}`)
}

// A y-websocket Update message carrying `update`.
function updateFrame (update) {
  const e = encoding.createEncoder()
  encoding.writeVarUint(e, 0) // sync
  encoding.writeVarUint(e, 2) // update
  encoding.writeVarUint8Array(e, update)
  return encoding.toUint8Array(e)
}

// An update with no structs and a delete set of `ranges`: [[client, clock, len], ...].
function deletesOnly (ranges) {
  const e = encoding.createEncoder()
  encoding.writeVarUint(e, 0) // no structs
  encoding.writeVarUint(e, ranges.length)
  for (const [client, clock, len] of ranges) {
    encoding.writeVarUint(e, client)
    encoding.writeVarUint(e, 1)
    encoding.writeVarUint(e, clock)
    encoding.writeVarUint(e, len)
  }
  return encoding.toUint8Array(e)
}

const pat = connect(a.url, docName, 'pat')
const hugo = connectHp(a.url, docName, 'hugo')
await waitSynced(pat)
await waitSynced(hugo)
pat.doc.getText('text').insert(0, 'start ')
await waitConverged([pat, hugo])

// The attacker's second update, without its first.
const own = new Y.Doc()
own.clientID = 770077
own.getText('text').insert(0, 'FIRST')
const sv = Y.encodeStateVector(own)
own.getText('text').insert(5, 'SECOND')
const second = Y.encodeStateAsUpdate(own, sv)
const clock = (doc) => Y.getState(doc.store, doc.clientID)
const attacker = new WebSocket(`${a.url}/${docName}`)
attacker.binaryType = 'arraybuffer'
const closed = new Promise((resolve) => attacker.on('close', (code) => resolve(code)))
await new Promise((resolve, reject) => { attacker.on('open', resolve); attacker.on('error', reject) })
attacker.send(updateFrame(second))
attacker.send(updateFrame(deletesOnly([
  [pat.doc.clientID, clock(pat.doc), 100000],
  [hugo.doc.clientID, clock(hugo.doc), 100000]
])))
const code = await Promise.race([closed, sleep(10000).then(() => 'open')])
check(code === 1013, `the attacker is closed with 1013 once its held update times out (got ${code})`)

// The victims type on.
const typed = []
for (let i = 0; i < 30; i++) {
  const c = i % 2 ? hugo : pat
  const t = c.doc.getText('text')
  const token = `<${c.name}${i}>`
  t.insert(t.length, token)
  typed.push(token)
  await sleep(10)
}
await waitConverged([pat, hugo])
const fresh = connect(a.url, docName, 'fresh')
await waitSynced(fresh)
await waitConverged([pat, hugo, fresh])
const final = fresh.doc.getText('text').toString()
const problems = []
const lost = typed.filter((t) => !final.includes(t))
if (lost.length) problems.push(`${lost.length} of the ${typed.length} edits typed after the attack are gone: ${lost.join(' ')}`)
if (!final.startsWith('start ')) problems.push(`the text before the attack is gone: ${JSON.stringify(final)}`)
if (final.includes('SECOND') || final.includes('FIRST')) problems.push('the attacker\'s update reached the document')
for (const p of problems) console.log(`not ok - ${p}`)
console.log(JSON.stringify({ ok: problems.length === 0, problems, typed: typed.length, final }))
destroy([pat, hugo, fresh])
process.exit(problems.length === 0 ? 0 : 1)
