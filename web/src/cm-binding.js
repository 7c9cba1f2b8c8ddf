// CodeMirror 6 <-> QuireText binding, with remote cursors from the QuireClient awareness.
//
// Data flow:
// - local edits: every CodeMirror transaction that changes the document and is not marked
//   with `quireRemote` is replayed onto the QuireText (text.insert / text.delete).
// - remote edits: `text.observe` gives a Yjs delta for every transaction; non-local ones are
//   turned into one CodeMirror transaction marked with `quireRemote`, so they are not echoed.
// - cursors: the local selection goes into the awareness field `cursor` as Yjs relative
//   positions ({ anchor, head }, the y-codemirror.next format); every other client's cursor is
//   resolved and drawn as a caret widget with a name label plus a selection mark.
//
// QuireText observers run right after the document transaction that caused them (as in
// Yjs). A remote delta is dispatched to the editor from there; decorations are mapped through
// that change and recomputed in a microtask.

import { Annotation, StateEffect, Transaction } from '@codemirror/state'
import { Decoration, EditorView, ViewPlugin, WidgetType } from '@codemirror/view'

/** Marks transactions that carry changes which came from the QuireText (remote edits). */
export const quireRemote = Annotation.define()

/** Asks the plugin to recompute the remote cursor decorations. */
const refreshCursors = StateEffect.define()

const FALLBACK_COLOR = '#30bced'
const COLOR_RE = /^(#[0-9a-fA-F]{3,8}|(rgb|rgba|hsl|hsla)\([0-9.,%\s/a-z-]*\)|[a-zA-Z]{3,20})$/

/** Only accept plain colour values from other clients: they end up in a style attribute. */
function safeColor (value, fallback) {
  return typeof value === 'string' && COLOR_RE.test(value.trim()) ? value.trim() : fallback
}

/** Turns a colour into a translucent one for selections, when the user gave none. */
function lightColor (color) {
  return /^#[0-9a-fA-F]{6}$/.test(color) ? color + '33' : 'rgba(48, 188, 237, 0.2)'
}

function statesAsMap (states) {
  if (states instanceof Map) return states
  const m = new Map()
  if (states && typeof states === 'object') {
    for (const [k, v] of Object.entries(states)) m.set(Number(k), v)
  }
  return m
}

class RemoteCaret extends WidgetType {
  constructor (name, color) {
    super()
    this.name = name
    this.color = color
  }

  eq (other) {
    return other.name === this.name && other.color === this.color
  }

  toDOM () {
    const caret = document.createElement('span')
    caret.className = 'cm-quire-cursor'
    caret.style.borderLeftColor = this.color
    caret.setAttribute('aria-hidden', 'true')
    const label = document.createElement('span')
    label.className = 'cm-quire-cursor-label'
    label.style.backgroundColor = this.color
    label.textContent = this.name
    caret.appendChild(label)
    return caret
  }

  ignoreEvent () {
    return true
  }
}

const cursorTheme = EditorView.baseTheme({
  '.cm-quire-cursor': {
    position: 'relative',
    display: 'inline',
    borderLeft: '2px solid',
    marginLeft: '-1px',
    marginRight: '-1px',
    pointerEvents: 'none'
  },
  '.cm-quire-cursor-label': {
    position: 'absolute',
    left: '-2px',
    bottom: '100%',
    padding: '0 4px',
    borderRadius: '3px 3px 3px 0',
    color: 'white',
    fontSize: '11px',
    lineHeight: '15px',
    fontFamily: 'system-ui, sans-serif',
    fontStyle: 'normal',
    fontWeight: '600',
    whiteSpace: 'nowrap',
    userSelect: 'none',
    zIndex: '10'
  },
  '.cm-quire-selection': {}
})

/**
 * Finds the smallest change that turns `from` into `to` (common prefix and suffix kept),
 * so a full resynchronisation keeps the selection where it can.
 */
function minimalChange (from, to) {
  let start = 0
  const max = Math.min(from.length, to.length)
  while (start < max && from.charCodeAt(start) === to.charCodeAt(start)) start++
  let endFrom = from.length
  let endTo = to.length
  while (endFrom > start && endTo > start && from.charCodeAt(endFrom - 1) === to.charCodeAt(endTo - 1)) {
    endFrom--
    endTo--
  }
  return { from: start, to: endFrom, insert: to.slice(start, endTo) }
}

/**
 * The CodeMirror extension binding an editor to a QuireText.
 *
 * The editor state must be created with `doc: text.toString()`, in the same synchronous block
 * as the view, so no remote delta can fall between reading the text and observing it.
 *
 * @param {import('../pkg/quire_client.js').QuireText} text
 * @param {import('../pkg/quire_client.js').QuireClient} client
 * @param {{ onStats?: (stats: object) => void }} [options]
 */
export function quireCollab (text, client, options = {}) {
  const plugin = ViewPlugin.fromClass(class {
    constructor (view) {
      this.view = view
      this.decorations = Decoration.none
      this.destroyed = false
      this.inObserver = false
      this.refreshPending = false
      this.lastCursorJson = null
      this.stats = { localChanges: 0, remoteDeltas: 0, resyncs: 0 }
      if (options.onStats) options.onStats(this.stats)

      this.observerId = text.observe((delta, local) => this.onRemoteDelta(delta, local))
      this.onAwareness = (change, origin) => {
        if (origin !== 'local') this.scheduleRefresh()
      }
      client.on('awareness', this.onAwareness)
      this.onSynced = (synced) => {
        if (synced) this.scheduleCheck()
      }
      client.on('synced', this.onSynced)

      // The view is being built: decorations and the first check come right after.
      this.scheduleCheck()
      this.scheduleRefresh()
    }

    /** A delta from the QuireText, called after the transaction; local ones are ours. */
    onRemoteDelta (delta, local) {
      if (local || this.destroyed) return
      const changes = []
      let pos = 0
      for (const op of delta) {
        if (op.retain != null) {
          pos += op.retain
        } else if (op.delete != null) {
          changes.push({ from: pos, to: pos + op.delete })
          pos += op.delete
        } else if (op.insert != null) {
          const insert = typeof op.insert === 'string' ? op.insert : ''
          if (insert) changes.push({ from: pos, insert })
        }
      }
      this.stats.remoteDeltas++
      if (changes.length === 0) return
      const docLength = this.view.state.doc.length
      if (changes.some(c => (c.to ?? c.from) > docLength)) {
        // The editor and the text disagree: rebuild from the text once the transaction is over.
        console.warn('quire: remote delta does not fit the editor; resynchronising')
        this.scheduleCheck(true)
        return
      }
      this.inObserver = true
      try {
        this.view.dispatch({ changes, annotations: [quireRemote.of(true), Transaction.addToHistory.of(false)] })
      } catch (e) {
        console.warn('quire: could not apply a remote delta; resynchronising', e)
        this.scheduleCheck(true)
      } finally {
        this.inObserver = false
      }
      this.scheduleRefresh()
    }

    update (update) {
      if (this.destroyed) return
      if (this.inObserver) {
        // Applying a remote delta: keep the decorations in place, recompute them afterwards.
        this.decorations = this.decorations.map(update.changes)
        return
      }
      let localChange = false
      for (const tr of update.transactions) {
        if (!tr.docChanged || tr.annotation(quireRemote)) continue
        localChange = true
        let shift = 0
        try {
          tr.changes.iterChanges((fromA, toA, fromB, toB, inserted) => {
            // fromA/toA are positions in the document before this transaction; the changes
            // before this one have already been applied to the text, which moved it by `shift`.
            const at = fromA + shift
            const deleted = toA - fromA
            if (deleted > 0) text.delete(at, deleted)
            const insert = inserted.toString()
            if (insert.length > 0) text.insert(at, insert)
            shift += insert.length - deleted
          })
        } catch (e) {
          // The text refused the edit (client destroyed?): show the text as it is.
          console.warn('quire: could not apply a local edit; resynchronising', e)
          this.scheduleCheck(true)
        }
        this.stats.localChanges++
      }
      if (localChange || update.selectionSet || update.focusChanged) {
        this.publishCursor(update.view)
      }
      const wantsRefresh = update.transactions.some(tr => tr.effects.some(e => e.is(refreshCursors)))
      if (wantsRefresh || update.docChanged) {
        this.decorations = this.buildDecorations(update.view)
      }
    }

    publishCursor (view) {
      const sel = view.state.selection.main
      let cursor
      try {
        // Y.RelativePosition-shaped objects (every key present): y-codemirror.next reads
        // them back without defaults. assoc 0 sticks to the character after, as it does.
        cursor = { anchor: text.stickyIndex(sel.anchor, 0), head: text.stickyIndex(sel.head, 0) }
      } catch (e) {
        console.warn('quire: could not compute the cursor position', e)
        return
      }
      const json = JSON.stringify(cursor)
      if (json === this.lastCursorJson) return
      this.lastCursorJson = json
      client.setLocalStateField('cursor', cursor)
    }

    buildDecorations (view) {
      const ranges = []
      const docLength = view.state.doc.length
      const clamp = (n) => Math.max(0, Math.min(docLength, n))
      let states
      try {
        states = statesAsMap(client.getStates())
      } catch (e) {
        return Decoration.none
      }
      for (const [id, state] of states) {
        if (id === client.clientId || !state || typeof state !== 'object') continue
        const cursor = state.cursor
        if (!cursor || cursor.anchor == null || cursor.head == null) continue
        let anchor, head
        try {
          anchor = text.resolveStickyIndex(cursor.anchor)
          head = text.resolveStickyIndex(cursor.head)
        } catch (e) {
          continue
        }
        if (anchor == null || head == null) continue
        anchor = clamp(anchor)
        head = clamp(head)
        const user = state.user && typeof state.user === 'object' ? state.user : {}
        const color = safeColor(user.color, FALLBACK_COLOR)
        const colorLight = safeColor(user.colorLight, lightColor(color))
        const name = typeof user.name === 'string' && user.name ? user.name : 'Anonymous'
        const from = Math.min(anchor, head)
        const to = Math.max(anchor, head)
        if (from < to) {
          ranges.push(Decoration.mark({
            class: 'cm-quire-selection',
            attributes: { style: `background-color: ${colorLight}` }
          }).range(from, to))
        }
        ranges.push(Decoration.widget({
          widget: new RemoteCaret(name, color),
          // Keep the caret outside the selection it ends.
          side: head > anchor ? -1 : 1
        }).range(head))
      }
      return Decoration.set(ranges, true)
    }

    scheduleRefresh () {
      if (this.refreshPending || this.destroyed) return
      this.refreshPending = true
      queueMicrotask(() => {
        this.refreshPending = false
        if (!this.destroyed) this.view.dispatch({ effects: refreshCursors.of(null) })
      })
    }

    /** Compares the editor with the text outside any transaction; rebuilds it if they differ. */
    scheduleCheck (force = false) {
      if (this.destroyed) return
      queueMicrotask(() => {
        if (this.destroyed) return
        const current = this.view.state.doc.toString()
        const wanted = text.toString()
        if (current === wanted) return
        if (!force) console.warn('quire: editor and document differ; resynchronising')
        this.stats.resyncs++
        this.view.dispatch({
          changes: minimalChange(current, wanted),
          annotations: [quireRemote.of(true), Transaction.addToHistory.of(false)]
        })
        this.scheduleRefresh()
      })
    }

    destroy () {
      this.destroyed = true
      try { text.unobserve(this.observerId) } catch (e) { /* client already destroyed */ }
      try { client.off('awareness', this.onAwareness) } catch (e) { /* idem */ }
      try { client.off('synced', this.onSynced) } catch (e) { /* idem */ }
    }
  }, {
    decorations: v => v.decorations
  })

  return [plugin, cursorTheme]
}
