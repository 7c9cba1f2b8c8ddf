// The suggestion view of the editor page (issue 35, docs/branches.md "In the web editor").
//
// On a branch (`GET /api/v1/docs/NAME/branch` answers 200) the page shows a "Suggestions"
// panel: the branch's changes over its parent, from `GET /changes`, as tracked changes in the
// editor (src/cm-suggestions.js) and as a list with Accept / Reject per change and Accept all
// (`POST /merge`, `POST /changes/{id}/reject`), and a link back to the parent. The list is
// fetched again (debounced) whenever the text changes here or remotely, when the panel is
// opened, after every action and every few seconds (another reviewer's decision changes no
// text). On a document that is not a branch the page offers "Suggest changes": a new branch
// of it (`POST /branches`), opened in this tab.

import { authorColor, token, tokenUrl, fetchToken, pageUrl } from './common.js'
import { buildSuggestionDecorations, runsText, setSuggestions } from './cm-suggestions.js'
import { Decoration } from '@codemirror/view'

/** Waits this long after the last edit before fetching the changes again. */
const DEBOUNCE_MS = 300
/** Fetches again this often while the panel is open (decisions taken in other tabs). */
const POLL_MS = 5000
/** While the fetched text and the editor's differ (edits not yet committed), retry after this,
 *  doubled on every further miss up to POLL_MS. */
const MISMATCH_RETRY_MS = 500

/** An API error with the problem+json answer's status, kind and `current` member. */
class ApiProblem extends Error {
  constructor (status, body) {
    super(body && body.detail ? body.detail : `the server answered ${status}`)
    this.status = status
    this.kind = body && typeof body.type === 'string' ? body.type.split('/').pop() : null
    this.current = body ? body.current : null
  }
}

async function call (name, path, init = {}) {
  const headers = { ...(init.headers || {}) }
  // The page's credential, as the history panel sends it.
  const credential = tokenUrl ? await fetchToken() : token
  if (credential) headers.authorization = `Bearer ${credential}`
  if (init.body) headers['content-type'] = 'application/json'
  // Reads revalidate with the ETag the server sent (`no-cache`: a 304 costs the server a few
  // indexed reads instead of the branch's whole review); writes are never cached.
  const cache = init.method && init.method !== 'GET' ? 'no-store' : 'no-cache'
  const res = await fetch(`/api/v1/docs/${encodeURIComponent(name)}${path}`, { ...init, headers, cache })
  const body = await res.json().catch(() => null)
  if (!res.ok) throw new ApiProblem(res.status, body)
  return body
}

function idempotencyKey (what) {
  return `${what}-${Date.now()}-${Math.random().toString(36).slice(2)}`
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

/** A short excerpt of a change: its first inserted and deleted words, as <ins> / <del>. */
function excerpt (change, limit = 60) {
  const box = document.createElement('div')
  box.className = 'excerpt'
  let budget = limit
  const content = (change.texts || []).find((t) => t.root === 'content') || (change.texts || [])[0]
  for (const run of content ? content.runs : []) {
    if (budget <= 0) break
    if (run.kind === 'kept') continue
    const el = document.createElement(run.kind === 'inserted' ? 'ins' : 'del')
    // Line breaks and a run of nothing but spaces stay visible.
    let shown = run.text.replace(/\r?\n/g, '↵')
    if (/^ +$/.test(shown)) shown = shown.replace(/ /g, '␣')
    el.textContent = shown.length > budget ? shown.slice(0, budget) + '…' : shown
    budget -= shown.length
    box.append(el, document.createTextNode(' '))
  }
  for (const other of change.other_roots || []) {
    const el = document.createElement('span')
    el.className = 'other-root'
    el.textContent = `${other.root} (${other.kind}) +${other.inserted} −${other.deleted}`
    box.append(el, document.createTextNode(' '))
  }
  if (!box.childNodes.length) box.textContent = '(no visible change)'
  return box
}

/** A branch name for "Suggest changes": under the document's own name, so a token for
 *  `NAME*` covers both. */
function newBranchName (name) {
  const d = new Date()
  const pad = (n) => String(n).padStart(2, '0')
  const stamp = `${d.getFullYear()}${pad(d.getMonth() + 1)}${pad(d.getDate())}-${pad(d.getHours())}${pad(d.getMinutes())}`
  return `${name}/suggestion-${stamp}-${Math.random().toString(36).slice(2, 6)}`
}

export function suggestionsPanel (name, client, text, view) {
  const panel = document.getElementById('suggestions')
  const history = document.getElementById('history')
  const toggle = document.getElementById('toggle-suggestions')
  const suggestButton = document.getElementById('suggest-changes')
  const parentLink = document.getElementById('parent-link')
  const list = document.getElementById('change-list')
  const note = document.getElementById('suggestions-note')
  const summary = document.getElementById('suggestions-summary')
  const acceptAll = document.getElementById('accept-all')

  const state = {
    /** The Branch when this document is one; null when not (or not known yet). */
    branch: null,
    /** 'unknown', 'branch', 'document' (not a branch), 'unavailable' (no branch API). */
    kind: 'unknown',
    open: false,
    /** The last /changes answer. */
    data: null,
    /** How many fetched answers were applied to the editor (tests wait on it). */
    applied: 0,
    /** True when the last answer did not match the editor's text (waiting for the next). */
    mismatch: false
  }
  let timer = null
  let misses = 0
  let inflight = false
  let again = false

  const say = (message, kind = 'info') => {
    note.replaceChildren()
    note.textContent = message
    note.dataset.kind = kind
  }

  function changeLabel (id) {
    const c = state.data && state.data.changes.find((x) => x.id === id)
    return c ? `#${id} (${c.author || 'unknown'})` : `#${id}`
  }

  // ---- decorations

  function clearDecorations () {
    view.dispatch({ effects: setSuggestions.of(Decoration.none) })
  }

  /** Applies the last answer's runs when they describe exactly the editor's text. */
  function applyDecorations () {
    const data = state.data
    if (!data || !state.open) return
    const root = (data.view || []).find((v) => v.root === 'content')
    const runs = root ? root.runs : []
    if (runsText(runs) !== view.state.doc.toString()) {
      // Edits not yet committed (or not yet here): the next fetch will match.
      state.mismatch = true
      panel.dataset.mismatch = 'true'
      schedule(Math.min(POLL_MS, MISMATCH_RETRY_MS * 2 ** misses))
      misses++
      return
    }
    misses = 0
    state.mismatch = false
    panel.dataset.mismatch = 'false'
    const states = new Map(data.changes.map((c) => [c.id, c.state]))
    const decorations = buildSuggestionDecorations(runs, (id) => states.get(id), (a) => authorColor(a))
    view.dispatch({ effects: setSuggestions.of(decorations) })
    state.applied++
    panel.dataset.applied = String(state.applied)
  }

  // ---- the list

  function render () {
    const data = state.data
    const branch = data.branch || state.branch
    state.branch = branch
    const open = data.changes.filter((c) => c.state === 'open')
    // Only a closed branch refuses decisions (a merged one can still take new suggestions).
    const branchOpen = branch.state !== 'closed'
    // Readers of the parent see the suggestions without the buttons to decide them.
    const canReview = branch.can_review !== false
    summary.textContent = `${open.length} open change${open.length === 1 ? '' : 's'}` +
      (branch.behind ? ` · the parent has ${branch.behind} newer update${branch.behind === 1 ? '' : 's'}` : '') +
      (branch.state === 'open' ? '' : ` · branch ${branch.state}`)
    toggle.textContent = open.length ? `Suggestions (${open.length})` : 'Suggestions'
    acceptAll.disabled = !branchOpen || !canReview || open.length === 0
    acceptAll.hidden = !canReview
    panel.dataset.branchState = branch.state

    const items = [...data.changes].sort((a, b) => (a.first_at - b.first_at) || (a.id - b.id))
    list.replaceChildren(...items.map((c) => {
      const li = document.createElement('li')
      li.className = `change change-${c.state}`
      li.dataset.changeId = String(c.id)
      li.dataset.author = c.author || ''
      li.dataset.state = c.state
      const head = document.createElement('div')
      head.className = 'change-head'
      head.append(authorChip(c.author))
      const size = document.createElement('span')
      size.className = 'size'
      size.textContent = `+${c.inserted} −${c.deleted}`
      size.title = `${c.updates} updates`
      head.append(size)
      if (c.state !== 'open') {
        const s = document.createElement('span')
        s.className = 'state'
        s.textContent = c.decided_by ? `${c.state} by ${c.decided_by}` : c.state
        head.append(s)
      }
      const when = document.createElement('span')
      when.className = 'when'
      when.textContent = c.first_at === c.last_at ? time(c.first_at) : `${time(c.first_at)} – ${new Date(c.last_at).toLocaleTimeString()}`
      li.append(head, when, excerpt(c))
      if (c.depends_on && c.depends_on.length) {
        const dep = document.createElement('span')
        dep.className = 'depends'
        dep.textContent = `needs ${c.depends_on.map(changeLabel).join(', ')}`
        li.append(dep)
      }
      // Its effect on roots that are not texts (a map, an XML fragment): before and after.
      for (const r of c.other_roots || []) {
        if (r.before == null && r.after == null) continue
        const effect = document.createElement('div')
        effect.className = 'effect'
        effect.dataset.root = r.root
        const del = document.createElement('del')
        del.textContent = r.before
        const ins = document.createElement('ins')
        ins.textContent = r.after
        effect.append(`${r.root}: `, del, ' → ', ins)
        li.append(effect)
      }
      if (c.mergeable === false) {
        // An effect the review cannot show: it cannot be accepted.
        const why = document.createElement('span')
        why.className = 'unshown'
        why.textContent = `cannot be accepted: ${c.unshown || 'its effects cannot be shown'}`
        li.append(why)
      }
      if (c.state === 'open' && branchOpen && canReview) {
        const actions = document.createElement('div')
        actions.className = 'change-actions'
        const accept = document.createElement('button')
        accept.type = 'button'
        accept.className = 'accept'
        accept.textContent = 'Accept'
        accept.disabled = c.mergeable === false
        accept.addEventListener('click', () => merge([c.id]))
        const reject = document.createElement('button')
        reject.type = 'button'
        reject.className = 'reject'
        reject.textContent = 'Reject'
        reject.addEventListener('click', () => rejectChange(c.id))
        actions.append(accept, reject)
        li.append(actions)
      }
      return li
    }))
    if (!items.length) {
      const li = document.createElement('li')
      li.className = 'empty'
      li.textContent = 'No changes on this branch yet: edit the text to suggest some.'
      list.append(li)
    }
  }

  // ---- fetching

  function schedule (delay = DEBOUNCE_MS) {
    if (state.kind !== 'branch' || !state.open) return
    clearTimeout(timer)
    timer = setTimeout(refresh, delay)
  }

  async function refresh () {
    if (state.kind !== 'branch' || !state.open) return
    if (inflight) {
      again = true
      return
    }
    inflight = true
    clearTimeout(timer)
    try {
      const data = await call(name, '/changes')
      state.data = data
      render()
      applyDecorations()
      if (note.dataset.kind === 'unavailable') say('')
    } catch (e) {
      say(`Suggestions unavailable: ${e.message}`, 'unavailable')
    } finally {
      inflight = false
      if (again) {
        again = false
        schedule(0)
      }
    }
  }

  // ---- actions

  async function merge (ids) {
    // What the reviewer sees is what merges: each change named with the last position the
    // panel shows; the server refuses (409 change-grew) a change that grew since.
    const listed = (state.data && state.data.changes) || []
    const chosen = ids == null
      ? listed.filter((c) => c.state === 'open' && c.mergeable !== false)
      : listed.filter((c) => ids.includes(c.id))
    const seen = chosen.map((c) => ({ id: c.id, last_seq: c.last_seq }))
    try {
      const r = await call(name, '/merge', {
        method: 'POST',
        headers: { 'idempotency-key': idempotencyKey('merge') },
        body: JSON.stringify({ changes: seen })
      })
      const merged = r.merged || []
      say(merged.length
        ? `Accepted ${merged.map(changeLabel).join(', ')} into ${state.branch.parent}.`
        : 'Nothing left to accept.', 'done')
    } catch (e) {
      if (e.status === 409 && e.kind === 'missing-dependencies' && e.current && Array.isArray(e.current.missing)) {
        showMissing(ids || [], e.current.missing)
      } else if (e.status === 409 && e.kind === 'change-grew') {
        say('The suggestion changed since it was shown; review it again before accepting.', 'error')
        schedule(0)
      } else {
        say(`Could not accept: ${e.message}`, 'error')
      }
    }
    await refresh()
  }

  /** A 409 missing-dependencies answer: what the chosen changes need, and a way to take them. */
  function showMissing (ids, missing) {
    note.replaceChildren()
    note.dataset.kind = 'missing'
    note.dataset.missing = missing.join(',')
    const what = ids.length ? ids.map(changeLabel).join(', ') : 'These changes'
    note.append(document.createTextNode(
      `${what} build${ids.length === 1 ? 's' : ''} on ${missing.map(changeLabel).join(', ')}, which ` +
      `${missing.length === 1 ? 'is' : 'are'} not accepted: accept ${missing.length === 1 ? 'it' : 'them'} too, or reject this one. `))
    const both = document.createElement('button')
    both.type = 'button'
    both.className = 'accept-with-dependencies'
    both.textContent = 'Accept together'
    both.addEventListener('click', () => merge([...missing, ...ids]))
    note.append(both)
  }

  async function rejectChange (id) {
    try {
      await call(name, `/changes/${id}/reject`, { method: 'POST' })
      say(`Rejected ${changeLabel(id)}.`, 'done')
    } catch (e) {
      say(`Could not reject: ${e.message}`, 'error')
    }
    await refresh()
  }

  async function suggest () {
    suggestButton.disabled = true
    try {
      // The branch starts from what the server has: wait (a little) for this tab's edits.
      if (client.unsaved > 0) {
        await new Promise((resolve) => {
          const done = () => { client.off('saved', onSaved); clearTimeout(t); resolve() }
          const onSaved = (n) => { if (n === 0) done() }
          const t = setTimeout(done, 5000)
          client.on('saved', onSaved)
        })
      }
      let branch = null
      for (let attempt = 0; attempt < 3 && !branch; attempt++) {
        try {
          branch = await call(name, '/branches', { method: 'POST', body: JSON.stringify({ name: newBranchName(name) }) })
        } catch (e) {
          if (!(e.status === 409 && e.kind === 'document-exists')) throw e
        }
      }
      if (!branch) throw new Error('no free branch name')
      window.location.href = pageUrl('/', branch.name)
    } catch (e) {
      say(`Could not create a branch: ${e.message}`, 'error')
      // The note lives in the (hidden) panel: show the reason in the header's title too.
      suggestButton.title = `Could not create a branch: ${e.message}`
      suggestButton.disabled = false
    }
  }

  function setOpen (open) {
    if (state.kind !== 'branch') return
    state.open = open
    panel.hidden = !open
    history.hidden = open
    toggle.setAttribute('aria-pressed', String(open))
    if (open) {
      refresh()
    } else {
      clearTimeout(timer)
      clearDecorations()
    }
  }

  // ---- is this document a branch?

  let detecting = null
  function detect () {
    if (!detecting) detecting = detectOnce().finally(() => { detecting = null })
    return detecting
  }

  async function detectOnce () {
    try {
      const branch = await call(name, '/branch')
      state.branch = branch
      state.kind = 'branch'
    } catch (e) {
      if (e.status === 404 && e.kind === 'not-a-branch') state.kind = 'document'
      else if (e.status === 404 && e.kind === 'not-found') state.kind = 'unknown' // not created yet
      else state.kind = 'unavailable' // a server without branches, or no read access
    }
    document.body.dataset.docKind = state.kind
    if (state.kind === 'branch') {
      parentLink.href = pageUrl('/', state.branch.parent)
      parentLink.textContent = `← ${state.branch.parent}`
      parentLink.title = `This document is a branch of ${state.branch.parent}: open the parent`
      parentLink.hidden = false
      toggle.hidden = false
      suggestButton.hidden = true
      setOpen(true)
    } else if (state.kind === 'document') {
      suggestButton.hidden = false
    }
  }

  toggle.addEventListener('click', () => setOpen(!state.open))
  acceptAll.addEventListener('click', () => merge(null))
  suggestButton.addEventListener('click', suggest)

  // Every change of the text, local or remote, asks for a fresh list (debounced).
  text.observe(() => schedule())
  // Committed edits: the server's view now holds them.
  client.on('saved', (unsaved) => {
    if (unsaved !== 0) return
    // A document this tab created exists once its first edit is committed.
    if (state.kind === 'unknown') detect()
    else if (state.mismatch) schedule()
  })
  client.on('synced', (synced) => {
    if (!synced) return
    if (state.kind === 'unknown') detect()
    else schedule()
  })
  setInterval(() => { if (state.open && !inflight) refresh() }, POLL_MS)
  detect()

  return {
    state,
    refresh,
    merge,
    reject: rejectChange,
    setOpen
  }
}
