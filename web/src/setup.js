// The editor extensions both pages share: a plain-text CodeMirror 6 setup built from
// @codemirror/view and @codemirror/commands only (no language packages: small bundles).

import { EditorState } from '@codemirror/state'
import {
  EditorView, crosshairCursor, drawSelection, dropCursor, highlightActiveLine,
  highlightActiveLineGutter, highlightSpecialChars, keymap, lineNumbers, rectangularSelection
} from '@codemirror/view'
import { defaultKeymap, indentWithTab } from '@codemirror/commands'

/** Everything but undo history (each page brings its own: CodeMirror's or Y.UndoManager's). */
export function editorBasics (label) {
  return [
    lineNumbers(),
    highlightActiveLineGutter(),
    highlightSpecialChars(),
    drawSelection(),
    dropCursor(),
    EditorState.allowMultipleSelections.of(true),
    rectangularSelection(),
    crosshairCursor(),
    highlightActiveLine(),
    EditorView.lineWrapping,
    EditorView.contentAttributes.of({ 'aria-label': label }),
    keymap.of([...defaultKeymap, indentWithTab])
  ]
}
