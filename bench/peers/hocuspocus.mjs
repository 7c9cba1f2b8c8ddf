// Hocuspocus with its SQLite extension (stores a snapshot after a 2 s debounce, its default).
// Usage: node hocuspocus.mjs PORT DB_FILE
import { Server } from '@hocuspocus/server'
import { SQLite } from '@hocuspocus/extension-sqlite'

const port = Number(process.argv[2] ?? 1234)
const database = process.argv[3] ?? ':memory:'
const server = new Server({
  port,
  address: '127.0.0.1',
  quiet: true,
  extensions: [new SQLite({ database })],
})
await server.listen()
console.log(`hocuspocus listening on ${port}`)
