//! The branch's rows grouped into changes, in one walk that also records each row's change.

use std::collections::{HashMap, HashSet};

use super::Change;
use crate::storage::branches::{BranchLogRow, Decision, DecisionRow};

/// The changes, in order of their first rows, and the change (by index) of each row that is
/// in one.
pub(super) struct Grouping {
    pub changes: Vec<Change>,
    pub change_of_row: HashMap<i64, usize>,
}

/// The branch's rows grouped into changes: per author, consecutive rows no further apart than
/// `gap_ms`; a decided change keeps the rows it had when decided (later ones start another).
/// Row 1 (the parent's content at the base) and the rows holding the parent's changes are in
/// no change.
pub(super) fn group(
    rows: &[BranchLogRow],
    pulls: &HashSet<i64>,
    decided: &HashMap<i64, DecisionRow>,
    gap_ms: i64,
) -> Grouping {
    let mut changes: Vec<Change> = Vec::new();
    let mut change_of_row = HashMap::new();
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
        change_of_row.insert(row.seq, i);
        let c = &mut changes[i];
        c.last_seq = row.seq;
        c.last_at = row.created_at;
        c.updates += 1;
        c.inserted += row.inserted;
        c.deleted += row.deleted;
    }
    Grouping {
        changes,
        change_of_row,
    }
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
        .changes
        .iter()
        .filter(|c| c.state == "open")
        .count() as i64
}
