// The history panel of the editor page (docs/history.md): the timeline of editing sessions and
// versions with their authors' colours, "Save version", a read-only preview of a version with
// the changes since it highlighted by author, and "Restore". Everything goes through the REST
// API (`/api/v1/docs/NAME/...`); a restore reaches this tab like any remote change.

import { authorColor, token, tokenUrl, fetchToken } from './common.js'

function api (name, path) {
  return `/api/v1/docs/${encodeURIComponent(name)}${path}`
}

async function call (name, path, init = {}) {
  const headers = { ...(init.headers || {}) }
  // The page's credential: its token, or a fresh one from its token endpoint.
  const credential = tokenUrl ? await fetchToken() : token
  if (credential) headers.authorization = `Bearer ${credential}`
  if (init.body) headers['content-type'] = 'application/json'
  const res = await fetch(api(name, path), { ...init, headers, cache: 'no-store' })
  const body = await res.json().catch(() => null)
  if (!res.ok) throw new Error(body && body.detail ? body.detail : `the server answered ${res.status}`)
  return body
}

function time (ms) {
  return new Date(ms).toLocaleString()
}

function authorChip (name) {
  const el = document.createElement('span')
  el.className = 'author'
  el.textContent = name || 'unknown'
  el.style.background = authorColor(name || '').color
  return el
}

/** Runs of the diff as text with each changed run in its author's colour. */
function renderDiff (pre, texts) {
  pre.replaceChildren()
  for (const t of texts) {
    for (const run of t.runs) {
      if (run.kind === 'kept') {
        pre.append(document.createTextNode(run.text))
        continue
      }
      const el = document.createElement(run.kind === 'inserted' ? 'ins' : 'del')
      el.textContent = run.text
      el.dataset.author = run.author || ''
      const c = authorColor(run.author || '')
      el.style.background = c.colorLight
      el.style.borderBottom = `2px solid ${c.color}`
      el.title = `${run.kind} · ${run.author || 'unknown'}`
      pre.append(el)
    }
  }
}

export function historyPanel (name, client) {
  const timeline = document.getElementById('timeline')
  const note = document.getElementById('history-note')
  const preview = document.getElementById('preview')
  const form = document.getElementById('save-version')
  const label = document.getElementById('version-label')
  let previewed = null

  const say = (text) => { note.textContent = text }

  async function refresh () {
    let sessions, versions
    try {
      [sessions, versions] = await Promise.all([call(name, '/history?limit=20'), call(name, '/versions')])
    } catch (e) {
      say(`History unavailable: ${e.message}`)
      return
    }
    const items = [
      ...sessions.items.map((s) => ({ at: s.last_at, session: s })),
      ...versions.map((v) => ({ at: v.created_at, version: v }))
    ].sort((a, b) => b.at - a.at)
    timeline.replaceChildren()
    for (const item of items) {
      const li = document.createElement('li')
      const when = document.createElement('span')
      when.className = 'when'
      if (item.session) {
        const s = item.session
        li.className = 'session'
        when.textContent = `${time(s.first_at)} – ${new Date(s.last_at).toLocaleTimeString()}`
        li.append(when)
        for (const a of s.authors) {
          const chip = authorChip(a.author)
          chip.title = `${a.updates} updates, +${a.inserted} −${a.deleted}`
          li.append(chip)
        }
        li.append(document.createTextNode(` +${s.inserted} −${s.deleted}`))
      } else {
        const v = item.version
        li.className = 'version'
        li.dataset.versionId = String(v.id)
        li.dataset.kind = v.kind
        when.textContent = time(v.created_at)
        const title = document.createElement('span')
        title.className = 'label'
        title.textContent = v.label || (v.kind === 'auto' ? 'Session saved' : v.kind)
        const open = document.createElement('button')
        open.type = 'button'
        open.className = 'open-version'
        open.textContent = 'Preview'
        open.addEventListener('click', () => show(v))
        li.append(when, title, document.createTextNode(' '), authorChip(v.author), open)
      }
      timeline.append(li)
    }
    if (items.length === 0) say('No history yet.')
    else if (note.textContent.startsWith('History unavailable') || note.textContent === 'No history yet.') say('')
  }

  async function show (v) {
    previewed = v
    document.getElementById('preview-title').textContent = `${v.label || v.kind} · ${time(v.created_at)}`
    preview.hidden = false
    try {
      const [content, diff] = await Promise.all([
        call(name, `/versions/${v.id}/json`),
        call(name, `/diff?from=${v.id}`)
      ])
      // Another version was opened meanwhile: its answers win.
      if (previewed !== v) return
      document.getElementById('preview-text').textContent = content.content ?? JSON.stringify(content, null, 2)
      renderDiff(document.getElementById('preview-diff'), diff.texts)
      preview.dataset.loaded = String(v.id)
    } catch (e) {
      say(`Could not load the version: ${e.message}`)
    }
  }

  form.addEventListener('submit', async (e) => {
    e.preventDefault()
    const text = label.value.trim()
    if (!text) return
    try {
      const v = await call(name, '/versions', {
        method: 'POST',
        headers: { 'idempotency-key': `save-${Date.now()}-${Math.random()}` },
        body: JSON.stringify({ label: text })
      })
      label.value = ''
      say(`Saved version "${v.label}".`)
      await refresh()
    } catch (err) {
      say(`Could not save the version: ${err.message}`)
    }
  })

  document.getElementById('close-preview').addEventListener('click', () => {
    preview.hidden = true
    previewed = null
  })

  document.getElementById('restore-version').addEventListener('click', async () => {
    if (!previewed) return
    try {
      const r = await call(name, `/versions/${previewed.id}/restore`, {
        method: 'POST',
        headers: { 'idempotency-key': `restore-${Date.now()}-${Math.random()}` },
        body: '{}'
      })
      say(`Restored "${previewed.label || previewed.kind}" (now version ${r.version.id}).`)
      preview.hidden = true
      previewed = null
      await refresh()
    } catch (err) {
      say(`Could not restore: ${err.message}`)
    }
  })

  // Keeps the timeline current while this tab edits (at most every second).
  let pending = null
  client.on('saved', () => {
    if (pending) return
    pending = setTimeout(() => { pending = null; refresh() }, 1000)
  })
  // Once connected (the document exists then, if this tab created it).
  client.on('synced', () => refresh())
  // And for others' edits, every few seconds.
  setInterval(refresh, 10000)
  refresh()
  return { refresh, show }
}
