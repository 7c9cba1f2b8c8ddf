//! A branch's review, computed from its log (docs/branches.md): the rows grouped into changes
//! (an author's editing session), which change needs which, each change's diff against the
//! parent, the branch's text with every run marked by its change, and the updates a merge of
//! some changes applies to the parent.
//!
//! Dependencies come from the updates themselves: each Yjs item names the items it was
//! inserted between (its origins) and its parent, and each delete set names the items it
//! deletes. A change needs another when one of its items refers to an item the other inserted,
//! when it deletes such an item, or when it continues the other's client clock (a Yjs client
//! holds back an update whose clock does not follow on). Merging a set of changes closed under
//! these needs applies cleanly: nothing is held back as pending, on yrs or Yjs.
//!
//! Everything here works on bytes read from storage: no I/O.

mod effects;
mod group;
mod parse;
mod view;
mod walk;

use std::collections::{BTreeSet, HashMap, HashSet};

use serde::Serialize;
use yrs::updates::decoder::Decode;
use yrs::updates::encoder::Encode;
use yrs::{Doc, Options, ReadTxn, Snapshot, Transact, Update};

pub use group::open_changes;
use group::{group, Grouping};
use parse::err;

use crate::history::{root_kinds, RootKind, TextDiff};
use crate::integrity::{admit, Admission};
use crate::storage::branches::{BranchLogRow, DecisionRow};

/// Most branch rows merged into one update a merge applies to the parent.
const MERGE_CHUNK_ROWS: usize = 1000;
/// Most bytes of branch rows merged into one such update.
const MERGE_CHUNK_BYTES: usize = 1 << 20;

/// Kept text shown around a change in its diff, in characters on each side.
const CONTEXT_CHARS: usize = 40;

/// One change: rows of one author within a session.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct Change {
    /// The branch log position the change starts at (stable: later rows only add to it).
    pub id: i64,
    pub author: Option<String>,
    /// `open`, `merged` or `rejected`.
    pub state: &'static str,
    pub first_seq: i64,
    pub last_seq: i64,
    /// Milliseconds since the Unix epoch.
    pub first_at: i64,
    pub last_at: i64,
    pub updates: i64,
    /// Content units (characters, elements, entries) inserted and deleted.
    pub inserted: i64,
    pub deleted: i64,
    /// The changes this one needs merged with it (or before it).
    pub depends_on: Vec<i64>,
    /// Who merged or rejected it.
    pub decided_by: Option<String>,
    /// Per text root, the change against the parent: kept context, inserted and deleted runs.
    pub texts: Vec<TextDiff>,
    /// The other roots (maps, arrays, XML) it touches: counts, and the part of each root's
    /// content it changes, before and after.
    pub other_roots: Vec<RootSummary>,
    /// Whether it may be merged: `false` when it has an effect the review cannot show (a row
    /// that depends on content the branch never held, or effects past the review's budget);
    /// `unshown` says which.
    pub mergeable: bool,
    pub unshown: Option<String>,
}

/// What a change does to one root that is not a text.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct RootSummary {
    pub root: String,
    /// `map`, `array`, `xml` or `text`.
    pub kind: &'static str,
    pub inserted: i64,
    pub deleted: i64,
    /// The root's content as JSON text (XML as markup) where the change alters it, with up
    /// to 40 characters of context each side (`…` where cut): as the parent holds it with the
    /// changes this one depends on, and with this one applied too. `null` when not computed
    /// (then the change is not mergeable).
    pub before: Option<String>,
    pub after: Option<String>,
}

/// One run of the branch's text.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ViewRun {
    /// `kept`, `inserted` or `deleted`.
    pub kind: &'static str,
    pub text: String,
    /// The change the run belongs to (`null` for kept text).
    pub change: Option<i64>,
    pub author: Option<String>,
    /// For a deleted run: who wrote the text it deletes (`null` if unknown).
    pub of: Option<String>,
}

/// The branch's text of one root against the parent's: the `kept` and `inserted` runs are the
/// branch's text; the `deleted` runs are text the branch removed, at their place.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct TextView {
    pub root: String,
    pub runs: Vec<ViewRun>,
}

/// An update (Yjs v1) and who wrote it.
pub type AuthoredUpdate = (Option<String>, Vec<u8>);

/// A branch's review.
#[derive(Debug, Clone, Default)]
pub struct Review {
    pub changes: Vec<Change>,
    pub view: Vec<TextView>,
    /// For each change (by index), the changes it needs directly.
    direct: Vec<BTreeSet<usize>>,
    /// For each change, its rows.
    rows_of: HashMap<i64, Vec<i64>>,
    /// Rows whose deletions of content the branch never held were cut: what merging them
    /// applies (the parent gets exactly what the review showed).
    cut_rows: HashMap<i64, Vec<u8>>,
}

/// A document that keeps deleted content, so a snapshot diff can show it.
fn history_doc() -> Doc {
    Doc::with_options(Options {
        skip_gc: true,
        ..Options::default()
    })
}

fn apply(doc: &Doc, data: &[u8]) -> Result<(), String> {
    let update = Update::decode_v1(data).map_err(err)?;
    doc.transact_mut().apply_update(update).map_err(err)
}

/// Most bytes of replayed content the review spends showing changes' effects on roots that
/// are not texts (each such change replays the parent's content with it): changes past it are
/// shown without them and cannot be merged until the others are decided.
const EFFECT_REPLAY_BYTES: usize = 64 << 20;

/// The branch's review from its log (rows from position 1, in order), decisions and pulls,
/// without knowing who wrote the parent's text.
pub fn review(
    rows: &[BranchLogRow],
    decisions: &[DecisionRow],
    pulls: &[i64],
    gap_ms: i64,
) -> Result<Review, String> {
    review_with(rows, decisions, pulls, gap_ms, &HashMap::new())
}

/// [`review`], with who wrote each client's items (`authors`: the parent's and the branch's
/// `doc_clients`), for the deleted runs' `of`.
pub fn review_with(
    rows: &[BranchLogRow],
    decisions: &[DecisionRow],
    pulls: &[i64],
    gap_ms: i64,
    authors: &HashMap<u64, String>,
) -> Result<Review, String> {
    let pulls: HashSet<i64> = pulls.iter().copied().collect();
    let decided: HashMap<i64, DecisionRow> =
        decisions.iter().map(|d| (d.change_id, d.clone())).collect();
    let Grouping {
        mut changes,
        change_of_row,
    } = group(rows, &pulls, &decided, gap_ms);
    let walked = walk::walk(rows, &change_of_row, &mut changes)?;
    let mut replayed = replay(rows, &pulls, &change_of_row, &mut changes)?;
    let kinds: HashMap<String, RootKind> = root_kinds(&replayed.doc).into_iter().collect();
    effects::other_roots(&mut changes, walked.summaries, &walked.root_names, &kinds);
    let mut review = Review {
        changes,
        view: Vec::new(),
        direct: walked.direct,
        rows_of: walked.rows_of,
        cut_rows: std::mem::take(&mut replayed.cut_rows),
    };
    review.show_effects(rows, &replayed.lo_state)?;
    review.view = view::text_views(
        &replayed,
        &kinds,
        (&walked.owners, &walked.deleters),
        &review.changes,
        authors,
    );
    view::attach_texts(&mut review.changes, &review.view);
    Ok(review)
}

/// The branch's content replayed: the parent's (the base and the parent's changes brought
/// in), then the changes'.
struct Replayed {
    doc: Doc,
    /// The parent's content, as a snapshot and as an update.
    lo: Snapshot,
    lo_state: Vec<u8>,
    /// The branch's content.
    hi: Snapshot,
    /// Rows whose deletions of content the branch never held were cut, as applied.
    cut_rows: HashMap<i64, Vec<u8>>,
}

/// Replays `rows`; a change whose row does not integrate is marked not mergeable.
fn replay(
    rows: &[BranchLogRow],
    pulls: &HashSet<i64>,
    change_of_row: &HashMap<i64, usize>,
    changes: &mut [Change],
) -> Result<Replayed, String> {
    let doc = history_doc();
    let parents = |r: &&BranchLogRow| r.seq == 1 || pulls.contains(&r.seq);
    for row in rows.iter().filter(parents) {
        apply(&doc, &row.data)?;
    }
    let lo = doc.transact().snapshot();
    let lo_state = doc
        .transact()
        .encode_state_as_update_v1(&yrs::StateVector::default());
    // The changes' rows pass the check every update entering a document passes
    // (`room::integrity`): a row that does not integrate is not applied and its change cannot
    // be merged; deletions of content the branch never held are cut, here and in the merge.
    let mut cut_rows = HashMap::new();
    for row in rows.iter().filter(|r| !parents(r)) {
        let mut update = Update::decode_v1(&row.data).map_err(err)?;
        let sv = doc.transact().state_vector();
        match admit(&sv, &mut update) {
            Admission::Missing(missing) => {
                if let Some(&i) = change_of_row.get(&row.seq) {
                    changes[i].mergeable = false;
                    changes[i].unshown = Some(format!(
                        "row {} depends on content the branch never held (client {}, clock {})",
                        row.seq, missing.client, missing.clock
                    ));
                }
                continue;
            }
            Admission::Integrates { cut: Some(_) } => {
                cut_rows.insert(row.seq, update.encode_v1());
            }
            Admission::Integrates { cut: None } => {}
        }
        doc.transact_mut().apply_update(update).map_err(err)?;
    }
    let hi = doc.transact().snapshot();
    Ok(Replayed {
        doc,
        lo,
        lo_state,
        hi,
        cut_rows,
    })
}

impl Review {
    /// The change with this id.
    pub fn change(&self, id: i64) -> Option<&Change> {
        // Ids are the changes' first positions, in order.
        self.changes
            .binary_search_by_key(&id, |c| c.id)
            .ok()
            .and_then(|i| self.changes.get(i))
    }

    /// Every change `selected` needs, directly or not, that is neither among them nor merged
    /// (a walk from the selected changes: the transitive needs are never stored).
    pub fn missing(&self, selected: &BTreeSet<i64>) -> BTreeSet<i64> {
        let index = |id: &i64| self.changes.binary_search_by_key(id, |c| c.id).ok();
        let mut seen: BTreeSet<usize> = selected.iter().filter_map(index).collect();
        let mut stack: Vec<usize> = seen.iter().copied().collect();
        let mut missing = BTreeSet::new();
        while let Some(i) = stack.pop() {
            for &j in self.direct.get(i).into_iter().flatten() {
                if seen.insert(j) {
                    let c = &self.changes[j];
                    if !selected.contains(&c.id) && c.state != "merged" {
                        missing.insert(c.id);
                    }
                    stack.push(j);
                }
            }
        }
        missing
    }

    /// The updates merging `selected` applies to the parent, in the branch's order: one per
    /// run of consecutive rows by one author (at most `MERGE_CHUNK_ROWS` rows and
    /// `MERGE_CHUNK_BYTES` each: merging many updates into one costs more than linear time, and
    /// the parent's typists wait behind each), with that author.
    pub fn merge_plan(
        &self,
        rows: &[BranchLogRow],
        selected: &BTreeSet<i64>,
    ) -> Result<Vec<AuthoredUpdate>, String> {
        let mut seqs: Vec<i64> = selected
            .iter()
            .flat_map(|id| self.rows_of.get(id).into_iter().flatten())
            .copied()
            .collect();
        seqs.sort_unstable();
        let by_seq: HashMap<i64, &BranchLogRow> = rows.iter().map(|r| (r.seq, r)).collect();
        let mut plan: Vec<(Option<String>, Vec<&[u8]>)> = Vec::new();
        for seq in seqs {
            let Some(row) = by_seq.get(&seq) else {
                return Err(format!("branch row {seq} is missing"));
            };
            // What the review showed: a row's deletions of content the branch never held cut.
            let data: &[u8] = self.cut_rows.get(&seq).unwrap_or(&row.data);
            match plan.last_mut() {
                Some((author, parts))
                    if *author == row.author
                        && parts.len() < MERGE_CHUNK_ROWS
                        && parts.iter().map(|p| p.len()).sum::<usize>() + data.len()
                            <= MERGE_CHUNK_BYTES =>
                {
                    parts.push(data)
                }
                _ => plan.push((row.author.clone(), vec![data])),
            }
        }
        plan.into_iter()
            .map(|(author, parts)| {
                yrs::merge_updates_v1(&parts)
                    .map(|u| (author, u))
                    .map_err(err)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
