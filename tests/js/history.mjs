// A restore while real y-websocket clients edit (docs/history.md): A writes and saves a
// version, then rewrites the text; B types at the end without pause, before, during and after
// the restore; C goes offline, edits its copy, and comes back after the restore. Everyone,
// and a fresh client, must converge on the version's text plus B's typing the restore had not
// seen and C's offline edit.
// Usage: node history.mjs --url ws://127.0.0.1:PORT --http http://127.0.0.1:PORT --doc NAME [--seed N]
import { args, prng, connect, sleep, waitSynced, waitConverged, content, destroy } from './lib.mjs'

const a = args()
const seed = Number(a.seed ?? 1)
const rng = prng(seed)
const api = (path) => `${a.http}/api/v1/docs/${encodeURIComponent(a.doc)}${path}`

async function json (path) {
  const resp = await fetch(api(path))
  if (!resp.ok) throw new Error(`GET ${path}: ${resp.status}`)
  return resp.json()
}

async function post (path, body) {
  const resp = await fetch(api(path), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body)
  })
  const out = await resp.json()
  if (!resp.ok) throw new Error(`POST ${path}: ${resp.status} ${JSON.stringify(out)}`)
  return out
}

// Waits until the server's committed text (read through the API) is `text`.
async function committed (text, ms = 10000) {
  const deadline = Date.now() + ms
  for (;;) {
    const doc = await json('/json')
    if (doc.text === text) return
    if (Date.now() > deadline) throw new Error(`committed text is ${JSON.stringify(doc.text)}, not ${JSON.stringify(text)}`)
    await sleep(20)
  }
}

const A = connect(a.url, a.doc, 'a')
await waitSynced(A)
A.doc.getText('text').insert(0, 'The cat sat.')
await committed('The cat sat.')
const version = await post('/versions', { label: 'the cat' })

const B = connect(a.url, a.doc, 'b')
const C = connect(a.url, a.doc, 'c')
await Promise.all([waitSynced(B), waitSynced(C)])

// C goes offline and edits its copy.
C.provider.disconnect()
C.doc.getText('text').insert(0, '>> ')

// A rewrites the sentence.
const ta = A.doc.getText('text')
ta.insert(4, 'big ')
ta.insert(ta.length, ' It purred.')
await committed('The big cat sat. It purred.')

// B types at the end all along; the restore happens in the middle.
let typing = true
let typed = 0
const typist = (async () => {
  while (typing) {
    const tb = B.doc.getText('text')
    tb.insert(tb.length, `·${typed++}`)
    await sleep(2 + rng.int(8))
  }
})()
await sleep(50)
const restored = await post(`/versions/${version.id}/restore`, {})
// What B types from now on, the restore cannot have seen.
const tb = B.doc.getText('text')
tb.insert(tb.length, ' [after]')
await sleep(50)
typing = false
await typist

// C comes back.
C.provider.connect()
await waitSynced(C)

const fresh = connect(a.url, a.doc, 'fresh')
await waitSynced(fresh)
const rooms = await waitConverged([A, B, C, fresh])
const final = fresh.doc.getText('text').toString()
const problems = []
if (!final.startsWith('>> The cat sat.')) problems.push('the restored sentence with the offline edit does not lead')
if (final.includes('big') || final.includes('purred')) problems.push('what came after the version is still there')
if (!final.includes('[after]')) problems.push("typing the restore did not see was lost")
if (restored.version.kind !== 'restore') problems.push('no restore version')
// And the server's committed content is the same.
await committed(final)
console.log(JSON.stringify({ ok: problems.length === 0, problems, typed, final, rooms: rooms.size, seq: restored.seq, content: JSON.parse(content(fresh.doc)) }))
destroy([A, B, C, fresh])
process.exit(problems.length === 0 ? 0 : 1)
