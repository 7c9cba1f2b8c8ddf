// The JavaScript side of the Python tool test (server/tests/js_interop.rs): a stock yjs +
// y-websocket client, the stack a browser editor uses, appends its text to the text root
// `content` of a document a pycrdt client (tests/python/edit_doc.py) edits at the same time,
// and waits until the root holds every expected string. Prints the text as JSON.
// Usage: node python-peer.mjs --url ws://HOST:PORT --doc NAME --text TEXT --expect A,B [--timeout MS]
import { args, connect, sleep, waitSynced, destroy } from './lib.mjs'

const a = args()
const client = connect(a.url, a.doc, 'js')
await waitSynced(client)
const text = client.doc.getText('content')
text.insert(text.length, a.text)
const expect = String(a.expect).split(',').filter(Boolean)
const deadline = Date.now() + Number(a.timeout ?? 30000)
while (!expect.every((e) => text.toString().includes(e))) {
  if (Date.now() > deadline) {
    console.log(JSON.stringify({ timeout: true, text: text.toString() }))
    destroy([client])
    process.exit(1)
  }
  await sleep(50)
}
// Let the provider flush what it has sent before leaving.
await sleep(500)
console.log(JSON.stringify({ text: text.toString() }))
destroy([client])
process.exit(0)
