//! Every way into the server, in one table: each HTTP route, each message of both WebSocket
//! protocols and each bus envelope, with the permission it needs, how its cost grows, the
//! bound that holds it and its rate limit.
//!
//! The table is enforced, not only written down: `tests/entry_points.rs` enumerates the
//! routes of the OpenAPI document, the message kinds of both protocols and the bus envelope
//! kinds, and fails on any without a row (or a row without one); it sends every
//! [`Cost::PerDocument`] HTTP route to a server whose heavy-work gate has no slot and expects 503,
//! so a route that does whole-document work outside the gate fails it; and docs/security.md
//! holds [`markdown`]'s rendering of this table, checked byte for byte.

/// Where a request or message arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// An HTTP route (`METHOD /path`, as the OpenAPI document names it).
    Http,
    /// A message kind of the y-websocket protocol (`quire_protocol::MessageKind`).
    YWebsocket,
    /// A message kind of the Hocuspocus protocol (`quire_protocol::hocuspocus::HpMessageKind`).
    Hocuspocus,
    /// A bus envelope kind between nodes (`bus::Kind`).
    Bus,
}

/// Who may use an entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone who can reach the port.
    Public,
    /// Any valid credential (the answer depends on it).
    Authenticated,
    /// Read permission on the document.
    Read,
    /// Write permission on the document.
    Write,
    /// Admin permission on the document (its owner, or a token with admin on it).
    DocAdmin,
    /// The admin key, or a token with admin permission on every document.
    Admin,
    /// A node signing with the cluster key.
    Cluster,
    /// Sent by the server only: what it does with one a client sends is in the bound.
    ServerOnly,
}

/// How the work an entry point costs grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cost {
    /// Bounded by a constant (or by the size of a bounded request).
    Constant,
    /// Grows with the update or message sent, bounded by `max_message_size` and the room's
    /// queues.
    PerUpdate,
    /// Grows with the whole document. An HTTP route of this class passes the heavy-work gate
    /// (`gate.rs`) to compute, and counts against its caller's `heavy_per_caller` until its
    /// answer is sent (`http::per_caller`); Sync Step 1 is answered from a Step 2 encoded once
    /// per version and shared; a forwarded request meets the gate on the owner.
    PerDocument,
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct EntryPoint {
    pub surface: Surface,
    pub name: &'static str,
    pub access: Access,
    pub cost: Cost,
    /// The bound that holds it (settings by name).
    pub bound: &'static str,
    /// The rate limit that applies.
    pub rate: &'static str,
}

const fn http(
    name: &'static str,
    access: Access,
    cost: Cost,
    bound: &'static str,
    rate: &'static str,
) -> EntryPoint {
    msg(Surface::Http, name, access, cost, bound, rate)
}

const fn msg(
    surface: Surface,
    name: &'static str,
    access: Access,
    cost: Cost,
    bound: &'static str,
    rate: &'static str,
) -> EntryPoint {
    EntryPoint {
        surface,
        name,
        access,
        cost,
        bound,
        rate,
    }
}

use Access::*;
use Cost::*;
use Surface::{Bus, Hocuspocus, YWebsocket};

/// Every API request: body at most 2 MiB; every credential failure counts per address.
const API: &str = "auth_failures_per_minute_per_addr";
/// The heavy-work gate's bounds.
const GATE: &str = "heavy-work gate: heavy_per_node, heavy_per_doc (429), heavy_queue and heavy_wait (503), history_cache_bytes; heavy_per_caller in flight per caller, answer sent included (429); the answer is sent without a gate slot and dropped after write_timeout without progress";
/// A socket's bounds.
const SOCKET: &str = "max_message_size, peer_queue, peer_queue_bytes (1013), room_queue_bytes; only what integrates enters: updates waiting for their dependencies are held for the connection within held_update_bytes and held_update_timeout (1013), deletions of what does not exist are cut";

/// The table. Keep it in the order of the routes and enums it mirrors.
pub const ENTRY_POINTS: &[EntryPoint] = &[
    // HTTP outside the API: health, metrics, the pages and the two sockets.
    http("GET /healthz", Public, Constant, "none: a constant answer", "none"),
    http("GET /readyz", Public, Constant, "one database ping within storage_timeout", "none"),
    http("GET /metrics", Public, Constant, "the metric families (a fixed set)", "none"),
    http("GET /admin", Public, Constant, "the page's three files, compiled in", "none"),
    http("GET /{web file}", Public, Constant, "the compiled-in pages, or files under web_root only (plain path segments)", "none"),
    http("GET /hocuspocus", Public, Constant, "hocuspocus_auth_timeout (a socket that authenticates no document is closed), hocuspocus_max_documents, hocuspocus_pending_frames, hocuspocus_pending_bytes, header_timeout", "connections_per_minute_per_addr"),
    http("GET /{document}", Read, Constant, "the token checked before the upgrade; max_connections_per_doc, header_timeout", "connections_per_minute_per_addr, auth_failures_per_minute_per_addr"),
    // The API: documents.
    http("POST /api/v1/docs", Write, Constant, "field lengths (name, title)", API),
    http("GET /api/v1/docs", Authenticated, Constant, "page of at most 200", API),
    http("GET /api/v1/docs/{name}", Read, Constant, "one row", API),
    http("PATCH /api/v1/docs/{name}", Write, Constant, "field lengths; If-Match", API),
    http("DELETE /api/v1/docs/{name}", DocAdmin, Constant, "one row; If-Match", API),
    http("POST /api/v1/docs/{name}/restore", DocAdmin, Constant, "one row", API),
    // Content.
    http("GET /api/v1/docs/{name}/update", Read, PerDocument, GATE, API),
    http("POST /api/v1/docs/{name}/update", Write, PerUpdate, "2 MiB body, max_doc_size, the room's queues; only an update that integrates (422 update-missing-dependencies otherwise, nothing applied)", API),
    http("GET /api/v1/docs/{name}/json", Read, PerDocument, GATE, API),
    http("POST /api/v1/docs/{name}/edits", Write, PerUpdate, "made by the document's room on its document, in its turn (no copy of the document, no retry): 2 MiB body, MAX_EDIT_OPS (1000 operations), MAX_EDIT_INSERT_BYTES (4 MiB inserted), edit_work_bytes of content read (422 edit-too-costly); max_doc_size, the room's queues; one client id per author and document", API),
    http("POST /api/v1/docs/{name}/stateless", Write, Constant, "max_stateless_bytes", API),
    // History.
    http("GET /api/v1/docs/{name}/history", Read, Constant, "page of at most 100 sessions (indexed reads)", API),
    http("GET /api/v1/docs/{name}/versions", Read, Constant, "the versions' rows, without their state", API),
    http("POST /api/v1/docs/{name}/versions", Write, PerDocument, "heavy-work gate; max_version_bytes (507)", API),
    http("DELETE /api/v1/docs/{name}/versions/{id}", Write, Constant, "one row; someone else's named or restore version: its author, the document's owner or admin only (403)", API),
    http("GET /api/v1/docs/{name}/versions/{id}/json", Read, PerDocument, GATE, API),
    http("POST /api/v1/docs/{name}/versions/{id}/restore", Write, PerDocument, "heavy-work gate; one restore, merge or reject per document at a time, its lock waited for within merge_lock_wait (503) without a gate slot; max_version_bytes (507, before anything changes)", API),
    http("GET /api/v1/docs/{name}/diff", Read, PerDocument, GATE, API),
    http("POST /api/v1/docs/{name}/fork", Read, PerDocument, "heavy-work gate; write permission on the new name", API),
    // Branches (docs/branches.md).
    http("POST /api/v1/docs/{name}/branches", Read, PerDocument, "heavy-work gate; write permission on the new name; max_doc_size", API),
    http("GET /api/v1/docs/{name}/branches", Read, PerDocument, "heavy-work gate; at most 200 branches, each one's log positions read without their updates", API),
    http("GET /api/v1/docs/{name}/branch", Read, PerDocument, "heavy-work gate; the branch's log positions read without their updates", API),
    http("GET /api/v1/docs/{name}/changes", Read, PerDocument, "heavy-work gate (the branch's log is read and grouped under an admission); every row checked to integrate; at most 64 MiB replayed to show the effects on roots that are not texts", API),
    http("POST /api/v1/docs/{name}/changes/{id}/reject", Write, PerDocument, "heavy-work gate; write permission on the parent; one decision row per change; under the parent's merge lock, waited for within merge_lock_wait (503) without a gate slot; a change already in the parent (a merge that stopped before recording it) is recorded merged, 409", API),
    http("POST /api/v1/docs/{name}/merge", Write, PerDocument, "heavy-work gate; at most 10,000 changes named, each with the last_seq reviewed or the listing's ETag (428 / 409 change-grew / 412); write permission on the parent; one merge, reject or restore per parent at a time, its lock waited for within merge_lock_wait (503) without a gate slot; the plan computed under the gate; max_version_bytes (507, before anything changes); changes with effects the review cannot show refused (409); applied together in one append, checked to integrate first (409, nothing applied); the review replays at most 64 MiB to show effects on non-text roots", API),
    http("POST /api/v1/docs/{name}/update-from-parent", Write, PerDocument, "heavy-work gate; max_doc_size; the branch's room queues", API),
    http("POST /api/v1/docs/{name}/close", Write, PerDocument, "heavy-work gate; one row (optimistic version check); write on the parent, or the branch's author", API),
    // Access, people, tokens.
    http("GET /api/v1/docs/{name}/access", Read, Constant, "the document's role rows", API),
    http("PUT /api/v1/docs/{name}/access/{user}", DocAdmin, Constant, "one row; field lengths", API),
    http("DELETE /api/v1/docs/{name}/access/{user}", DocAdmin, Constant, "one row", API),
    http("GET /api/v1/users/{id}", Authenticated, Constant, "one row", API),
    http("PATCH /api/v1/users/{id}", Authenticated, Constant, "one row, the user's own (or admin); If-Match; field lengths", API),
    http("GET /api/v1/me", Authenticated, Constant, "one row", API),
    http("POST /api/v1/tokens", Admin, Constant, "field lengths", API),
    http("POST /api/v1/tokens/revoke", Admin, Constant, "one row", API),
    // Administration.
    http("GET /api/v1/admin/outbox", Admin, Constant, "page of at most 200", API),
    http("GET /api/v1/admin/set-aside", Admin, Constant, "at most 1000 rows, sizes only (never the bytes)", API),
    http("GET /api/v1/admin/overview", Admin, Constant, "the kept samples (admin_history)", API),
    http("GET /api/v1/admin/docs", Admin, Constant, "page with a limit", API),
    http("GET /api/v1/admin/cluster", Admin, Constant, "nodes seen within a day, with a limit", API),
    http("POST /api/v1/admin/dead/{id}/retry", Admin, Constant, "one row", API),
    http("GET /api/v1/admin/stream", Admin, Constant, "one sample per admin_sample_every; ends at the token's expiry or revocation", API),
    http("GET /api/v1/openapi.json", Public, Constant, "a constant document", "none"),
    // y-websocket messages, per connection.
    msg(YWebsocket, "SyncStep1", Read, PerDocument, "the room's shared Step 2 answer (encoded once per version); one unread answer per peer", "sync_requests_per_minute (1008)"),
    msg(YWebsocket, "SyncStep2", Write, PerUpdate, SOCKET, "none beyond the queues (a read-only peer's is dropped)"),
    msg(YWebsocket, "Update", Write, PerUpdate, "max_message_size, max_doc_size, room_queue_bytes (the connection waits); held_update_bytes and held_update_timeout for updates waiting on their dependencies (1013); deletions of what does not exist cut", "none beyond the queues (a read-only peer's is dropped)"),
    msg(YWebsocket, "Awareness", Read, PerUpdate, "max_message_size; only the client ids the connection may speak for (a closed connection's stay its user's for presence_grace); relayed once per awareness_tick in one frame per peer", "awareness_per_second (1008)"),
    msg(YWebsocket, "Auth", ServerOnly, Constant, "ignored", "none"),
    msg(YWebsocket, "QueryAwareness", Read, PerUpdate, "one unread answer per peer", "sync_requests_per_minute (1008)"),
    msg(YWebsocket, "DurableAck", Read, Constant, "echoed once committed; one per message", "none beyond the queues"),
    msg(YWebsocket, "Unknown", Public, Constant, "ignored (read within max_message_size)", "none"),
    // Hocuspocus messages, per document of a socket.
    msg(Hocuspocus, "Sync", Read, PerUpdate, "as y-websocket's Sync messages, per document", "sync_requests_per_minute across the socket"),
    msg(Hocuspocus, "SyncReply", Read, PerUpdate, "as Sync", "as Sync"),
    msg(Hocuspocus, "Awareness", Read, PerUpdate, "as y-websocket's Awareness", "awareness_per_second across the socket"),
    msg(Hocuspocus, "Token", Public, Constant, "the credential verified as on the y-websocket endpoint; hocuspocus_max_documents", "auth_failures_per_minute_per_addr"),
    msg(Hocuspocus, "PermissionDenied", ServerOnly, Constant, "ignored", "none"),
    msg(Hocuspocus, "Authenticated", ServerOnly, Constant, "ignored", "none"),
    msg(Hocuspocus, "TokenRequest", ServerOnly, Constant, "ignored", "none"),
    msg(Hocuspocus, "QueryAwareness", Read, PerUpdate, "one unread answer per peer", "sync_requests_per_minute across the socket"),
    msg(Hocuspocus, "Stateless", Write, Constant, "max_stateless_bytes (1009); one outbox row each; a read-only session's are dropped", "stateless_per_second (1008)"),
    msg(Hocuspocus, "BroadcastStateless", ServerOnly, Constant, "closes the document", "none"),
    msg(Hocuspocus, "Close", Public, Constant, "forgets the document", "none"),
    msg(Hocuspocus, "SyncStatus", ServerOnly, Constant, "ignored", "none"),
    // Bus envelopes: every one signed with the cluster key (others are dropped and counted).
    msg(Bus, "Open", Cluster, Constant, "the relaying node checked the client; max_connections_per_doc", "connections_per_minute_per_addr on the relaying node"),
    msg(Bus, "Frame", Cluster, PerUpdate, "max_message_size; the remote peer's queues (1013); in order or the connection closes (1012)", "the client's limits, applied by the owner"),
    msg(Bus, "Alive", Cluster, Constant, "a remote peer not heard from for 3 s is dropped", "one per second per connection"),
    msg(Bus, "Close", Cluster, Constant, "one connection", "none"),
    msg(Bus, "Out", Cluster, PerUpdate, "the relaying node's socket bounds (peer_queue_bytes, slow_close_timeout)", "none"),
    msg(Bus, "Beat", Cluster, Constant, "one connection", "none"),
    msg(Bus, "Kill", Cluster, Constant, "one connection", "none"),
    msg(Bus, "Changed", Cluster, Constant, "older than CHANGE_MAX_AGE is ignored", "none"),
    msg(Bus, "Request", Cluster, PerDocument, "forward_timeout; the owner's API bounds and heavy-work gate; admitted once per nonce, only if sent within 30 s and after the owner's process started; at most 65,536 nonces per window, past them refused with an answer (503 forward-refused), never dropped", "the caller's, on the node it called"),
    msg(Bus, "Response", Cluster, Constant, "answers only a request this node is waiting for", "none"),
    msg(Bus, "Reauth", Cluster, Constant, "one connection", "none"),
    msg(Bus, "Batch", Cluster, PerUpdate, "BATCH_ENVELOPES envelopes, the message at most max(BATCH_BYTES, max_message_size + 1 KiB); each envelope in it is bounded as its own kind, and one malformed or longer than max_message_size + 1 KiB is skipped and counted (its connection sees the hole: 1012)", "none: the envelopes' own"),
];

impl Surface {
    fn title(self) -> &'static str {
        match self {
            Surface::Http => "HTTP",
            Surface::YWebsocket => "y-websocket",
            Surface::Hocuspocus => "Hocuspocus",
            Surface::Bus => "bus",
        }
    }
}

impl Access {
    fn text(self) -> &'static str {
        match self {
            Access::Public => "none",
            Access::Authenticated => "any valid credential",
            Access::Read => "read",
            Access::Write => "write",
            Access::DocAdmin => "admin on the document",
            Access::Admin => "admin",
            Access::Cluster => "cluster key",
            Access::ServerOnly => "server-sent",
        }
    }
}

impl Cost {
    fn text(self) -> &'static str {
        match self {
            Cost::Constant => "constant",
            Cost::PerUpdate => "per update",
            Cost::PerDocument => "per document",
        }
    }
}

/// The table as Markdown, as docs/security.md holds it between its markers.
pub fn markdown() -> String {
    let mut out = String::from(
        "| surface | entry point | permission | cost | bound | rate limit |\n|---|---|---|---|---|---|\n",
    );
    for e in ENTRY_POINTS {
        out.push_str(&format!(
            "| {} | `{}` | {} | {} | {} | {} |\n",
            e.surface.title(),
            e.name,
            e.access.text(),
            e.cost.text(),
            e.bound,
            e.rate
        ));
    }
    out
}
