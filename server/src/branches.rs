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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::Serialize;
use yrs::types::text::{ChangeKind, YChange};
use yrs::updates::decoder::Decode;
use yrs::{Doc, Options, Out, ReadTxn, Text, Transact, Update};

use crate::history::{root_kinds, RootKind, Run, TextDiff};
use crate::integrity::{admit, Admission};
use parse::{err, parse_v1};
use yrs::updates::encoder::Encode;

mod parse;
use crate::storage::branches::{BranchLogRow, Decision, DecisionRow};

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

/// An item range `(client, start..end)` mapped to a value, the first mapping of a clock kept.
#[derive(Debug, Default)]
struct Ranges {
    by_client: HashMap<u64, BTreeMap<u32, (u32, usize)>>,
}

impl Ranges {
    /// Maps the clocks of `start..end` not mapped yet to `value`.
    fn fill(&mut self, client: u64, start: u32, end: u32, value: usize) {
        let map = self.by_client.entry(client).or_default();
        let mut at = start;
        while at < end {
            if let Some((_, &(e, _))) = map.range(..=at).next_back().filter(|(_, (e, _))| *e > at) {
                at = e;
                continue;
            }
            let next = map.range(at + 1..).next().map_or(end, |(&s, _)| s.min(end));
            map.insert(at, (next, value));
            at = next;
        }
    }

    fn get(&self, client: u64, clock: u32) -> Option<(usize, u32)> {
        let (_, &(end, value)) = self
            .by_client
            .get(&client)?
            .range(..=clock)
            .next_back()
            .filter(|(_, (e, _))| *e > clock)?;
        Some((value, end))
    }

    /// Each mapped part of `start..end`: its value and length.
    fn overlaps(&self, client: u64, start: u32, end: u32) -> Vec<(usize, u32)> {
        let Some(map) = self.by_client.get(&client) else {
            return Vec::new();
        };
        let from = map.range(..=start).next_back().map_or(start, |(&s, _)| s);
        map.range(from..end)
            .filter_map(|(&s, &(e, v))| {
                let (lo, hi) = (s.max(start), e.min(end));
                (lo < hi).then_some((v, hi - lo))
            })
            .collect()
    }
}

/// The branch's rows grouped into changes: per author, consecutive rows no further apart than
/// `gap_ms`; a decided change keeps the rows it had when decided (later ones start another).
/// Row 1 (the parent's content at the base) and the rows holding the parent's changes are in
/// no change.
fn group(
    rows: &[BranchLogRow],
    pulls: &HashSet<i64>,
    decided: &HashMap<i64, DecisionRow>,
    gap_ms: i64,
) -> Vec<Change> {
    let mut changes: Vec<Change> = Vec::new();
    let mut open: HashMap<Option<String>, usize> = HashMap::new();
    for row in rows.iter().filter(|r| r.seq > 1 && !pulls.contains(&r.seq)) {
        let joins = open.get(&row.author).copied().filter(|&i| {
            let c = &changes[i];
            row.created_at - c.last_at <= gap_ms
                && decided.get(&c.id).is_none_or(|d| row.seq <= d.last_seq)
        });
        let i = match joins {
            Some(i) => i,
            None => {
                changes.push(Change {
                    id: row.seq,
                    author: row.author.clone(),
                    state: match decided.get(&row.seq).map(|d| d.decision) {
                        Some(Decision::Merged) => "merged",
                        Some(Decision::Rejected) => "rejected",
                        None => "open",
                    },
                    first_seq: row.seq,
                    last_seq: row.seq,
                    first_at: row.created_at,
                    last_at: row.created_at,
                    updates: 0,
                    inserted: 0,
                    deleted: 0,
                    depends_on: Vec::new(),
                    decided_by: decided.get(&row.seq).and_then(|d| d.decided_by.clone()),
                    texts: Vec::new(),
                    other_roots: Vec::new(),
                    mergeable: true,
                    unshown: None,
                });
                open.insert(row.author.clone(), changes.len() - 1);
                changes.len() - 1
            }
        };
        let c = &mut changes[i];
        c.last_seq = row.seq;
        c.last_at = row.created_at;
        c.updates += 1;
        c.inserted += row.inserted;
        c.deleted += row.deleted;
    }
    changes
}

/// How many of the branch's changes are open (neither merged nor rejected), from its rows'
/// positions, authors and times alone.
pub fn open_changes(
    rows: &[BranchLogRow],
    decisions: &[DecisionRow],
    pulls: &[i64],
    gap_ms: i64,
) -> i64 {
    let pulls: HashSet<i64> = pulls.iter().copied().collect();
    let decided: HashMap<i64, DecisionRow> =
        decisions.iter().map(|d| (d.change_id, d.clone())).collect();
    group(rows, &pulls, &decided, gap_ms)
        .iter()
        .filter(|c| c.state == "open")
        .count() as i64
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
    let mut changes = group(rows, &pulls, &decided, gap_ms);
    let change_of_row: HashMap<i64, usize> = {
        // The same walk as `group`: a row starts a change or joins its author's open one.
        let starts: HashMap<i64, usize> =
            changes.iter().enumerate().map(|(i, c)| (c.id, i)).collect();
        let mut map = HashMap::new();
        let mut open: HashMap<Option<String>, usize> = HashMap::new();
        for row in rows.iter().filter(|r| r.seq > 1 && !pulls.contains(&r.seq)) {
            if let Some(&i) = starts.get(&row.seq) {
                open.insert(row.author.clone(), i);
            }
            if let Some(&i) = open.get(&row.author) {
                map.insert(row.seq, i);
            }
        }
        map
    };

    // One pass over the rows in order: each row's items can only refer to, follow or delete
    // items of earlier rows, so who inserted them is known when the row is read. Nothing of a
    // row is kept but the ranges it fills.
    let mut owners = Ranges::default();
    let mut deleters = Ranges::default();
    let mut roots = Ranges::default();
    let mut root_names: Vec<String> = Vec::new();
    let mut direct: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); changes.len()];
    let mut summaries: Vec<BTreeMap<usize, (i64, i64)>> = vec![BTreeMap::new(); changes.len()];
    let mut rows_of: HashMap<i64, Vec<i64>> = HashMap::new();
    for row in rows {
        let p = parse_v1(&row.data)?;
        let change = change_of_row.get(&row.seq).copied();
        if let Some(i) = change {
            rows_of.entry(changes[i].id).or_default().push(row.seq);
            let mut need = |owner: Option<(usize, u32)>| {
                if let Some((o, _)) = owner.filter(|(o, _)| *o != i) {
                    direct[i].insert(o);
                }
            };
            for b in &p.blocks {
                for &(c, k) in &b.refs {
                    need(owners.get(c, k));
                }
                if b.start > 0 {
                    need(owners.get(b.client, b.start - 1));
                }
            }
            for &(client, start, end) in &p.deletes {
                for (o, _) in owners.overlaps(client, start, end) {
                    need(Some((o, 0)));
                }
                for (root, n) in roots.overlaps(client, start, end) {
                    summaries[i].entry(root).or_default().1 += i64::from(n);
                }
                deleters.fill(client, start, end, i);
            }
        }
        for b in &p.blocks {
            let root = match &b.root {
                Some(name) => Some(match root_names.iter().position(|n| n == name) {
                    Some(r) => r,
                    None => {
                        root_names.push(name.clone());
                        root_names.len() - 1
                    }
                }),
                None => b
                    .refs
                    .iter()
                    .find_map(|&(c, k)| roots.get(c, k).map(|(r, _)| r)),
            };
            if let Some(root) = root {
                roots.fill(b.client, b.start, b.start + b.len, root);
            }
            if let Some(i) = change {
                owners.fill(b.client, b.start, b.start + b.len, i);
                if let Some(root) = root {
                    summaries[i].entry(root).or_default().0 += i64::from(b.len);
                }
            }
        }
    }
    for (i, d) in direct.iter().enumerate() {
        changes[i].depends_on = d.iter().map(|&j| changes[j].id).collect();
    }

    // The parent's content (the base and the parent's changes brought in), then the changes.
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
    // The other roots each change touches.
    let kinds: HashMap<String, RootKind> = root_kinds(&doc).into_iter().collect();
    for (i, summary) in summaries.into_iter().enumerate() {
        changes[i].other_roots = summary
            .into_iter()
            .filter_map(|(root, (inserted, deleted))| {
                let name = root_names.get(root)?;
                let kind = match kinds.get(name) {
                    Some(RootKind::Text) => return None,
                    Some(RootKind::Map) => "map",
                    Some(RootKind::Array) => "array",
                    Some(RootKind::Xml) => "xml",
                    None => "text",
                };
                Some(RootSummary {
                    root: name.clone(),
                    kind,
                    inserted,
                    deleted,
                    before: None,
                    after: None,
                })
            })
            .collect();
    }
    let mut review = Review {
        changes,
        view: Vec::new(),
        direct,
        rows_of,
        cut_rows,
    };
    review.show_effects(rows, &lo_state)?;
    let Review {
        mut changes,
        direct,
        rows_of,
        cut_rows,
        ..
    } = review;

    // The branch's texts against the parent's, each run marked by its change.
    let mut texts: Vec<&String> = kinds
        .iter()
        .filter(|(_, k)| **k == RootKind::Text)
        .map(|(n, _)| n)
        .collect();
    texts.sort();
    let mut view = Vec::new();
    for name in texts {
        let text = doc.get_or_insert_text(name.as_str());
        let chunks = {
            let mut txn = doc.transact_mut();
            text.diff_range(&mut txn, Some(&hi), Some(&lo), YChange::identity)
        };
        let mut runs: Vec<ViewRun> = Vec::new();
        let mut push =
            |kind: &'static str, text: &str, change: Option<usize>, of: Option<&String>| {
                let (change, author) = match change {
                    Some(i) => (Some(changes[i].id), changes[i].author.clone()),
                    None => (None, None),
                };
                let of = of.cloned();
                match runs.last_mut() {
                    Some(last) if last.kind == kind && last.change == change && last.of == of => {
                        last.text.push_str(text)
                    }
                    _ => runs.push(ViewRun {
                        kind,
                        text: text.to_owned(),
                        change,
                        author,
                        of,
                    }),
                }
            };
        for chunk in chunks {
            let Out::Any(yrs::Any::String(s)) = &chunk.insert else {
                continue; // an embed: not text
            };
            match &chunk.ychange {
                None => push("kept", s, None, None),
                Some(c) => {
                    let client = c.id.client.get();
                    for (part, start) in split_utf16(s, c.id.clock) {
                        let owner = owners.get(client, start).map(|(o, _)| o);
                        if c.kind == ChangeKind::Added {
                            // Parent content the branch got after its base reads as kept.
                            match owner {
                                Some(o) => push("inserted", part, Some(o), None),
                                None => push("kept", part, None, None),
                            }
                        } else if owner.is_none() {
                            // Deleted text of the parent: deleted by a change, or by the
                            // parent itself (then it is not the branch's to show).
                            if let Some((d, _)) = deleters.get(client, start) {
                                push("deleted", part, Some(d), authors.get(&client));
                            }
                        }
                    }
                }
            }
        }
        view.push(TextView {
            root: name.clone(),
            runs,
        });
    }
    let mut per_text: Vec<HashMap<i64, TextDiff>> = view.iter().map(change_texts).collect();
    for c in changes.iter_mut() {
        c.texts = per_text
            .iter_mut()
            .filter_map(|texts| texts.remove(&c.id))
            .collect();
    }
    Ok(Review {
        changes,
        view,
        direct,
        rows_of,
        cut_rows,
    })
}

/// The part of `before` and `after` that differs, with up to [`CONTEXT_CHARS`] characters of
/// what they share on each side (`…` where more was cut).
fn changed_part(before: &str, after: &str) -> (String, String) {
    let (b, a): (Vec<char>, Vec<char>) = (before.chars().collect(), after.chars().collect());
    let prefix = b.iter().zip(&a).take_while(|(x, y)| x == y).count();
    let suffix = b[prefix..]
        .iter()
        .rev()
        .zip(a[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let from = prefix.saturating_sub(CONTEXT_CHARS);
    let cut = |s: &[char]| {
        let to = (s.len() - suffix + CONTEXT_CHARS).min(s.len());
        let mut out = String::new();
        if from > 0 {
            out.push('…');
        }
        out.extend(&s[from..to]);
        if to < s.len() {
            out.push('…');
        }
        out
    };
    (cut(&b), cut(&a))
}

/// `text`, starting at clock `start`, cut where the clock could change owner: one piece per
/// character, merged again by the caller's run building.
fn split_utf16(text: &str, start: u32) -> Vec<(&str, u32)> {
    let mut out = Vec::with_capacity(text.len());
    let mut clock = start;
    let mut from = 0;
    for (i, _) in text.char_indices().skip(1) {
        let width = text[from..i].encode_utf16().count() as u32;
        out.push((&text[from..i], clock));
        clock += width;
        from = i;
    }
    if from < text.len() {
        out.push((&text[from..], clock));
    }
    out
}

/// Runs a context walk looks at, at most, on each side of a change's run.
const CONTEXT_RUNS: usize = 1000;

/// Whether a run of the branch's view is parent text as change `id` sees it: kept text, or
/// parent text another change deleted.
fn parent_text(run: &ViewRun, id: i64) -> bool {
    run.kind == "kept" || (run.kind == "deleted" && run.change != Some(id))
}

/// The parent's text next to run `at` as change `id` sees it, at most `CONTEXT_CHARS`
/// characters, walking forward up to `stop` (excluded) or backward down to `stop` (included)
/// through at most `CONTEXT_RUNS` runs, and stopping at the change's own runs; and whether
/// there is more beyond.
fn context(runs: &[ViewRun], at: usize, forward: bool, stop: usize, id: i64) -> (String, bool) {
    let mut pieces: Vec<&str> = Vec::new();
    let mut chars = 0;
    let mut i = at;
    for _ in 0..CONTEXT_RUNS {
        let next = if forward {
            (i + 1 < stop).then_some(i + 1)
        } else {
            (i > stop).then(|| i - 1)
        };
        let Some(n) = next else {
            return (join(pieces, forward), false);
        };
        i = n;
        let run = &runs[i];
        if run.change == Some(id) {
            return (join(pieces, forward), false);
        }
        if !parent_text(run, id) {
            continue;
        }
        let len = run.text.chars().count();
        if chars + len >= CONTEXT_CHARS {
            let take = CONTEXT_CHARS - chars;
            let piece = if forward {
                let end = run
                    .text
                    .char_indices()
                    .nth(take)
                    .map_or(run.text.len(), |(b, _)| b);
                &run.text[..end]
            } else {
                let start = run
                    .text
                    .char_indices()
                    .nth(len - take)
                    .map_or(0, |(b, _)| b);
                &run.text[start..]
            };
            pieces.push(piece);
            let beyond = if forward { i + 1 < stop } else { i > stop };
            return (join(pieces, forward), chars + len > CONTEXT_CHARS || beyond);
        }
        chars += len;
        pieces.push(&run.text);
    }
    (join(pieces, forward), true)
}

fn join(mut pieces: Vec<&str>, forward: bool) -> String {
    if !forward {
        pieces.reverse();
    }
    pieces.concat()
}

/// Each change's diff of one text against the parent: its own insertions and deletions, the
/// parent's text around them as context (cut with `…`), other changes' insertions left out.
/// One pass over the view, then a bounded walk around each of a change's runs.
fn change_texts(view: &TextView) -> HashMap<i64, TextDiff> {
    let runs = &view.runs;
    let mut own: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    for (i, r) in runs.iter().enumerate() {
        if let (Some(c), "inserted" | "deleted") = (r.change, r.kind) {
            own.entry(c).or_default().push(i);
        }
    }
    let mut out = HashMap::new();
    for (id, indices) in own {
        let mut diff: Vec<Run> = Vec::new();
        let mut push = |kind: &'static str, text: &str, author: Option<String>| {
            if text.is_empty() {
                return;
            }
            match diff.last_mut() {
                Some(last) if last.kind == kind => last.text.push_str(text),
                _ => diff.push(Run {
                    kind,
                    text: text.to_owned(),
                    author,
                }),
            }
        };
        let mut prev: Option<usize> = None;
        for &i in &indices {
            match prev {
                // Between two runs of the change: all of the parent's text if short, else
                // both ends.
                Some(p) => {
                    let (head, more) = context(runs, p, true, i, id);
                    if more {
                        let (tail, _) = context(runs, i, false, p + 1, id);
                        push("kept", &format!("{head}…{tail}"), None);
                    } else {
                        push("kept", &head, None);
                    }
                }
                None => {
                    let (tail, more) = context(runs, i, false, 0, id);
                    let tail = if more { format!("…{tail}") } else { tail };
                    push("kept", &tail, None);
                }
            }
            let r = &runs[i];
            // A deleted run names who wrote the text it deletes, as history diffs do.
            let author = if r.kind == "deleted" {
                r.of.clone()
            } else {
                r.author.clone()
            };
            push(r.kind, &r.text, author);
            prev = Some(i);
        }
        if let Some(p) = prev {
            let (head, more) = context(runs, p, true, runs.len(), id);
            let head = if more { format!("{head}…") } else { head };
            push("kept", &head, None);
        }
        out.insert(
            id,
            TextDiff {
                root: view.root.clone(),
                runs: diff,
            },
        );
    }
    out
}

impl Review {
    /// Each change's effect on the roots that are not texts: the parent's content with the
    /// change's open dependencies (`lo_state` and their rows), then with the change's rows,
    /// each touched root's JSON compared. At most [`EFFECT_REPLAY_BYTES`] replayed in all.
    fn show_effects(&mut self, rows: &[BranchLogRow], lo_state: &[u8]) -> Result<(), String> {
        let by_seq: HashMap<i64, &BranchLogRow> = rows.iter().map(|r| (r.seq, r)).collect();
        let mut spent = 0usize;
        for i in 0..self.changes.len() {
            if self.changes[i].other_roots.is_empty() || !self.changes[i].mergeable {
                continue;
            }
            let id = self.changes[i].id;
            let mut deps: Vec<i64> = self
                .missing(&[id].into())
                .into_iter()
                .flat_map(|d| self.rows_of.get(&d).cloned().unwrap_or_default())
                .collect();
            deps.sort_unstable();
            let own = self.rows_of.get(&id).cloned().unwrap_or_default();
            let data = |seq: &i64| -> Option<&[u8]> {
                self.cut_rows
                    .get(seq)
                    .map(Vec::as_slice)
                    .or_else(|| by_seq.get(seq).map(|r| r.data.as_slice()))
            };
            let cost = lo_state.len()
                + deps
                    .iter()
                    .chain(&own)
                    .filter_map(data)
                    .map(<[u8]>::len)
                    .sum::<usize>();
            spent += cost;
            if spent > EFFECT_REPLAY_BYTES {
                let c = &mut self.changes[i];
                c.mergeable = false;
                c.unshown = Some(
                    "its effect on roots that are not texts was not computed (the review's \
                     budget); decide other changes first"
                        .into(),
                );
                continue;
            }
            let doc = Doc::new();
            apply(&doc, lo_state)?;
            for seq in &deps {
                if let Some(d) = data(seq) {
                    apply(&doc, d)?;
                }
            }
            let before = crate::history::doc_json(&doc);
            for seq in &own {
                if let Some(d) = data(seq) {
                    apply(&doc, d)?;
                }
            }
            let after = crate::history::doc_json(&doc);
            for summary in &mut self.changes[i].other_roots {
                let text = |v: &serde_json::Value| match v.get(&summary.root) {
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(v) => v.to_string(),
                    None => String::new(),
                };
                let (b, a) = changed_part(&text(&before), &text(&after));
                summary.before = Some(b);
                summary.after = Some(a);
            }
        }
        Ok(())
    }

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
