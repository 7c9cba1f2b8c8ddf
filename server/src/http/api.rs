//! The REST API under `/api/v1`: its routes, by resource (documents, content, access and
//! profiles, tokens, history, the admin views), and the OpenAPI document generated from their
//! handlers.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use utoipa::OpenApi;

use super::access::{
    __path_delete_access, __path_get_me, __path_get_user, __path_list_access, __path_patch_user,
    __path_put_access,
};
use super::admin::__path_admin_outbox;
use super::content::{
    __path_get_json, __path_get_update, __path_post_stateless, __path_post_update,
};
use super::docs::{
    __path_create_doc, __path_delete_doc, __path_get_doc, __path_list_docs, __path_patch_doc,
    __path_restore_doc,
};
use super::edits::__path_post_edits;
use super::tokens::{__path_issue_token, __path_revoke};
use super::{access, admin, branches, content, docs, edits, history, tokens};
use crate::app::AppState;
use crate::auth::Permission;
use crate::problem::{ApiError, Problem};
use crate::storage::api::{
    DeadEvent, DocMeta, DocPatch, OutboxEvent, Revocation, Role, UserPatch, UserProfile,
};

pub fn routes(app: &AppState) -> Router<AppState> {
    // Content writes go through the document's room: on the owner's node (see `owner.rs`).
    let on_owner = || axum::middleware::from_fn_with_state(app.clone(), super::owner::on_owner);
    let on_parent_owner =
        || axum::middleware::from_fn_with_state(app.clone(), super::owner::on_parent_owner);
    Router::new()
        .route("/docs", post(docs::create_doc).get(docs::list_docs))
        .route(
            "/docs/{name}",
            get(docs::get_doc)
                .patch(docs::patch_doc)
                .delete(docs::delete_doc),
        )
        .route("/docs/{name}/restore", post(docs::restore_doc))
        .route(
            "/docs/{name}/update",
            get(content::get_update).merge(post(content::post_update).route_layer(on_owner())),
        )
        .route("/docs/{name}/json", get(content::get_json))
        .route(
            "/docs/{name}/edits",
            post(edits::post_edits).route_layer(on_owner()),
        )
        .route(
            "/docs/{name}/stateless",
            post(content::post_stateless).route_layer(on_owner()),
        )
        .route("/docs/{name}/history", get(history::get_history))
        .route(
            "/docs/{name}/versions",
            get(history::list_versions).post(history::create_version),
        )
        .route(
            "/docs/{name}/versions/{id}",
            axum::routing::delete(history::delete_version),
        )
        .route(
            "/docs/{name}/versions/{id}/json",
            get(history::version_json),
        )
        .route(
            "/docs/{name}/versions/{id}/restore",
            post(history::restore_version).route_layer(on_owner()),
        )
        .route("/docs/{name}/diff", get(history::get_diff))
        .route("/docs/{name}/fork", post(history::fork))
        .route(
            "/docs/{name}/branches",
            post(branches::create_branch).get(branches::list_branches),
        )
        .route("/docs/{name}/branch", get(branches::get_branch))
        .route("/docs/{name}/changes", get(branches::list_changes))
        .route(
            "/docs/{name}/changes/{id}/reject",
            post(branches::reject_change),
        )
        // A merge writes the parent: on the parent's owner.
        .route(
            "/docs/{name}/merge",
            post(branches::merge).route_layer(on_parent_owner()),
        )
        .route(
            "/docs/{name}/update-from-parent",
            post(branches::update_from_parent).route_layer(on_owner()),
        )
        .route("/docs/{name}/close", post(branches::close_branch))
        .route("/docs/{name}/access", get(access::list_access))
        .route(
            "/docs/{name}/access/{user}",
            put(access::put_access).delete(access::delete_access),
        )
        .route(
            "/users/{id}",
            get(access::get_user).patch(access::patch_user),
        )
        .route("/me", get(access::get_me))
        .route("/tokens", post(tokens::issue_token))
        .route("/tokens/revoke", post(tokens::revoke))
        .route("/admin/outbox", get(admin::admin_outbox))
        .route("/admin/set-aside", get(admin::set_aside))
        .route("/admin/overview", get(admin::overview))
        .route("/admin/docs", get(admin::docs))
        .route("/admin/cluster", get(admin::cluster))
        .route("/admin/dead/{id}/retry", post(admin::retry_dead))
        .route("/admin/stream", get(admin::stream))
        .route("/openapi.json", get(openapi_json))
        // Whole-document routes: at most `heavy_per_caller` in flight per caller.
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            super::per_caller,
        ))
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Quire API", version = "1", description = "Documents, content, access, profiles, tokens and webhooks of a Quire server."),
    // Bare names for the handlers the API served untagged before it was split by resource,
    // `super::admin::` and `history::` for those tagged so: the document's tags stay as
    // clients generated from it know them.
    paths(
        create_doc, list_docs, get_doc, patch_doc, delete_doc, restore_doc, get_update,
        post_update, post_stateless, get_json, post_edits, list_access, put_access, delete_access, get_user, patch_user,
        get_me, issue_token, revoke, admin_outbox, super::admin::overview, super::admin::docs,
        super::admin::cluster, super::admin::retry_dead, super::admin::set_aside, history::get_history, history::list_versions,
        history::create_version, history::delete_version, history::version_json,
        history::get_diff, history::restore_version, history::fork, branches::create_branch,
        branches::list_branches, branches::get_branch, branches::list_changes, branches::merge,
        branches::reject_change, branches::update_from_parent, branches::close_branch
    ),
    components(schemas(
        DocMeta, DocPatch, UserProfile, UserPatch, Role, Permission, Problem, docs::CreateDoc, docs::DocPage,
        content::UpdateApplied, content::StatelessMessage, content::StatelessSent,
        crate::edits::Edits, crate::edits::Contains, edits::EditsApplied, crate::edits::Change, access::AccessEntry, access::SetRole, tokens::IssueToken, tokens::IssuedToken, tokens::RevokeRequest, Revocation,
        admin::OutboxView, OutboxEvent, DeadEvent, admin::Overview, admin::AdminDocs,
        admin::AdminDoc, admin::ClusterView, admin::SetAsideView,
        crate::storage::set_aside::SetAsideListed, crate::storage::api::DocStats,
        crate::storage::api::ClusterRows, crate::storage::api::NodeRow,
        crate::storage::api::LeaseRow, history::HistoryPage, crate::history::Session,
        crate::history::AuthorShare, crate::storage::history::Version,
        crate::storage::history::VersionKind, history::CreateVersion, history::DiffView,
        crate::history::TextDiff, crate::history::Run, history::Restored, history::Fork,
        branches::Branch, branches::CreateBranch, branches::BranchFrom, branches::BranchList,
        branches::ChangeList, branches::MergeRequest, branches::ChangeRef, branches::Merged,
        branches::Pulled,
        crate::branches::Change, crate::branches::RootSummary, crate::branches::TextView,
        crate::branches::ViewRun
    )),
    modifiers(&BearerAuth, &HeaderValues),
    security(("bearer" = []))
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .build(),
            ),
        );
    }
}

/// Every header parameter (Idempotency-Key, If-Match) is a string of 1 to 255 visible ASCII
/// characters: what an HTTP header can carry and what the server accepts. Derived from
/// `Option<String>` they would read as nullable strings of any characters, which no client can
/// send (and a generator such as schemathesis then throws most of its inputs away). Likewise
/// the document name in a path is 1 to [`MAX_DOC_NAME_BYTES`] characters, as
/// [`DocName::parse`] takes it: an unbounded string makes a generator spend its inputs on
/// empty and oversized names.
///
/// [`MAX_DOC_NAME_BYTES`]: crate::room::MAX_DOC_NAME_BYTES
/// [`DocName::parse`]: crate::room::DocName::parse
struct HeaderValues;

impl utoipa::Modify for HeaderValues {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::ParameterIn;
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        for item in openapi.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ];
            let parameters = operations
                .into_iter()
                .flatten()
                .flat_map(|op| op.parameters.iter_mut().flatten());
            for parameter in parameters {
                if matches!(parameter.parameter_in, ParameterIn::Header) {
                    let schema = ObjectBuilder::new()
                        .schema_type(Type::String)
                        .pattern(Some("^[!-~]{1,255}$"))
                        .min_length(Some(1))
                        .max_length(Some(255));
                    parameter.schema = Some(schema.into());
                } else if matches!(parameter.parameter_in, ParameterIn::Path)
                    && parameter.name == "name"
                {
                    let schema = ObjectBuilder::new()
                        .schema_type(Type::String)
                        .min_length(Some(1))
                        .max_length(Some(crate::room::MAX_DOC_NAME_BYTES));
                    parameter.schema = Some(schema.into());
                }
            }
        }
    }
}

/// `GET /api/v1/openapi.json`
pub async fn openapi_json() -> Response {
    match ApiDoc::openapi().to_json() {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
            .into_response(),
    }
}
