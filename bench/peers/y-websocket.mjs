// The reference server (@y/websocket-server): documents in memory, no persistence configured.
// Usage: node y-websocket.mjs PORT
process.env.HOST = '127.0.0.1'
process.env.PORT = process.argv[2] ?? '1234'
await import('@y/websocket-server/src/server.js').catch(async () => {
  await import('./node_modules/@y/websocket-server/src/server.js')
})
