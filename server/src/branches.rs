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
use yrs::encoding::read::{Cursor, Read};
use yrs::types::text::{ChangeKind, YChange};
use yrs::updates::decoder::{Decode, Decoder, DecoderV1};
use yrs::{Doc, IdSet, Options, Out, ReadTxn, Text, Transact, Update};

use crate::history::{root_kinds, RootKind, Run, TextDiff};
use crate::storage::branches::{BranchLogRow, Decision, DecisionRow};

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
    /// The other roots (maps, arrays, XML) it touches, summarized.
    pub other_roots: Vec<RootSummary>,
}

/// What a change does to one root that is not a text.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct RootSummary {
    pub root: String,
    /// `map`, `array`, `xml` or `text`.
    pub kind: &'static str,
    pub inserted: i64,
    pub deleted: i64,
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
    /// For each change, every change it needs, directly or through others.
    needs: HashMap<i64, BTreeSet<i64>>,
    /// For each change, its rows.
    rows_of: HashMap<i64, Vec<i64>>,
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

/// One block of an update: the items it inserts and what it refers to.
#[derive(Debug)]
struct Block {
    client: u64,
    start: u32,
    len: u32,
    /// Items it refers to: its origins and its parent item.
    refs: Vec<(u64, u32)>,
    /// Its parent, when named: a root.
    root: Option<String>,
}

/// An update's blocks and deletions.
#[derive(Debug, Default)]
struct Parsed {
    blocks: Vec<Block>,
    deletes: Vec<(u64, u32, u32)>,
}

const HAS_ORIGIN: u8 = 0b1000_0000;
const HAS_RIGHT_ORIGIN: u8 = 0b0100_0000;
const HAS_PARENT_SUB: u8 = 0b0010_0000;
const GC: u8 = 0;
const SKIP: u8 = 10;

fn err(e: impl std::fmt::Display) -> String {
    format!("stored update: {e}")
}

/// The blocks and delete set of a Yjs v1 update, read as yrs reads them.
fn parse_v1(data: &[u8]) -> Result<Parsed, String> {
    let mut d = DecoderV1::new(Cursor::new(data));
    let mut parsed = Parsed::default();
    let clients: u32 = d.read_var().map_err(err)?;
    for _ in 0..clients {
        let blocks: u32 = d.read_var().map_err(err)?;
        let client = d.read_client().map_err(err)?.get();
        let mut clock: u32 = d.read_var().map_err(err)?;
        for _ in 0..blocks {
            let info = d.read_info().map_err(err)?;
            let (len, refs, root) = match info {
                SKIP => (d.read_var::<u32>().map_err(err)?, Vec::new(), None),
                GC => (d.read_len().map_err(err)?, Vec::new(), None),
                info => {
                    let mut refs = Vec::new();
                    if info & HAS_ORIGIN != 0 {
                        let id = d.read_left_id().map_err(err)?;
                        refs.push((id.client.get(), id.clock));
                    }
                    if info & HAS_RIGHT_ORIGIN != 0 {
                        let id = d.read_right_id().map_err(err)?;
                        refs.push((id.client.get(), id.clock));
                    }
                    let mut root = None;
                    if info & (HAS_ORIGIN | HAS_RIGHT_ORIGIN) == 0 {
                        if d.read_parent_info().map_err(err)? {
                            root = Some(d.read_string().map_err(err)?.to_owned());
                        } else {
                            let id = d.read_left_id().map_err(err)?;
                            refs.push((id.client.get(), id.clock));
                        }
                        if info & HAS_PARENT_SUB != 0 {
                            d.read_string().map_err(err)?;
                        }
                    }
                    (content_len(&mut d, info)?, refs, root)
                }
            };
            if info != SKIP {
                parsed.blocks.push(Block {
                    client,
                    start: clock,
                    len,
                    refs,
                    root,
                });
            }
            clock = clock.saturating_add(len);
        }
    }
    let deletes = IdSet::decode(&mut d).map_err(err)?;
    for (client, ranges) in deletes.iter() {
        for range in ranges.iter() {
            parsed.deletes.push((client.get(), range.start, range.end));
        }
    }
    Ok(parsed)
}

/// Reads an item's content, answering its length in clock units (UTF-16 code units of a
/// string, values of a list, one for anything else).
fn content_len(d: &mut DecoderV1, info: u8) -> Result<u32, String> {
    Ok(match info & 0b1111 {
        1 => d.read_len().map_err(err)?,
        2 => {
            let n = d.read_len().map_err(err)?;
            for _ in 0..n {
                d.read_string().map_err(err)?;
            }
            n
        }
        3 => {
            d.read_buf().map_err(err)?;
            1
        }
        4 => d.read_string().map_err(err)?.encode_utf16().count() as u32,
        5 => {
            d.read_json().map_err(err)?;
            1
        }
        6 => {
            d.read_key().map_err(err)?;
            d.read_json().map_err(err)?;
            1
        }
        7 => {
            // A nested type: an XML element carries its name.
            if d.read_type_ref().map_err(err)? == 3 {
                d.read_key().map_err(err)?;
            }
            1
        }
        8 => {
            let n = d.read_len().map_err(err)?;
            for _ in 0..n {
                d.read_any().map_err(err)?;
            }
            n
        }
        9 => {
            d.read_string().map_err(err)?;
            d.read_any().map_err(err)?;
            1
        }
        other => return Err(format!("stored update: unknown content {other}")),
    })
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

/// The branch's review from its log (rows from position 1, in order), decisions and pulls.
pub fn review(
    rows: &[BranchLogRow],
    decisions: &[DecisionRow],
    pulls: &[i64],
    gap_ms: i64,
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

    // Who inserted which items, who deleted which, and which root each item lives in.
    let mut owners = Ranges::default();
    let mut deleters = Ranges::default();
    let mut roots = Ranges::default();
    let mut root_names: Vec<String> = Vec::new();
    let mut parsed: Vec<(i64, Option<usize>, Parsed)> = Vec::with_capacity(rows.len());
    for row in rows {
        let p = parse_v1(&row.data)?;
        let change = change_of_row.get(&row.seq).copied();
        for b in &p.blocks {
            let root = match &b.root {
                Some(name) => Some(match root_names.iter().position(|n| n == name) {
                    Some(i) => i,
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
            }
        }
        if let Some(i) = change {
            for &(client, start, end) in &p.deletes {
                deleters.fill(client, start, end, i);
            }
        }
        parsed.push((row.seq, change, p));
    }

    // What each change needs directly.
    let mut direct: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); changes.len()];
    for (_, change, p) in &parsed {
        let Some(i) = *change else { continue };
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
        }
    }
    let mut needs: HashMap<i64, BTreeSet<i64>> = HashMap::new();
    for i in 0..changes.len() {
        let mut seen: BTreeSet<usize> = BTreeSet::new();
        let mut stack: Vec<usize> = direct[i].iter().copied().collect();
        while let Some(j) = stack.pop() {
            if j != i && seen.insert(j) {
                stack.extend(direct[j].iter().copied());
            }
        }
        needs.insert(changes[i].id, seen.iter().map(|&j| changes[j].id).collect());
        changes[i].depends_on = direct[i].iter().map(|&j| changes[j].id).collect();
    }

    // The parent's content (the base and the parent's changes brought in), then the changes.
    let doc = history_doc();
    let parents = |r: &&BranchLogRow| r.seq == 1 || pulls.contains(&r.seq);
    for row in rows.iter().filter(parents) {
        apply(&doc, &row.data)?;
    }
    let lo = doc.transact().snapshot();
    for row in rows.iter().filter(|r| !parents(r)) {
        apply(&doc, &row.data)?;
    }
    let hi = doc.transact().snapshot();
    // The other roots each change touches.
    let kinds: HashMap<String, RootKind> = root_kinds(&doc).into_iter().collect();
    let mut summaries: Vec<BTreeMap<usize, (i64, i64)>> = vec![BTreeMap::new(); changes.len()];
    for (_, change, p) in &parsed {
        let Some(i) = *change else { continue };
        for b in &p.blocks {
            for (root, n) in roots.overlaps(b.client, b.start, b.start + b.len) {
                summaries[i].entry(root).or_default().0 += i64::from(n);
            }
        }
        for &(client, start, end) in &p.deletes {
            for (root, n) in roots.overlaps(client, start, end) {
                summaries[i].entry(root).or_default().1 += i64::from(n);
            }
        }
    }
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
                })
            })
            .collect();
    }

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
        let mut push = |kind: &'static str, text: &str, change: Option<usize>| {
            let (change, author) = match change {
                Some(i) => (Some(changes[i].id), changes[i].author.clone()),
                None => (None, None),
            };
            match runs.last_mut() {
                Some(last) if last.kind == kind && last.change == change => {
                    last.text.push_str(text)
                }
                _ => runs.push(ViewRun {
                    kind,
                    text: text.to_owned(),
                    change,
                    author,
                }),
            }
        };
        for chunk in chunks {
            let Out::Any(yrs::Any::String(s)) = &chunk.insert else {
                continue; // an embed: not text
            };
            match &chunk.ychange {
                None => push("kept", s, None),
                Some(c) => {
                    let client = c.id.client.get();
                    for (part, start) in split_utf16(s, c.id.clock) {
                        let owner = owners.get(client, start).map(|(o, _)| o);
                        if c.kind == ChangeKind::Added {
                            // Parent content the branch got after its base reads as kept.
                            match owner {
                                Some(o) => push("inserted", part, Some(o)),
                                None => push("kept", part, None),
                            }
                        } else if owner.is_none() {
                            // Deleted text of the parent: deleted by a change, or by the
                            // parent itself (then it is not the branch's to show).
                            if let Some((d, _)) = deleters.get(client, start) {
                                push("deleted", part, Some(d));
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
    for c in changes.iter_mut() {
        c.texts = view.iter().map(|v| change_diff(v, c.id)).collect();
        c.texts.retain(|t| t.runs.iter().any(|r| r.kind != "kept"));
    }
    let rows_of = {
        let mut map: HashMap<i64, Vec<i64>> = HashMap::new();
        for (seq, change, _) in &parsed {
            if let Some(i) = change {
                map.entry(changes[*i].id).or_default().push(*seq);
            }
        }
        map
    };
    Ok(Review {
        changes,
        view,
        needs,
        rows_of,
    })
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

/// One change's diff of a text against the parent: its own insertions and deletions, the
/// parent's text around them as context, other changes' insertions left out.
fn change_diff(view: &TextView, id: i64) -> TextDiff {
    let mut runs: Vec<Run> = Vec::new();
    for r in &view.runs {
        let kind = match (r.kind, r.change) {
            ("inserted", Some(c)) if c == id => "inserted",
            ("deleted", Some(c)) if c == id => "deleted",
            ("inserted", _) => continue,
            _ => "kept",
        };
        match runs.last_mut() {
            Some(last) if last.kind == kind => last.text.push_str(&r.text),
            _ => runs.push(Run {
                kind,
                text: r.text.clone(),
                author: (kind != "kept").then(|| r.author.clone()).flatten(),
            }),
        }
    }
    // Kept text shortened to the context around the change.
    let last = runs.len().saturating_sub(1);
    for (i, run) in runs.iter_mut().enumerate() {
        if run.kind != "kept" {
            continue;
        }
        let chars: Vec<char> = run.text.chars().collect();
        let head = if i == 0 { 0 } else { CONTEXT_CHARS };
        let tail = if i == last { 0 } else { CONTEXT_CHARS };
        if chars.len() > head + tail + 1 {
            let mut text: String = chars[..head].iter().collect();
            text.push('…');
            text.extend(&chars[chars.len() - tail..]);
            run.text = text;
        }
    }
    TextDiff {
        root: view.root.clone(),
        runs,
    }
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

    /// Every change `selected` needs, directly or not, that is neither among them nor merged.
    pub fn missing(&self, selected: &BTreeSet<i64>) -> BTreeSet<i64> {
        selected
            .iter()
            .flat_map(|id| self.needs.get(id).into_iter().flatten())
            .filter(|n| !selected.contains(n))
            .filter(|n| self.change(**n).is_none_or(|c| c.state != "merged"))
            .copied()
            .collect()
    }

    /// The updates merging `selected` applies to the parent, in the branch's order: one per
    /// run of consecutive rows by one author, with that author.
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
            match plan.last_mut() {
                Some((author, parts)) if *author == row.author => parts.push(&row.data),
                _ => plan.push((row.author.clone(), vec![&row.data])),
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
mod tests {
    use super::*;
    use yrs::{GetString, StateVector, WriteTxn};

    fn doc(client: u64) -> Doc {
        Doc::with_options(Options {
            client_id: yrs::ClientID::new(client),
            ..Options::default()
        })
    }

    fn row(seq: i64, data: Vec<u8>, author: &str, at: i64) -> BranchLogRow {
        BranchLogRow {
            seq,
            data,
            author: Some(author.into()),
            created_at: at,
            inserted: 0,
            deleted: 0,
        }
    }

    /// Runs `f` on `d`'s text `content` and returns the update it made.
    fn edit(d: &Doc, f: impl FnOnce(&yrs::TextRef, &mut yrs::TransactionMut)) -> Vec<u8> {
        let before = d.transact().state_vector();
        let text = d.get_or_insert_text("content");
        {
            let mut txn = d.transact_mut();
            f(&text, &mut txn);
        }
        d.transact().encode_diff_v1(&before)
    }

    fn sync(from: &Doc, to: &Doc) {
        let sv = to.transact().state_vector();
        let update = from.transact().encode_diff_v1(&sv);
        to.transact_mut()
            .apply_update(Update::decode_v1(&update).unwrap())
            .unwrap();
    }

    /// A branch whose base says "Hello world", then: alice inserts " dear" (change 2), bob
    /// (another session, another client) deletes "world" and writes "there" (change 3), and
    /// alice, later, deletes part of bob's word (change 4, needing 3, and 2 by her clock).
    fn branch() -> (Vec<BranchLogRow>, Doc) {
        let base = doc(1);
        let u1 = edit(&base, |t, txn| t.insert(txn, 0, "Hello world"));
        let alice = doc(2);
        let bob = doc(3);
        sync(&base, &alice);
        sync(&base, &bob);
        let u2 = edit(&alice, |t, txn| t.insert(txn, 5, " dear"));
        sync(&alice, &bob);
        let u3 = edit(&bob, |t, txn| {
            t.remove_range(txn, 11, 5);
            t.insert(txn, 11, "there");
        });
        sync(&bob, &alice);
        let u4 = edit(&alice, |t, txn| t.remove_range(txn, 13, 2));
        let rows = vec![
            row(1, u1, "owner", 0),
            row(2, u2, "alice", 10),
            row(3, u3, "bob", 20),
            row(4, u4, "alice", 1_000_000),
        ];
        (rows, alice)
    }

    #[test]
    fn changes_are_sessions_by_author_with_their_dependencies() {
        let (rows, alice) = branch();
        let r = review(&rows, &[], &[], 60_000).unwrap();
        let ids: Vec<i64> = r.changes.iter().map(|c| c.id).collect();
        assert_eq!(ids, vec![2, 3, 4]);
        assert_eq!(r.change(2).unwrap().depends_on, Vec::<i64>::new());
        // bob's "there" refers to the base's items only; alice's deletion of part of it
        // needs it.
        assert_eq!(r.change(3).unwrap().depends_on, Vec::<i64>::new());
        assert_eq!(r.change(4).unwrap().depends_on, vec![3]);
        // The view: concatenated kept + inserted runs are the branch's text.
        let text: String = r.view[0]
            .runs
            .iter()
            .filter(|r| r.kind != "deleted")
            .map(|r| r.text.as_str())
            .collect();
        let t = alice.get_or_insert_text("content");
        assert_eq!(text, t.get_string(&alice.transact()));
        let deleted: Vec<(&str, Option<i64>)> = r.view[0]
            .runs
            .iter()
            .filter(|r| r.kind == "deleted")
            .map(|r| (r.text.as_str(), r.change))
            .collect();
        assert_eq!(deleted, vec![("world", Some(3))]);
        let inserted: Vec<(&str, Option<i64>)> = r.view[0]
            .runs
            .iter()
            .filter(|r| r.kind == "inserted")
            .map(|r| (r.text.as_str(), r.change))
            .collect();
        assert_eq!(inserted, vec![(" dear", Some(2)), ("the", Some(3))]);
        // Change 3's own diff: "world" deleted, "there" inserted, the parent's text around.
        let runs: Vec<(&str, &str)> = r.change(3).unwrap().texts[0]
            .runs
            .iter()
            .map(|r| (r.kind, r.text.as_str()))
            .collect();
        assert_eq!(
            runs,
            vec![
                ("kept", "Hello "),
                ("deleted", "world"),
                ("inserted", "the")
            ]
        );
    }

    #[test]
    fn a_merge_of_a_closed_set_applies_cleanly_and_an_open_one_names_what_is_missing() {
        let (rows, _) = branch();
        let r = review(&rows, &[], &[], 60_000).unwrap();
        let only4: BTreeSet<i64> = [4].into();
        assert_eq!(r.missing(&only4), [3].into());
        let only3: BTreeSet<i64> = [3].into();
        assert!(r.missing(&only3).is_empty());
        // The parent: the base, then change 3 alone.
        let parent = doc(9);
        parent
            .transact_mut()
            .apply_update(Update::decode_v1(&rows[0].data).unwrap())
            .unwrap();
        for (_, update) in r.merge_plan(&rows, &only3).unwrap() {
            parent
                .transact_mut()
                .apply_update(Update::decode_v1(&update).unwrap())
                .unwrap();
        }
        assert!(!parent.transact().has_missing_updates());
        let t = parent.get_or_insert_text("content");
        assert_eq!(t.get_string(&parent.transact()), "Hello there");
        // Merged changes no longer count as missing.
        let decided = [DecisionRow {
            change_id: 3,
            last_seq: 3,
            decision: Decision::Merged,
            decided_by: None,
            parent_seq: None,
            created_at: 0,
        }];
        let r = review(&rows, &decided, &[], 60_000).unwrap();
        assert_eq!(r.change(3).unwrap().state, "merged");
        assert!(r.missing(&only4).is_empty());
    }

    #[test]
    fn a_decided_change_keeps_its_rows_and_later_ones_start_another() {
        let (mut rows, _) = branch();
        rows[3].created_at = 15; // alice's second edit within her session
        let r = review(&rows, &[], &[], 60_000).unwrap();
        assert_eq!(r.change(2).unwrap().last_seq, 4);
        let decided = [DecisionRow {
            change_id: 2,
            last_seq: 2,
            decision: Decision::Rejected,
            decided_by: None,
            parent_seq: None,
            created_at: 0,
        }];
        let r = review(&rows, &decided, &[], 60_000).unwrap();
        assert_eq!(r.change(2).unwrap().last_seq, 2);
        assert_eq!(r.change(2).unwrap().state, "rejected");
        assert_eq!(r.change(4).unwrap().state, "open");
    }

    #[test]
    fn parsing_reads_every_block_of_a_real_update() {
        let d = doc(5);
        let map = d.get_or_insert_map("meta");
        let xml = d.get_or_insert_xml_fragment("default");
        {
            let mut txn = d.transact_mut();
            yrs::Map::insert(&map, &mut txn, "k", "v");
            let p = yrs::XmlFragment::push_back(
                &xml,
                &mut txn,
                yrs::XmlElementPrelim::empty("paragraph"),
            );
            yrs::XmlFragment::push_back(&p, &mut txn, yrs::XmlTextPrelim::new("hi 😀"));
            let _ = txn.get_or_insert_text("content");
        }
        let update = d
            .transact()
            .encode_state_as_update_v1(&StateVector::default());
        let parsed = parse_v1(&update).unwrap();
        let total: u32 = parsed.blocks.iter().map(|b| b.len).sum();
        // map entry, paragraph, text node, "hi 😀" (5 UTF-16 units).
        assert_eq!(total, 1 + 1 + 1 + 5);
        assert_eq!(
            parsed.blocks.iter().map(|b| b.start + b.len).max(),
            d.transact()
                .state_vector()
                .get(&yrs::ClientID::new(5))
                .into()
        );
    }
}
