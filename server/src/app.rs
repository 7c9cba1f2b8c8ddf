//! The server's shared state: what every request handler, connection and background job
//! reaches through one [`AppState`].

use std::sync::Arc;

use tokio_util::task::TaskTracker;

use crate::auth::Auth;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::room::Registry;
use crate::storage::api::ApiStore;
use crate::storage::DocStore;
use crate::{admin, bus, gate, limits};

/// What request handlers share: one [`App`] behind an `Arc`, so that a copy (each request's,
/// each connection's) is one pointer, not the dozen the fields are.
#[derive(Clone)]
pub struct AppState(Arc<App>);

impl AppState {
    pub fn new(app: App) -> AppState {
        AppState(Arc::new(app))
    }
}

impl App {
    /// Verifies a credential from `ip` under the per-address limit on failed authentications
    /// ([`Auth::verify_from`]), counting the refusals of that limit.
    pub fn verify(
        &self,
        ip: Option<std::net::IpAddr>,
        credential: Option<&str>,
    ) -> Result<crate::auth::Principal, crate::auth::VerifyError> {
        let verified = self
            .auth
            .verify_from(&self.address_limits.auth_failures, ip, credential);
        if let Err(crate::auth::VerifyError::Limited(_)) = &verified {
            self.metrics.addr_limited.inc();
        }
        verified
    }
}

impl std::ops::Deref for AppState {
    type Target = App;

    fn deref(&self) -> &App {
        &self.0
    }
}

/// The server's shared parts (through [`AppState`]).
pub struct App {
    pub config: Arc<Config>,
    pub store: Arc<dyn DocStore>,
    pub api: Arc<dyn ApiStore>,
    pub auth: Arc<Auth>,
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    /// Tracks WebSocket connection tasks so shutdown can wait for their close frames.
    pub connections: TaskTracker,
    /// The bus to other nodes (`--bus`), when several nodes share a PostgreSQL database.
    pub bus: Option<Arc<bus::Bus>>,
    /// Per-client-address limits (new connections, failed authentications).
    pub address_limits: Arc<limits::AddressLimits>,
    /// The admission gate every whole-document computation passes (`crate::gate`).
    pub gate: Arc<gate::Gate>,
    /// The nonces of the forwarded requests served lately (`crate::http::owner`).
    pub forward_guard: Arc<bus::replay::ReplayGuard>,
    /// The owners of the documents this node relays connections to (`crate::socket::relay`).
    pub relay_leases: Arc<bus::owners::LeaseWatch>,
    /// The admin dashboard's kept figures and their stream.
    pub admin: Arc<admin::Admin>,
    /// Tests only: hooks that make a dangerous interleaving happen.
    #[doc(hidden)]
    pub hooks: TestHooks,
}

/// Hooks tests use to force an interleaving or a fault; none is set in a served node.
#[doc(hidden)]
#[derive(Clone, Default)]
pub struct TestHooks {
    /// Faults injected into what this node publishes on the bus.
    pub bus_faults: Option<Arc<bus::Faults>>,
    /// A restore waits here (at most half a second) between reading the current content and
    /// applying its change, so a test can make two restores meet there.
    pub restore_hold: Option<Arc<tokio::sync::Barrier>>,
    /// The first JSON edit stops here after it is parsed and before it is sent to its
    /// document's room, so a test can make another client's edit land first.
    pub edit_hold: Option<Arc<EditHold>>,
    /// The first merge stops here after applying its changes and before recording them as
    /// merged, so a test can send a reject into that gap.
    pub merge_hold: Option<Arc<EditHold>>,
}

/// Where a JSON edit waits once, so that a test can change the document between the edit's
/// computation and its application: the edit notifies `reached`, then waits for `resume` (at
/// most five seconds).
#[doc(hidden)]
#[derive(Default)]
pub struct EditHold {
    pub reached: tokio::sync::Notify,
    pub resume: tokio::sync::Notify,
    claimed: std::sync::atomic::AtomicBool,
}

impl EditHold {
    /// True the first time only: the edit that waits.
    pub fn claim(&self) -> bool {
        !self.claimed.swap(true, std::sync::atomic::Ordering::SeqCst)
    }
}
