// @hocuspocus/provider (the current major, 4.x, and the previous one, 3.x) against Quire's
// /hocuspocus endpoint, run by server/tests/hocuspocus.rs. One scenario per run:
//
//   features  connect, sync, edit, presence across both protocols, read-only refusal, bad token
//             refusal, token refresh and expiry, three documents over one socket, client Close,
//             stateless both ways
//   unsynced  hasUnsyncedChanges stays true while the server holds the commit (the Rust side
//             holds it, says `releasing` on stdin and, once heard, releases it) and turns false
//             only after
//   restart   edits before, during and after a server restart (the Rust side restarts it and
//             says `restarted`); a fresh provider sees every one
//   kill      providers type until the server is SIGKILLed; prints, per provider, the last edit
//             it was told is synced (the Rust side checks those after a restart)
//
// Usage: node hocuspocus.mjs --scenario NAME --url ws://HOST:PORT [--http http://HOST:PORT]
//        [--tokens JSON] [--admin KEY] [--seed N]
import * as readline from 'node:readline'
import WebSocket from 'ws'
import { args, connect, connectHp, hpSocket, sleep, prng } from './lib.mjs'

const a = args()
const url = a.url
const http = a.http
const tokens = a.tokens ? JSON.parse(a.tokens) : {}
const seed = Number(a.seed ?? 1)
const rng = prng(seed)

const lines = readline.createInterface({ input: process.stdin })
const heard = []
lines.on('line', (l) => heard.push(l.trim()))
async function hear (what, ms = 60000) {
  const deadline = Date.now() + ms
  while (!heard.includes(what)) {
    if (Date.now() > deadline) throw new Error(`never heard "${what}" on stdin`)
    await sleep(10)
  }
}

function check (ok, what) {
  if (!ok) throw new Error(`failed: ${what}`)
  console.log(`ok - ${what}`)
}

async function until (cond, what, ms = 15000) {
  const deadline = Date.now() + ms
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out: ${what}`)
    await sleep(20)
  }
  console.log(`ok - ${what}`)
}

const text = (c) => c.doc.getText('text').toString()
const synced = (c) => c.provider.isAuthenticated && c.provider.synced && !c.provider.hasUnsyncedChanges
// Records a provider's events, for the checks below.
function watch (c) {
  c.events = []
  for (const e of ['authenticated', 'authenticationFailed', 'close', 'stateless']) {
    c.provider.on(e, (data) => c.events.push({ e, data: e === 'close' ? { reason: data?.event?.reason } : data }))
  }
  return c
}
const saw = (c, e) => c.events.filter((x) => x.e === e)

async function features () {
  // Three documents over one socket, a 4.x provider each.
  const socket = hpSocket(url)
  const [pa, pb, pc] = ['hp-a', 'hp-b', 'hp-c'].map((room) =>
    watch(connectHp(url, room, `ann-${room}`, { socket, token: tokens.ann })))
  await until(() => [pa, pb, pc].every(synced), 'three documents over one socket authenticate and sync')
  check([pa, pb, pc].every((c) => saw(c, 'authenticated')[0]?.data?.scope === 'read-write'), 'scope read-write')
  pa.doc.getText('text').insert(0, 'alpha ')
  pb.doc.getText('text').insert(0, 'beta ')
  pc.doc.getText('text').insert(0, 'gamma ')
  await until(() => [pa, pb, pc].every(synced), 'each edit acknowledged (SyncStatus)')

  // Another user's 3.x provider, a y-websocket client and a 4.x provider on the same document.
  const v3 = watch(connectHp(url, 'hp-a', 'bob-v3', { token: tokens.bob, v3: true }))
  const yws = connect(url, 'hp-a', 'bob-yws', { params: { token: tokens.bob } })
  await until(() => synced(v3) && yws.provider.synced, 'a 3.x provider and a y-websocket client sync')
  check(text(v3) === 'alpha ' && text(yws) === 'alpha ', 'both see the Hocuspocus edit')
  yws.doc.getText('text').insert(text(yws).length, 'from-yws ')
  v3.doc.getText('text').insert(0, 'from-v3 ')
  await until(() => [pa, v3, yws].every((c) => text(c) === text(pa)) && text(pa).includes('from-yws') && text(pa).includes('from-v3'),
    'edits cross between y-websocket and both provider versions')

  // Presence: everyone sees everyone's awareness state.
  const names = (c) => [...c.provider.awareness.getStates().values()].map((s) => s.user?.name).filter(Boolean).sort().join(',')
  await until(() => names(pa) === 'ann-hp-a,bob-v3,bob-yws' && names(yws) === names(pa) && names(v3) === names(pa),
    'presence crosses both protocols')

  // Read-only: a reader is told `readonly`, syncs, and its local edit is refused (SyncStatus 0,
  // so it stays unsynced) and reaches nobody.
  const reader = watch(connectHp(url, 'hp-a', 'rob', { token: tokens.rob }))
  await until(() => synced(reader), 'a reader syncs (nothing of its own to acknowledge)')
  check(saw(reader, 'authenticated')[0]?.data?.scope === 'readonly', 'scope readonly')
  reader.doc.getText('text').insert(0, 'FORBIDDEN ')
  await sleep(800)
  check(reader.provider.hasUnsyncedChanges, 'the reader\'s edit is not acknowledged')
  check(!text(pa).includes('FORBIDDEN'), 'the reader\'s edit reaches nobody')

  // Refusals: a bad token, and a token for other documents. The socket's other documents stay.
  const bad = watch(connectHp(url, 'hp-d', 'mallory', { socket, token: 'not-a-token' }))
  const elsewhere = watch(connectHp(url, 'secret-doc', 'ann-elsewhere', { socket, token: tokens.ann }))
  await until(() => saw(bad, 'authenticationFailed').length > 0 && saw(elsewhere, 'authenticationFailed').length > 0,
    'a bad token and an uncovered document are refused (PermissionDenied)')
  console.log(`  reasons: ${saw(bad, 'authenticationFailed')[0].data.reason} / ${saw(elsewhere, 'authenticationFailed')[0].data.reason}`)
  check(text(bad) === '' && text(elsewhere) === '', 'refused documents get no content')
  pb.doc.getText('text').insert(0, 'still ')
  await until(() => synced(pb), 'the socket\'s other documents keep working')

  // A second provider of hp-b on the same socket, with 4.x session awareness (its address is
  // `hp-b\0session`): its own peer of the document.
  const twin = watch(connectHp(url, 'hp-b', 'ann-twin', { socket, token: tokens.ann, sessionAwareness: true }))
  await until(() => synced(twin) && text(twin) === text(pb), 'a session-awareness provider shares the socket and the document')
  twin.doc.getText('text').insert(0, 'twin ')
  await until(() => text(pb).startsWith('twin ') && names(pb).includes('ann-twin'), 'its edits and presence reach the other provider')

  // Tokens: one provider refreshes its short token before it expires, another does not. Only
  // the second's document closes; their shared socket and the refreshed one stay.
  const issue = async (doc, ttl) => {
    const r = await fetch(`${http}/api/v1/tokens`, {
      method: 'POST',
      headers: { authorization: `Bearer ${a.admin}`, 'content-type': 'application/json' },
      body: JSON.stringify({ user: 'ann', doc, permission: 'write', ttl_secs: ttl })
    })
    return (await r.json()).token
  }
  const shortSocket = hpSocket(url)
  const refreshed = watch(connectHp(url, 'hp-r', 'ann-refresh', { socket: shortSocket, token: await issue('hp-r', 3) }))
  const expiring = watch(connectHp(url, 'hp-e', 'ann-expire', { socket: shortSocket, token: await issue('hp-e', 3) }))
  await until(() => synced(refreshed) && synced(expiring), 'short-lived tokens authenticate')
  refreshed.provider.configuration.token = tokens.ann
  await refreshed.provider.sendToken()
  await until(() => saw(expiring, 'close').length > 0, 'an expired token closes its document', 10000)
  console.log(`  close reason: ${saw(expiring, 'close')[0].data.reason}`)
  check(saw(refreshed, 'close').length === 0, 'the refreshed document stays open')
  refreshed.doc.getText('text').insert(0, 'after expiry ')
  await until(() => synced(refreshed), 'and its edits are acknowledged after the old token\'s expiry')
  check(shortSocket.status === 'connected', 'the socket stays open')

  // Stateless: client to server (a webhook event in the outbox), server to clients (the API).
  pa.provider.sendStateless(JSON.stringify({ hello: 'server' }))
  const outbox = async () => {
    const r = await fetch(`${http}/api/v1/admin/outbox?limit=50`, { headers: { authorization: `Bearer ${a.admin}` } })
    return (await r.json()).events.filter((e) => e.type === 'document.stateless')
  }
  let events = []
  const deadline = Date.now() + 10000
  while (events.length === 0 && Date.now() < deadline) { events = await outbox(); await sleep(50) }
  check(events.length === 1 && JSON.parse(events[0].payload).payload === '{"hello":"server"}' &&
    JSON.parse(events[0].payload).name === 'hp-a', 'a client\'s stateless message is a document.stateless event')
  const sent = await fetch(`${http}/api/v1/docs/hp-a/stateless`, {
    method: 'POST',
    headers: { authorization: `Bearer ${tokens.ann}`, 'content-type': 'application/json' },
    body: JSON.stringify({ payload: '{"hello":"clients"}' })
  })
  const delivered = (await sent.json()).delivered
  await until(() => [pa, v3, reader].every((c) => saw(c, 'stateless').some((s) => s.data.payload === '{"hello":"clients"}')),
    'the API\'s stateless message reaches every provider of the document, 3.x included')
  check(delivered === 3, `delivered to the 3 Hocuspocus clients of hp-a (${delivered})`)

  // Close one document of the shared socket; the others go on.
  pc.provider.destroy()
  await sleep(200)
  pa.doc.getText('text').insert(0, 'after-close ')
  await until(() => synced(pa) && text(v3) === text(pa), 'closing one document leaves the others')
  check(socket.status === 'connected', 'the shared socket stays open')
  return { ok: true }
}

async function unsynced () {
  const c = watch(connectHp(url, 'held', 'ann'))
  await until(() => synced(c), 'synced')
  let early = null
  let released = false
  c.provider.on('unsyncedChanges', (e) => {
    const n = typeof e === 'number' ? e : e.number
    if (n === 0 && !released && early === null) early = new Error('hasUnsyncedChanges cleared before the commit')
  })
  console.log('ready')
  await hear('holding')
  c.doc.getText('text').insert(0, 'held edit ')
  await sleep(1000)
  check(c.provider.hasUnsyncedChanges, 'unsynced while the commit is held')
  console.log('edited')
  await hear('releasing')
  released = true
  if (early) throw early
  console.log('release-heard')
  await until(() => !c.provider.hasUnsyncedChanges, 'synced once the commit went through')
  return { ok: true }
}

async function restart () {
  const p = [connectHp(url, 'restarted', 'p0'), connectHp(url, 'restarted', 'p1')]
  await until(() => p.every(synced), 'synced')
  let n = 0
  const edit = () => { const c = p[n % 2]; c.doc.getText('text').insert(text(c).length, `e${n} `); n++ }
  for (let i = 0; i < 10; i++) edit()
  await until(() => p.every(synced), 'first edits acknowledged')
  console.log('ready')
  // Edits continue while the server goes down and comes back.
  while (!heard.includes('restarted')) { edit(); await sleep(30) }
  for (let i = 0; i < 10; i++) edit()
  await until(() => p.every(synced) && text(p[0]) === text(p[1]), 'reconnected and resynced', 30000)
  const fresh = connectHp(url, 'restarted', 'fresh')
  await until(() => synced(fresh), 'a fresh provider syncs')
  const missing = [...Array(n).keys()].filter((i) => !text(fresh).includes(`e${i} `))
  check(missing.length === 0, `all ${n} edits are there (missing: ${missing.join(',')})`)
  check(text(fresh) === text(p[0]), 'the fresh provider holds exactly the same text')
  return { ok: true, edits: n }
}

async function kill () {
  // Two documents; two providers share a socket.
  const shared = hpSocket(url)
  const p = [
    connectHp(url, 'killed-0', 'k0', { socket: shared }),
    connectHp(url, 'killed-1', 'k1', { socket: shared }),
    connectHp(url, 'killed-0', 'k2')
  ]
  await until(() => p.every(synced), 'synced')
  const sent = p.map(() => -1)
  const acked = p.map(() => -1)
  p.forEach((c, i) => c.provider.on('unsyncedChanges', (e) => {
    const n = typeof e === 'number' ? e : e.number
    // Nothing unacknowledged: every edit sent so far is durable.
    if (n === 0) acked[i] = sent[i]
  }))
  let down = false
  for (const s of [shared, p[2].socket]) s.on('status', ({ status }) => { if (status !== 'connected') down = true })
  console.log('typing')
  while (!down) {
    const i = rng.int(p.length)
    const c = p[i]
    sent[i]++
    c.doc.getText('text').insert(text(c).length, `${c.name}-${sent[i]} `)
    await sleep(2 + rng.int(10))
  }
  return { ok: true, acked: Object.fromEntries(p.map((c, i) => [c.name, { doc: c.room, upto: acked[i] }])) }
}

const scenarios = { features, unsynced, restart, kill }
const run = scenarios[a.scenario]
if (!run) { console.error(`unknown --scenario ${a.scenario}`); process.exit(2) }
try {
  const result = await run()
  console.log(JSON.stringify(result))
  process.exit(0)
} catch (e) {
  console.log(`not ok - ${e.message}`)
  process.exit(1)
}
