//! An edit checked whole before anything changes, then made.
//!
//! A room edits its live document, and yrs has no rollback: an operation refused half way
//! through a request would leave the ones before it in. So [`plan`] first checks every
//! operation against the state the operations before it leave, reading the document: a root
//! one operation touches is read where it lies (a text's length is kept by yrs, and a
//! character boundary is found by walking the items before it, as an insert does); a root
//! several touch is copied once, as its visible content, and the later operations are checked
//! on the copy. Every position an operation needs is resolved then, so [`perform`] cannot
//! fail. Reading content (a replace searching a text, a copy, a precondition) is charged to
//! the request's work budget, so a request costs what it reads, never the document's size.

use std::collections::HashMap;

use yrs::branch::FirstVisible;
use yrs::types::TypeRef;
use yrs::XmlTextPrelim;
use yrs::{Array, Map, Out, ReadTxn, Text, TransactionMut, Xml, XmlElementPrelim, XmlFragment};

use super::{
    check_at, check_range, invalid, text_nodes, utf16_len, visible, Change, EditError, Edits, Op,
    Part, Refusal, Replace, Root, MAX_EDIT_INSERT_BYTES,
};
use crate::history::RootKind;

/// A change to one text at UTF-16 offsets.
#[derive(Debug, Clone)]
pub(super) enum TextEdit {
    Remove { at: u32, len: u32 },
    Insert { at: u32, text: String },
}

/// An operation with what it needs resolved against the state it applies to.
pub(super) enum Step {
    /// The operation's text edits (an insert, a delete, or a replace's, last first).
    Text(Vec<TextEdit>),
    /// A replace in an XML fragment: each text node's edits, by its place among the text
    /// nodes the operation names.
    XmlText(Vec<(usize, Vec<TextEdit>)>),
    /// The index an insert goes to (given, or the end).
    At(u32),
    /// Nothing to resolve (a map operation, an array delete).
    Plain,
}

/// A copy of a root several operations of the request touch, as the operations so far leave
/// it (a root without one is read where it lies in the document).
enum Sim {
    /// A text's visible content.
    Text(String),
    /// An XML fragment's text nodes, per top-level node.
    Xml(Vec<Vec<String>>),
}

/// The checking of one request.
struct Planner<'a, T: ReadTxn> {
    txn: &'a T,
    roots: &'a HashMap<String, Root>,
    /// Bytes of content the request may still read.
    work: usize,
    /// Bytes it may still insert (`MAX_EDIT_INSERT_BYTES`).
    insert: usize,
    sims: HashMap<String, Sim>,
    /// Array lengths and fragment lengths as the operations so far leave them.
    lens: HashMap<String, u32>,
    /// Operations not yet checked, per root.
    left: HashMap<String, usize>,
}

/// Checks every operation of `edits` against `txn`'s state; the resolved steps and what each
/// changes (map operations' counts are filled in by [`perform`]).
pub(super) fn plan<T: ReadTxn>(
    txn: &T,
    roots: &HashMap<String, Root>,
    edits: &Edits,
    work: usize,
) -> Result<(Vec<Step>, Vec<Change>, usize), EditError> {
    let mut left: HashMap<String, usize> = HashMap::new();
    for op in &edits.ops {
        *left.entry(op.root().0.to_owned()).or_default() += 1;
    }
    let mut planner = Planner {
        txn,
        roots,
        work,
        insert: MAX_EDIT_INSERT_BYTES,
        sims: HashMap::new(),
        lens: HashMap::new(),
        left,
    };
    let mut steps = Vec::with_capacity(edits.ops.len());
    let mut changes = Vec::with_capacity(edits.ops.len());
    for (i, op) in edits.ops.iter().enumerate() {
        let (step, change) = planner.op(op).map_err(|e| e.at(Part::Op(i)))?;
        steps.push(step);
        changes.push(Change { op: i, ..change });
    }
    Ok((steps, changes, planner.work))
}

/// Why an operation was refused, before it is placed in the request.
pub(super) enum Refused {
    Op(Refusal),
    /// Past the work budget (422).
    Costly(String),
}

impl From<Refusal> for Refused {
    fn from(r: Refusal) -> Refused {
        Refused::Op(r)
    }
}

impl Refused {
    pub(super) fn at(self, at: Part) -> EditError {
        match self {
            Refused::Op(Refusal::Invalid(reason)) => invalid(at, reason),
            Refused::Op(Refusal::Failed(reason)) => super::failed(at, reason),
            Refused::Costly(reason) => EditError::TooCostly { at, reason },
        }
    }
}

/// Charges `bytes` of reading to a budget of `work`.
pub(super) fn charge(work: &mut usize, bytes: usize) -> Result<(), Refused> {
    *work = work.checked_sub(bytes).ok_or_else(|| {
        Refused::Costly(
            "the edit reads more of the document than one request may (edit_work_bytes): \
             split it, or name a smaller part (an XML \"element\")"
                .into(),
        )
    })?;
    Ok(())
}

impl<T: ReadTxn> Planner<'_, T> {
    fn spend(&mut self, bytes: usize) -> Result<(), Refused> {
        self.insert = self.insert.checked_sub(bytes).ok_or_else(|| {
            Refused::Op(Refusal::Invalid(format!(
                "the edit inserts more than {MAX_EDIT_INSERT_BYTES} bytes (MAX_EDIT_INSERT_BYTES)"
            )))
        })?;
        Ok(())
    }

    fn op(&mut self, op: &Op) -> Result<(Step, Change), Refused> {
        let (name, _) = op.root();
        let root = self
            .roots
            .get(name)
            .ok_or_else(|| Refusal::Invalid(format!("root \"{name}\" was not typed")))?;
        let later = {
            let n = self.left.entry(name.to_owned()).or_default();
            *n = n.saturating_sub(1);
            *n > 0
        };
        let mut change = Change::default();
        let step = match (op, root) {
            (
                Op::TextInsert { .. } | Op::TextDelete { .. } | Op::TextReplace { .. },
                Root::Text(t),
            ) => {
                let edits = self.text_op(name, t, op, later, &mut change)?;
                Step::Text(edits)
            }
            (Op::MapSet { size, .. }, Root::Map(_)) => {
                self.spend(*size)?;
                Step::Plain
            }
            (Op::MapDelete { .. }, Root::Map(_)) => Step::Plain,
            (
                Op::ArrayInsert {
                    values, at, size, ..
                },
                Root::Array(a),
            ) => {
                self.spend(*size)?;
                let len = *self
                    .lens
                    .entry(name.to_owned())
                    .or_insert_with(|| a.len(self.txn));
                let at = at.unwrap_or(len);
                if at > len {
                    return Err(Refusal::Invalid(format!(
                        "\"at\" {at} is past the array's end ({len} elements)"
                    ))
                    .into());
                }
                self.lens.insert(name.to_owned(), len + values.len() as u32);
                change.inserted = values.len() as u64;
                Step::At(at)
            }
            (Op::ArrayDelete { len, at, .. }, Root::Array(a)) => {
                let size = *self
                    .lens
                    .entry(name.to_owned())
                    .or_insert_with(|| a.len(self.txn));
                if u64::from(*at) + u64::from(*len) > u64::from(size) {
                    return Err(Refusal::Invalid(format!(
                        "deleting {len} elements at {at} goes past the array's end ({size} elements)"
                    ))
                    .into());
                }
                self.lens.insert(name.to_owned(), size - len);
                change.deleted = u64::from(*len);
                Step::Plain
            }
            (Op::XmlInsert { node, at, .. }, Root::Xml(x)) => {
                self.spend(node.size)?;
                let len = *self
                    .lens
                    .entry(name.to_owned())
                    .or_insert_with(|| x.len(self.txn));
                let at = at.unwrap_or(len);
                if at > len {
                    return Err(Refusal::Invalid(format!(
                        "\"at\" {at} is past the fragment's end ({len} nodes)"
                    ))
                    .into());
                }
                self.lens.insert(name.to_owned(), len + 1);
                if later {
                    self.copy_xml(name, x)?;
                }
                if let Some(Sim::Xml(nodes)) = self.sims.get_mut(name) {
                    let text = node.text.clone().filter(|t| !t.is_empty());
                    let at = (at as usize).min(nodes.len());
                    nodes.insert(at, text.into_iter().collect());
                }
                change.inserted = 1;
                Step::At(at)
            }
            (
                Op::XmlReplace {
                    replace, element, ..
                },
                Root::Xml(x),
            ) => {
                let nodes = self.xml_texts(name, x, *element)?;
                let mut per_node = Vec::new();
                for (i, content) in nodes.iter().enumerate() {
                    if change.replaced > 0 && !replace.all {
                        break;
                    }
                    charge(&mut self.work, content.len())?;
                    let (edits, found) = replace_edits(content, replace);
                    for _ in 0..found.replaced {
                        self.spend(replace.new.len().max(1))?;
                    }
                    change.inserted += found.inserted;
                    change.deleted += found.deleted;
                    change.replaced += found.replaced;
                    if !edits.is_empty() {
                        per_node.push((i, edits));
                    }
                }
                if change.replaced == 0 {
                    let inside = element.map_or(String::new(), |e| format!(" (in node {e})"));
                    return Err(Refusal::Failed(format!(
                        "root \"{name}\" does not contain {:?}{inside}",
                        replace.old
                    ))
                    .into());
                }
                if later {
                    self.copy_xml(name, x)?;
                }
                if let Some(Sim::Xml(tops)) = self.sims.get_mut(name) {
                    apply_xml_edits(tops, *element, &per_node);
                }
                Step::XmlText(per_node)
            }
            _ => return Err(Refusal::Invalid("the root's kind changed".into()).into()),
        };
        Ok((step, change))
    }

    /// A text operation checked and resolved: against the document for a root no earlier
    /// operation changed, else against the copy; the copy is made (or kept up) when a later
    /// operation touches the root.
    fn text_op(
        &mut self,
        name: &str,
        t: &yrs::TextRef,
        op: &Op,
        later: bool,
        change: &mut Change,
    ) -> Result<Vec<TextEdit>, Refused> {
        let copied = matches!(self.sims.get(name), Some(Sim::Text(_)));
        let edits = match op {
            Op::TextInsert { text, at, .. } => {
                self.spend(text.len())?;
                let at = if copied {
                    let content = self.copy_of(name);
                    let at = at.unwrap_or_else(|| utf16_len(content));
                    check_at(content, at, "at")?;
                    at
                } else {
                    let branch: &yrs::branch::Branch = t.as_ref();
                    let len = branch.content_len;
                    let at = at.unwrap_or(len);
                    live_boundary(branch, at, "at")?;
                    at
                };
                change.inserted = u64::from(utf16_len(text));
                vec![TextEdit::Insert {
                    at,
                    text: text.clone(),
                }]
            }
            Op::TextDelete { len, at, .. } => {
                if copied {
                    check_range(self.copy_of(name), *at, *len)?;
                } else {
                    let branch: &yrs::branch::Branch = t.as_ref();
                    let size = branch.content_len;
                    if u64::from(*at) + u64::from(*len) > u64::from(size) {
                        return Err(Refusal::Invalid(format!(
                            "deleting {len} code units at {at} goes past the text's end ({size} UTF-16 code units)"
                        ))
                        .into());
                    }
                    live_boundary(branch, *at, "at")?;
                    live_boundary(branch, at + len, "at + delete")?;
                }
                change.deleted = u64::from(*len);
                vec![TextEdit::Remove { at: *at, len: *len }]
            }
            Op::TextReplace { replace, .. } => {
                let live;
                let content = if copied {
                    self.copy_of(name)
                } else {
                    live = visible(t, self.txn);
                    &live
                };
                let scanned = content.len();
                let (edits, found) = replace_edits(content, replace);
                charge(&mut self.work, scanned)?;
                if found.replaced == 0 {
                    return Err(Refusal::Failed(format!(
                        "root \"{name}\" does not contain {:?}",
                        replace.old
                    ))
                    .into());
                }
                for _ in 0..found.replaced {
                    self.spend(replace.new.len().max(1))?;
                }
                *change = found;
                edits
            }
            _ => return Err(Refusal::Invalid("the root's kind changed".into()).into()),
        };
        if !copied && later {
            let content = visible(t, self.txn);
            charge(&mut self.work, content.len())?;
            self.sims.insert(name.to_owned(), Sim::Text(content));
        }
        if let Some(Sim::Text(content)) = self.sims.get_mut(name) {
            charge(&mut self.work, content.len())?;
            apply_text_edits(content, &edits);
        }
        Ok(edits)
    }

    fn copy_of(&self, name: &str) -> &str {
        match self.sims.get(name) {
            Some(Sim::Text(content)) => content,
            _ => "",
        }
    }

    /// The visible content of the text nodes an XML replace names, from the copy or the
    /// document (charged).
    fn xml_texts(
        &mut self,
        name: &str,
        x: &yrs::XmlFragmentRef,
        element: Option<u32>,
    ) -> Result<Vec<String>, Refused> {
        if let Some(Sim::Xml(tops)) = self.sims.get(name) {
            return match element {
                None => Ok(tops.iter().flatten().cloned().collect()),
                Some(e) => tops.get(e as usize).cloned().ok_or_else(|| {
                    Refused::Op(Refusal::Invalid(format!(
                        "\"element\" {e} is past the fragment's end ({} nodes)",
                        tops.len()
                    )))
                }),
            };
        }
        let nodes = text_nodes(x, self.txn, element).map_err(Refusal::Invalid)?;
        Ok(nodes.iter().map(|n| visible(n, self.txn)).collect())
    }

    /// Copies a fragment's text nodes, per top-level node, if not copied yet (charged).
    fn copy_xml(&mut self, name: &str, x: &yrs::XmlFragmentRef) -> Result<(), Refused> {
        if self.sims.contains_key(name) {
            return Ok(());
        }
        let mut tops = Vec::new();
        for i in 0..x.len(self.txn) {
            let nodes = text_nodes(x, self.txn, Some(i)).map_err(Refusal::Invalid)?;
            let texts: Vec<String> = nodes.iter().map(|n| visible(n, self.txn)).collect();
            charge(&mut self.work, texts.iter().map(String::len).sum())?;
            tops.push(texts);
        }
        self.sims.insert(name.to_owned(), Sim::Xml(tops));
        Ok(())
    }
}

/// Refuses `at` past the end of the live text, or between the halves of a surrogate pair (a
/// low surrogate at `at`), without rendering the text.
fn live_boundary(branch: &yrs::branch::Branch, at: u32, what: &str) -> Result<(), Refusal> {
    let len = branch.content_len;
    if at > len {
        return Err(Refusal::Invalid(format!(
            "\"{what}\" {at} is past the text's end ({len} UTF-16 code units)"
        )));
    }
    if at > 0 && at < len {
        if let Some(unit) = branch.utf16_unit_at(at) {
            if (0xDC00..=0xDFFF).contains(&unit) {
                return Err(Refusal::Invalid(format!(
                    "\"{what}\" {at} falls inside a character (between the halves of a UTF-16 surrogate pair)"
                )));
            }
        }
    }
    Ok(())
}

/// The edits replacing the first occurrence of `replace.old` in `content` (or every one), the
/// last first so the earlier offsets stay right; and what they change.
fn replace_edits(content: &str, replace: &Replace) -> (Vec<TextEdit>, Change) {
    let mut at16 = Vec::new();
    let (mut bytes, mut units) = (0usize, 0u32);
    for (start, _) in content.match_indices(replace.old.as_str()) {
        units += utf16_len(content.get(bytes..start).unwrap_or(""));
        bytes = start;
        at16.push(units);
        if !replace.all {
            break;
        }
    }
    let old_len = utf16_len(&replace.old);
    let new_len = utf16_len(&replace.new);
    let mut edits = Vec::new();
    for &at in at16.iter().rev() {
        edits.push(TextEdit::Remove { at, len: old_len });
        if !replace.new.is_empty() {
            edits.push(TextEdit::Insert {
                at,
                text: replace.new.clone(),
            });
        }
    }
    let n = at16.len() as u64;
    let change = Change {
        op: 0,
        inserted: n * u64::from(new_len),
        deleted: n * u64::from(old_len),
        replaced: n,
    };
    (edits, change)
}

/// The byte offset of UTF-16 offset `at` in `s` (its end past it).
fn byte_at(s: &str, at: u32) -> usize {
    let mut units = 0u32;
    for (i, c) in s.char_indices() {
        if units >= at {
            return i;
        }
        units += c.len_utf16() as u32;
    }
    s.len()
}

fn apply_text_edits(content: &mut String, edits: &[TextEdit]) {
    for edit in edits {
        match edit {
            TextEdit::Remove { at, len } => {
                let start = byte_at(content, *at);
                let end = start + byte_at(content.get(start..).unwrap_or(""), *len);
                content.replace_range(start..end, "");
            }
            TextEdit::Insert { at, text } => {
                let at = byte_at(content, *at);
                content.insert_str(at, text);
            }
        }
    }
}

/// A replace's edits made to the copy of a fragment's text nodes.
fn apply_xml_edits(
    tops: &mut [Vec<String>],
    element: Option<u32>,
    per_node: &[(usize, Vec<TextEdit>)],
) {
    let mut nodes: Vec<&mut String> = match element {
        None => tops.iter_mut().flatten().collect(),
        Some(e) => tops
            .get_mut(e as usize)
            .map(|n| n.iter_mut().collect())
            .unwrap_or_default(),
    };
    for (i, edits) in per_node {
        if let Some(node) = nodes.get_mut(*i) {
            apply_text_edits(node, edits);
        }
    }
}

/// Makes the planned steps in `txn`; map operations' changes are counted here.
pub(super) fn perform(
    txn: &mut TransactionMut,
    roots: &HashMap<String, Root>,
    edits: &Edits,
    steps: Vec<Step>,
    changes: &mut [Change],
) {
    for ((op, step), change) in edits.ops.iter().zip(steps).zip(changes.iter_mut()) {
        let Some(root) = roots.get(op.root().0) else {
            continue;
        };
        match (op, root, step) {
            (_, Root::Text(t), Step::Text(edits)) => text_edits(txn, t, edits),
            (Op::MapSet { key, value, .. }, Root::Map(m), _) => {
                let existed = m.get(txn, key).is_some();
                m.insert(txn, key.as_str(), value.clone());
                change.inserted = 1;
                change.deleted = u64::from(existed);
            }
            (Op::MapDelete { key, .. }, Root::Map(m), _) => {
                change.deleted = u64::from(m.remove(txn, key).is_some());
            }
            (Op::ArrayInsert { values, .. }, Root::Array(a), Step::At(at)) => {
                a.insert_range(txn, at, values.iter().cloned());
            }
            (Op::ArrayDelete { len, at, .. }, Root::Array(a), _) => {
                a.remove_range(txn, *at, *len);
            }
            (Op::XmlInsert { node, .. }, Root::Xml(x), Step::At(at)) => {
                let element = x.insert(txn, at, XmlElementPrelim::empty(node.kind.as_str()));
                for (key, value) in &node.attrs {
                    element.insert_attribute(txn, key.as_str(), value.clone());
                }
                if let Some(text) = node.text.as_deref().filter(|t| !t.is_empty()) {
                    element.push_back(txn, XmlTextPrelim::new(text));
                }
            }
            (Op::XmlReplace { element, .. }, Root::Xml(x), Step::XmlText(per_node)) => {
                let Ok(nodes) = text_nodes(x, txn, *element) else {
                    continue;
                };
                for (i, edits) in per_node {
                    if let Some(node) = nodes.get(i) {
                        text_edits(txn, node, edits);
                    }
                }
            }
            _ => {}
        }
    }
}

fn text_edits<T: Text>(txn: &mut TransactionMut, text: &T, edits: Vec<TextEdit>) {
    for edit in edits {
        match edit {
            TextEdit::Remove { at, len } => text.remove_range(txn, at, len),
            TextEdit::Insert { at, text: s } => text.insert(txn, at, &s),
        }
    }
}

/// The kind of a root as its content shows it, read from its first visible item and its map
/// (no copy of it); `None` for a root holding nothing visible (however it is typed: a root an
/// edit typed and then refused leaves no trace).
pub(super) fn live_kind(root: &Out, txn: &impl ReadTxn) -> Option<RootKind> {
    let branch: &yrs::branch::Branch = match root {
        Out::YText(r) => r.as_ref(),
        Out::YArray(r) => r.as_ref(),
        Out::YMap(r) => r.as_ref(),
        Out::YXmlFragment(r) => r.as_ref(),
        Out::YXmlElement(r) => r.as_ref(),
        Out::YXmlText(r) => r.as_ref(),
        Out::UndefinedRef(b) => b,
        _ => return None,
    };
    let map = yrs::MapRef::from(yrs::branch::BranchPtr::from(branch));
    if branch.content_len == 0 && map.len(txn) == 0 {
        return None;
    }
    Some(match root {
        Out::YText(_) => RootKind::Text,
        Out::YArray(_) => RootKind::Array,
        Out::YMap(_) => RootKind::Map,
        Out::UndefinedRef(_) if branch.content_len == 0 => RootKind::Map,
        Out::UndefinedRef(_) => match branch.first_visible() {
            Some(FirstVisible::Text) => RootKind::Text,
            Some(FirstVisible::Branch(
                TypeRef::XmlElement(_) | TypeRef::XmlText | TypeRef::XmlFragment,
            )) => RootKind::Xml,
            _ => RootKind::Array,
        },
        _ => RootKind::Xml,
    })
}
