// Shared helpers for the interop scripts: a seeded PRNG, clients, content comparison.
import * as Y from 'yjs'
import { WebsocketProvider } from 'y-websocket'
import WebSocket from 'ws'

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

export function connect (url, room, name) {
  const doc = new Y.Doc()
  const provider = new WebsocketProvider(url, room, doc, {
    WebSocketPolyfill: WebSocket,
    disableBc: true,
    maxBackoffTime: 500
  })
  provider.awareness.setLocalState({ user: { name } })
  return { doc, provider, room, name }
}

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
  while (!client.provider.synced) {
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
    c.doc.destroy()
  }
}
