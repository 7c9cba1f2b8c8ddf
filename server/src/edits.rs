//! JSON edits (`POST /docs/{name}/edits`, docs/api.md): operations on a document's root types
//! for tools and agents that do not speak Yjs, parsed from JSON and made on a document in one
//! transaction, giving the Yjs update that makes them.
//!
//! - [`parse`] reads the request and refuses what is malformed, naming the operation and the
//!   reason: a key combination no operation has, a missing field, a value of the wrong JSON
//!   type, or more than the bounds below.
//! - [`apply_to`] makes it on a document (text offsets in UTF-16 code units, as JavaScript
//!   and Yjs count them): the preconditions and the root kinds checked, then every operation
//!   checked against the state the ones before it leave (`plan.rs`), then all made in one
//!   transaction under the author's client id. yrs has no rollback, so nothing is made until
//!   everything is checked: a refused edit changes nothing. The room edits its live document
//!   with it (`room/actor/edits.rs`); [`apply`] makes it on a scratch copy (tools, tests).
//!
//! XML roots are edited as y-prosemirror (Tiptap) stores them: block nodes are `XmlElement`s
//! named by their node type (`paragraph`, `heading`), attributes as JSON values (a heading's
//! `level` a number), their text an `XmlText` inside.
//!
//! No I/O: a document or its state comes in, the update goes out as bytes.

use std::collections::HashMap;

use base64::Engine;
use serde::Serialize;
use serde_json::Value;
use yrs::updates::decoder::Decode;
use yrs::updates::encoder::Encode;
use yrs::{
    Any, ArrayRef, ClientID, Doc, MapRef, OffsetKind, Options, ReadTxn, StateVector, TextRef,
    Transact, TransactionMut, Update, XmlFragment, XmlFragmentRef, XmlOut, XmlTextRef,
};

use crate::history::RootKind;

mod parse;
mod plan;
mod schema;
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

/// An edit made.
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
    /// Reading what it needs would pass the request's work budget (422): nothing applied.
    #[error("{}{reason}", prefix(.at))]
    TooCostly { at: Part, reason: String },
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
            EditError::Invalid { at, .. }
            | EditError::Failed { at, .. }
            | EditError::TooCostly { at, .. } => at,
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

/// The client id `author`'s JSON edits of document `doc` are made under: the same for every
/// edit they make (so a thousand edits add one entry to the document's state vector), and
/// apart from the ids Yjs clients pick (random 32-bit numbers): at or above 2^32, below
/// 2^53 (JavaScript's exact integers). The room continues its clock from the document.
pub fn edit_client(doc: i64, author: &str) -> u64 {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update(b"quire edit client\0");
    hash.update(doc.to_le_bytes());
    hash.update(author.as_bytes());
    let digest = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    const LOW: u64 = 1 << 32;
    const SPAN: u64 = (1 << 53) - LOW;
    LOW + u64::from_le_bytes(first) % SPAN
}

/// A root of the document, typed as the edit's operations use it.
enum Root {
    Text(TextRef),
    Map(MapRef),
    Array(ArrayRef),
    Xml(XmlFragmentRef),
}

/// Applies `edits` to the document whose state is `current` (a Yjs v1 update), on a scratch
/// copy (text offsets in UTF-16 code units), as a change by `client_id`: what [`apply_to`]
/// gives. Nothing is kept: on an error, no update exists. (Tools and tests; the server's rooms
/// edit their live document with [`apply_to`].)
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
    apply_to(&doc, edits, client_id, usize::MAX, |_| ()).map(|(outcome, ())| outcome)
}

/// Applies `edits` to `doc` (whose text offsets must count UTF-16 code units), in one
/// transaction whose new items are made as `client`: the update, the state vectors before
/// and after, what each operation changed; and what `inspect` reads of the transaction
/// before it commits. Every operation is checked first, against the state the ones before it
/// leave (`plan.rs`): a refused edit changes nothing in `doc`. Reading content (a replace's
/// search, a copy of a root several operations touch, a precondition) is charged to `work`
/// bytes, past which the edit is refused (422).
pub fn apply_to<R>(
    doc: &Doc,
    edits: &Edits,
    client: u64,
    work: usize,
    inspect: impl FnOnce(&TransactionMut) -> R,
) -> Result<(Outcome, R), EditError> {
    if doc.offset_kind() != OffsetKind::Utf16 {
        return Err(EditError::Stored(
            "the document does not count text in UTF-16 code units".into(),
        ));
    }
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
    let (existing, branches) = existing_kinds(doc, edits);
    let kinds = used_kinds(edits, &existing)?;
    let mut work = work;
    check_conditions(doc, &edits.if_contains, &existing, &branches, &mut work)?;
    // Checked on the roots the document has, read as they are (neither made nor typed), a
    // root it has not yet reading as empty: a refused edit leaves the document as it was.
    let held = as_used(&kinds, &branches);
    let planned = {
        let txn = doc.transact();
        plan::plan(&txn, &held, edits, work)
    };
    let (steps, mut changes, _) = planned?;
    let roots = typed(doc, &kinds);
    let mut txn = doc.transact_mut();
    let own = txn.set_local_client(ClientID::new(client));
    plan::perform(&mut txn, &roots, edits, steps, &mut changes);
    txn.set_local_client(own);
    let update = txn.encode_update_v1();
    let inspected = inspect(&txn);
    drop(txn);
    let state_vector = doc.transact().state_vector().encode_v1();
    Ok((
        Outcome {
            update,
            base,
            state_vector,
            changes,
        },
        inspected,
    ))
}

/// The kind of each root the edit names that the document holds, read from its content
/// (`plan::live_kind`; `None` for one holding nothing visible), and the roots themselves.
#[allow(clippy::type_complexity)]
fn existing_kinds(
    doc: &Doc,
    edits: &Edits,
) -> (
    HashMap<String, Option<RootKind>>,
    HashMap<String, yrs::branch::BranchPtr>,
) {
    let named: std::collections::HashSet<&str> = edits
        .ops
        .iter()
        .map(|op| op.root().0)
        .chain(edits.if_contains.iter().map(|c| c.root.as_str()))
        .collect();
    let txn = doc.transact();
    let (mut kinds, mut branches) = (HashMap::new(), HashMap::new());
    for (name, root) in txn.root_refs() {
        if !named.contains(name) {
            continue;
        }
        kinds.insert(name.to_owned(), plan::live_kind(&root, &txn));
        if let Some(branch) = plan::branch_of(&root) {
            branches.insert(name.to_owned(), yrs::branch::BranchPtr::from(branch));
        }
    }
    (kinds, branches)
}

/// The roots the document holds, as the kinds the edit uses them as (not typed: a read).
fn as_used(
    kinds: &HashMap<String, RootKind>,
    branches: &HashMap<String, yrs::branch::BranchPtr>,
) -> HashMap<String, Root> {
    kinds
        .iter()
        .filter_map(|(name, kind)| {
            let branch = *branches.get(name)?;
            let root = match kind {
                RootKind::Text => Root::Text(TextRef::from(branch)),
                RootKind::Map => Root::Map(MapRef::from(branch)),
                RootKind::Array => Root::Array(ArrayRef::from(branch)),
                RootKind::Xml => Root::Xml(XmlFragmentRef::from(branch)),
            };
            Some((name.clone(), root))
        })
        .collect()
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

/// The kind each root the operations name is used as; 400 for an operation that uses a root
/// as another kind than the document holds, or than an earlier operation used it as.
fn used_kinds(
    edits: &Edits,
    existing: &HashMap<String, Option<RootKind>>,
) -> Result<HashMap<String, RootKind>, EditError> {
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
    Ok(used
        .into_iter()
        .map(|(name, (kind, _))| (name.to_owned(), kind))
        .collect())
}

/// The roots of `kinds`, typed as they are used, once the edit is checked. Outside any
/// transaction (yrs takes the document's store to type a root); a root the document does not
/// have is made.
fn typed(doc: &Doc, kinds: &HashMap<String, RootKind>) -> HashMap<String, Root> {
    kinds
        .iter()
        .map(|(name, kind)| {
            let root = match kind {
                RootKind::Text => Root::Text(doc.get_or_insert_text(name.as_str())),
                RootKind::Map => Root::Map(doc.get_or_insert_map(name.as_str())),
                RootKind::Array => Root::Array(doc.get_or_insert_array(name.as_str())),
                RootKind::Xml => Root::Xml(doc.get_or_insert_xml_fragment(name.as_str())),
            };
            (name.clone(), root)
        })
        .collect()
}

/// 409 for the first condition that does not hold: its root is missing or does not contain
/// its value. (`used_kinds` has refused a condition on a root of another kind.) What each
/// reads is charged to `work`; a value holding U+FFFC (what an embed reads as) is 400.
fn check_conditions(
    doc: &Doc,
    conditions: &[Contains],
    existing: &HashMap<String, Option<RootKind>>,
    branches: &HashMap<String, yrs::branch::BranchPtr>,
    work: &mut usize,
) -> Result<(), EditError> {
    let txn = doc.transact();
    for (i, c) in conditions.iter().enumerate() {
        if c.value.contains('\u{FFFC}') {
            return Err(invalid(Part::IfContains(i), plan::OBJECT_REPLACEMENT));
        }
        let mut read = |content: String| -> Result<bool, EditError> {
            plan::charge(work, content.len()).map_err(|e| e.at(Part::IfContains(i)))?;
            Ok(content.contains(&c.value))
        };
        let branch = branches.get(&c.root).copied();
        let holds = match (existing.get(&c.root), branch) {
            (None, _) | (_, None) => false,
            (Some(_), _) if c.value.is_empty() => true,
            (Some(None), _) => false,
            (Some(Some(RootKind::Text)), Some(branch)) => {
                read(visible(&TextRef::from(branch), &txn).text)?
            }
            (Some(Some(RootKind::Map | RootKind::Array)), _) => false,
            (Some(Some(RootKind::Xml)), Some(branch)) => {
                let nodes =
                    text_nodes(&XmlFragmentRef::from(branch), &txn, None).unwrap_or_default();
                plan::charge(work, nodes.len() * plan::NODE_COST)
                    .map_err(|e| e.at(Part::IfContains(i)))?;
                let mut found = false;
                for node in nodes {
                    let mut read = |content: String| -> Result<bool, EditError> {
                        plan::charge(work, content.len()).map_err(|e| e.at(Part::IfContains(i)))?;
                        Ok(content.contains(&c.value))
                    };
                    if read(visible(&node, &txn).text)? {
                        found = true;
                        break;
                    }
                }
                found
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

/// The `XmlText` nodes of a fragment in document order: all of them (one walk over its
/// top-level nodes), or those of its top-level node at `element` (an error if there is none).
fn text_nodes<R: ReadTxn>(
    fragment: &XmlFragmentRef,
    txn: &R,
    element: Option<u32>,
) -> Result<Vec<XmlTextRef>, String> {
    match element {
        None => Ok(fragment
            .children(txn)
            .flat_map(|node| texts_of(node, txn))
            .collect()),
        Some(i) => fragment
            .get(txn, i)
            .map(|node| texts_of(node, txn))
            .ok_or_else(|| {
                format!(
                    "\"element\" {i} is past the fragment's end ({} nodes)",
                    fragment.len(txn)
                )
            }),
    }
}

/// The `XmlText` nodes of one node of a fragment, in document order.
fn texts_of<R: ReadTxn>(node: XmlOut, txn: &R) -> Vec<XmlTextRef> {
    let texts = |walk: &mut dyn Iterator<Item = XmlOut>| -> Vec<XmlTextRef> {
        walk.filter_map(|node| match node {
            XmlOut::Text(t) => Some(t),
            _ => None,
        })
        .collect()
    };
    match node {
        XmlOut::Text(t) => vec![t],
        XmlOut::Element(e) => texts(&mut e.successors(txn)),
        XmlOut::Fragment(f) => texts(&mut f.successors(txn)),
    }
}

/// A text's content as a string an index counts into, as yrs counts it: its strings, every
/// embed and embedded type as U+FFFC (one unit, as Yjs counts it), formatting left out; and
/// whether it holds values that are not text (an array's values written into it), which
/// become U+FFFC too, one per value. Walks the items without a diff.
fn visible<T: AsRef<yrs::branch::Branch>, R: ReadTxn>(text: &T, _txn: &R) -> Visible {
    let mut out = Visible::default();
    out.steps = text.as_ref().visit_visible(|content, len| {
        match content {
            yrs::block::ItemContent::String(s) => out.text.push_str(s.as_str()),
            yrs::block::ItemContent::Embed(_) | yrs::block::ItemContent::Type(_) => {
                out.text.push('\u{FFFC}')
            }
            _ => {
                out.mixed = true;
                for _ in 0..len {
                    out.text.push('\u{FFFC}');
                }
            }
        }
        true
    });
    out
}

/// What [`visible`] reads.
#[derive(Default)]
struct Visible {
    text: String,
    /// The text holds values that are not text: an edit cannot remove across them safely.
    mixed: bool,
    /// Items stepped over to read it (deleted ones included): an index-based edit's walk.
    steps: u64,
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
mod live_tests;
#[cfg(test)]
mod tests;
