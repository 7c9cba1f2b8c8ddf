//! The one pass over a branch's rows that finds, from the updates themselves, which change
//! needs which, what each inserts into and deletes from which root, and who inserted and who
//! deleted each item.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::parse::parse_v1;
use super::Change;
use crate::storage::branches::BranchLogRow;

/// An item range `(client, start..end)` mapped to a value, the first mapping of a clock kept.
#[derive(Debug, Default)]
pub(super) struct Ranges {
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

    pub(super) fn get(&self, client: u64, clock: u32) -> Option<(usize, u32)> {
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

/// What the walk found.
pub(super) struct Walked {
    /// Which change (by index) inserted each item, and which deleted it.
    pub owners: Ranges,
    pub deleters: Ranges,
    /// For each change, the changes it needs directly.
    pub direct: Vec<BTreeSet<usize>>,
    /// For each change, per root (an index into `root_names`): units inserted and deleted.
    pub summaries: Vec<BTreeMap<usize, (i64, i64)>>,
    pub root_names: Vec<String>,
    /// For each change (by id), its rows.
    pub rows_of: HashMap<i64, Vec<i64>>,
}

/// Walks `rows` (from position 1, in order), each in the change `change_of_row` gives it, and
/// sets each change's `depends_on`.
pub(super) fn walk(
    rows: &[BranchLogRow],
    change_of_row: &HashMap<i64, usize>,
    changes: &mut [Change],
) -> Result<Walked, String> {
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
    Ok(Walked {
        owners,
        deleters,
        direct,
        summaries,
        root_names,
        rows_of,
    })
}
