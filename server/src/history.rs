//! The version history's computations, shared by the HTTP routes and the CLI (docs/history.md):
//! rebuilding content at a log position, grouping the log into editing sessions, the diff of
//! two versions' texts with authors, and a restore as a forward update.
//!
//! Everything here works on bytes read from storage and returns bytes or values: no I/O.

use std::collections::HashMap;

use serde::Serialize;
use yrs::types::text::{ChangeKind, YChange};
use yrs::types::AsPrelim;
use yrs::undo::{Options as UndoOptions, UndoManager};
use yrs::updates::decoder::Decode;
use yrs::{ClientID, Doc, GetString, In, Options, Out, ReadTxn, Text, Transact, Update};

use crate::storage::history::StateAt;

/// What kind of shared type a root is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootKind {
    Text,
    Array,
    Map,
    Xml,
}

/// A document that keeps deleted content (no garbage collection), so deletions stay visible
/// to a diff and can be undone.
fn history_doc(client_id: Option<u64>) -> Doc {
    let mut options = Options {
        skip_gc: true,
        ..Options::default()
    };
    if let Some(id) = client_id {
        options.client_id = ClientID::new(id);
    }
    Doc::with_options(options)
}

fn apply_v2(doc: &Doc, state: &[u8]) -> Result<(), String> {
    // A state an earlier Quire wrote with yrs 0.28's skip fault is read around it.
    let (update, _) =
        crate::protocol::state::decode_state_v2(state).map_err(|e| format!("stored state: {e}"))?;
    doc.transact_mut()
        .apply_update(update)
        .map_err(|e| format!("stored state: {e}"))
}

fn apply_v1(doc: &Doc, data: &[u8]) -> Result<(), String> {
    let update = Update::decode_v1(data).map_err(|e| format!("stored update: {e}"))?;
    doc.transact_mut()
        .apply_update(update)
        .map_err(|e| format!("stored update: {e}"))
}

/// The document at a log position, from its base and the rows after it.
pub fn rebuild(at: &StateAt) -> Result<Doc, String> {
    let doc = history_doc(None);
    if let Some(base) = &at.base {
        apply_v2(&doc, base)?;
    }
    for row in &at.updates {
        apply_v1(&doc, row)?;
    }
    Ok(doc)
}

/// A document from a full state (Yjs v2).
pub fn from_state(state: &[u8]) -> Result<Doc, String> {
    let doc = history_doc(None);
    apply_v2(&doc, state)?;
    Ok(doc)
}

/// Each root's name and kind (a root only ever filled by remote updates has no declared
/// type: its content says which).
pub fn root_kinds(doc: &Doc) -> Vec<(String, RootKind)> {
    let txn = doc.transact();
    let mut roots: Vec<(String, RootKind)> = txn
        .root_refs()
        .map(|(name, root)| {
            let kind = match &root {
                Out::YText(_) => RootKind::Text,
                Out::YArray(_) => RootKind::Array,
                Out::YMap(_) => RootKind::Map,
                Out::YXmlFragment(_) | Out::YXmlElement(_) | Out::YXmlText(_) => RootKind::Xml,
                _ => match root.as_prelim(&txn) {
                    In::Text(_) => RootKind::Text,
                    // A fragment of XML elements (y-prosemirror's) reads as a list too.
                    In::Array(_) if holds_xml(&root, &txn) => RootKind::Xml,
                    In::Array(_) => RootKind::Array,
                    In::Map(_) => RootKind::Map,
                    _ => RootKind::Xml,
                },
            };
            (name.to_owned(), kind)
        })
        .collect();
    roots.sort_by(|a, b| a.0.cmp(&b.0));
    roots
}

/// Whether an untyped root's first element is an XML node: an XML fragment's, not an array's.
fn holds_xml(root: &Out, txn: &impl ReadTxn) -> bool {
    use yrs::Array;
    let Out::UndefinedRef(branch) = root else {
        return false;
    };
    matches!(
        yrs::ArrayRef::from(*branch).get(txn, 0),
        Some(Out::YXmlElement(_) | Out::YXmlText(_) | Out::YXmlFragment(_))
    )
}

/// Log rows grouped into editing sessions: a session ends where no edit came for `gap_ms`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct Session {
    /// Log positions of the session's first and last update.
    pub first_seq: i64,
    pub last_seq: i64,
    /// Milliseconds since the Unix epoch.
    pub first_at: i64,
    pub last_at: i64,
    pub updates: i64,
    /// Content units (characters, elements, entries) inserted and deleted.
    pub inserted: i64,
    pub deleted: i64,
    /// Who edited in the session, most updates first.
    pub authors: Vec<AuthorShare>,
}

/// One author's part of a session.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct AuthorShare {
    /// `null` for updates written without an author (tools).
    pub author: Option<String>,
    pub first_at: i64,
    pub last_at: i64,
    pub updates: i64,
    pub inserted: i64,
    pub deleted: i64,
}

/// The session of log positions `first..=last` from its authors' totals.
pub fn session(
    first_seq: i64,
    last_seq: i64,
    totals: Vec<crate::storage::history::AuthorTotals>,
) -> Session {
    let mut authors: Vec<AuthorShare> = totals
        .into_iter()
        .map(|t| AuthorShare {
            author: t.author,
            first_at: t.first_at,
            last_at: t.last_at,
            updates: t.updates,
            inserted: t.inserted,
            deleted: t.deleted,
        })
        .collect();
    authors.sort_by(|a, b| b.updates.cmp(&a.updates).then(a.author.cmp(&b.author)));
    Session {
        first_seq,
        last_seq,
        first_at: authors.iter().map(|a| a.first_at).min().unwrap_or(0),
        last_at: authors.iter().map(|a| a.last_at).max().unwrap_or(0),
        updates: authors.iter().map(|a| a.updates).sum(),
        inserted: authors.iter().map(|a| a.inserted).sum(),
        deleted: authors.iter().map(|a| a.deleted).sum(),
        authors,
    }
}

/// One run of a text diff.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct Run {
    /// `kept`, `inserted` or `deleted`.
    pub kind: &'static str,
    pub text: String,
    /// Who wrote the run (inserted, kept) or the text deleted; `null` if unknown.
    pub author: Option<String>,
}

/// The diff of one text root.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct TextDiff {
    pub root: String,
    pub runs: Vec<Run>,
}

/// For each text root, the runs of the `to` state against the `from` state (both Yjs v2):
/// kept, inserted and deleted, each with its author (`authors`: client id → author).
///
/// Both states go into one document that keeps deleted content, `from` first: the items
/// `to` deletes stay there as deleted items, so yrs' snapshot diff can show them.
pub fn diff(
    from: &[u8],
    to: &[u8],
    authors: &HashMap<u64, String>,
) -> Result<Vec<TextDiff>, String> {
    let doc = history_doc(None);
    apply_v2(&doc, from)?;
    let lo = doc.transact().snapshot();
    // A root is a text if either side says so (a text `to` emptied has no live string left).
    let mut texts: Vec<String> = root_kinds(&doc)
        .into_iter()
        .filter(|(_, k)| *k == RootKind::Text)
        .map(|(n, _)| n)
        .collect();
    apply_v2(&doc, to)?;
    let hi = doc.transact().snapshot();
    for (name, kind) in root_kinds(&doc) {
        if kind == RootKind::Text && !texts.contains(&name) {
            texts.push(name);
        }
    }
    texts.sort();
    let author_of = |id: &yrs::ID| authors.get(&id.client.get()).cloned();
    let mut out = Vec::new();
    for name in texts {
        let text = doc.get_or_insert_text(name.as_str());
        let mut txn = doc.transact_mut();
        let chunks = text.diff_range(&mut txn, Some(&hi), Some(&lo), YChange::identity);
        let mut runs: Vec<Run> = Vec::new();
        for chunk in chunks {
            let Out::Any(yrs::Any::String(s)) = &chunk.insert else {
                continue; // an embed: not text
            };
            let (kind, author) = match &chunk.ychange {
                Some(c) if c.kind == ChangeKind::Added => ("inserted", author_of(&c.id)),
                Some(c) => ("deleted", author_of(&c.id)),
                None => ("kept", None),
            };
            match runs.last_mut() {
                Some(last) if last.kind == kind && last.author == author => last.text.push_str(s),
                _ => runs.push(Run {
                    kind,
                    text: s.to_string(),
                    author,
                }),
            }
        }
        out.push(TextDiff { root: name, runs });
    }
    Ok(out)
}

/// The update that makes a document whose state is `current` (Yjs v1) hold `version`'s
/// content again (Yjs v2), as a change made now by `client_id`: it deletes what was inserted
/// since the version and inserts again what was deleted since (texts, array elements, map
/// keys, XML children), nothing else. Applied to a document that moved on meanwhile, it
/// leaves the concurrent edits in place.
///
/// How: the version's document, the changes since applied under a tracked origin, undone
/// with yrs' `UndoManager` over every root; the update is what the undo wrote.
pub fn restore_update(version: &[u8], current: &[u8], client_id: u64) -> Result<Vec<u8>, String> {
    let current_doc = history_doc(None);
    apply_v1(&current_doc, current)?;
    let roots = root_kinds(&current_doc);

    let doc = history_doc(Some(client_id));
    apply_v2(&doc, version)?;
    let mut undo: UndoManager<()> = UndoManager::with_options(UndoOptions::default());
    for (name, kind) in &roots {
        let name = name.as_str();
        match kind {
            RootKind::Text => undo.expand_scope(&doc, &doc.get_or_insert_text(name)),
            RootKind::Array => undo.expand_scope(&doc, &doc.get_or_insert_array(name)),
            RootKind::Map => undo.expand_scope(&doc, &doc.get_or_insert_map(name)),
            RootKind::Xml => undo.expand_scope(&doc, &doc.get_or_insert_xml_fragment(name)),
        }
    }
    let origin = "quire-restore";
    undo.include_origin(origin);
    {
        let update = Update::decode_v1(current).map_err(|e| format!("current state: {e}"))?;
        let mut txn = doc.transact_mut_with(origin);
        txn.apply_update(update)
            .map_err(|e| format!("current state: {e}"))?;
    }
    let since = doc.transact().state_vector();
    if undo.can_undo() {
        undo.undo_blocking();
    }
    let update = doc.transact().encode_diff_v1(&since);
    Ok(update)
}

/// A fresh client id for a change the server makes (a restore): random within Yjs' 53 bits.
pub fn server_client_id() -> u64 {
    rand::random::<u64>() & ((1 << 53) - 1)
}

/// The texts of a document, by root (for tests and tools).
pub fn texts(doc: &Doc) -> HashMap<String, String> {
    root_kinds(doc)
        .into_iter()
        .filter(|(_, k)| *k == RootKind::Text)
        .map(|(name, _)| {
            let text = doc.get_or_insert_text(name.as_str());
            let s = text.get_string(&doc.transact());
            (name, s)
        })
        .collect()
}

/// The state of `doc` as a Yjs v2 update (what versions store); `None` while it holds an
/// update waiting for missing dependencies, which yrs may panic encoding (see the room's
/// `spawn_snapshot`), or if it panics all the same.
pub fn encode_state(doc: &Doc) -> Option<Vec<u8>> {
    if doc.transact().has_missing_updates() {
        return None;
    }
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        crate::protocol::state::encode_state_v2(&doc.transact())
    }))
    .ok()
}

/// A diff read the other way round: what one side inserted, the other deleted.
pub fn reverse(texts: Vec<TextDiff>) -> Vec<TextDiff> {
    texts
        .into_iter()
        .map(|t| TextDiff {
            root: t.root,
            runs: t
                .runs
                .into_iter()
                .map(|r| Run {
                    kind: match r.kind {
                        "inserted" => "deleted",
                        "deleted" => "inserted",
                        other => other,
                    },
                    ..r
                })
                .collect(),
        })
        .collect()
}

/// The document's root types as JSON. Roots loaded from updates have no declared type, so
/// the type is inferred from the content the way yrs does (text, array or map).
pub fn doc_json(doc: &Doc) -> serde_json::Value {
    use yrs::types::AsPrelim;
    use yrs::types::ToJson;
    use yrs::{ArrayRef, In, MapRef, Out, TextRef, XmlFragmentRef};
    let txn = doc.transact();
    let mut out = serde_json::Map::new();
    for (name, root) in txn.root_refs() {
        let typed = match &root {
            Out::UndefinedRef(branch) => match root.as_prelim(&txn) {
                In::Text(_) => Out::YText(TextRef::from(*branch)),
                In::Array(_) => Out::YArray(ArrayRef::from(*branch)),
                In::Map(_) => Out::YMap(MapRef::from(*branch)),
                _ => Out::YXmlFragment(XmlFragmentRef::from(*branch)),
            },
            _ => root.clone(),
        };
        let json = serde_json::to_value(typed.to_json(&txn)).unwrap_or(serde_json::Value::Null);
        out.insert(name.to_owned(), json);
    }
    serde_json::Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use yrs::{Array, Map};

    fn edit(doc: &Doc, f: impl FnOnce(&mut yrs::TransactionMut)) -> Vec<u8> {
        let mut txn = doc.transact_mut();
        f(&mut txn);
        txn.encode_update_v1()
    }

    fn text_of(state_v1: &[&[u8]]) -> String {
        let doc = Doc::new();
        for u in state_v1 {
            doc.transact_mut()
                .apply_update(Update::decode_v1(u).expect("update"))
                .expect("apply");
        }
        let t = doc.get_or_insert_text("text");
        let s = t.get_string(&doc.transact());
        s
    }

    #[test]
    fn a_restore_undoes_what_came_since_and_keeps_concurrent_edits() {
        let ann = Doc::with_client_id(1);
        let text = ann.get_or_insert_text("text");
        let map = ann.get_or_insert_map("meta");
        let list = ann.get_or_insert_array("list");
        edit(&ann, |t| {
            text.insert(t, 0, "hello world");
            map.insert(t, "title", "first");
            list.insert(t, 0, 1);
        });
        let version = encode_state(&ann).expect("state");
        edit(&ann, |t| {
            text.remove_range(t, 0, 6); // "world"
            text.insert(t, 5, "!!!"); // "world!!!"
            map.insert(t, "title", "second");
            map.insert(t, "extra", 7);
            list.push_back(t, 2);
        });
        let current = ann
            .transact()
            .encode_state_as_update_v1(&yrs::StateVector::default());
        let restore = restore_update(&version, &current, 99).expect("restore");

        // Meanwhile, another client typed at the end (concurrent with the restore).
        let bob = Doc::with_client_id(2);
        bob.transact_mut()
            .apply_update(Update::decode_v1(&current).expect("u"))
            .expect("apply");
        let bob_text = bob.get_or_insert_text("text");
        let concurrent = edit(&bob, |t| bob_text.push(t, " (bob)"));

        // Everyone converges on the version's content plus Bob's concurrent typing.
        for order in [[&restore, &concurrent], [&concurrent, &restore]] {
            let s = text_of(&[&current, order[0], order[1]]);
            assert_eq!(s, "hello world (bob)");
        }
        let doc = Doc::new();
        for u in [&current, &restore] {
            doc.transact_mut()
                .apply_update(Update::decode_v1(u).expect("u"))
                .expect("apply");
        }
        let json = super::doc_json(&doc);
        assert_eq!(json["meta"], serde_json::json!({"title": "first"}));
        assert_eq!(json["list"], serde_json::json!([1]));
        // The restore's new items carry the client id it was given.
        let update = Update::decode_v1(&restore).expect("u");
        let clients: Vec<u64> = update.state_vector().iter().map(|(c, _)| c.get()).collect();
        assert_eq!(clients, vec![99]);
    }

    #[test]
    fn a_diff_of_an_emptied_text_and_a_reversed_diff() {
        let ann = Doc::with_client_id(1);
        let text = ann.get_or_insert_text("text");
        edit(&ann, |t| text.insert(t, 0, "gone soon"));
        let full = encode_state(&ann).expect("state");
        edit(&ann, |t| text.remove_range(t, 0, 9));
        let empty = encode_state(&ann).expect("state");
        let authors = HashMap::from([(1, "ann".to_owned())]);
        let runs = |d: Vec<TextDiff>| -> Vec<(&'static str, String)> {
            d.into_iter()
                .flat_map(|t| t.runs)
                .map(|r| (r.kind, r.text))
                .collect()
        };
        // The emptied text is still a text: its content shows as deleted.
        let forward = diff(&full, &empty, &authors).expect("diff");
        assert_eq!(runs(forward), vec![("deleted", "gone soon".to_owned())]);
        // From the newer state back to the older one: the older's text was "inserted".
        let back = reverse(diff(&full, &empty, &authors).expect("diff"));
        assert_eq!(runs(back), vec![("inserted", "gone soon".to_owned())]);
    }

    #[test]
    fn a_diff_shows_inserted_and_deleted_runs_with_their_authors() {
        let ann = Doc::with_client_id(1);
        let text = ann.get_or_insert_text("text");
        edit(&ann, |t| text.insert(t, 0, "the quick fox"));
        let from = encode_state(&ann).expect("state");
        let bob = Doc::with_client_id(2);
        bob.transact_mut()
            .apply_update(Update::decode_v2(&from).expect("u"))
            .expect("apply");
        let bob_text = bob.get_or_insert_text("text");
        edit(&bob, |t| {
            bob_text.remove_range(t, 4, 6); // "quick "
            bob_text.insert(t, 4, "brown ");
        });
        let to = encode_state(&bob).expect("state");
        let authors = HashMap::from([(1, "ann".to_owned()), (2, "bob".to_owned())]);
        let diff = diff(&from, &to, &authors).expect("diff");
        assert_eq!(diff.len(), 1);
        let runs: Vec<(&str, &str, Option<&str>)> = diff[0]
            .runs
            .iter()
            .map(|r| (r.kind, r.text.as_str(), r.author.as_deref()))
            .collect();
        assert_eq!(
            runs,
            vec![
                ("kept", "the ", None),
                ("deleted", "quick ", Some("ann")),
                ("inserted", "brown ", Some("bob")),
                ("kept", "fox", None),
            ]
        );
    }
}
