// Tracked changes in CodeMirror 6: a branch's text shown against its parent (issue 35).
//
// The editor always holds the branch's own text. Over it, from the `view` of
// `GET /api/v1/docs/{branch}/changes` (runs of kept, inserted and deleted text):
// - inserted runs of open changes are marked in their author's colour,
// - deleted runs are shown struck through, in the author's colour, as widgets at their place
//   (not editable text: they are not in the branch's document),
// - runs of merged changes are left unmarked, runs of rejected changes are greyed.
//
// The runs are only applied when the kept + inserted runs equal the editor's text exactly, so
// every position is right; between two fetches the decorations are mapped through the edits.

import { StateEffect, StateField } from '@codemirror/state'
import { Decoration, EditorView, WidgetType } from '@codemirror/view'

/** Replaces the suggestion decorations (a DecorationSet, or Decoration.none). */
export const setSuggestions = StateEffect.define()

class DeletedRun extends WidgetType {
  constructor (text, author, change, state, color) {
    super()
    this.text = text
    this.author = author
    this.change = change
    this.state = state
    this.color = color
  }

  eq (other) {
    return other.text === this.text && other.author === this.author &&
      other.change === this.change && other.state === this.state && other.color === this.color
  }

  toDOM () {
    const el = document.createElement('del')
    el.className = `cm-quire-suggest-del cm-quire-suggest-${this.state}`
    el.dataset.author = this.author
    if (this.change != null) el.dataset.change = String(this.change)
    el.dataset.state = this.state
    // Line breaks the branch removed are shown as a mark, so the widget stays on one line.
    el.textContent = this.text.replace(/\r?\n/g, '↵')
    if (this.state === 'open') {
      el.style.color = this.color.color
      el.style.textDecorationColor = this.color.color
    }
    el.title = `${this.author || 'unknown'} deleted this (${this.state})`
    el.setAttribute('aria-label', `deleted by ${this.author || 'unknown'}: ${this.text}`)
    return el
  }

  ignoreEvent () {
    return false
  }
}

export const suggestionTheme = EditorView.baseTheme({
  '.cm-quire-suggest-ins': { borderBottom: '2px solid' },
  '.cm-quire-suggest-del': { textDecoration: 'line-through', textDecorationThickness: '2px', opacity: '0.85' },
  '.cm-quire-suggest-ins.cm-quire-suggest-rejected': {
    color: '#8c959f',
    backgroundColor: '#eaeef2',
    borderBottomColor: '#afb8c1'
  },
  '.cm-quire-suggest-del.cm-quire-suggest-rejected': { color: '#afb8c1', textDecorationColor: '#afb8c1' }
})

/** The field holding the suggestion decorations, mapped through every edit. */
export const suggestionField = StateField.define({
  create () {
    return Decoration.none
  },
  update (decos, tr) {
    for (const e of tr.effects) if (e.is(setSuggestions)) return e.value
    return tr.docChanged ? decos.map(tr.changes) : decos
  },
  provide: (f) => EditorView.decorations.from(f)
})

/** The extension to add to the editor: the field and its styles. */
export function suggestionDecorations () {
  return [suggestionField, suggestionTheme]
}

/** The text the runs give the branch: its kept and inserted runs, in order. */
export function runsText (runs) {
  let s = ''
  for (const r of runs) if (r.kind !== 'deleted') s += r.text
  return s
}

/**
 * Decorations for `runs` (the `view` of one text root). `stateOf(changeId)` gives a change's
 * state ('open', 'merged', 'rejected'); `colorOf(author)` its author's `{color, colorLight}`.
 * Returns a DecorationSet over a document whose text is `runsText(runs)`.
 */
export function buildSuggestionDecorations (runs, stateOf, colorOf) {
  const ranges = []
  let pos = 0
  for (const run of runs) {
    const len = run.text.length
    if (run.kind === 'kept') {
      pos += len
      continue
    }
    const state = run.change == null ? 'open' : (stateOf(run.change) || 'open')
    const author = run.author || ''
    const color = colorOf(author)
    if (run.kind === 'inserted') {
      if (state !== 'merged' && len > 0) {
        const attributes = {
          'data-author': author,
          'data-state': state,
          title: `${author || 'unknown'} inserted this (${state})`
        }
        if (run.change != null) attributes['data-change'] = String(run.change)
        if (state === 'open') {
          attributes.style = `background-color: ${color.colorLight}; border-bottom-color: ${color.color}`
        }
        ranges.push(Decoration.mark({
          class: `cm-quire-suggest-ins cm-quire-suggest-${state}`,
          attributes,
          inclusive: false
        }).range(pos, pos + len))
      }
      pos += len
    } else if (run.kind === 'deleted') {
      if (state !== 'merged' && len > 0) {
        // side -1: the deleted text stays before whatever is typed at this place.
        ranges.push(Decoration.widget({
          widget: new DeletedRun(run.text, author, run.change, state, color),
          side: -1
        }).range(pos))
      }
    }
  }
  return Decoration.set(ranges, true)
}
