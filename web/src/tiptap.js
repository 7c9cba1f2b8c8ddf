// A rich-text editor on Tiptap's collaboration stack, unchanged: @tiptap/core with the
// Collaboration and CollaborationCaret extensions over @hocuspocus/provider, pointed at
// Quire's Hocuspocus endpoint (/hocuspocus). Only the URL differs from a Hocuspocus setup.
//
// Tiptap keeps its content in the Yjs XML fragment `default`, not in the `content` text the
// two other pages edit: the same document name opened here and there shows two fields of one
// Yjs document.

import * as Y from 'yjs'
import { Editor } from '@tiptap/core'
import StarterKit from '@tiptap/starter-kit'
import Collaboration from '@tiptap/extension-collaboration'
import CollaborationCaret from '@tiptap/extension-collaboration-caret'
import { HocuspocusProvider } from '@hocuspocus/provider'
import {
  docName, token, tokenUrl, fetchToken, serverUrl, pageUrl, loadUser, bindNameField, renderPeers,
  renderStatus, showPicker
} from './common.js'

function openEditor (name) {
  document.title = `${name} · Quire (Tiptap)`
  document.getElementById('doc-name').textContent = name
  document.getElementById('other-page').href = pageUrl('/', name)
  renderStatus('connecting')

  const ydoc = new Y.Doc()
  const provider = new HocuspocusProvider({
    url: `${serverUrl()}/hocuspocus`,
    name,
    document: ydoc,
    // A fresh token for every (re)connection when the page has a token endpoint.
    token: tokenUrl ? fetchToken : (token ?? '')
  })
  const user = loadUser()

  const editor = new Editor({
    element: document.getElementById('editor'),
    extensions: [
      // The collaboration extension brings its own undo (this user's changes only).
      StarterKit.configure({ undoRedo: false }),
      Collaboration.configure({ document: ydoc }),
      CollaborationCaret.configure({ provider, user: { name: user.name, color: user.color } })
    ],
    editorProps: { attributes: { class: 'tiptap-content', 'aria-label': `Document ${name}` } }
  })

  provider.on('status', ({ status }) => {
    renderStatus(status === 'disconnected' ? 'offline' : status)
  })
  // Saved means committed to Quire's log: Quire sends the provider's SyncStatus only then.
  const saved = document.getElementById('saved')
  const renderSaved = () => {
    const done = provider.isSynced && !provider.hasUnsyncedChanges
    saved.textContent = done ? 'All changes saved' : 'Saving…'
    saved.dataset.saved = String(done)
  }
  renderSaved()
  provider.on('synced', renderSaved)
  provider.on('unsyncedChanges', renderSaved)
  provider.on('close', renderSaved)
  provider.on('authenticationFailed', ({ reason }) => {
    const fatal = document.getElementById('fatal')
    fatal.textContent = `Quire refused this document: ${reason}`
    fatal.hidden = false
  })

  const peers = document.getElementById('peers')
  const refreshPeers = () => renderPeers(peers, provider.awareness.getStates(), ydoc.clientID)
  provider.awareness.on('change', refreshPeers)
  refreshPeers()

  bindNameField(document.getElementById('user-name'), user, (u) => {
    editor.commands.updateUser({ name: u.name, color: u.color })
  })

  window.quire = { doc: ydoc, provider, editor }
  editor.commands.focus('end')
}

async function main () {
  if (!docName) {
    await showPicker('/tiptap.html')
    return
  }
  document.getElementById('picker').hidden = true
  openEditor(docName)
}

main()
