//! What a change does to the roots that are not texts: units inserted and deleted per root,
//! and the part of each root's content it changes, before and after.

use std::collections::{BTreeMap, HashMap};

use yrs::Doc;

use super::{apply, Change, Review, RootSummary, CONTEXT_CHARS, EFFECT_REPLAY_BYTES};
use crate::history::RootKind;
use crate::storage::branches::BranchLogRow;

/// Sets each change's `other_roots` from its per-root counts (`summaries`, by index into
/// `root_names`), leaving out the text roots (`kinds`: the roots of the branch's content).
pub(super) fn other_roots(
    changes: &mut [Change],
    summaries: Vec<BTreeMap<usize, (i64, i64)>>,
    root_names: &[String],
    kinds: &HashMap<String, RootKind>,
) {
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
}

impl Review {
    /// Each change's effect on the roots that are not texts: the parent's content with the
    /// change's open dependencies (`lo_state` and their rows), then with the change's rows,
    /// each touched root's JSON compared. At most [`EFFECT_REPLAY_BYTES`] replayed in all.
    pub(super) fn show_effects(
        &mut self,
        rows: &[BranchLogRow],
        lo_state: &[u8],
    ) -> Result<(), String> {
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
