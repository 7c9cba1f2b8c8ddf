// What the WASM editor page and the stock y-websocket page share: the query parameters, the
// user's name and colour, links between the pages, the document picker and the peer list.

export const params = new URLSearchParams(window.location.search)

/** The document named by `?doc=`, or null for the picker. */
export const docName = params.get('doc') || null

/** Optional access token (`?token=`), passed to the API and the WebSocket. */
export const token = params.get('token') || null

/**
 * Optional token endpoint (`?tokenUrl=`, a path on this site): fetched before every connection
 * for a fresh token (`{"token": "..."}` in the response), so the editor keeps working when
 * tokens expire. An application embedding Quire serves it from its own login session.
 */
export const tokenUrl = (() => {
  const v = params.get('tokenUrl')
  // Same origin only: a token endpoint elsewhere would be sent this site's cookies.
  return v && v.startsWith('/') && !v.startsWith('//') ? v : null
})()

/** Fetches a token from `tokenUrl`. */
export async function fetchToken () {
  const res = await fetch(tokenUrl, { credentials: 'same-origin', cache: 'no-store' })
  if (!res.ok) throw new Error(`token endpoint answered ${res.status}`)
  const body = await res.json()
  if (typeof body.token !== 'string') throw new Error('token endpoint sent no token')
  return body.token
}

/** y-websocket convention: the document's socket is serverUrl + '/' + encoded name. */
export function serverUrl () {
  // `?server=ws://host:port` points the page at another Quire (the page's own by default).
  const other = params.get('server')
  if (other && /^wss?:\/\/[^/?#]+$/.test(other)) return other
  return (window.location.protocol === 'https:' ? 'wss://' : 'ws://') + window.location.host
}

/** Link to `path` (`/` or `/stock.html`) for a document, keeping `token` and `name`. */
export function pageUrl (path, doc) {
  const q = new URLSearchParams()
  if (doc != null) q.set('doc', doc)
  for (const keep of ['token', 'tokenUrl', 'name']) {
    const v = params.get(keep)
    if (v) q.set(keep, v)
  }
  const s = q.toString()
  return s ? `${path}?${s}` : path
}

// Colour pairs: the caret / label colour and a light one for selections.
const PALETTE = [
  { color: '#d9480f', colorLight: '#d9480f33' },
  { color: '#2b8a3e', colorLight: '#2b8a3e33' },
  { color: '#1971c2', colorLight: '#1971c233' },
  { color: '#9c36b5', colorLight: '#9c36b533' },
  { color: '#c2255c', colorLight: '#c2255c33' },
  { color: '#0c8599', colorLight: '#0c859933' },
  { color: '#e67700', colorLight: '#e6770033' },
  { color: '#5f3dc4', colorLight: '#5f3dc433' }
]

const USER_KEY = 'quire.user'

/** The colour pair of an author name (the same name, the same colour, on every page). */
export function authorColor (name) {
  return PALETTE[hashString(name || '') % PALETTE.length]
}

function hashString (s) {
  let h = 0
  for (let i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) | 0
  return Math.abs(h)
}

function readStoredUser () {
  try {
    const raw = window.localStorage.getItem(USER_KEY)
    if (!raw) return null
    const u = JSON.parse(raw)
    if (u && typeof u.name === 'string' && u.name && typeof u.color === 'string') {
      return { name: u.name, color: u.color, colorLight: u.colorLight || u.color + '33' }
    }
  } catch (e) { /* storage unavailable or corrupt */ }
  return null
}

/**
 * The local user: `?name=` wins (its colour is derived from the name, so it is stable), then
 * what this browser stored, then a random "User 1234" with a random palette colour (stored).
 */
export function loadUser () {
  const fromUrl = params.get('name')
  if (fromUrl) {
    const pick = PALETTE[hashString(fromUrl) % PALETTE.length]
    return { name: fromUrl, ...pick }
  }
  const stored = readStoredUser()
  if (stored) return stored
  const pick = PALETTE[Math.floor(Math.random() * PALETTE.length)]
  const user = { name: `User ${1000 + Math.floor(Math.random() * 9000)}`, ...pick }
  saveUser(user)
  return user
}

export function saveUser (user) {
  try {
    window.localStorage.setItem(USER_KEY, JSON.stringify(user))
  } catch (e) { /* storage unavailable */ }
}

/** Wires the name field: edits go to `onChange(user)` and, unless `?name=` set it, storage. */
export function bindNameField (input, user, onChange) {
  input.value = user.name
  input.addEventListener('input', () => {
    const name = input.value.trim()
    if (!name) return
    user.name = name
    if (!params.get('name')) saveUser(user)
    onChange(user)
  })
}

/** Renders the people present: `states` is a Map clientId -> awareness state. */
export function renderPeers (list, states, selfId) {
  const entries = []
  for (const [id, state] of states) {
    if (!state || typeof state !== 'object' || !state.user) continue
    const name = typeof state.user.name === 'string' && state.user.name ? state.user.name : 'Anonymous'
    const color = typeof state.user.color === 'string' ? state.user.color : '#888'
    entries.push({ id, name, color, self: id === selfId })
  }
  entries.sort((a, b) => (b.self - a.self) || a.name.localeCompare(b.name) || a.id - b.id)
  list.replaceChildren(...entries.map(e => {
    const li = document.createElement('li')
    li.dataset.clientId = String(e.id)
    const dot = document.createElement('span')
    dot.className = 'peer-dot'
    dot.style.backgroundColor = /^#[0-9a-fA-F]{3,8}$/.test(e.color) ? e.color : '#888'
    const label = document.createElement('span')
    label.className = 'peer-name'
    label.textContent = e.self ? `${e.name} (you)` : e.name
    li.append(dot, label)
    return li
  }))
}

// Set when the connection was lost, until it is back: a reconnection attempt ('connecting')
// after a loss still counts as offline for the banner and the saved indicator.
let lostConnection = false

/** True while offline, including reconnection attempts after the connection was lost. */
export function isOffline (status) {
  return status === 'offline' || (status === 'connecting' && lostConnection)
}

/** Sets the connection indicator (text and data-status are the status itself) and the banner. */
export function renderStatus (status) {
  if (status === 'offline') lostConnection = true
  else if (status === 'connected' || status === 'closed') lostConnection = false
  const el = document.getElementById('status')
  el.textContent = status
  el.dataset.status = status
  const banner = document.getElementById('offline-banner')
  if (banner) banner.hidden = !isOffline(status)
}

/**
 * The document picker (no `?doc=`): the documents the API lists, when it answers, and a name
 * field that opens any document. `editorPath` is the page the picker leads to.
 */
export async function showPicker (editorPath) {
  document.body.classList.add('picking')
  for (const el of document.querySelectorAll('[data-editor-only]')) el.hidden = true
  const picker = document.getElementById('picker')
  picker.hidden = false

  const form = document.getElementById('open-form')
  const input = document.getElementById('open-name')
  form.addEventListener('submit', (e) => {
    e.preventDefault()
    const name = input.value.trim()
    if (name) window.location.href = pageUrl(editorPath, name)
  })
  input.focus()

  const list = document.getElementById('doc-list')
  const note = document.getElementById('doc-list-note')
  try {
    const headers = { Accept: 'application/json' }
    if (token) headers.Authorization = `Bearer ${token}`
    const res = await fetch('/api/v1/docs?limit=100', { headers })
    if (!res.ok) throw new Error(`HTTP ${res.status}`)
    const body = await res.json()
    const items = Array.isArray(body.items) ? body.items : []
    if (items.length === 0) {
      note.textContent = 'No documents yet: type a name to create one.'
    } else {
      note.textContent = body.next_cursor ? `The first ${items.length} documents:` : 'Documents:'
    }
    list.replaceChildren(...items.filter(it => typeof it.name === 'string').map(it => {
      const li = document.createElement('li')
      const a = document.createElement('a')
      a.href = pageUrl(editorPath, it.name)
      a.textContent = it.name
      li.append(a)
      if (it.title && it.title !== it.name) {
        const t = document.createElement('span')
        t.className = 'doc-title'
        t.textContent = ` ${it.title}`
        li.append(t)
      }
      return li
    }))
    list.hidden = items.length === 0
  } catch (e) {
    // Listing needs a token when auth is on; opening by name still works.
    list.hidden = true
    note.textContent = 'Type the name of a document to open or create it.'
  }
}
