// Real y-websocket clients against Quire: random concurrent text, map and array edits with
// random disconnects, then every client and a fresh late client must hold identical state.
// Usage: node interop.mjs --url ws://127.0.0.1:PORT [--seed N] [--duration MS] [--clients 8] [--docs 3]
import { args, prng, connect, randomEdit, sleep, waitSynced, waitConverged, content, destroy } from './lib.mjs'

const a = args()
const url = a.url
if (!url) { console.error('--url is required'); process.exit(2) }
const seed = Number(a.seed ?? Math.floor(Math.random() * 2 ** 31))
const duration = Number(a.duration ?? 20000)
const nClients = Number(a.clients ?? 8)
const nDocs = Number(a.docs ?? 3)
const prefix = a.prefix ?? `interop-${seed}`
console.log(`interop: seed=${seed} (replay with --seed ${seed}) clients=${nClients} docs=${nDocs} duration=${duration}ms`)
const rng = prng(seed)

const clients = []
for (let i = 0; i < nClients; i++) clients.push(connect(url, `${prefix}-${i % nDocs}`, `c${i}`))
await Promise.all(clients.map((c) => waitSynced(c)))

let edits = 0
let disconnects = 0
const end = Date.now() + duration
while (Date.now() < end) {
  for (const c of clients) {
    if (rng.next() < 0.5) { randomEdit(rng, c); edits++ }
    // Now and then a client drops off for a while and keeps editing offline.
    if (c.provider.wsconnected && rng.next() < 0.004) {
      c.provider.disconnect()
      disconnects++
      const offline = 100 + rng.int(1500)
      setTimeout(() => c.provider.connect(), offline)
    }
  }
  await sleep(10 + rng.int(20))
}
// Everyone back online.
for (const c of clients) if (!c.provider.shouldConnect) c.provider.connect()
await sleep(100)
await Promise.all(clients.map((c) => waitSynced(c)))
const rooms = await waitConverged(clients)

// A fresh client per document must see exactly the same state: the server has everything.
const late = []
for (const room of rooms.keys()) late.push(connect(url, room, `late-${room}`))
await Promise.all(late.map((c) => waitSynced(c)))
await waitConverged([...clients, ...late])
for (const c of late) {
  const expected = [...rooms.get(c.room)][0]
  if (content(c.doc) !== expected) throw new Error(`late client for ${c.room} differs`)
  if (content(c.doc).length < 20) throw new Error(`document ${c.room} is suspiciously empty`)
}
console.log(JSON.stringify({ ok: true, seed, edits, disconnects, rooms: [...rooms.keys()] }))
destroy([...clients, ...late])
process.exit(0)
