// The editor page on Quire's own WASM client: CodeMirror 6 bound to a QuireText, remote
// cursors, connection / saved indicators and the people present.

import init, { QuireClient } from '../pkg/quire_client.js'
import { EditorState } from '@codemirror/state'
import { EditorView, keymap } from '@codemirror/view'
import { history, historyKeymap } from '@codemirror/commands'
import { quireCollab } from './cm-binding.js'
import { editorBasics } from './setup.js'
import { historyPanel } from './history-panel.js'
import { suggestionDecorations } from './cm-suggestions.js'
import { suggestionsPanel } from './suggestions.js'
import {
  params, docName, token, tokenUrl, fetchToken, serverUrl, pageUrl, loadUser, bindNameField, renderPeers, renderStatus, isOffline, showPicker
} from './common.js'

function renderSaved (client) {
  const el = document.getElementById('saved')
  const unsaved = client.unsaved
  const saved = unsaved === 0 && client.synced
  let label
  if (saved) {
    label = 'All changes saved'
  } else if (client.status === 'closed' || isOffline(client.status)) {
    label = `Not saved (offline, ${unsaved} unsaved)`
  } else {
    label = `Saving… (${unsaved} unsaved)`
  }
  el.textContent = label
  el.dataset.saved = String(saved)
}

/** Largest document kept in localStorage while unsaved (its quota is a few MB). */
const KEEP_LIMIT = 2 << 20

/**
 * Keeps the document in localStorage while it has unsaved changes, so closing or reloading
 * the tab while offline loses nothing: on the next load the kept state is applied as a local
 * change (the client sends whatever the server lacks). Removed once everything is saved.
 */
function unsavedKeeper (client, key) {
  try {
    const kept = window.localStorage.getItem(key)
    if (kept) client.applyUpdate(Uint8Array.from(atob(kept), (c) => c.charCodeAt(0)))
  } catch (e) {
    console.warn('quire: could not restore unsaved work', e)
  }
  const store = () => {
    try {
      if (client.unsaved === 0) {
        window.localStorage.removeItem(key)
        return
      }
      const bytes = client.encodeStateAsUpdate()
      if (bytes.length > KEEP_LIMIT) return
      let binary = ''
      for (let i = 0; i < bytes.length; i += 0x8000) {
        binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000))
      }
      window.localStorage.setItem(key, btoa(binary))
    } catch (e) {
      console.warn('quire: could not keep unsaved work', e)
    }
  }
  client.on('saved', store)
  return { store }
}

function showFatal (message) {
  const el = document.getElementById('fatal')
  el.textContent = message
  el.hidden = false
}

async function openEditor (name) {
  document.title = `${name} · Quire`
  document.getElementById('doc-name').textContent = name
  const other = document.getElementById('other-page')
  other.href = pageUrl('/stock.html', name)
  renderStatus('connecting')

  await init({ module_or_path: '/assets/quire_client_bg.wasm' })

  const options = token ? { token } : {}
  // With a token endpoint, every (re)connection asks it for a fresh token first.
  if (tokenUrl) options.tokenProvider = fetchToken
  // Reconnection backoff can be tuned from the URL (tests use a short one).
  for (const key of ['minBackoffMs', 'maxBackoffMs']) {
    const v = Number.parseInt(params.get(key) ?? '', 10)
    if (Number.isFinite(v) && v > 0) options[key] = v
  }
  const client = new QuireClient(serverUrl(), name, options)
  const text = client.getText('content')
  // Work not yet saved when the tab closed comes back (and is sent) before the editor opens.
  const keeper = unsavedKeeper(client, `quire:unsaved:${serverUrl()}/${name}`)
  const user = loadUser()
  client.setLocalState({ user: { ...user }, cursor: null })

  let stats = null
  // Created from the text in the same synchronous block as the binding's observer, so every
  // later remote delta applies to exactly this content.
  const view = new EditorView({
    state: EditorState.create({
      doc: text.toString(),
      extensions: [
        // Local undo history: undoing replays inverse changes through the binding.
        history(),
        keymap.of(historyKeymap),
        editorBasics(`Document ${name}`),
        quireCollab(text, client, { onStats: (s) => { stats = s } }),
        // Tracked changes when the document is a branch (src/suggestions.js).
        suggestionDecorations()
      ]
    }),
    parent: document.getElementById('editor')
  })

  const peers = document.getElementById('peers')
  const refreshPeers = () => {
    try {
      renderPeers(peers, client.getStates(), client.clientId)
    } catch (e) { /* client destroyed */ }
  }

  const onStatus = (status) => {
    renderStatus(status)
    renderSaved(client)
  }
  client.on('status', onStatus)
  client.on('synced', () => renderSaved(client))
  client.on('saved', () => renderSaved(client))
  client.on('awareness', refreshPeers)
  client.on('closed', (info) => {
    renderStatus('closed')
    renderSaved(client)
    const reason = info && info.reason ? `: ${info.reason}` : ''
    showFatal(`The server closed this document (code ${info ? info.code : '?'}${reason}). Reload to try again.`)
  })
  client.on('denied', (reason) => {
    showFatal(`This document is read-only for you (${reason}): your changes stay in this tab and are not saved.`)
  })
  onStatus(client.status)
  refreshPeers()

  bindNameField(document.getElementById('user-name'), user, (u) => {
    client.setLocalStateField('user', { name: u.name, color: u.color, colorLight: u.colorLight })
    refreshPeers()
  })

  window.addEventListener('beforeunload', (e) => {
    keeper.store()
    if (client.unsaved > 0) e.preventDefault()
  })

  const historyView = historyPanel(name, client)
  const suggestionsView = suggestionsPanel(name, client, text, view)

  window.quire = {
    client,
    text,
    view,
    history: historyView,
    suggestions: suggestionsView,
    get stats () { return stats }
  }
  view.focus()
}

async function main () {
  if (!docName) {
    await showPicker('/')
    return
  }
  document.getElementById('picker').hidden = true
  try {
    await openEditor(docName)
  } catch (e) {
    console.error(e)
    renderStatus('closed')
    showFatal(`Could not start the editor: ${e && e.message ? e.message : e}`)
  }
}

main()
