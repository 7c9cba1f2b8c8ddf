//! The branch's texts against the parent's, each run marked by the change it belongs to, and
//! each change's own diff of each text with the parent's text around it as context.

use std::collections::{BTreeMap, HashMap};

use yrs::types::text::{ChangeKind, YChange};
use yrs::{Out, Text, Transact};

use super::walk::Ranges;
use super::{Change, Replayed, TextView, ViewRun, CONTEXT_CHARS};
use crate::history::{RootKind, Run, TextDiff};

/// The view of every text root of `replayed` (in name order): its branch text (`hi`) against
/// the parent's (`lo`), inserted runs by the change that `owners` says inserted them, deleted
/// parent text by the change that `deleters` says deleted it, naming who wrote it (`authors`).
pub(super) fn text_views(
    replayed: &Replayed,
    kinds: &HashMap<String, RootKind>,
    walked: (&Ranges, &Ranges),
    changes: &[Change],
    authors: &HashMap<u64, String>,
) -> Vec<TextView> {
    let (owners, deleters) = walked;
    let Replayed { doc, lo, hi, .. } = replayed;
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
            text.diff_range(&mut txn, Some(hi), Some(lo), YChange::identity)
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
    view
}

/// Sets each change's `texts` from the views.
pub(super) fn attach_texts(changes: &mut [Change], view: &[TextView]) {
    let mut per_text: Vec<HashMap<i64, TextDiff>> = view.iter().map(change_texts).collect();
    for c in changes.iter_mut() {
        c.texts = per_text
            .iter_mut()
            .filter_map(|texts| texts.remove(&c.id))
            .collect();
    }
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
pub(super) fn change_texts(view: &TextView) -> HashMap<i64, TextDiff> {
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
