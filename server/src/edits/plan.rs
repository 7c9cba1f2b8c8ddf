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

/// What stepping over one item of a sequence is charged (an index-based edit walks the items
/// before its index, deleted ones included).
const STEP_COST: usize = 4;
/// What listing one XML text node is charged.
pub(super) const NODE_COST: usize = 64;
/// Why a search for U+FFFC is refused.
pub(super) const OBJECT_REPLACEMENT: &str =
    "U+FFFC stands for an embed in a text as it is read, and cannot be searched for";

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
    /// A text's visible content, and the items of the live text (each later operation on it
    /// walks them once more in yrs).
    Text(String, u64),
    /// An XML fragment's text nodes, per top-level node.
    Xml(Vec<Vec<String>>),
}

/// The checking of one request.
struct Planner<'a, T: ReadTxn> {
    txn: &'a T,
    /// The roots the document has (a root it has not is empty).
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
        let root = self.roots.get(name);
        let later = {
            let n = self.left.entry(name.to_owned()).or_default();
            *n = n.saturating_sub(1);
            *n > 0
        };
        let mut change = Change::default();
        let step = match op {
            Op::TextInsert { .. } | Op::TextDelete { .. } | Op::TextReplace { .. } => {
                let t = match root {
                    Some(Root::Text(t)) => Some(t),
                    None => None,
                    Some(_) => return Err(kind_changed()),
                };
                Step::Text(self.text_op(name, t, op, later, &mut change)?)
            }
            Op::MapSet { size, .. } => {
                self.spend(*size)?;
                Step::Plain
            }
            Op::MapDelete { .. } => Step::Plain,
            Op::ArrayInsert {
                values, at, size, ..
            } => {
                self.spend(*size)?;
                let len = self.seq_len(name, root)?;
                let at = at.unwrap_or(len);
                if at > len {
                    return Err(Refusal::Invalid(format!(
                        "\"at\" {at} is past the array's end ({len} elements)"
                    ))
                    .into());
                }
                self.lens.insert(name.to_owned(), len + values.len() as u32);
                // (yrs walks the items before the index.)
                charge(&mut self.work, walk(u64::from(at)))?;
                change.inserted = values.len() as u64;
                Step::At(at)
            }
            Op::ArrayDelete { len, at, .. } => {
                let size = self.seq_len(name, root)?;
                if u64::from(*at) + u64::from(*len) > u64::from(size) {
                    return Err(Refusal::Invalid(format!(
                        "deleting {len} elements at {at} goes past the array's end ({size} elements)"
                    ))
                    .into());
                }
                self.lens.insert(name.to_owned(), size - len);
                charge(&mut self.work, walk(u64::from(*at) + u64::from(*len)))?;
                change.deleted = u64::from(*len);
                Step::Plain
            }
            Op::XmlInsert { node, at, .. } => {
                self.spend(node.size)?;
                let len = self.seq_len(name, root)?;
                let at = at.unwrap_or(len);
                if at > len {
                    return Err(Refusal::Invalid(format!(
                        "\"at\" {at} is past the fragment's end ({len} nodes)"
                    ))
                    .into());
                }
                self.lens.insert(name.to_owned(), len + 1);
                charge(&mut self.work, walk(u64::from(at)))?;
                if later {
                    self.copy_xml(name, xml_of(root)?)?;
                }
                if let Some(Sim::Xml(nodes)) = self.sims.get_mut(name) {
                    let text = node.text.clone().filter(|t| !t.is_empty());
                    let at = (at as usize).min(nodes.len());
                    nodes.insert(at, text.into_iter().collect());
                }
                change.inserted = 1;
                Step::At(at)
            }
            Op::XmlReplace {
                replace, element, ..
            } => {
                let x = xml_of(root)?;
                let nodes = self.xml_texts(name, x, *element)?;
                // The edit lists the nodes again in yrs.
                charge(&mut self.work, nodes.len() * NODE_COST)?;
                let mut per_node = Vec::new();
                for (i, (content, steps)) in nodes.iter().enumerate() {
                    if change.replaced > 0 && !replace.all {
                        break;
                    }
                    charge(&mut self.work, content.len())?;
                    let (edits, found) = self.replace_in(content, replace, *steps)?;
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
                    apply_xml_edits(tops, *element, &per_node, &mut self.work)?;
                }
                Step::XmlText(per_node)
            }
        };
        Ok((step, change))
    }

    /// The length of an array or a fragment as the operations so far leave it (0 for a root
    /// the document does not have).
    fn seq_len(&mut self, name: &str, root: Option<&Root>) -> Result<u32, Refused> {
        if let Some(len) = self.lens.get(name) {
            return Ok(*len);
        }
        let len = match root {
            None => 0,
            Some(Root::Array(a)) => a.len(self.txn),
            Some(Root::Xml(x)) => x.len(self.txn),
            Some(_) => return Err(kind_changed()),
        };
        self.lens.insert(name.to_owned(), len);
        Ok(len)
    }

    /// The edits replacing `replace.old` in `content` (its first occurrence or every one),
    /// the insert budget spent and each occurrence's two walks (a removal and an insertion
    /// over the text's `steps` items) charged before any replacement is made.
    fn replace_in(
        &mut self,
        content: &str,
        replace: &Replace,
        steps: u64,
    ) -> Result<(Vec<TextEdit>, Change), Refused> {
        if replace.old.contains('\u{FFFC}') {
            return Err(Refusal::Invalid(OBJECT_REPLACEMENT.into()).into());
        }
        let found = matches(content, replace);
        for _ in &found {
            self.spend(replace.new.len().max(1))?;
            charge(&mut self.work, walk(steps) * 2)?;
        }
        Ok(replace_edits(&found, replace))
    }

    /// A text operation checked and resolved: against the document for a root no earlier
    /// operation changed (`t`: `None` for a root the document does not have), else against
    /// the copy; the copy is made (or kept up) when a later operation touches the root.
    fn text_op(
        &mut self,
        name: &str,
        t: Option<&yrs::TextRef>,
        op: &Op,
        later: bool,
        change: &mut Change,
    ) -> Result<Vec<TextEdit>, Refused> {
        let copied = match self.sims.get(name) {
            Some(Sim::Text(_, steps)) => Some(*steps),
            _ => None,
        };
        if let Some(steps) = copied {
            // The edit walks the live text once more in yrs.
            charge(&mut self.work, walk(steps))?;
        }
        let branch: Option<&yrs::branch::Branch> = t.map(|t| t.as_ref());
        let edits = match op {
            Op::TextInsert { text, at, .. } => {
                self.spend(text.len())?;
                let at = if copied.is_some() {
                    let content = self.copy_of(name);
                    let at = at.unwrap_or_else(|| utf16_len(content));
                    check_at(content, at, "at")?;
                    at
                } else {
                    let len = branch.map_or(0, |b| b.content_len);
                    let at = at.unwrap_or(len);
                    let steps = live_range(branch, at, 0)?;
                    charge(&mut self.work, walk(steps))?;
                    at
                };
                change.inserted = u64::from(utf16_len(text));
                vec![TextEdit::Insert {
                    at,
                    text: text.clone(),
                }]
            }
            Op::TextDelete { len, at, .. } => {
                if copied.is_some() {
                    check_range(self.copy_of(name), *at, *len)?;
                } else {
                    let steps = live_range(branch, *at, *len)?;
                    charge(&mut self.work, walk(steps))?;
                }
                change.deleted = u64::from(*len);
                vec![TextEdit::Remove { at: *at, len: *len }]
            }
            Op::TextReplace { replace, .. } => {
                let (content, steps) = match copied {
                    Some(steps) => {
                        let copy = self.copy_of(name).to_owned();
                        charge(&mut self.work, copy.len())?;
                        (copy, steps)
                    }
                    None => self.read_text(name, t)?,
                };
                let (edits, found) = self.replace_in(&content, replace, steps)?;
                if found.replaced == 0 {
                    return Err(Refusal::Failed(format!(
                        "root \"{name}\" does not contain {:?}",
                        replace.old
                    ))
                    .into());
                }
                *change = found;
                edits
            }
            _ => return Err(kind_changed()),
        };
        if copied.is_none() && later {
            let (content, steps) = self.read_text(name, t)?;
            self.sims.insert(name.to_owned(), Sim::Text(content, steps));
        }
        if let Some(Sim::Text(content, _)) = self.sims.get_mut(name) {
            apply_text_edits(content, &edits, &mut self.work)?;
        }
        Ok(edits)
    }

    /// A live text's content (charged) and its items, refused if it holds values that are
    /// not text: yrs removes text across them by other counts than it inserts, so only an
    /// insert or a delete clear of them is made on such a root.
    fn read_text(
        &mut self,
        name: &str,
        t: Option<&yrs::TextRef>,
    ) -> Result<(String, u64), Refused> {
        let Some(t) = t else {
            return Ok((String::new(), 0));
        };
        let read = visible(t, self.txn);
        charge(&mut self.work, read.text.len())?;
        if read.mixed {
            return Err(not_text(name));
        }
        Ok((read.text, read.steps))
    }

    fn copy_of(&self, name: &str) -> &str {
        match self.sims.get(name) {
            Some(Sim::Text(content, _)) => content,
            _ => "",
        }
    }

    /// The visible content of the text nodes an XML replace names, with each node's items,
    /// from the copy or the document (charged; a node holding values that are not text is
    /// refused).
    fn xml_texts(
        &mut self,
        name: &str,
        x: Option<&yrs::XmlFragmentRef>,
        element: Option<u32>,
    ) -> Result<Vec<(String, u64)>, Refused> {
        if let Some(Sim::Xml(tops)) = self.sims.get(name) {
            // (A node's items are not kept with the copy: its length bounds them.)
            let pick: Vec<String> = match element {
                None => tops.iter().flatten().cloned().collect(),
                Some(e) => tops.get(e as usize).cloned().ok_or_else(|| {
                    Refused::Op(Refusal::Invalid(format!(
                        "\"element\" {e} is past the fragment's end ({} nodes)",
                        tops.len()
                    )))
                })?,
            };
            charge(&mut self.work, pick.iter().map(String::len).sum())?;
            return Ok(pick
                .into_iter()
                .map(|t| {
                    let steps = t.len() as u64 + 1;
                    (t, steps)
                })
                .collect());
        }
        let Some(x) = x else {
            return match element {
                None => Ok(Vec::new()),
                Some(e) => Err(Refusal::Invalid(format!(
                    "\"element\" {e} is past the fragment's end (0 nodes)"
                ))
                .into()),
            };
        };
        let nodes = text_nodes(x, self.txn, element).map_err(Refusal::Invalid)?;
        charge(&mut self.work, nodes.len() * NODE_COST)?;
        let mut texts = Vec::with_capacity(nodes.len());
        for node in &nodes {
            let read = visible(node, self.txn);
            charge(&mut self.work, read.text.len())?;
            if read.mixed {
                return Err(not_text(name));
            }
            texts.push((read.text, read.steps));
        }
        Ok(texts)
    }

    /// Copies a fragment's text nodes, per top-level node, if not copied yet (one walk over
    /// its top-level nodes; charged).
    fn copy_xml(&mut self, name: &str, x: Option<&yrs::XmlFragmentRef>) -> Result<(), Refused> {
        if self.sims.contains_key(name) {
            return Ok(());
        }
        let mut tops = Vec::new();
        if let Some(x) = x {
            for node in x.children(self.txn) {
                let mut texts = Vec::new();
                for text in super::texts_of(node, self.txn) {
                    let read = visible(&text, self.txn);
                    charge(&mut self.work, read.text.len() + NODE_COST)?;
                    if read.mixed {
                        return Err(not_text(name));
                    }
                    texts.push(read.text);
                }
                tops.push(texts);
            }
        }
        self.sims.insert(name.to_owned(), Sim::Xml(tops));
        Ok(())
    }
}

/// The fragment an XML operation names (`None`: the document does not have it).
fn xml_of(root: Option<&Root>) -> Result<Option<&yrs::XmlFragmentRef>, Refused> {
    match root {
        None => Ok(None),
        Some(Root::Xml(x)) => Ok(Some(x)),
        Some(_) => Err(kind_changed()),
    }
}

fn kind_changed() -> Refused {
    Refused::Op(Refusal::Invalid("the root's kind changed".into()))
}

fn not_text(name: &str) -> Refused {
    Refused::Op(Refusal::Invalid(format!(
        "root \"{name}\" holds values that are not text (an array's, written into it); only \
         an insert or a delete clear of them can be made on it"
    )))
}

/// What a walk over `steps` items is charged.
fn walk(steps: u64) -> usize {
    usize::try_from(steps)
        .unwrap_or(usize::MAX)
        .saturating_mul(STEP_COST)
}

/// Refuses, on the live text (`None`: empty), a range `at..at + len` past its end, with an end
/// between the halves of a surrogate pair, or (for a removal) over values that are not text:
/// yrs would remove by another count than it checked. Walks the items up to the range's end,
/// as the edit itself will, and copies nothing.
fn live_range(branch: Option<&yrs::branch::Branch>, at: u32, len: u32) -> Result<u64, Refusal> {
    let size = branch.map_or(0, |b| b.content_len);
    let end = u64::from(at) + u64::from(len);
    if end > u64::from(size) {
        return Err(Refusal::Invalid(if len == 0 {
            format!("\"at\" {at} is past the text's end ({size} UTF-16 code units)")
        } else {
            format!(
                "deleting {len} code units at {at} goes past the text's end ({size} UTF-16 code units)"
            )
        }));
    }
    let Some(branch) = branch else {
        return Ok(0);
    };
    let end = at + len;
    let mut problem = None;
    let mut pos = 0u32;
    let steps = branch.visit_visible(|content, item_len| {
        let (start, stop) = (pos, pos + item_len);
        pos = stop;
        if stop <= at {
            return true;
        }
        if start > end {
            return false;
        }
        use yrs::block::ItemContent;
        let text = matches!(
            content,
            ItemContent::String(_) | ItemContent::Embed(_) | ItemContent::Type(_)
        );
        if len > 0 && start < end && stop > at && !text {
            problem = Some("goes over values that are not text (an array's, written into the text)".to_owned());
            return false;
        }
        if let ItemContent::String(s) = content {
            for (bound, what) in [(at, "at"), (end, "at + delete")] {
                let inside = bound > start && bound < stop;
                let low = inside
                    && s.as_str()
                        .encode_utf16()
                        .nth((bound - start) as usize)
                        .is_some_and(|u| (0xDC00..=0xDFFF).contains(&u));
                if low && (what == "at" || len > 0) {
                    problem = Some(format!(
                        "\"{what}\" {bound} falls inside a character (between the halves of a UTF-16 surrogate pair)"
                    ));
                    return false;
                }
            }
        }
        stop <= end
    });
    match problem {
        Some(reason) if reason.starts_with("goes over") => Err(Refusal::Invalid(format!(
            "deleting {len} code units at {at} {reason}"
        ))),
        Some(reason) => Err(Refusal::Invalid(reason)),
        None => Ok(steps),
    }
}

/// The UTF-16 offsets of the first occurrence of `replace.old` in `content`, or of every one.
fn matches(content: &str, replace: &Replace) -> Vec<u32> {
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
    at16
}

/// The edits replacing the occurrences at `found`, the last first so the earlier offsets stay
/// right; and what they change.
fn replace_edits(found: &[u32], replace: &Replace) -> (Vec<TextEdit>, Change) {
    let old_len = utf16_len(&replace.old);
    let new_len = utf16_len(&replace.new);
    let mut edits = Vec::new();
    for &at in found.iter().rev() {
        edits.push(TextEdit::Remove { at, len: old_len });
        if !replace.new.is_empty() {
            edits.push(TextEdit::Insert {
                at,
                text: replace.new.clone(),
            });
        }
    }
    let n = found.len() as u64;
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

/// `edits` made on a copy, each charged the copy's length (it moves the string's tail).
fn apply_text_edits(
    content: &mut String,
    edits: &[TextEdit],
    work: &mut usize,
) -> Result<(), Refused> {
    for edit in edits {
        charge(work, content.len())?;
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
    Ok(())
}

/// A replace's edits made to the copy of a fragment's text nodes.
fn apply_xml_edits(
    tops: &mut [Vec<String>],
    element: Option<u32>,
    per_node: &[(usize, Vec<TextEdit>)],
    work: &mut usize,
) -> Result<(), Refused> {
    let mut nodes: Vec<&mut String> = match element {
        None => tops.iter_mut().flatten().collect(),
        Some(e) => tops
            .get_mut(e as usize)
            .map(|n| n.iter_mut().collect())
            .unwrap_or_default(),
    };
    for (i, edits) in per_node {
        if let Some(node) = nodes.get_mut(*i) {
            apply_text_edits(node, edits, work)?;
        }
    }
    Ok(())
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

/// The branch of a root.
pub(super) fn branch_of(root: &Out) -> Option<&yrs::branch::Branch> {
    Some(match root {
        Out::YText(r) => r.as_ref(),
        Out::YArray(r) => r.as_ref(),
        Out::YMap(r) => r.as_ref(),
        Out::YXmlFragment(r) => r.as_ref(),
        Out::YXmlElement(r) => r.as_ref(),
        Out::YXmlText(r) => r.as_ref(),
        Out::UndefinedRef(b) => b,
        _ => return None,
    })
}

/// The kind of a root as its content shows it, read from its first visible item and its map
/// (no copy of it), whatever type it was given (an edit types a root as it uses it; a writer
/// may have put an array's values into a root typed as text): `None` for a root holding
/// nothing visible.
pub(super) fn live_kind(root: &Out, txn: &impl ReadTxn) -> Option<RootKind> {
    let branch = branch_of(root)?;
    if branch.content_len == 0 {
        // (The first live entry is enough.)
        let map = yrs::MapRef::from(yrs::branch::BranchPtr::from(branch));
        let held = map.iter(txn).next().is_some();
        return held.then_some(RootKind::Map);
    }
    let xml = |t: &TypeRef| {
        matches!(
            t,
            TypeRef::XmlElement(_) | TypeRef::XmlText | TypeRef::XmlFragment
        )
    };
    Some(match (root, branch.first_visible()) {
        (_, Some(FirstVisible::Text)) => RootKind::Text,
        // A text may begin with an embedded type; a fragment with its nodes.
        (Out::YText(_) | Out::YXmlText(_), Some(FirstVisible::Branch(t))) if !xml(&t) => {
            RootKind::Text
        }
        (_, Some(FirstVisible::Branch(t))) if xml(&t) => RootKind::Xml,
        _ => RootKind::Array,
    })
}
