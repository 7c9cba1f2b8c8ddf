// Shared helpers for the interop scripts: a seeded PRNG, clients, content comparison.
import * as Y from 'yjs'
import { WebsocketProvider } from 'y-websocket'
import WebSocket from 'ws'
import * as HP4 from '@hocuspocus/provider'
import * as HP3 from 'hocuspocus-provider-v3'

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

// mulberry32: small, seedable, good enough for choosing edits.
export function prng (seed) {
  let a = seed >>> 0
  const next = () => {
    a = (a + 0x6D2B79F5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
  return { next, int: (n) => Math.floor(next() * n), pick: (xs) => xs[Math.floor(next() * xs.length)] }
}

export function args () {
  const out = {}
  const argv = process.argv.slice(2)
  for (let i = 0; i < argv.length; i += 2) out[argv[i].replace(/^--/, '')] = argv[i + 1]
  return out
}

export function connect (url, room, name, { params } = {}) {
  const doc = new Y.Doc()
  const provider = new WebsocketProvider(url, room, doc, {
    WebSocketPolyfill: WebSocket,
    disableBc: true,
    maxBackoffTime: 500,
    params
  })
  provider.awareness.setLocalState({ user: { name } })
  return { doc, provider, room, name }
}

// One HocuspocusProviderWebsocket (the socket several providers share), reconnecting fast.
// `v3`: the previous major version of the provider (3.4.4) instead of the current one.
export function hpSocket (url, { v3 = false } = {}) {
  const M = v3 ? HP3 : HP4
  return new M.HocuspocusProviderWebsocket({
    url: `${url}/hocuspocus`,
    WebSocketPolyfill: WebSocket,
    delay: 100,
    minDelay: 100,
    maxDelay: 500
  })
}

// A Hocuspocus client of `room` over `socket` (or a socket of its own).
export function connectHp (url, room, name, { socket, token = '', v3 = false, ...rest } = {}) {
  const M = v3 ? HP3 : HP4
  const doc = new Y.Doc()
  const own = !socket
  const ws = socket ?? hpSocket(url, { v3 })
  const provider = new M.HocuspocusProvider({ websocketProvider: ws, name: room, document: doc, token, ...rest })
  provider.attach()
  provider.awareness.setLocalState({ user: { name } })
  return { kind: 'hp', doc, provider, socket: ws, ownSocket: own, room, name }
}

// The same questions for either kind of client.
export const isOnline = (c) => c.kind === 'hp' ? c.socket.status === 'connected' : c.provider.wsconnected
export const wantsOnline = (c) => c.kind === 'hp' ? c.socket.shouldConnect : c.provider.shouldConnect
export const goOffline = (c) => c.kind === 'hp' ? c.socket.disconnect() : c.provider.disconnect()
export const goOnline = (c) => c.kind === 'hp' ? c.socket.connect() : c.provider.connect()
// Synced: y-websocket's Step 2 received; Hocuspocus' also every local change acknowledged.
export const isSynced = (c) => c.kind === 'hp'
  ? c.provider.isAuthenticated && c.provider.synced && !c.provider.hasUnsyncedChanges
  : c.provider.synced

export function content (doc) {
  const map = doc.getMap('map').toJSON()
  const sorted = Object.fromEntries(Object.keys(map).sort().map((k) => [k, map[k]]))
  return JSON.stringify({
    text: doc.getText('text').toString(),
    map: sorted,
    array: doc.getArray('array').toJSON()
  })
}

export function randomEdit (rng, client) {
  const { doc, name } = client
  const text = doc.getText('text')
  const map = doc.getMap('map')
  const array = doc.getArray('array')
  const r = rng.next()
  if (r < 0.45) {
    text.insert(rng.int(text.length + 1), `${name}${rng.int(100)} `)
  } else if (r < 0.6 && text.length > 0) {
    const at = rng.int(text.length)
    text.delete(at, Math.min(1 + rng.int(4), text.length - at))
  } else if (r < 0.75) {
    map.set(`k${rng.int(20)}`, `${name}:${rng.int(1000)}`)
  } else if (r < 0.8) {
    map.delete(`k${rng.int(20)}`)
  } else if (r < 0.95) {
    array.insert(rng.int(array.length + 1), [rng.int(1000)])
  } else if (array.length > 0) {
    array.delete(rng.int(array.length), 1)
  }
}

export async function waitSynced (client, ms = 20000) {
  const deadline = Date.now() + ms
  while (!isSynced(client)) {
    if (Date.now() > deadline) throw new Error(`${client.name} did not sync`)
    await sleep(20)
  }
}

// Waits until every client of each room holds the same content as `reference(room)`.
export async function waitConverged (clients, ms = 30000) {
  const deadline = Date.now() + ms
  for (;;) {
    const byRoom = new Map()
    for (const c of clients) {
      if (!byRoom.has(c.room)) byRoom.set(c.room, new Set())
      byRoom.get(c.room).add(content(c.doc))
    }
    if ([...byRoom.values()].every((s) => s.size === 1)) return byRoom
    if (Date.now() > deadline) {
      const detail = clients.map((c) => `${c.room}/${c.name}: ${content(c.doc).slice(0, 200)}`).join('\n')
      throw new Error(`clients did not converge:\n${detail}`)
    }
    await sleep(50)
  }
}

export function destroy (clients) {
  for (const c of clients) {
    c.provider.awareness.destroy()
    c.provider.destroy()
    if (c.kind === 'hp') c.socket.destroy()
    c.doc.destroy()
  }
}
