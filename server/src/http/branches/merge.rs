//! Merging a branch's changes into its parent (docs/branches.md): what the reviewer saw is
//! what merges (each change named with its last position, or the listing's ETag), and the
//! chosen changes are applied together, under the parent's lock, in one append.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::{Extension, Json};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use yrs::updates::decoder::Decode;
use yrs::Update;

use super::{branch_of, changes_tag, conflict, open, optional_json, review_of, settle};
use crate::app::AppState;
use crate::auth::{Permission, Principal};
use crate::branches;
use crate::gate::Form;
use crate::http::extract::{ApiBytes, ApiPath};
use crate::http::history::{budget_full, merge_lock, record};
use crate::http::reads::{heavy, latest, stored_invalid};
use crate::http::shared::{applied, ask_room, doc_for, live, ApiResult};
use crate::problem::responses::*;
use crate::problem::ApiError;
use crate::room::{ApplyCmd, RoomCmd};
use crate::storage::api::DocMeta;
use crate::storage::branches::{BranchRow, Decision, DecisionRow};
use crate::storage::history::{Version, VersionKind};

/// Most changes one merge request names.
const MAX_MERGE_CHANGES: usize = 10_000;

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeRequest {
    /// The changes to merge, each with the `last_seq` the review showed (or by id alone, with
    /// the listing's ETag as `If-Match`); omitted: every open change (`If-Match` required).
    pub changes: Option<Vec<ChangeRef>>,
}

/// A change a merge names.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ChangeRef {
    /// The change as the reviewer saw it: refused (409 `change-grew`) if it has grown since.
    Seen { id: i64, last_seq: i64 },
    /// By id alone: only with the listing's ETag as `If-Match`.
    Id(i64),
}

impl ChangeRef {
    fn id(self) -> i64 {
        match self {
            ChangeRef::Seen { id, .. } | ChangeRef::Id(id) => id,
        }
    }
}

/// The part of a change list's ETag that describes the branch (its last position, decisions,
/// pulls and state), without the parent's position and the caller's permission: a merge
/// sent with the listing's ETag is refused when the branch moved, not when the parent did.
fn branch_part(tag: &str) -> Option<&str> {
    let body = tag.trim().trim_start_matches("W/").trim_matches('"');
    let mut cut = body.rsplitn(3, '-');
    let (_, _) = (cut.next()?, cut.next()?);
    cut.next()
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Merged {
    /// The changes this request merged.
    pub merged: Vec<i64>,
    /// The changes asked for that an earlier merge had merged.
    pub already_merged: Vec<i64>,
    /// The parent's log position after the merge (`null` if nothing was applied).
    pub parent_seq: Option<i64>,
    /// The parent's versions recorded before and after the merge.
    pub version_before: Option<Version>,
    pub version_after: Option<Version>,
}

/// Applies a merge's updates to `doc` through its room, each as its author's, checked together
/// and committed in one append (all or none); the log position after them.
async fn apply_all(
    app: &AppState,
    doc: &DocMeta,
    plan: Vec<branches::AuthoredUpdate>,
) -> ApiResult<i64> {
    let mut plan = plan
        .into_iter()
        .map(|(a, u)| (a.map(Arc::from), Bytes::from(u)));
    let Some((author, raw)) = plan.next() else {
        return Err(stored_invalid("a merge with nothing to apply".to_owned()));
    };
    let result = ask_apply(app, doc, author, raw, plan.collect()).await?;
    match result {
        Err(crate::room::ApplyError::Missing(why)) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "change-does-not-integrate",
            format!("the merge does not integrate into the parent, nothing was applied: {why}"),
        )),
        result => applied(result, stored_invalid),
    }
}

/// Asks `doc`'s room to apply `raw` as `author`'s, then `then` with it (in one append); the
/// room's answer.
pub(super) async fn ask_apply(
    app: &AppState,
    doc: &DocMeta,
    author: Option<Arc<str>>,
    raw: Bytes,
    then: Vec<(Option<Arc<str>>, Bytes)>,
) -> ApiResult<Result<i64, crate::room::ApplyError>> {
    ask_room(app, &doc.name, |reply| {
        RoomCmd::Apply(Box::new(ApplyCmd {
            raw: raw.clone(),
            update: Update::decode_v1(&raw).unwrap_or_else(|_| Update::new()),
            reply,
            author: author.clone(),
            budget: None,
            then: then.clone(),
        }))
    })
    .await
}

/// Merges the chosen changes (all open ones if none are named) into the parent, through the
/// parent's room: each applied as its author's change, committed and broadcast to the
/// parent's clients, with a version of the parent recorded before and after. A change needs
/// the changes it depends on merged with it or before: 409 `missing-dependencies` lists them,
/// and nothing is applied. Changes merged before are not applied again.
#[utoipa::path(post, path = "/api/v1/docs/{name}/merge", request_body(content = MergeRequest, description = "optional"),
    params(("name" = String, Path, description = "The branch's name, percent-encoded"),
        ("Idempotency-Key" = Option<String>, Header),
        ("If-Match" = Option<String>, Header, description = "The change list's ETag: required unless every change is named with its last_seq")),
    responses((status = 200, body = Merged), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Gone, Stale, NeedsIfMatch, TooLarge, Unprocessable, Busy, Unavailable, BudgetFull))]
pub async fn merge(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
    headers: HeaderMap,
    ApiBytes(body): ApiBytes,
) -> ApiResult<Json<Merged>> {
    let request: MergeRequest = optional_json(&body)?;
    if request
        .changes
        .as_ref()
        .is_some_and(|c| c.len() > MAX_MERGE_CHANGES)
    {
        return Err(ApiError::bad_request(
            "too-many-changes",
            format!("a merge names at most {MAX_MERGE_CHANGES} changes"),
        ));
    }
    let branch = live(doc_for(&app, &principal, &name, Permission::Read).await?)?;
    // Refused at once when the gate has no room; the admission is given back at once, so
    // nothing of the gate is held while the parent's lock is awaited.
    drop(app.gate.admit(branch.id).await?);
    // What the reviewer saw: every change named with its last position, or the listing's ETag.
    let if_match = headers
        .get(header::IF_MATCH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let all_seen = request
        .changes
        .as_ref()
        .is_some_and(|c| c.iter().all(|r| matches!(r, ChangeRef::Seen { .. })));
    if if_match.is_none() && !all_seen {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_REQUIRED,
            "precondition-required",
            "name each change with the last_seq its review showed ({\"id\": 14, \"last_seq\": \
             20}), or send the change list's ETag as If-Match",
        ));
    }
    let row = branch_of(&app, &branch).await?;
    open(&row)?;
    let parent = live(doc_for(&app, &principal, &row.parent, Permission::Write).await?)?;
    // One merge or restore of a parent at a time (they all run on its owner), waited for
    // within merge_lock_wait and without a slot of the gate: admitted once it holds the lock.
    let _one_at_a_time = merge_lock(&app, parent.id).await?;
    let admission = app.gate.admit(branch.id).await?;
    let result = merge_locked(
        &app,
        &principal,
        (&row, &branch, &parent),
        (request, if_match),
        admission,
    )
    .await;
    result.map(Json)
}

async fn merge_locked(
    app: &AppState,
    principal: &Principal,
    (row, branch, parent): (&BranchRow, &DocMeta, &DocMeta),
    (request, if_match): (MergeRequest, Option<String>),
    admission: crate::gate::Admission,
) -> ApiResult<Merged> {
    if let Some(seen) = &if_match {
        let now = changes_tag(app, row, principal).await?;
        if branch_part(seen).is_none() || branch_part(seen) != branch_part(&now) {
            return Err(ApiError::new(
                StatusCode::PRECONDITION_FAILED,
                "precondition-failed",
                "the branch's changes moved since that listing: list them again",
            ));
        }
    }
    let (review, rows) = review_of(app, branch, admission).await?;
    if let Some(seen) = &if_match {
        // Again after the review read the log: a row committed in between is in it.
        let now = changes_tag(app, row, principal).await?;
        if branch_part(seen) != branch_part(&now) {
            return Err(ApiError::new(
                StatusCode::PRECONDITION_FAILED,
                "precondition-failed",
                "the branch's changes moved since that listing: list them again",
            ));
        }
    }
    for seen in request.changes.iter().flatten() {
        if let ChangeRef::Seen { id, last_seq } = *seen {
            if let Some(c) = review.change(id).filter(|c| c.last_seq != last_seq) {
                let mut e = ApiError::new(
                    StatusCode::CONFLICT,
                    "change-grew",
                    format!(
                        "change {id} ends at {} now, not at {last_seq}: review it again",
                        c.last_seq
                    ),
                );
                e.current = Some(serde_json::json!({ "id": id, "last_seq": c.last_seq }));
                return Err(e);
            }
        }
    }
    let asked: BTreeSet<i64> = match request.changes {
        Some(refs) => refs.into_iter().map(ChangeRef::id).collect(),
        None => review
            .changes
            .iter()
            .filter(|c| c.state == "open")
            .map(|c| c.id)
            .collect(),
    };
    let mut already = Vec::new();
    let mut selected = BTreeSet::new();
    for id in &asked {
        match review.change(*id).map(|c| c.state) {
            None => {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "no-such-change",
                    format!("the branch has no change {id}"),
                ))
            }
            Some("merged") => already.push(*id),
            Some("rejected") => {
                return Err(conflict(
                    "change-rejected",
                    format!("change {id} was rejected"),
                    &[*id].into(),
                ))
            }
            Some(_) => {
                selected.insert(*id);
            }
        }
    }
    let missing = review.missing(&selected);
    let rejected: BTreeSet<i64> = missing
        .iter()
        .filter(|id| review.change(**id).is_some_and(|c| c.state == "rejected"))
        .copied()
        .collect();
    if !rejected.is_empty() {
        return Err(conflict(
            "change-rejected",
            format!("the changes depend on rejected changes {rejected:?}"),
            &rejected,
        ));
    }
    if !missing.is_empty() {
        return Err(conflict(
            "missing-dependencies",
            format!("the changes depend on changes not chosen: {missing:?}; merge them too"),
            &missing,
        ));
    }
    let unshown: BTreeSet<i64> = selected
        .iter()
        .filter(|id| review.change(**id).is_some_and(|c| !c.mergeable))
        .copied()
        .collect();
    if !unshown.is_empty() {
        let mut e = ApiError::new(
            StatusCode::CONFLICT,
            "change-not-reviewable",
            format!(
                "changes {unshown:?} have effects the review cannot show; they cannot be merged"
            ),
        );
        e.current = Some(serde_json::json!({ "unreviewable": unshown }));
        return Err(e);
    }
    if selected.is_empty() {
        settle(app, row, &review, &BTreeSet::new()).await?;
        return Ok(Merged {
            merged: Vec::new(),
            already_merged: already,
            parent_seq: None,
            version_before: None,
            version_after: None,
        });
    }
    // The plan merges the chosen rows chunk by chunk: heavy work, admitted and run on the
    // blocking pool.
    let admission = app.gate.admit(branch.id).await?;
    let chosen = selected.clone();
    let (plan, review) = heavy(admission, move || {
        let plan = review.merge_plan(&rows, &chosen).map_err(stored_invalid)?;
        Ok((plan, review))
    })
    .await?;
    // The versions before and after: refused before anything changes if they would not fit
    // the parent's version budget.
    let (seq_before, state_before) = latest(app, parent, Form::StateV2).await?;
    let budget = app.config.max_version_bytes;
    if app.api.kept_version_bytes(parent.id).await? + 2 * state_before.len() as u64 > budget {
        app.metrics.versions_refused.inc();
        return Err(budget_full(budget));
    }
    let label = |what: &str| Some(format!("{what} merging branch {}", row.name));
    let before = record(
        app,
        parent,
        seq_before,
        state_before,
        (VersionKind::Named, label("before")),
        principal,
        budget,
    )
    .await?;
    // Every update of the merge in one append: all of it or none.
    let parent_seq = Some(apply_all(app, parent, plan).await?);
    if let Some(hold) = app.hooks.merge_hold.clone().filter(|h| h.claim()) {
        hold.reached.notify_one();
        let _ =
            tokio::time::timeout(std::time::Duration::from_secs(5), hold.resume.notified()).await;
    }
    // The merge is applied: recorded as decided whatever comes next (a retry finds them
    // merged and applies nothing again).
    let now = crate::storage::now_ms();
    for id in &selected {
        let last_seq = review.change(*id).map_or(*id, |c| c.last_seq);
        app.api
            .decide(
                branch.id,
                DecisionRow {
                    change_id: *id,
                    last_seq,
                    decision: Decision::Merged,
                    decided_by: Some(principal.user.clone()),
                    parent_seq,
                    created_at: now,
                },
            )
            .await?;
    }
    let (seq_after, state_after) = latest(app, parent, Form::StateV2).await?;
    let after = record(
        app,
        parent,
        seq_after,
        state_after,
        (VersionKind::Named, label("after")),
        principal,
        u64::MAX,
    )
    .await?;
    let still_open = review
        .changes
        .iter()
        .any(|c| c.state == "open" && !selected.contains(&c.id));
    if !still_open && row.state == "open" {
        let _ = app
            .api
            .set_branch_state(row.doc_id, row.version, "merged")
            .await?;
    }
    Ok(Merged {
        merged: selected.into_iter().collect(),
        already_merged: already,
        parent_seq,
        version_before: Some(before),
        version_after: Some(after),
    })
}
