// Real y-websocket clients against Quire: random concurrent text, map and array edits with
// random disconnects, then every client and a fresh late client must hold identical state.
// With --hocuspocus K, every K-th client is a @hocuspocus/provider instead (a third of those on
// the previous major version, 3.x), sharing one socket per three of them: both protocols on
// the same documents.
// Usage: node interop.mjs --url ws://127.0.0.1:PORT [--seed N] [--duration MS] [--clients 8] [--docs 3] [--hocuspocus K]
import {
  args, prng, connect, connectHp, hpSocket, randomEdit, sleep, waitSynced, waitConverged, content,
  destroy, isOnline, wantsOnline, goOffline, goOnline
} from './lib.mjs'

const a = args()
const url = a.url
if (!url) { console.error('--url is required'); process.exit(2) }
const seed = Number(a.seed ?? Math.floor(Math.random() * 2 ** 31))
const duration = Number(a.duration ?? 20000)
const nClients = Number(a.clients ?? 8)
const nDocs = Number(a.docs ?? 3)
const every = Number(a.hocuspocus ?? 0)
const prefix = a.prefix ?? `interop-${seed}`
console.log(`interop: seed=${seed} (replay with --seed ${seed}) clients=${nClients} docs=${nDocs} duration=${duration}ms hocuspocus=every ${every || 'none'}`)
const rng = prng(seed)

const clients = []
let socket = null
let onSocket = 0
let hpClients = 0
for (let i = 0; i < nClients; i++) {
  const room = `${prefix}-${i % nDocs}`
  if (every > 0 && i % every === every - 1) {
    const v3 = hpClients % 3 === 2
    if (!socket || onSocket === 3 || socket.v3 !== v3) {
      socket = hpSocket(url, { v3 })
      socket.v3 = v3
      onSocket = 0
    }
    onSocket++
    hpClients++
    clients.push(connectHp(url, room, `h${i}`, { socket, v3 }))
  } else {
    clients.push(connect(url, room, `c${i}`))
  }
}
await Promise.all(clients.map((c) => waitSynced(c)))

let edits = 0
let disconnects = 0
const end = Date.now() + duration
while (Date.now() < end) {
  for (const c of clients) {
    if (rng.next() < 0.5) { randomEdit(rng, c); edits++ }
    // Now and then a client drops off for a while and keeps editing offline.
    if (isOnline(c) && wantsOnline(c) && rng.next() < 0.004) {
      goOffline(c)
      disconnects++
      const offline = 100 + rng.int(1500)
      setTimeout(() => goOnline(c), offline)
    }
  }
  await sleep(10 + rng.int(20))
}
// Everyone back online.
for (const c of clients) if (!wantsOnline(c)) goOnline(c)
await sleep(100)
await Promise.all(clients.map((c) => waitSynced(c)))
const rooms = await waitConverged(clients)

// A fresh client per document must see exactly the same state: the server has everything.
const late = []
for (const room of rooms.keys()) {
  late.push(connect(url, room, `late-${room}`))
  if (every > 0) late.push(connectHp(url, room, `late-hp-${room}`))
}
await Promise.all(late.map((c) => waitSynced(c)))
await waitConverged([...clients, ...late])
for (const c of late) {
  const expected = [...rooms.get(c.room)][0]
  if (content(c.doc) !== expected) throw new Error(`late client for ${c.room} differs`)
  if (content(c.doc).length < 20) throw new Error(`document ${c.room} is suspiciously empty`)
}
console.log(JSON.stringify({ ok: true, seed, edits, disconnects, hocuspocus: hpClients, rooms: [...rooms.keys()] }))
// (Sockets shared by several providers are destroyed once.)
for (const c of [...clients, ...late]) { if (c.kind === 'hp' && !c.ownSocket) c.kind = 'hp-shared' }
destroy([...clients, ...late])
for (const c of clients) if (c.kind === 'hp-shared') c.socket.destroy()
process.exit(0)
