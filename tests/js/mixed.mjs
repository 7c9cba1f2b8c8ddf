// JS half of the mixed run: y-websocket clients edit one document while Rust clients (driven by
// the Rust test) edit it too. When stdin says "done" (the Rust clients' edits are committed),
// the JS clients stop editing, converge with a fresh client, and print the final content.
// Usage: node mixed.mjs --url ws://127.0.0.1:PORT --doc NAME [--seed N] [--clients 3]
import { args, prng, connect, sleep, waitSynced, waitConverged, content, destroy } from './lib.mjs'
import { createInterface } from 'node:readline'

const a = args()
const seed = Number(a.seed ?? 1)
const rng = prng(seed)
const n = Number(a.clients ?? 3)
const clients = []
for (let i = 0; i < n; i++) clients.push(connect(a.url, a.doc, `js${i}`))
await Promise.all(clients.map((c) => waitSynced(c)))
console.log('ready')

let rustDone = false
createInterface({ input: process.stdin }).on('line', (line) => { if (line.trim() === 'done') rustDone = true })

let edits = 0
const minEnd = Date.now() + Number(a.duration ?? 3000)
while (Date.now() < minEnd || !rustDone) {
  const c = rng.pick(clients)
  const text = c.doc.getText('text')
  text.insert(rng.int(text.length + 1), `${c.name}.${edits} `)
  edits++
  await sleep(5 + rng.int(20))
}
const fresh = connect(a.url, a.doc, 'js-fresh')
await waitSynced(fresh)
await waitConverged([...clients, fresh])
console.log(JSON.stringify({ edits, content: JSON.parse(content(fresh.doc)) }))
destroy([...clients, fresh])
process.exit(0)
