// The same editor on the stock npm clients: yjs + y-websocket + y-codemirror.next, to show
// (and test) that Quire serves unmodified y-websocket providers next to its own WASM client.

import * as Y from 'yjs'
import { WebsocketProvider } from 'y-websocket'
import { yCollab, yUndoManagerKeymap } from 'y-codemirror.next'
import { EditorState } from '@codemirror/state'
import { EditorView, keymap } from '@codemirror/view'
import {
  docName, token, serverUrl, pageUrl, loadUser, bindNameField, renderPeers, renderStatus, showPicker
} from './common.js'
import { editorBasics } from './setup.js'

// y-codemirror.next shows the name label only on hover; show it always, like the WASM page.
const alwaysShowNames = EditorView.theme({
  '.cm-ySelectionInfo': { opacity: 1, fontFamily: 'system-ui, sans-serif' }
})

function openEditor (name) {
  document.title = `${name} · Quire (stock client)`
  document.getElementById('doc-name').textContent = name
  document.getElementById('other-page').href = pageUrl('/', name)
  renderStatus('connecting')

  const ydoc = new Y.Doc()
  const text = ydoc.getText('content')
  // The room is the encoded name, so the socket path is '/' + encodeURIComponent(name).
  const provider = new WebsocketProvider(serverUrl(), encodeURIComponent(name), ydoc, {
    params: token ? { token } : {},
    // Two stock tabs of one browser would otherwise also sync through a BroadcastChannel,
    // hiding what the server does.
    disableBc: true
  })
  const user = loadUser()
  provider.awareness.setLocalStateField('user', { ...user })

  const undoManager = new Y.UndoManager(text)
  const view = new EditorView({
    state: EditorState.create({
      doc: text.toString(),
      extensions: [
        // Undo / redo through the Y.UndoManager: only this user's own changes.
        keymap.of(yUndoManagerKeymap),
        editorBasics(`Document ${name}`),
        alwaysShowNames,
        yCollab(text, provider.awareness, { undoManager })
      ]
    }),
    parent: document.getElementById('editor')
  })

  provider.on('status', ({ status }) => {
    renderStatus(status === 'disconnected' ? 'offline' : status)
  })
  const synced = document.getElementById('saved')
  const renderSynced = (isSynced) => {
    synced.textContent = isSynced ? 'Synced' : 'Syncing…'
    synced.dataset.saved = String(isSynced)
  }
  renderSynced(false)
  provider.on('sync', renderSynced)

  const peers = document.getElementById('peers')
  const refreshPeers = () => renderPeers(peers, provider.awareness.getStates(), ydoc.clientID)
  provider.awareness.on('change', refreshPeers)
  refreshPeers()

  bindNameField(document.getElementById('user-name'), user, (u) => {
    provider.awareness.setLocalStateField('user', { name: u.name, color: u.color, colorLight: u.colorLight })
  })

  window.quire = { doc: ydoc, provider, view, text }
  view.focus()
}

async function main () {
  if (!docName) {
    await showPicker('/stock.html')
    return
  }
  document.getElementById('picker').hidden = true
  openEditor(docName)
}

main()
