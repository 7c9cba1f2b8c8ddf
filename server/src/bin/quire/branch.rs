//! `quire branch ...`: branches of a document through a running server's REST API (the routes
//! of docs/branches.md, the ones the web editor uses): create one, list them, review a
//! branch's changes, merge all or some of them into the parent, reject one, bring the parent's
//! changes in, close it. The server and the credential are found as for `quire history`.

use anyhow::bail;
use clap::Subcommand;
use serde_json::{json, Value};

use crate::history::{time, Api};

#[derive(Subcommand)]
pub enum BranchCommand {
    /// Create NAME as a branch of PARENT: its content now, at a version or at a log position
    Create {
        parent: String,
        name: String,
        /// Start from this version of the parent
        #[arg(long, conflicts_with = "position")]
        version: Option<i64>,
        /// Start from this log position of the parent
        #[arg(long)]
        position: Option<i64>,
        /// The branch's title
        #[arg(long, default_value = "")]
        title: String,
    },
    /// List PARENT's branches: state, author, base, changes ahead and behind
    List { parent: String },
    /// A branch's changes for review: author, state, size, dependencies and text diff
    Changes { branch: String },
    /// Merge a branch's changes into its parent (every open one unless --change names some).
    /// Each is merged as far as the review showed it: ID@LAST_SEQ names the last position
    /// reviewed (`quire branch changes` prints it), and the server refuses a change that has
    /// grown since; a plain ID is named as the change list shows it now (printed first)
    Merge {
        branch: String,
        /// A change to merge, ID or ID@LAST_SEQ (repeat for several)
        #[arg(long = "change", value_name = "ID[@LAST_SEQ]", value_parser = parse_change)]
        changes: Vec<(i64, Option<i64>)>,
    },
    /// Reject a change of a branch: it will never be merged
    Reject { branch: String, id: i64 },
    /// Bring the parent's changes since the branch's base (or last update) into the branch
    UpdateFromParent { branch: String },
    /// Close a branch: nothing more is merged from it; its content and history stay
    Close { branch: String },
}

/// `quire branch ...`.
pub async fn branch(api: &Api, command: BranchCommand) -> anyhow::Result<()> {
    match command {
        BranchCommand::Create {
            parent,
            name,
            version,
            position,
            title,
        } => {
            let from = match (version, position) {
                (Some(v), _) => json!({ "version": v }),
                (None, Some(p)) => json!({ "position": p }),
                (None, None) => Value::Null,
            };
            let mut body = json!({ "name": name, "title": title });
            if !from.is_null() {
                body["from"] = from;
            }
            let b = api.post(&parent, "/branches", Some(body)).await?.ok()?;
            println!(
                "branch {} of {} from position {}",
                str_of(&b["name"]),
                str_of(&b["parent"]),
                b["base_seq"]
            );
        }
        BranchCommand::List { parent } => {
            let list = api.get(&parent, "/branches").await?.ok()?;
            let branches = list["branches"].as_array().cloned().unwrap_or_default();
            if branches.is_empty() {
                println!("no branches of {parent}");
            }
            for b in branches {
                println!("{}", branch_line(&b));
            }
        }
        BranchCommand::Changes { branch } => {
            let list = api.get(&branch, "/changes").await?.ok()?;
            let b = &list["branch"];
            println!(
                "branch {} of {}: {}",
                str_of(&b["name"]),
                str_of(&b["parent"]),
                branch_summary(b)
            );
            let changes = list["changes"].as_array().cloned().unwrap_or_default();
            if changes.is_empty() {
                println!("no changes");
            }
            for c in changes {
                print!("{}", change_lines(&c));
            }
        }
        BranchCommand::Merge { branch, changes } => {
            let named = reviewed(api, &branch, &changes).await?;
            let changes: Vec<i64> = named.iter().map(|(id, _)| *id).collect();
            let seen: Vec<Value> = named
                .iter()
                .map(|(id, last)| json!({"id": id, "last_seq": last}))
                .collect();
            let answer = api
                .post(&branch, "/merge", Some(json!({ "changes": seen })))
                .await?;
            if answer.status == reqwest::StatusCode::CONFLICT
                && answer.problem() == "missing-dependencies"
            {
                let missing = ids(&answer.body["current"]["missing"]);
                let mut all: Vec<i64> = changes.clone();
                all.extend(
                    answer.body["current"]["missing"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_i64),
                );
                all.sort_unstable();
                all.dedup();
                let again: Vec<String> = all.iter().map(|id| format!("--change {id}")).collect();
                bail!(
                    "nothing merged: the chosen changes depend on changes not chosen: {missing}\n\
                     merge them with it: quire branch merge {branch} {}",
                    again.join(" ")
                );
            }
            let m = answer.ok()?;
            let merged = ids(&m["merged"]);
            if m["merged"].as_array().is_none_or(Vec::is_empty) {
                println!("nothing to merge from {branch}");
            } else {
                println!(
                    "merged changes {merged} of {branch} into the parent at position {} \
                     (versions {} before, {} after)",
                    m["parent_seq"], m["version_before"]["id"], m["version_after"]["id"]
                );
            }
            if m["already_merged"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
            {
                println!("already merged: {}", ids(&m["already_merged"]));
            }
        }
        BranchCommand::Reject { branch, id } => {
            let c = api
                .post(&branch, &format!("/changes/{id}/reject"), None)
                .await?
                .ok()?;
            println!(
                "rejected change {} of {branch} ({}, +{} -{})",
                c["id"],
                c["author"].as_str().unwrap_or("(unknown)"),
                c["inserted"],
                c["deleted"]
            );
        }
        BranchCommand::UpdateFromParent { branch } => {
            let p = api.post(&branch, "/update-from-parent", None).await?.ok()?;
            if p["seq"].is_null() {
                println!(
                    "{branch} already has the parent's changes up to its position {}",
                    p["parent_seq"]
                );
            } else {
                println!(
                    "brought the parent's changes up to its position {} into {branch} at \
                     position {}",
                    p["parent_seq"], p["seq"]
                );
            }
        }
        BranchCommand::Close { branch } => {
            let b = api.post(&branch, "/close", None).await?.ok()?;
            println!("{}", branch_line(&b));
        }
    }
    Ok(())
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// `[5, 9]` as `5, 9`.
fn ids(v: &Value) -> String {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|id| id.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `open, by ann, base position 3, 2 ahead, 1 behind, created ...`.
fn branch_summary(b: &Value) -> String {
    format!(
        "{}, by {}, base position {}, {} ahead, {} behind, created {}",
        str_of(&b["state"]),
        b["author"].as_str().unwrap_or("(unknown)"),
        b["base_seq"],
        b["ahead"],
        b["behind"],
        time(&b["created_at"])
    )
}

/// One branch on one line: its name and summary.
fn branch_line(b: &Value) -> String {
    format!("{}  {}", str_of(&b["name"]), branch_summary(b))
}

/// A change: a header line, then a line per text root (its runs, compact) and per other root.
fn change_lines(c: &Value) -> String {
    let mut out = format!(
        "change {}  {}  {}  positions {}-{}  {} updates, +{} -{}  {} .. {}",
        c["id"],
        c["author"].as_str().unwrap_or("(unknown)"),
        str_of(&c["state"]),
        c["first_seq"],
        c["last_seq"],
        c["updates"],
        c["inserted"],
        c["deleted"],
        time(&c["first_at"]),
        time(&c["last_at"]),
    );
    if c["depends_on"].as_array().is_some_and(|d| !d.is_empty()) {
        out.push_str(&format!("  depends on {}", ids(&c["depends_on"])));
    }
    out.push('\n');
    for t in c["texts"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "    {}: {}\n",
            str_of(&t["root"]),
            runs(&t["runs"])
        ));
    }
    for r in c["other_roots"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "    {} ({}): +{} -{}\n",
            str_of(&r["root"]),
            str_of(&r["kind"]),
            r["inserted"],
            r["deleted"]
        ));
    }
    out
}

/// Kept text longer than this is shortened to its ends around an ellipsis.
const KEPT_CHARS: usize = 24;

/// A diff's runs on one line, as `git diff --word-diff` shows them: kept text as it is
/// (shortened), `{+inserted+}`, `[-deleted-]`; line breaks shown as `\n`.
fn runs(runs: &Value) -> String {
    let all: Vec<&Value> = runs.as_array().into_iter().flatten().collect();
    let mut out = String::new();
    for (i, r) in all.iter().enumerate() {
        let text = str_of(&r["text"]).replace('\n', "\\n");
        match str_of(&r["kind"]) {
            "inserted" => out.push_str(&format!("{{+{text}+}}")),
            "deleted" => out.push_str(&format!("[-{text}-]")),
            _ => {
                let chars: Vec<char> = text.chars().collect();
                let half = KEPT_CHARS / 2;
                if chars.len() <= KEPT_CHARS + 1 {
                    out.push_str(&text);
                } else if i == 0 {
                    out.push('…');
                    out.extend(&chars[chars.len() - half..]);
                } else if i == all.len() - 1 {
                    out.extend(&chars[..half]);
                    out.push('…');
                } else {
                    out.extend(&chars[..half]);
                    out.push('…');
                    out.extend(&chars[chars.len() - half..]);
                }
            }
        }
    }
    out
}

/// `ID` or `ID@LAST_SEQ`.
fn parse_change(arg: &str) -> Result<(i64, Option<i64>), String> {
    let (id, last) = match arg.split_once('@') {
        Some((id, last)) => (id, Some(last)),
        None => (arg, None),
    };
    let id = id.parse().map_err(|_| format!("not a change id: {id}"))?;
    let last = last
        .map(|l| l.parse().map_err(|_| format!("not a log position: {l}")))
        .transpose()?;
    Ok((id, last))
}

/// The changes a merge names, each with the last position it is merged up to: as given, or as
/// the branch's change list shows it now (every open change when none is given), printed.
async fn reviewed(
    api: &Api,
    branch: &str,
    changes: &[(i64, Option<i64>)],
) -> anyhow::Result<Vec<(i64, i64)>> {
    if !changes.is_empty() && changes.iter().all(|(_, last)| last.is_some()) {
        return Ok(changes
            .iter()
            .map(|(id, last)| (*id, last.unwrap_or(*id)))
            .collect());
    }
    let list = api.get(branch, "/changes").await?.ok()?;
    let listed = list["changes"].as_array().cloned().unwrap_or_default();
    let last_of = |id: i64| {
        listed
            .iter()
            .find(|c| c["id"].as_i64() == Some(id))
            .and_then(|c| c["last_seq"].as_i64())
    };
    let named: Vec<(i64, i64)> = if changes.is_empty() {
        listed
            .iter()
            .filter(|c| c["state"] == "open")
            .filter_map(|c| Some((c["id"].as_i64()?, c["last_seq"].as_i64()?)))
            .collect()
    } else {
        changes
            .iter()
            .map(|(id, last)| (*id, last.or_else(|| last_of(*id)).unwrap_or(*id)))
            .collect()
    };
    for (id, last) in &named {
        if !changes.iter().any(|(c, l)| c == id && l.is_some()) {
            eprintln!("merging change {id} as listed now: up to position {last}");
        }
    }
    Ok(named)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_compact_word_diffs() {
        let r = json!([
            {"kind": "kept", "text": "A long sentence that goes on and on before"},
            {"kind": "deleted", "text": "old"},
            {"kind": "inserted", "text": "new\nline"},
            {"kind": "kept", "text": " and after it a long tail of kept text"}
        ]);
        assert_eq!(runs(&r), "…nd on before[-old-]{+new\\nline+} and after i…");
    }
}
