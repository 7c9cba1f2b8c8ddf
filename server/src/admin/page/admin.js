// Quire's admin dashboard. The credential lives in this tab's session storage only and goes
// to the server as an `Authorization: Bearer` header: never in an address, a cookie or local
// storage. Everything the server sends is put in the page as text (document names are
// chosen by users), never as HTML.

const KEY = 'quire.admin.credential'
// Dead letters listed with a Retry button (the newest).
const DEAD_SHOWN = 20
const $ = (id) => document.getElementById(id)

let credential = sessionStorage.getItem(KEY)
let streamAbort = null
let timers = []
let samples = []
let historyMs = 3600_000
let everyMs = 1000
let liveRooms = new Map()
let docsAfter = [] // the `after` of each page shown, to go back to the first
let nextAfter = null
let overview = null

// ---------------------------------------------------------------------------------------------
// Formatting

function bytes (n) {
  if (n == null) return '–'
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB']
  let i = 0
  let v = Number(n)
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++ }
  return `${v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1)} ${units[i]}`
}

function num (n, digits = 1) {
  if (n == null) return '–'
  const v = Number(n)
  return Number.isInteger(v) ? v.toLocaleString('en') : v.toFixed(digits)
}

function span (ms) {
  const s = Math.round(Math.abs(ms) / 1000)
  if (s < 60) return `${s} s`
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`
}

function ago (t) {
  if (!t) return '–'
  return `${span(Date.now() - t)} ago`
}

function cell (text, cls) {
  const td = document.createElement('td')
  td.textContent = text
  if (cls) td.className = cls
  return td
}

function fillTable (id, rows, empty) {
  const body = $(id).tBodies[0]
  const trs = rows.map((cells) => {
    const tr = document.createElement('tr')
    for (const c of cells) tr.append(c instanceof Node ? c : cell(String(c)))
    return tr
  })
  if (trs.length === 0) {
    const tr = document.createElement('tr')
    tr.className = 'empty'
    const td = cell(empty)
    td.colSpan = $(id).tHead.rows[0].cells.length
    tr.append(td)
    trs.push(tr)
  }
  body.replaceChildren(...trs)
}

function badge (text, ok) {
  const b = document.createElement('span')
  b.className = `badge ${ok ? 'ok' : 'bad'}`
  b.textContent = text
  const td = document.createElement('td')
  td.append(b)
  return td
}

function setStatus (text, state) {
  const s = $('status')
  s.textContent = text
  s.className = state || ''
}

// ---------------------------------------------------------------------------------------------
// The API

class AuthFailed extends Error {}

async function api (path, options = {}) {
  const res = await fetch(`/api/v1${path}`, {
    ...options,
    cache: 'no-store',
    headers: { ...(options.headers || {}), Authorization: `Bearer ${credential}` }
  })
  if (res.status === 401 || res.status === 403) {
    let detail = `${res.status}`
    try { detail = (await res.json()).detail || detail } catch {}
    throw new AuthFailed(detail)
  }
  if (!res.ok) {
    let detail = `${res.status} ${res.statusText}`
    try { detail = (await res.json()).detail || detail } catch {}
    throw new Error(detail)
  }
  return res.json()
}

function failed (e) {
  if (e instanceof AuthFailed) {
    signOut(`Signed out: ${e.message}`)
  } else {
    setStatus(`error: ${e.message}`, 'down')
  }
}

// ---------------------------------------------------------------------------------------------
// Signing in and out

function showLogin (message) {
  $('dashboard').hidden = true
  $('logout').hidden = true
  $('login').hidden = false
  $('login-error').textContent = message || ''
  $('credential').value = ''
  $('credential').focus()
}

function signOut (message) {
  credential = null
  sessionStorage.removeItem(KEY)
  if (streamAbort) streamAbort.abort()
  streamAbort = null
  for (const t of timers) clearInterval(t)
  timers = []
  setStatus('')
  $('node').textContent = ''
  showLogin(message)
}

$('login').addEventListener('submit', async (event) => {
  event.preventDefault()
  credential = $('credential').value.trim()
  $('credential').value = ''
  try {
    await api('/admin/overview')
  } catch (e) {
    credential = null
    $('login-error').textContent = e instanceof AuthFailed
      ? `Not accepted: ${e.message}`
      : `The server did not answer: ${e.message}`
    return
  }
  sessionStorage.setItem(KEY, credential)
  start()
})

$('logout').addEventListener('click', () => signOut('Signed out.'))

// ---------------------------------------------------------------------------------------------
// The panels

async function loadOverview () {
  overview = await api('/admin/overview')
  $('node').textContent = `node ${overview.node_id} · ${overview.database}`
  const rows = [
    ['Node', overview.node_id],
    ['Version', overview.version],
    ['Database', overview.database + (overview.cluster ? ' (several nodes may share it)' : '')],
    ['Store size', bytes(overview.store_bytes)],
    ['Up for', span(overview.now - overview.started_at)],
    ['Rooms loaded', num(overview.rooms_loaded)],
    ['Connections', num(overview.connections)],
    ['Rooms stalled on storage', num(overview.rooms_stalled)],
    ['Bus to other nodes', overview.bus ? 'connected' : 'none'],
    ['Authentication', overview.open_mode ? 'OPEN (development mode: no key configured)' : 'keys configured'],
    ['Figures kept', `${num(overview.samples_kept)} samples, one every ${span(overview.sample_every_ms)}, for ${span(overview.history_ms)}`]
  ]
  const dl = $('overview')
  dl.replaceChildren(...rows.flatMap(([k, v]) => {
    const dt = document.createElement('dt')
    dt.textContent = k
    const dd = document.createElement('dd')
    dd.textContent = v
    return [dt, dd]
  }))
}

async function loadDocs () {
  const after = docsAfter.length ? docsAfter[docsAfter.length - 1] : null
  const params = new URLSearchParams({ limit: '50' })
  const prefix = $('prefix').value.trim()
  if (prefix) params.set('prefix', prefix)
  if (after != null) params.set('after', String(after))
  const page = await api(`/admin/docs?${params}`)
  nextAfter = page.next_after
  $('docs-next').disabled = nextAfter == null
  renderDocs(page.docs)
}

let shownDocs = []
function renderDocs (docs) {
  if (docs) shownDocs = docs
  fillTable('docs', shownDocs.map((d) => {
    const live = liveRooms.get(d.name) || d.live
    const lease = d.lease_owner
      ? `${d.lease_owner} · epoch ${d.lease_epoch}${d.lease_expires_at < Date.now() ? ' (expired)' : ''}`
      : '–'
    const lastCommit = Math.max(d.last_commit || 0, live ? live.last_commit : 0)
    const lastSnapshot = Math.max(d.snapshot_at || 0, live ? live.last_snapshot : 0)
    const tr = [
      cell(d.name),
      live ? badge('live', true) : cell('–'),
      cell(live ? num(live.peers) : '–', 'num'),
      cell(live ? num(live.updates_in) : '–', 'num'),
      cell(d.snapshot_bytes ? `${bytes(d.snapshot_bytes)} @ ${d.snapshot_seq}` : 'none'),
      cell(`${num(d.log_rows)} rows · ${bytes(d.log_bytes)}`),
      cell(ago(lastCommit)),
      cell(ago(lastSnapshot)),
      cell(lease)
    ]
    return tr
  }), 'No documents.')
}

function renderRooms (tick) {
  liveRooms = new Map(tick.rooms.map((r) => [r.name, r]))
  $('rooms-note').textContent = tick.rooms_total > tick.rooms.length
    ? `the ${tick.rooms.length} busiest of ${tick.rooms_total}`
    : `${tick.rooms_total} loaded`
  fillTable('rooms', tick.rooms.map((r) => [
    cell(r.name),
    cell(num(r.peers), 'num'),
    cell(num(r.updates_in), 'num'),
    cell(num(r.updates_out), 'num'),
    cell(bytes(r.stored_bytes), 'num'),
    cell(num(r.log_rows), 'num'),
    cell(ago(r.last_commit)),
    cell(ago(r.last_snapshot)),
    cell(r.epoch ? String(r.epoch) : '–', 'num')
  ]), 'No room is loaded.')
  renderDocs()
}

async function loadOutbox () {
  const view = await api('/admin/outbox?limit=50')
  const pending = view.events.filter((e) => e.status === 'pending').length
  $('outbox-note').textContent = `${pending} pending of the newest ${view.events.length}`
  fillTable('outbox', view.events.map((e) => [
    cell(String(e.id), 'num'),
    cell(e.type),
    badge(e.status, e.status === 'delivered'),
    cell(num(e.attempts), 'num'),
    cell(e.status === 'pending' ? (e.available_at > Date.now() ? `in ${span(e.available_at - Date.now())}` : 'now') : '–'),
    cell(e.last_error || '', 'error'),
    cell(ago(e.created_at))
  ]), 'No events (webhooks are off, or nothing happened yet).')
  const shown = view.dead.slice(0, DEAD_SHOWN)
  $('dead-note').textContent = view.dead.length > shown.length
    ? `the newest ${shown.length} of ${view.dead.length}${view.dead.length === 50 ? '+' : ''}`
    : `${view.dead.length}`
  fillTable('dead', shown.map((d) => {
    const button = document.createElement('button')
    button.type = 'button'
    button.textContent = 'Retry'
    button.dataset.id = String(d.id)
    button.addEventListener('click', () => retry(d.id, button))
    const td = document.createElement('td')
    td.append(button)
    return [
      cell(String(d.id), 'num'),
      cell(d.type),
      cell(num(d.attempts), 'num'),
      cell(d.last_error || '', 'error'),
      cell(ago(d.died_at)),
      td
    ]
  }), 'No dead letters.')
}

async function retry (id, button) {
  button.disabled = true
  try {
    await api(`/admin/dead/${encodeURIComponent(id)}/retry`, { method: 'POST' })
    setStatus(`event ${id} is back in the outbox`, 'live')
  } catch (e) {
    failed(e)
  }
  await loadOutbox().catch(failed)
}

async function loadCluster () {
  const view = await api('/admin/cluster')
  const owned = new Map()
  for (const l of view.leases) owned.set(l.owner, (owned.get(l.owner) || 0) + 1)
  $('cluster-note').textContent = overview && !overview.cluster
    ? 'One node on SQLite: rooms hold no leases.'
    : `${view.nodes.length} node(s) on this database; this is ${view.this_node}.`
  const nodes = view.nodes.length || !overview || overview.cluster
    ? view.nodes
    : [{ id: view.this_node, address: location.host, version: overview.version, started_at: overview.started_at, last_seen_at: view.now }]
  fillTable('nodes', nodes.map((n) => {
    const alive = view.now - n.last_seen_at <= view.gone_after_ms
    return [
      cell(n.id + (n.id === view.this_node ? ' (this node)' : '')),
      cell(n.address),
      cell(n.version),
      cell(ago(n.started_at)),
      cell(ago(n.last_seen_at)),
      badge(alive ? 'alive' : 'gone', alive),
      cell(num(owned.get(n.id) || 0), 'num')
    ]
  }), 'No node has written a heartbeat yet.')
  fillTable('leases', view.leases.map((l) => [
    cell(l.doc_name),
    cell(l.owner),
    cell(String(l.epoch), 'num'),
    cell(span(l.expires_at - view.now))
  ]), 'No live leases.')
}

// ---------------------------------------------------------------------------------------------
// Plots

const W = 480
const H = 180
const PAD = { left: 46, right: 8, top: 18, bottom: 20 }
const SVG = 'http://www.w3.org/2000/svg'

function el (name, attrs, text) {
  const e = document.createElementNS(SVG, name)
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v))
  if (text != null) e.textContent = text
  return e
}

function niceMax (v) {
  if (!(v > 0)) return 1
  const p = 10 ** Math.floor(Math.log10(v))
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p
  return 10 * p
}

// Draws `series` ([{ name, values: [number|null] }], one value per sample of `times`) over the
// window ending now. Gaps (null) break the line.
function plot (id, times, series, format) {
  const svg = $(id)
  const end = times.length ? times[times.length - 1] : Date.now()
  // "All kept": from the oldest sample kept (at least a minute), else the chosen window.
  const chosen = $('window').value
  const windowMs = chosen === 'auto'
    ? Math.max(60_000, times.length ? end - times[0] : 0)
    : Number(chosen) * 1000
  const start = end - windowMs
  const first = times.findIndex((t) => t >= start)
  const from = first < 0 ? times.length : first
  const ts = times.slice(from)
  // A loop, not Math.max(...values): a day of samples is too many arguments for one call.
  let top = 0
  for (const s of series) {
    for (let i = from; i < s.values.length; i++) if (s.values[i] > top) top = s.values[i]
  }
  const max = niceMax(top)
  const x = (t) => PAD.left + (W - PAD.left - PAD.right) * (t - start) / windowMs
  const y = (v) => H - PAD.bottom - (H - PAD.top - PAD.bottom) * v / max
  const parts = []
  for (let i = 0; i <= 4; i++) {
    const v = max * i / 4
    parts.push(el('line', { class: 'grid', x1: PAD.left, x2: W - PAD.right, y1: y(v), y2: y(v) }))
    parts.push(el('text', { x: PAD.left - 4, y: y(v) + 3, 'text-anchor': 'end' }, format(v)))
  }
  parts.push(el('text', { x: PAD.left, y: H - 5 }, `−${span(windowMs)}`))
  parts.push(el('text', { x: W - PAD.right, y: H - 5, 'text-anchor': 'end' }, 'now'))
  series.forEach((s, k) => {
    let d = ''
    let pen = false
    s.values.slice(from).forEach((v, i) => {
      if (v == null) { pen = false; return }
      d += `${pen ? 'L' : 'M'}${x(ts[i]).toFixed(1)},${y(v).toFixed(1)}`
      pen = true
    })
    parts.push(el('path', { class: `series s${k}`, d }))
    const last = [...s.values].reverse().find((v) => v != null)
    parts.push(el('text', { class: `legend s${k}`, x: PAD.left + 4 + k * 150, y: 12 },
      `${s.name}: ${last == null ? '–' : format(last)}`))
  })
  svg.replaceChildren(...parts)
  // For tests and scripts: how many samples are drawn, and the first series' newest value.
  svg.dataset.points = String(ts.length)
  const newest = series[0].values[series[0].values.length - 1]
  svg.dataset.last = newest == null ? '' : String(newest)
}

function renderPlots () {
  const t = samples.map((s) => s.t)
  const col = (k) => samples.map((s) => s[k])
  const rate = (v) => v >= 100 ? v.toFixed(0) : v.toFixed(1)
  plot('plot-updates', t, [{ name: 'in', values: col('updates_in') }, { name: 'out', values: col('updates_out') }], rate)
  plot('plot-latency', t, [{ name: 'p50', values: col('commit_p50_ms') }, { name: 'p99', values: col('commit_p99_ms') }], (v) => v >= 10 ? v.toFixed(0) : v.toFixed(2))
  plot('plot-connections', t, [{ name: 'connections', values: col('connections') }, { name: 'rooms', values: col('rooms') }], (v) => v.toFixed(0))
  plot('plot-memory', t, [{ name: 'resident', values: col('memory_bytes') }], bytes)
  $('plots-note').textContent = `${samples.length} samples, one every ${span(everyMs)}`
}

$('window').addEventListener('change', renderPlots)

// ---------------------------------------------------------------------------------------------
// The stream: server-sent events read with fetch, so the credential goes in a header.

async function openStream () {
  while (credential) {
    const abort = new AbortController()
    streamAbort = abort
    try {
      const res = await fetch('/api/v1/admin/stream', {
        headers: { Authorization: `Bearer ${credential}`, Accept: 'text/event-stream' },
        cache: 'no-store',
        signal: abort.signal
      })
      if (res.status === 401 || res.status === 403) {
        let detail = String(res.status)
        try { detail = (await res.json()).detail || detail } catch {}
        signOut(`Signed out: ${detail}`)
        return
      }
      if (!res.ok || !res.body) throw new Error(`${res.status}`)
      setStatus('live', 'live')
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader()
      let buffer = ''
      for (;;) {
        const { value, done } = await reader.read()
        if (done) break
        buffer += value
        let cut
        while ((cut = buffer.indexOf('\n\n')) >= 0) {
          handleEvent(buffer.slice(0, cut))
          buffer = buffer.slice(cut + 2)
        }
      }
    } catch (e) {
      if (abort.signal.aborted) return
    }
    if (!credential) return
    setStatus('disconnected; reconnecting', 'down')
    // A stream that ends without an error may mean the token expired: the next request says.
    await loadOverview().catch(failed)
    await new Promise((resolve) => setTimeout(resolve, 2000))
  }
}

function handleEvent (text) {
  let name = 'message'
  let data = ''
  for (const line of text.split('\n')) {
    if (line.startsWith('event:')) name = line.slice(6).trim()
    else if (line.startsWith('data:')) data += line.slice(5).replace(/^ /, '')
  }
  if (!data) return
  const msg = JSON.parse(data)
  if (name === 'history') {
    everyMs = msg.every_ms
    historyMs = msg.history_ms
    samples = msg.samples
    renderPlots()
    renderRooms(msg.tick)
  } else if (name === 'tick') {
    samples.push(msg.sample)
    const keep = Math.max(1, Math.round(historyMs / everyMs))
    if (samples.length > keep) samples.splice(0, samples.length - keep)
    renderPlots()
    renderRooms(msg)
  }
}

// ---------------------------------------------------------------------------------------------

$('docs-first').addEventListener('click', () => { docsAfter = []; loadDocs().catch(failed) })
$('docs-next').addEventListener('click', () => {
  if (nextAfter == null) return
  docsAfter.push(nextAfter)
  loadDocs().catch(failed)
})
$('prefix').addEventListener('input', () => { docsAfter = []; loadDocs().catch(failed) })

async function start () {
  $('login').hidden = true
  $('dashboard').hidden = false
  $('logout').hidden = false
  try {
    await loadOverview()
    await Promise.all([loadDocs(), loadOutbox(), loadCluster()])
  } catch (e) {
    failed(e)
    if (!credential) return
  }
  const every = (ms, f) => timers.push(setInterval(() => { if (credential) f().catch(failed) }, ms))
  every(5000, loadOverview)
  every(5000, loadOutbox)
  every(5000, loadCluster)
  every(10000, loadDocs)
  openStream()
}

if (credential) start()
else showLogin()
