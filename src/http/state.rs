//! The HTTP layer's state: the services its handlers share and the typed
//! settings they read, cheap to clone.
//!
//! `crate::app` (the composition root) builds it from the configuration;
//! the handlers never see the whole `Config`, only [`HttpSettings`], so
//! `http` names neither `app` nor `config`.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::client::{ClientInfo, TrustedProxies};
use super::cookies::CookieSecure;
use super::entry_times::EntryTimes;
use super::limit::RequestLimits;
use crate::brand::PageDir;
use crate::catalog::Catalog;
use crate::challenge::{self, auto};
use crate::identity::Identity;
#[cfg(feature = "demo-orders")]
use crate::orders;
use crate::queue::{Policy, QueueName, TicketSigner};
use crate::store::SharedStore;
use crate::{gate, push};

/// What the handlers read of the configuration, typed.
#[derive(Debug, Clone, Default)]
pub struct HttpSettings {
    /// `--base-path`: the prefix the proxy forwards unchanged ("" for none).
    pub base_path: String,
    /// `--ticket-in-query`: the ticket may come as `?ticket=`.
    pub ticket_in_query: bool,
    /// `--ticket-ttl-secs`: how long a ticket (and its cookie) lasts.
    pub ticket_ttl_secs: u64,
    /// `--allowed-origins`: other origins buyer endpoints answer.
    pub allowed_origins: Vec<String>,
    /// `--drain-secs`: how long streams get to close at shutdown.
    pub drain: Duration,
    /// `--keep-alive-secs`: the streams' keep-alive interval.
    pub keep_alive: Duration,
    /// `--streams-per-address`.
    pub streams_per_address: u32,
    /// `--shop-url`: where the page sends an admitted buyer by default.
    pub shop_url: Option<String>,
    /// `--claim-lease-secs`: the lease of a claimed entry token.
    pub claim_lease_secs: u64,
    /// `--stock-from-orders`: the demo order service reports stock.
    pub stock_from_orders: bool,
    /// `--admin-hosts`, validated: the names the operator listener answers.
    pub admin_hosts: Vec<String>,
    /// `--cookie-secure`.
    pub cookie_secure: CookieSecure,
    /// `--service-token`: the token API's bearer token (`None`: off).
    pub service_token: Option<String>,
    /// The admin API's bearer token (configured, or made up at start).
    pub admin_token: String,
    /// Most streams this instance holds open.
    pub max_streams: usize,
    /// The pass cookie's name, `Domain` and `Path` (`--pass-cookie*`).
    pub pass_cookie: crate::pass::PassCookie,
    /// How long sessions last (`--session-idle-secs`, `--session-max-secs`,
    /// and per queue, a room's or a `[queues.<name>]` table's).
    pub sessions: crate::store::SessionPolicy,
    /// `--protected-origins`: where return URLs may point.
    pub protected_origins: crate::pass::ReturnOrigins,
    /// `--pass-page-url`: the waiting page the gateway check sends
    /// visitors to (unset: the base path on the gateway's host).
    pub pass_page_url: Option<String>,
}

/// Everything [`AppState`] holds, as the composition root hands it over.
pub struct Services {
    /// The live queues and their settings (re-read from the store).
    pub catalog: Arc<Catalog>,
    /// This instance's name in the streams report of the console.
    pub instance: String,
    pub store: SharedStore,
    pub signer: TicketSigner,
    pub hub: Arc<push::Hub>,
    pub gate: gate::Gate,
    pub identity: Identity,
    pub limits: Arc<RequestLimits>,
    pub proxies: TrustedProxies,
    #[cfg(feature = "demo-orders")]
    pub orders: Option<orders::OrderStore>,
    pub shutdown: CancellationToken,
    /// Join challenges: issued and checked by `door`, asked for by `door_switch`.
    pub door: challenge::Door,
    pub door_switch: Arc<auto::Switch>,
    /// `--page-dir`: page files and brandings, checked at start-up.
    pub page_dir: Option<PageDir>,
    /// Queues whose lottery draw is still ahead (the lottery draw task).
    pub lotteries: Arc<crate::lottery::Pending>,
    /// Admission passes: issued here, checked by the gateway check (and the
    /// built-in proxy).
    pub passes: Arc<crate::pass::PassService>,
    /// `--fairness-log`: receipts and the public admission log (`None`: off).
    pub fairness: Option<Arc<crate::fairness::Fairness>>,
    pub settings: HttpSettings,
}

/// What a request handler needs; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Services>,
    /// The entry times this instance answered with (`entry_times.rs`).
    entry_times: Arc<EntryTimes>,
}

impl AppState {
    /// The state of `services`.
    pub fn new(services: Services) -> Self {
        Self {
            inner: Arc::new(services),
            entry_times: Arc::default(),
        }
    }

    /// The entry times this instance answered with, for the next polls.
    pub fn entry_times(&self) -> &EntryTimes {
        &self.entry_times
    }

    /// What the handlers read of the configuration.
    pub fn settings(&self) -> &HttpSettings {
        &self.inner.settings
    }

    /// Queues whose lottery draw is still ahead, as this instance last saw.
    pub fn lotteries(&self) -> &Arc<crate::lottery::Pending> {
        &self.inner.lotteries
    }

    /// The store.
    pub fn store(&self) -> &SharedStore {
        &self.inner.store
    }

    /// `queue`'s admission policy, as this instance last read it.
    pub fn policy(&self, queue: &QueueName) -> Policy {
        self.inner.catalog.policy(queue)
    }

    /// The live queues, in name order.
    pub fn queue_names(&self) -> Vec<QueueName> {
        self.inner.catalog.current().keys().cloned().collect()
    }

    /// Whether `queue` exists (configured, or opened by an operator).
    pub fn has_queue(&self, queue: &QueueName) -> bool {
        self.inner.catalog.contains(queue)
    }

    /// The live queue catalog.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.inner.catalog
    }

    /// This instance's name among its peers (host, process, a random tag).
    pub fn instance(&self) -> &str {
        &self.inner.instance
    }

    /// Receipts and the public admission log, when `--fairness-log` is on.
    pub fn fairness(&self) -> Option<&Arc<crate::fairness::Fairness>> {
        self.inner.fairness.as_ref()
    }

    /// The ticket signer.
    pub fn signer(&self) -> &TicketSigner {
        &self.inner.signer
    }

    /// The bearer token of the admin API.
    pub fn admin_token(&self) -> &str {
        &self.inner.settings.admin_token
    }

    /// Most streams this instance holds open: `--max-streams`, or the
    /// open-file limit less headroom for Redis, the database and the rest.
    pub fn max_streams(&self) -> usize {
        self.inner.settings.max_streams
    }

    /// The order gate (entry-token claims).
    pub fn gate(&self) -> &gate::Gate {
        &self.inner.gate
    }

    /// Who requests are for: the one identity source of the queue, the
    /// gate and the demo order service.
    pub fn identity(&self) -> &Identity {
        &self.inner.identity
    }

    /// Per-buyer request limits of this instance.
    pub fn limits(&self) -> &RequestLimits {
        &self.inner.limits
    }

    /// The proxies whose forwarding headers name the client.
    pub fn trusted_proxies(&self) -> &TrustedProxies {
        &self.inner.proxies
    }

    /// Whether cookies set for `client` get `Secure` (`--cookie-secure`).
    pub fn cookie_secure(&self, client: &ClientInfo) -> bool {
        super::cookies::secure(self.inner.settings.cookie_secure, client)
    }

    /// The `Set-Cookie` value of a visitor cookie carrying `value`.
    pub fn visitor_cookie(&self, value: String, client: &ClientInfo) -> String {
        super::cookies::visitor(value, self.cookie_secure(client))
    }

    /// The demo order database, when `--orders on`.
    #[cfg(feature = "demo-orders")]
    pub fn orders(&self) -> Option<&orders::OrderStore> {
        self.inner.orders.as_ref()
    }

    /// The bearer token of the token API: `--service-token`; `None` while
    /// the token API is off. Never the admin token (a separate scope: an
    /// order service cannot pause queues or reprice products).
    pub fn service_token(&self) -> Option<&str> {
        self.inner.settings.service_token.as_deref()
    }

    /// Issues and checks join challenges.
    pub fn door(&self) -> &challenge::Door {
        &self.inner.door
    }

    /// Whether joins need a solved challenge now.
    pub fn door_switch(&self) -> &auto::Switch {
        &self.inner.door_switch
    }

    /// `--page-dir`, when set.
    pub fn page_dir(&self) -> Option<&PageDir> {
        self.inner.page_dir.as_ref()
    }

    /// Admission passes: issue, verify, the local set of ended sessions.
    pub fn passes(&self) -> &Arc<crate::pass::PassService> {
        &self.inner.passes
    }

    /// The per-instance event hub.
    pub fn hub(&self) -> &Arc<push::Hub> {
        &self.inner.hub
    }

    /// The shutdown signal shared by the server and every task.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.inner.shutdown
    }

    /// The wait forecast of `queue`: from its observed passes, or a point
    /// estimate at the configured rate until there is data.
    pub fn forecast(&self, queue: &QueueName) -> crate::queue::Forecast {
        self.inner
            .hub
            .forecast(queue, self.policy(queue).configured_rate())
    }
}

impl axum::extract::FromRef<AppState> for gate::Gate {
    fn from_ref(state: &AppState) -> Self {
        state.inner.gate.clone()
    }
}
