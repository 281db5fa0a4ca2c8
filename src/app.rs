//! The application state: what a request handler or background task
//! needs, built once from the configuration and cheap to clone.
//!
//! It is the composition root: it opens the store, the order database and
//! the ticket secret, and hands each part only what it uses. Background
//! tasks get their own handles (the push hub, the store, the policy, the
//! shutdown token), not the state, so `push`, `gate`, `store` and `queue`
//! never depend on this module or on `http`.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::catalog::Catalog;
use crate::challenge::{self, auto};
use crate::config::{self, Config};
use crate::http::client::{ClientInfo, TrustedProxies};
use crate::http::limit::{AddressPolicy, BURST, PER_SECOND, RequestLimits};
use crate::identity::Identity;
#[cfg(feature = "demo-orders")]
use crate::orders;
use crate::queue::{self, Policy, QueueName, QueueSettings, TicketSigner};
use crate::store::memory::MemoryStore;
use crate::store::redis::{RedisOptions, RedisStore, Topology};
use crate::store::{SharedStore, StoreError};
use crate::{admission, gate, push};

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("cannot reach the store: {0}")]
    Store(#[from] StoreError),
    #[cfg(feature = "demo-orders")]
    #[error("cannot open the order database: {0}")]
    Orders(#[from] sqlx::Error),
    #[error("cannot serve: {0}")]
    Io(#[from] std::io::Error),
    #[error("--page-dir: {0}")]
    Page(#[from] crate::brand::BrandError),
}

/// Everything a request handler or background task needs; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    /// The live queues and their settings (re-read from the store).
    catalog: Arc<Catalog>,
    /// This instance's name in the streams report of the console.
    instance: String,
    store: SharedStore,
    signer: TicketSigner,
    admin_token: String,
    hub: Arc<push::Hub>,
    gate: gate::Gate,
    identity: Identity,
    limits: Arc<RequestLimits>,
    proxies: TrustedProxies,
    #[cfg(feature = "demo-orders")]
    orders: Option<orders::OrderStore>,
    max_streams: usize,
    max_connections: usize,
    shutdown: CancellationToken,
    /// Join challenges: issued and checked by `door`, asked for by `door_switch`.
    door: challenge::Door,
    door_switch: Arc<auto::Switch>,
    /// `--page-dir`: page files and brandings, checked at start-up.
    page_dir: Option<crate::brand::PageDir>,
    /// Queues whose lottery draw is still ahead (`crate::lottery`).
    lotteries: Arc<crate::lottery::Pending>,
}

impl AppState {
    /// Validates `config`, connects the store and sets up the ticket secret.
    pub async fn new(config: Config, shutdown: CancellationToken) -> Result<Self, StartError> {
        config.validate()?;
        let (store, shared_secret): (SharedStore, Option<String>) = match &config.redis_url {
            Some(url) => {
                let options = RedisOptions {
                    topology: Topology::from_flags(url, config.redis_cluster)
                        .map_err(config::ConfigError)?,
                    wait_replicas: config.redis_wait_replicas,
                };
                let redis = RedisStore::open(&options, &config.key_prefix)
                    .await?
                    .with_audit_max_len(config.audit_max_len)
                    .with_join_batch(config.join_batch());
                let secret = match config.ticket_secret {
                    Some(_) => None,
                    None => {
                        tracing::warn!(
                            "no --ticket-secret: using a secret shared through Redis; set one explicitly in production"
                        );
                        Some(redis.shared_secret().await?)
                    }
                };
                (Arc::new(redis), secret)
            }
            None => (
                Arc::new(MemoryStore::new().with_audit_max_len(config.audit_max_len)),
                None,
            ),
        };
        Self::with_store(config, store, shared_secret, shutdown).await
    }

    /// Builds the state around an existing store (tests share one between
    /// several instances), opening the demo order database if `--orders on`.
    pub async fn with_store(
        config: Config,
        store: SharedStore,
        shared_secret: Option<String>,
        shutdown: CancellationToken,
    ) -> Result<Self, StartError> {
        config.validate()?;
        let queues = config.queue_names()?;
        let secret: Vec<u8> = match (&config.ticket_secret, shared_secret) {
            (Some(secret), _) => secret.as_bytes().to_vec(),
            (None, Some(shared)) => shared.into_bytes(),
            (None, None) => {
                let mut random = vec![0u8; 32];
                rand::fill(&mut random[..]);
                random
            }
        };
        // Visitor cookies are signed with a key derived from the ticket
        // secret, so they are shared across instances the same way.
        let identity = match config.signed_identity()? {
            Some(signed) => Identity::signed(&signed).map_err(config::ConfigError)?,
            None if config.identity == config::IdentityMode::Header => Identity::header(),
            None => Identity::visitor(&secret),
        };
        // Like visitor cookies, join challenges are signed with a key
        // derived from the ticket secret, so every instance accepts them.
        let door = challenge::Door::new(
            &secret,
            config.join_challenge_difficulty,
            Duration::from_secs(config.join_challenge_ttl_secs),
        );
        let door_switch = Arc::new(auto::Switch::new(
            config.join_challenge,
            &queues,
            config.join_challenge_threshold,
            Duration::from_secs(config.join_challenge_hold_secs),
        ));
        let signer = TicketSigner::new(secret);
        let admin_token = config
            .admin_token
            .clone()
            .unwrap_or_else(|| queue::EntryToken::generate().as_str().to_owned());
        #[cfg(feature = "demo-orders")]
        let orders = match config.orders {
            config::OrdersMode::On => {
                // The demo product is sold in the first configured queue.
                Some(orders::OrderStore::open(&config.orders_db, queues[0].as_str()).await?)
            }
            config::OrdersMode::Off => None,
        };
        // Every stream is a connection: unset, either cap follows the
        // other one set explicitly.
        let max_connections = config
            .max_connections
            .unwrap_or_else(|| default_max_connections().max(config.max_streams.unwrap_or(0)));
        let max_streams = config
            .max_streams
            .unwrap_or_else(|| default_max_streams().min(max_connections));
        if max_streams > max_connections {
            return Err(config::ConfigError(format!(
                "--max-connections ({max_connections}) must be at least --max-streams ({max_streams})"
            ))
            .into());
        }
        let page_dir = match &config.page_dir {
            Some(dir) => Some(crate::brand::PageDir::open(dir, &queues)?),
            None => None,
        };
        let policy = config.policy();
        let catalog = Arc::new(
            Catalog::open(
                store.clone(),
                queues.clone(),
                QueueSettings {
                    adaptive: config.adaptive_settings(),
                    ..QueueSettings::from_policy(&policy, config.claim_lease_secs * 1000)
                },
            )
            .await,
        );
        let proxies = TrustedProxies::new(config.proxy_nets()?, config.client_address_header);
        let limits = RequestLimits::new(
            PER_SECOND,
            BURST,
            AddressPolicy {
                joins_per_minute: config.joins_per_address_per_minute,
                places: config.places_per_address,
                visitors_per_minute: config.visitors_per_address_per_minute,
            },
        );
        let gate = gate::Gate::new(
            store.clone(),
            queues.clone(),
            Duration::from_secs(config.claim_lease_secs),
            Duration::from_millis(policy.token_ttl_ms)
                + Duration::from_secs(config.claim_lease_secs),
            shutdown.clone(),
        )
        .with_identity(identity.clone());
        gate.set_queues(gate_queues(&catalog.current()));
        gate.set_adaptive(gate_adaptive(&catalog.current()));
        Ok(Self {
            inner: Arc::new(Inner {
                catalog,
                instance: instance_id(),
                gate,
                identity,
                limits: Arc::new(limits),
                proxies,
                #[cfg(feature = "demo-orders")]
                orders,
                hub: Arc::new(push::Hub::new(&queues)),
                max_streams,
                max_connections,
                config,
                store,
                signer,
                admin_token,
                shutdown,
                door,
                door_switch,
                page_dir,
                lotteries: Arc::default(),
            }),
        })
    }

    /// Queues whose lottery draw is still ahead, as this instance last saw.
    pub fn lotteries(&self) -> &Arc<crate::lottery::Pending> {
        &self.inner.lotteries
    }

    /// The store.
    pub fn store(&self) -> &SharedStore {
        &self.inner.store
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
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

    /// The ticket signer.
    pub fn signer(&self) -> &TicketSigner {
        &self.inner.signer
    }

    /// The bearer token of the admin API.
    pub fn admin_token(&self) -> &str {
        &self.inner.admin_token
    }

    /// Most streams this instance holds open: `--max-streams`, or the
    /// open-file limit less headroom for Redis, the database and the rest.
    pub fn max_streams(&self) -> usize {
        self.inner.max_streams
    }

    /// Most connections this instance holds open, streams included:
    /// `--max-connections`, or the open-file limit less a smaller headroom
    /// than the stream cap's.
    pub fn max_connections(&self) -> usize {
        self.inner.max_connections
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
        crate::http::cookies::secure(self.inner.config.cookie_secure, client)
    }

    /// The `Set-Cookie` value of a visitor cookie carrying `value`.
    pub fn visitor_cookie(&self, value: String, client: &ClientInfo) -> String {
        crate::http::cookies::visitor(value, self.cookie_secure(client))
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
        self.inner.config.service_token.as_deref()
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
    pub fn page_dir(&self) -> Option<&crate::brand::PageDir> {
        self.inner.page_dir.as_ref()
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

    /// Starts the admission loop, the event subscription, the request
    /// limiter's clean-up and, with the demo order service, its
    /// token-delete reconciler on `tasks`.
    pub fn spawn_background(&self, tasks: &TaskTracker) {
        tasks.spawn(self.catalog().clone().run(self.shutdown().clone()));
        tasks.spawn(admission::run(
            self.store().clone(),
            self.catalog().watch(),
            self.shutdown().clone(),
        ));
        tasks.spawn(admission::adaptive::run(
            self.store().clone(),
            self.catalog().watch(),
            self.shutdown().clone(),
        ));
        tasks.spawn(crate::lottery::run(
            self.store().clone(),
            self.catalog().watch(),
            self.lotteries().clone(),
            self.config().lottery_draw_chunk as usize,
            self.shutdown().clone(),
        ));
        // The streams' presence writes and first estimates follow the
        // start-up flags; their queues follow the catalog.
        tasks.spawn(push::run(
            self.hub().clone(),
            self.store().clone(),
            self.catalog().defaults().policy(),
            self.catalog().watch(),
            self.shutdown().clone(),
        ));
        tasks.spawn(report_streams(
            self.store().clone(),
            self.hub().clone(),
            self.instance().to_owned(),
            self.shutdown().clone(),
        ));
        tasks.spawn(crate::webhook::run(
            self.store().clone(),
            self.config().webhooks.clone(),
            self.catalog().watch(),
            crate::webhook::DeliveryOptions {
                consumer: self.instance().to_owned(),
                claim_ms: self.config().webhook_claim_ms,
                tick: Duration::from_millis(250),
            },
            self.shutdown().clone(),
        ));
        tasks.spawn(follow_gate(
            self.gate().clone(),
            self.catalog().watch(),
            self.shutdown().clone(),
        ));
        tasks.spawn(
            self.inner
                .limits
                .clone()
                .housekeeping(self.shutdown().clone()),
        );
        // Only `auto` runs anything: the other modes need no store.
        if self.inner.door_switch.mode() == auto::Mode::Auto {
            tasks.spawn(
                self.inner
                    .door_switch
                    .clone()
                    .run(self.store().clone(), self.shutdown().clone()),
            );
        }
        #[cfg(feature = "demo-orders")]
        if let Some(orders) = self.orders()
            && self.config().stock_from_orders
        {
            // Links each queue to its products' stock once at start; every
            // order and restock reports again (`http::stock`).
            let (store, orders, queues) = (
                self.store().clone(),
                orders.clone(),
                self.queue_names().to_vec(),
            );
            tasks.spawn(async move {
                for queue in &queues {
                    if let Err(e) = crate::http::stock::report_from(&store, &orders, queue).await {
                        tracing::warn!(%queue, error = %e, "cannot report the demo stock");
                    }
                }
            });
        }
        #[cfg(feature = "demo-orders")]
        if let Some(orders) = self.orders() {
            tasks.spawn(orders::reconcile::run(
                orders.clone(),
                self.gate().clone(),
                self.shutdown().clone(),
            ));
        }
    }
}

/// How long an instance's streams report lasts: a few missed reports.
pub const STREAMS_REPORT_TTL: Duration = Duration::from_secs(10);

/// `<host>/<pid>-<random>`: readable, and distinct for instances sharing
/// a host and a process (tests).
fn instance_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".to_owned());
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(60)
        .collect();
    format!(
        "{host}/{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

/// Reports this instance's open streams to the store every 2 s, so the
/// console of any instance shows the streams of all.
async fn report_streams(
    store: SharedStore,
    hub: Arc<push::Hub>,
    instance: String,
    shutdown: CancellationToken,
) {
    let ttl = STREAMS_REPORT_TTL.as_millis() as u64;
    loop {
        let streams = hub.open_streams() as u64;
        if let Err(e) = store.report_streams(&instance, streams, ttl).await {
            tracing::debug!(error = %e, "streams report failed");
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}

/// The gate's queues and claim leases from the catalog.
fn gate_queues(queues: &crate::catalog::Queues) -> Vec<(QueueName, Duration)> {
    queues
        .iter()
        .map(|(q, s)| (q.clone(), Duration::from_millis(s.settings.claim_lease_ms)))
        .collect()
}

/// The queues whose orders' outcomes the gate counts: adaptive admission
/// on, each with its window.
fn gate_adaptive(queues: &crate::catalog::Queues) -> std::collections::HashMap<QueueName, u64> {
    queues
        .iter()
        .filter_map(|(q, s)| {
            let a = s.settings.adaptive.as_ref().filter(|a| a.enabled)?;
            Some((q.clone(), a.window_ms))
        })
        .collect()
}

/// Keeps the gate's queues and leases in step with the catalog.
async fn follow_gate(
    gate: gate::Gate,
    mut queues: tokio::sync::watch::Receiver<Arc<crate::catalog::Queues>>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            changed = queues.changed() => {
                if changed.is_err() {
                    break;
                }
                let current = queues.borrow_and_update().clone();
                gate.set_queues(gate_queues(&current));
                gate.set_adaptive(gate_adaptive(&current));
            }
        }
    }
}

/// Each stream holds one socket: leave a twentieth of the open-file limit
/// (at least 256) for everything else.
fn default_max_streams() -> usize {
    let soft = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft);
    let soft = usize::try_from(soft).unwrap_or(usize::MAX).min(1 << 24);
    soft.saturating_sub((soft / 20).max(256)).max(1)
}

/// Every connection holds one socket: leave a fortieth of the open-file
/// limit (at least 128) for Redis, the database, logs and connections
/// being turned away, so accepting never runs out of descriptors.
fn default_max_connections() -> usize {
    let soft = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft);
    let soft = usize::try_from(soft).unwrap_or(usize::MAX).min(1 << 24);
    soft.saturating_sub((soft / 40).max(128)).max(1)
}

impl axum::extract::FromRef<AppState> for gate::Gate {
    fn from_ref(state: &AppState) -> Self {
        state.inner.gate.clone()
    }
}
