//! JSON edits (`POST /docs/{name}/edits`, docs/api.md): operations on a document's root types
//! for tools and agents that do not speak Yjs, parsed from JSON and applied to a scratch copy
//! of the document, giving the Yjs update that makes them.
//!
//! - [`parse`] reads the request and refuses what is malformed, naming the operation and the
//!   reason: a key combination no operation has, a missing field, a value of the wrong JSON
//!   type, or more than the bounds below.
//! - [`apply`] builds a scratch `Doc` from the document's state (text offsets in UTF-16 code
//!   units, as JavaScript and Yjs count them), checks the preconditions and the root kinds,
//!   then applies every operation in one transaction, each against the state the operations
//!   before it left (an index out of range is refused there). The scratch copy is discarded on
//!   any error: nothing of a refused edit reaches the document.
//!
//! XML roots are edited as y-prosemirror (Tiptap) stores them: block nodes are `XmlElement`s
//! named by their node type (`paragraph`, `heading`), attributes as JSON values (a heading's
//! `level` a number), their text an `XmlText` inside.
//!
//! No I/O: the state comes in as bytes and the update goes out as bytes.

use std::collections::HashMap;

use base64::Engine;
use serde::Serialize;
use serde_json::Value;
use yrs::types::text::YChange;
use yrs::updates::decoder::Decode;
use yrs::updates::encoder::Encode;
use yrs::{
    Any, Array, ArrayRef, ClientID, Doc, Map, MapRef, OffsetKind, Options, Out, ReadTxn,
    StateVector, Text, TextRef, Transact, TransactionMut, Update, Xml, XmlElementPrelim,
    XmlFragment, XmlFragmentRef, XmlOut, XmlTextPrelim, XmlTextRef,
};

use crate::history::{root_kinds, RootKind};

mod parse;
pub use parse::parse;

/// Most operations in one edit.
pub const MAX_EDIT_OPS: usize = 1000;
/// Most content one edit may insert, in bytes of UTF-8 (strings) or of JSON (values), every
/// replacement of a `"all": true` replace counted: an edit of a 2 MiB body cannot grow into
/// more than this.
pub const MAX_EDIT_INSERT_BYTES: usize = 4 << 20;
/// Longest root name, attribute name or element type, in bytes.
pub const MAX_EDIT_NAME: usize = 255;

/// A parsed edit request.
#[derive(Debug, Clone, PartialEq)]
pub struct Edits {
    pub ops: Vec<Op>,
    pub if_contains: Vec<Contains>,
    /// The state vector the caller computed its edit against: the edit applies only onto it.
    pub state_vector: Option<StateVector>,
}

/// One operation, on the root it names.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `at: None`: at the end.
    TextInsert {
        root: String,
        text: String,
        at: Option<u32>,
    },
    TextDelete {
        root: String,
        len: u32,
        at: u32,
    },
    TextReplace {
        root: String,
        replace: Replace,
    },
    MapSet {
        root: String,
        key: String,
        value: Any,
        /// Bytes of the value as JSON.
        size: usize,
    },
    MapDelete {
        root: String,
        key: String,
    },
    /// `at: None`: at the end (`push`).
    ArrayInsert {
        root: String,
        values: Vec<Any>,
        at: Option<u32>,
        size: usize,
    },
    ArrayDelete {
        root: String,
        len: u32,
        at: u32,
    },
    /// `at: None`: appended.
    XmlInsert {
        root: String,
        node: Node,
        at: Option<u32>,
    },
    /// In the `XmlText`s of the fragment, or only of its top-level node at `element`.
    XmlReplace {
        root: String,
        replace: Replace,
        element: Option<u32>,
    },
}

/// A replacement of a string by another: the first occurrence, or every one.
#[derive(Debug, Clone, PartialEq)]
pub struct Replace {
    pub old: String,
    pub new: String,
    pub all: bool,
}

/// A block node to insert into an XML fragment: `<type attrs>text</type>`.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub kind: String,
    pub attrs: Vec<(String, Any)>,
    pub text: Option<String>,
    /// Bytes of the node's type, attributes (as JSON) and text.
    pub size: usize,
}

/// A precondition: the text (or some text node of the XML fragment) `root` contains `value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Contains {
    pub root: String,
    pub kind: RootKind,
    pub value: String,
}

/// What one operation changed: content units (UTF-16 code units of text, array elements, map
/// entries, XML nodes) inserted and deleted, and occurrences replaced.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Change {
    /// The operation's index in `ops`.
    pub op: usize,
    pub inserted: u64,
    pub deleted: u64,
    pub replaced: u64,
}

/// An edit applied to the scratch copy.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The Yjs v1 update that makes the edit (only what its transaction wrote).
    pub update: Vec<u8>,
    /// The state vector the edit was computed from.
    pub base: StateVector,
    /// The state vector after the edit (Yjs v1).
    pub state_vector: Vec<u8>,
    pub changes: Vec<Change>,
}

/// Where in the request an error is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// The request as a whole (`ops` missing, an unknown member).
    Request,
    Op(usize),
    IfContains(usize),
    /// The request's `state_vector`; with the document's current one (base64) on a failed
    /// precondition.
    StateVector(Option<String>),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    /// Malformed, or not applicable to this document (400): nothing applied.
    #[error("{}{reason}", prefix(.at))]
    Invalid { at: Part, reason: String },
    /// A precondition no longer holds, or a replace found nothing (409): nothing applied.
    #[error("{}{reason}", prefix(.at))]
    Failed { at: Part, reason: String },
    /// The document's state does not decode.
    #[error("the document's state: {0}")]
    Stored(String),
}

fn prefix(at: &Part) -> String {
    match at {
        Part::Request => String::new(),
        Part::Op(i) => format!("op {i}: "),
        Part::IfContains(i) => format!("if_contains {i}: "),
        Part::StateVector(_) => "state_vector: ".into(),
    }
}

impl EditError {
    /// Where the error is, as the problem's `current` member: `{"op": 2}`, `{"if_contains":
    /// 0}`, `{"state_vector": "<the current one>"}`.
    pub fn current(&self) -> Option<Value> {
        let at = match self {
            EditError::Invalid { at, .. } | EditError::Failed { at, .. } => at,
            EditError::Stored(_) => return None,
        };
        match at {
            Part::Request => None,
            Part::Op(i) => Some(serde_json::json!({ "op": i })),
            Part::IfContains(i) => Some(serde_json::json!({ "if_contains": i })),
            Part::StateVector(sv) => Some(serde_json::json!({ "state_vector": sv })),
        }
    }
}

fn invalid(at: Part, reason: impl Into<String>) -> EditError {
    EditError::Invalid {
        at,
        reason: reason.into(),
    }
}

fn failed(at: Part, reason: impl Into<String>) -> EditError {
    EditError::Failed {
        at,
        reason: reason.into(),
    }
}

/// A root of the scratch document, typed as the edit's operations use it.
enum Root {
    Text(TextRef),
    Map(MapRef),
    Array(ArrayRef),
    Xml(XmlFragmentRef),
}

/// Applies `edits` to the document whose state is `current` (a Yjs v1 update), as a change
/// by `client_id`: the update, the state vectors before and after, what each operation
/// changed. Nothing is kept: on an error, no update exists.
pub fn apply(current: &[u8], edits: &Edits, client_id: u64) -> Result<Outcome, EditError> {
    let doc = Doc::with_options(Options {
        client_id: ClientID::new(client_id),
        offset_kind: OffsetKind::Utf16,
        ..Options::default()
    });
    let update = Update::decode_v1(current).map_err(|e| EditError::Stored(e.to_string()))?;
    doc.transact_mut()
        .apply_update(update)
        .map_err(|e| EditError::Stored(e.to_string()))?;
    let base = doc.transact().state_vector();
    if let Some(expected) = &edits.state_vector {
        if *expected != base {
            let now = base64::engine::general_purpose::STANDARD.encode(base.encode_v1());
            return Err(failed(
                Part::StateVector(Some(now)),
                "the document is no longer at this state vector",
            ));
        }
    }
    let existing = existing_kinds(&doc);
    let roots = typed_roots(&doc, edits, &existing)?;
    check_conditions(&doc, &edits.if_contains, &existing)?;

    let mut txn = doc.transact_mut();
    let mut budget = MAX_EDIT_INSERT_BYTES;
    let mut changes = Vec::with_capacity(edits.ops.len());
    for (i, op) in edits.ops.iter().enumerate() {
        let change = apply_op(&mut txn, &roots, op, &mut budget).map_err(|e| match e {
            Refusal::Invalid(reason) => invalid(Part::Op(i), reason),
            Refusal::Failed(reason) => failed(Part::Op(i), reason),
        })?;
        changes.push(Change { op: i, ..change });
    }
    let update = txn.encode_update_v1();
    drop(txn);
    let state_vector = doc.transact().state_vector().encode_v1();
    Ok(Outcome {
        update,
        base,
        state_vector,
        changes,
    })
}

/// The kind of each root the document holds; `None` for one holding nothing visible (a root
/// written only by remote updates has no declared type, and an emptied one shows none).
fn existing_kinds(doc: &Doc) -> HashMap<String, Option<RootKind>> {
    let mut kinds: HashMap<String, Option<RootKind>> = root_kinds(doc)
        .into_iter()
        .map(|(name, kind)| (name, Some(kind)))
        .collect();
    let txn = doc.transact();
    for (name, root) in txn.root_refs() {
        if let Out::UndefinedRef(branch) = root {
            let empty = branch.content_len == 0 && MapRef::from(branch).len(&txn) == 0;
            if empty {
                kinds.insert(name.to_owned(), None);
            }
        }
    }
    kinds
}

fn kind_name(kind: RootKind) -> &'static str {
    match kind {
        RootKind::Text => "a text",
        RootKind::Map => "a map",
        RootKind::Array => "an array",
        RootKind::Xml => "an XML fragment",
    }
}

impl Op {
    fn root(&self) -> (&str, RootKind) {
        match self {
            Op::TextInsert { root, .. }
            | Op::TextDelete { root, .. }
            | Op::TextReplace { root, .. } => (root, RootKind::Text),
            Op::MapSet { root, .. } | Op::MapDelete { root, .. } => (root, RootKind::Map),
            Op::ArrayInsert { root, .. } | Op::ArrayDelete { root, .. } => (root, RootKind::Array),
            Op::XmlInsert { root, .. } | Op::XmlReplace { root, .. } => (root, RootKind::Xml),
        }
    }
}

/// Each root the operations name, typed as they use it; 400 for an operation that uses a
/// root as another kind than the document holds, or than an earlier operation used it as.
fn typed_roots(
    doc: &Doc,
    edits: &Edits,
    existing: &HashMap<String, Option<RootKind>>,
) -> Result<HashMap<String, Root>, EditError> {
    let mut used: HashMap<&str, (RootKind, usize)> = HashMap::new();
    for (i, op) in edits.ops.iter().enumerate() {
        let (name, kind) = op.root();
        if let Some(Some(held)) = existing.get(name) {
            if *held != kind {
                return Err(invalid(
                    Part::Op(i),
                    format!(
                        "root \"{name}\" is {}, not {}",
                        kind_name(*held),
                        kind_name(kind)
                    ),
                ));
            }
        }
        match used.get(name) {
            Some((earlier, j)) if *earlier != kind => {
                return Err(invalid(
                    Part::Op(i),
                    format!(
                        "root \"{name}\" is used as {} by op {j}, not {}",
                        kind_name(*earlier),
                        kind_name(kind)
                    ),
                ))
            }
            Some(_) => {}
            None => {
                used.insert(name, (kind, i));
            }
        }
    }
    for (i, c) in edits.if_contains.iter().enumerate() {
        if let Some(Some(held)) = existing.get(&c.root) {
            if *held != c.kind {
                return Err(invalid(
                    Part::IfContains(i),
                    format!(
                        "root \"{}\" is {}, not {}",
                        c.root,
                        kind_name(*held),
                        kind_name(c.kind)
                    ),
                ));
            }
        }
    }
    // Typed outside any transaction (yrs takes the document's store to do it).
    Ok(used
        .into_iter()
        .map(|(name, (kind, _))| {
            let root = match kind {
                RootKind::Text => Root::Text(doc.get_or_insert_text(name)),
                RootKind::Map => Root::Map(doc.get_or_insert_map(name)),
                RootKind::Array => Root::Array(doc.get_or_insert_array(name)),
                RootKind::Xml => Root::Xml(doc.get_or_insert_xml_fragment(name)),
            };
            (name.to_owned(), root)
        })
        .collect())
}

/// 409 for the first condition that does not hold: its root is missing or does not contain
/// its value. (`typed_roots` has refused a condition on a root of another kind.)
fn check_conditions(
    doc: &Doc,
    conditions: &[Contains],
    existing: &HashMap<String, Option<RootKind>>,
) -> Result<(), EditError> {
    for (i, c) in conditions.iter().enumerate() {
        let holds = match existing.get(&c.root) {
            None => false,
            Some(_) if c.value.is_empty() => true,
            Some(None) => false,
            Some(Some(RootKind::Text)) => {
                let text = doc.get_or_insert_text(c.root.as_str());
                let txn = doc.transact();
                visible(&text, &txn).contains(&c.value)
            }
            Some(Some(RootKind::Map | RootKind::Array)) => false,
            Some(Some(RootKind::Xml)) => {
                let xml = doc.get_or_insert_xml_fragment(c.root.as_str());
                let txn = doc.transact();
                text_nodes(&xml, &txn, None)
                    .map(|nodes| nodes.iter().any(|t| visible(t, &txn).contains(&c.value)))
                    .unwrap_or(false)
            }
        };
        if !holds {
            return Err(failed(
                Part::IfContains(i),
                format!("root \"{}\" does not contain {:?}", c.root, c.value),
            ));
        }
    }
    Ok(())
}

/// Why an operation was refused: malformed for this state (400) or a replace that found
/// nothing (409).
enum Refusal {
    Invalid(String),
    Failed(String),
}

fn apply_op(
    txn: &mut TransactionMut,
    roots: &HashMap<String, Root>,
    op: &Op,
    budget: &mut usize,
) -> Result<Change, Refusal> {
    let (name, _) = op.root();
    let root = roots
        .get(name)
        .ok_or_else(|| Refusal::Invalid(format!("root \"{name}\" was not typed")))?;
    let mut spend = |bytes: usize| -> Result<(), Refusal> {
        *budget = budget.checked_sub(bytes).ok_or_else(|| {
            Refusal::Invalid(format!(
                "the edit inserts more than {MAX_EDIT_INSERT_BYTES} bytes (MAX_EDIT_INSERT_BYTES)"
            ))
        })?;
        Ok(())
    };
    let mut change = Change::default();
    match (op, root) {
        (Op::TextInsert { text, at, .. }, Root::Text(t)) => {
            spend(text.len())?;
            let content = visible(t, txn);
            let len = utf16_len(&content);
            let at = at.unwrap_or(len);
            check_at(&content, at, "at")?;
            t.insert(txn, at, text);
            change.inserted = u64::from(utf16_len(text));
        }
        (Op::TextDelete { len, at, .. }, Root::Text(t)) => {
            let content = visible(t, txn);
            check_range(&content, *at, *len)?;
            t.remove_range(txn, *at, *len);
            change.deleted = u64::from(*len);
        }
        (Op::TextReplace { replace, .. }, Root::Text(t)) => {
            let found = replace_in(txn, t, replace, &mut spend)?;
            if found.replaced == 0 {
                return Err(Refusal::Failed(format!(
                    "root \"{name}\" does not contain {:?}",
                    replace.old
                )));
            }
            change = found;
        }
        (
            Op::MapSet {
                key, value, size, ..
            },
            Root::Map(m),
        ) => {
            spend(*size)?;
            let existed = m.get(txn, key).is_some();
            m.insert(txn, key.as_str(), value.clone());
            change.inserted = 1;
            change.deleted = u64::from(existed);
        }
        (Op::MapDelete { key, .. }, Root::Map(m)) => {
            change.deleted = u64::from(m.remove(txn, key).is_some());
        }
        (
            Op::ArrayInsert {
                values, at, size, ..
            },
            Root::Array(a),
        ) => {
            spend(*size)?;
            let len = a.len(txn);
            let at = at.unwrap_or(len);
            if at > len {
                return Err(Refusal::Invalid(format!(
                    "\"at\" {at} is past the array's end ({len} elements)"
                )));
            }
            a.insert_range(txn, at, values.iter().cloned());
            change.inserted = values.len() as u64;
        }
        (Op::ArrayDelete { len, at, .. }, Root::Array(a)) => {
            let size = a.len(txn);
            if u64::from(*at) + u64::from(*len) > u64::from(size) {
                return Err(Refusal::Invalid(format!(
                    "deleting {len} elements at {at} goes past the array's end ({size} elements)"
                )));
            }
            a.remove_range(txn, *at, *len);
            change.deleted = u64::from(*len);
        }
        (Op::XmlInsert { node, at, .. }, Root::Xml(x)) => {
            spend(node.size)?;
            let len = x.len(txn);
            let at = at.unwrap_or(len);
            if at > len {
                return Err(Refusal::Invalid(format!(
                    "\"at\" {at} is past the fragment's end ({len} nodes)"
                )));
            }
            let element = x.insert(txn, at, XmlElementPrelim::empty(node.kind.as_str()));
            for (key, value) in &node.attrs {
                element.insert_attribute(txn, key.as_str(), value.clone());
            }
            if let Some(text) = node.text.as_deref().filter(|t| !t.is_empty()) {
                element.push_back(txn, XmlTextPrelim::new(text));
            }
            change.inserted = 1;
        }
        (
            Op::XmlReplace {
                replace, element, ..
            },
            Root::Xml(x),
        ) => {
            let nodes = text_nodes(x, txn, *element).map_err(Refusal::Invalid)?;
            for node in nodes {
                if change.replaced > 0 && !replace.all {
                    break;
                }
                let found = replace_in(txn, &node, replace, &mut spend)?;
                change.inserted += found.inserted;
                change.deleted += found.deleted;
                change.replaced += found.replaced;
            }
            if change.replaced == 0 {
                let inside = element.map_or(String::new(), |e| format!(" (in node {e})"));
                return Err(Refusal::Failed(format!(
                    "root \"{name}\" does not contain {:?}{inside}",
                    replace.old
                )));
            }
        }
        _ => return Err(Refusal::Invalid("the root's kind changed".into())),
    }
    Ok(change)
}

/// Replaces the first occurrence of `replace.old` in `text` (or every one) by `replace.new`.
fn replace_in<T: Text>(
    txn: &mut TransactionMut,
    text: &T,
    replace: &Replace,
    spend: &mut impl FnMut(usize) -> Result<(), Refusal>,
) -> Result<Change, Refusal> {
    let content = visible(text, txn);
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
    for _ in &at16 {
        spend(replace.new.len().max(1))?;
    }
    // From the last to the first, so that the earlier offsets stay right.
    for &at in at16.iter().rev() {
        text.remove_range(txn, at, old_len);
        if !replace.new.is_empty() {
            text.insert(txn, at, &replace.new);
        }
    }
    let n = at16.len() as u64;
    Ok(Change {
        op: 0,
        inserted: n * u64::from(new_len),
        deleted: n * u64::from(old_len),
        replaced: n,
    })
}

/// The `XmlText` nodes of a fragment in document order: all of them, or those of its
/// top-level node at `element` (an error if there is none).
fn text_nodes<R: ReadTxn>(
    fragment: &XmlFragmentRef,
    txn: &R,
    element: Option<u32>,
) -> Result<Vec<XmlTextRef>, String> {
    let texts = |walk: &mut dyn Iterator<Item = XmlOut>| -> Vec<XmlTextRef> {
        walk.filter_map(|node| match node {
            XmlOut::Text(t) => Some(t),
            _ => None,
        })
        .collect()
    };
    match element {
        None => Ok(texts(&mut fragment.successors(txn))),
        Some(i) => match fragment.get(txn, i) {
            Some(XmlOut::Text(t)) => Ok(vec![t]),
            Some(XmlOut::Element(e)) => Ok(texts(&mut e.successors(txn))),
            Some(XmlOut::Fragment(f)) => Ok(texts(&mut f.successors(txn))),
            None => Err(format!(
                "\"element\" {i} is past the fragment's end ({} nodes)",
                fragment.len(txn)
            )),
        },
    }
}

/// A text's content as a string an index counts into: its text, each embed as U+FFFC (one
/// unit, as Yjs counts it), formatting left out. (An embed that is a bare string reads as
/// text here: Quill's and y-prosemirror's embeds are objects.)
fn visible<T: Text, R: ReadTxn>(text: &T, txn: &R) -> String {
    let mut out = String::new();
    for chunk in text.diff(txn, YChange::identity) {
        match chunk.insert {
            Out::Any(Any::String(s)) => out.push_str(&s),
            _ => out.push('\u{FFFC}'),
        }
    }
    out
}

fn utf16_len(s: &str) -> u32 {
    u32::try_from(s.encode_utf16().count()).unwrap_or(u32::MAX)
}

/// Refuses an offset past the end of `content` or inside a character (between the two
/// halves of a surrogate pair).
fn check_at(content: &str, at: u32, what: &str) -> Result<(), Refusal> {
    let mut units = 0u32;
    for c in content.chars() {
        if units >= at {
            break;
        }
        units += c.len_utf16() as u32;
    }
    let len = utf16_len(content);
    if at > len {
        return Err(Refusal::Invalid(format!(
            "\"{what}\" {at} is past the text's end ({len} UTF-16 code units)"
        )));
    }
    if units != at {
        return Err(Refusal::Invalid(format!(
            "\"{what}\" {at} falls inside a character (between the halves of a UTF-16 surrogate pair)"
        )));
    }
    Ok(())
}

fn check_range(content: &str, at: u32, len: u32) -> Result<(), Refusal> {
    let size = utf16_len(content);
    if u64::from(at) + u64::from(len) > u64::from(size) {
        return Err(Refusal::Invalid(format!(
            "deleting {len} code units at {at} goes past the text's end ({size} UTF-16 code units)"
        )));
    }
    check_at(content, at, "at")?;
    check_at(content, at + len, "at + delete")
}

#[cfg(test)]
mod tests;
