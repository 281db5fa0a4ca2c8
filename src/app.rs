//! The composition root: builds the services from the configuration,
//! hands the HTTP layer its state ([`AppState`], with typed
//! [`HttpSettings`]) and the transport its [`server::Settings`], and
//! starts the background tasks, each with only its own handles.
//!
//! Nothing in the crate imports this module but `lib.rs`: `http`, `gate`,
//! `push`, `store` and `queue` never see the whole `Config`.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::catalog::Catalog;
use crate::challenge::{self, auto};
use crate::config::{self, Config};
use crate::http::client::TrustedProxies;
use crate::http::limit::{AddressPolicy, BURST, PER_SECOND, RequestLimits};
use crate::http::{AppState, HttpSettings, Services};
use crate::identity::Identity;
#[cfg(feature = "demo-orders")]
use crate::orders;
use crate::queue::{self, QueueName, TicketSigner};
use crate::store::memory::MemoryStore;
use crate::store::redis::{RedisOptions, RedisStore, Topology};
use crate::store::{SharedStore, StoreError};
use crate::tasks::gate::{gate_adaptive, gate_queues};
use crate::{front, gate, push, server, tasks};
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

/// A built instance: the HTTP state, the transport's settings and what
/// the background tasks need; cheap to clone.
#[derive(Clone)]
pub struct App {
    state: AppState,
    config: Arc<Config>,
    server: server::Settings,
    limits: Arc<RequestLimits>,
    door_switch: Arc<auto::Switch>,
    /// The built-in reverse proxy, with `--origin` or `[[rooms]]`.
    front: Option<Arc<front::Front>>,
}

impl App {
    /// Validates `config`, connects the store and sets up the ticket secret.
    pub async fn new(config: Config, shutdown: CancellationToken) -> Result<Self, StartError> {
        config.validate()?;
        let (store, shared_secret) = open_store(&config).await?;
        Self::with_store(config, store, shared_secret, shutdown).await
    }

    /// Builds the instance around an existing store (tests share one
    /// between several instances), opening the demo order database if
    /// `--orders on`.
    pub async fn with_store(
        config: Config,
        store: SharedStore,
        shared_secret: Option<String>,
        shutdown: CancellationToken,
    ) -> Result<Self, StartError> {
        config.validate()?;
        let queues = config.queue_names()?;
        let secret = ticket_secret(&config, shared_secret);
        // Visitor cookies are signed with a key derived from the ticket
        // secret, so they are shared across instances the same way.
        let identity = open_identity(&config, &secret)?;
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
        #[cfg(feature = "demo-orders")]
        let orders = match config.orders {
            // The demo product is sold in the first configured queue.
            config::OrdersMode::On => {
                Some(orders::OrderStore::open(&config.orders_db, queues[0].as_str()).await?)
            }
            config::OrdersMode::Off => None,
        };
        let (max_streams, max_connections) = caps(&config)?;
        let page_dir = match &config.page_dir {
            Some(dir) => Some(crate::brand::PageDir::open(dir, &queues)?),
            None => None,
        };
        let catalog = open_catalog(&config, &store).await?;
        let limits = Arc::new(request_limits(&config));
        let gate = open_gate(&config, &store, &queues, &catalog, &shutdown)
            .with_identity(identity.clone());
        let settings = http_settings(&config, max_streams)?;
        let passes = Arc::new(open_passes(&config)?);
        let server = server_settings(&config, max_connections);
        // Receipts and heads are signed with a key derived from the ticket
        // secret: the same on every instance that shares it, and after a
        // restart (`fairness::keys` says why not the pass's ring).
        let fairness = config.fairness_log.then(|| {
            let ring = Arc::new(crate::fairness::shared_ring(&secret));
            Arc::new(crate::fairness::Fairness::new(ring, &secret))
        });
        let state = AppState::new(Services {
            catalog,
            instance: instance_id(),
            store,
            signer: TicketSigner::new(secret),
            hub: Arc::new(push::Hub::new(&queues)),
            gate,
            identity,
            limits: limits.clone(),
            proxies: TrustedProxies::new(config.proxy_nets()?, config.client_address_header),
            #[cfg(feature = "demo-orders")]
            orders,
            shutdown,
            door,
            door_switch: door_switch.clone(),
            page_dir,
            lotteries: Arc::default(),
            passes,
            fairness,
            settings,
        });
        let front = open_front(&config, &state)?;
        Ok(Self {
            state,
            config: Arc::new(config),
            server,
            limits,
            door_switch,
            front,
        })
    }

    /// The HTTP layer's state.
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What the public listener serves: waitroom's own router, behind the
    /// built-in proxy when one is configured.
    pub fn public_router(&self) -> axum::Router {
        let own = crate::http::router(self.state.clone());
        match &self.front {
            Some(front) => front::router(self.state.clone(), front.clone(), own),
            None => own,
        }
    }

    /// What the transport reads of the configuration.
    pub fn server_settings(&self) -> &server::Settings {
        &self.server
    }

    /// Starts the background tasks on `tasks`: the catalog's re-reads, the
    /// admission passes and the adaptive controller, the lottery draw, the
    /// push loop and the streams report, webhook delivery, the public
    /// admission log (`--fairness-log`), the gate
    /// following the catalog, the request limiter's clean-up, the join
    /// challenge's `auto` switch and, with the demo order service, its
    /// stock report and token-delete reconciler.
    pub fn spawn_background(&self, tasks: &TaskTracker) {
        let state = &self.state;
        let shutdown = state.shutdown();
        let store = state.store();
        let catalog = state.catalog();
        tasks.spawn(tasks::catalog::run(catalog.clone(), shutdown.clone()));
        tasks.spawn(tasks::admission::run(
            store.clone(),
            catalog.watch(),
            shutdown.clone(),
        ));
        tasks.spawn(tasks::adaptive::run(
            store.clone(),
            catalog.watch(),
            shutdown.clone(),
        ));
        if let Some(fairness) = state.fairness() {
            tasks.spawn(tasks::fairness::run(
                store.clone(),
                fairness.clone(),
                catalog.watch(),
                shutdown.clone(),
            ));
        }
        tasks.spawn(tasks::lottery::run(
            store.clone(),
            catalog.watch(),
            state.lotteries().clone(),
            self.config.lottery_draw_chunk as usize,
            shutdown.clone(),
        ));
        // The streams' presence writes and first estimates follow the
        // start-up flags; their queues follow the catalog.
        tasks.spawn(push::run(
            state.hub().clone(),
            store.clone(),
            catalog.defaults().policy(),
            catalog.watch(),
            shutdown.clone(),
        ));
        tasks.spawn(tasks::streams::run(
            store.clone(),
            state.hub().clone(),
            state.instance().to_owned(),
            shutdown.clone(),
        ));
        tasks.spawn(tasks::webhooks::run(
            store.clone(),
            self.config.webhooks.clone(),
            catalog.watch(),
            tasks::webhooks::DeliveryOptions {
                consumer: state.instance().to_owned(),
                claim_ms: self.config.webhook_claim_ms,
                tick: Duration::from_millis(250),
            },
            shutdown.clone(),
        ));
        tasks.spawn(tasks::gate::run(
            state.gate().clone(),
            catalog.watch(),
            shutdown.clone(),
        ));
        tasks.spawn(tasks::sessions::run(
            store.clone(),
            state.passes().clone(),
            catalog.watch(),
            self.config.session_policy(),
            shutdown.clone(),
        ));
        tasks.spawn(self.limits.clone().housekeeping(shutdown.clone()));
        // Only `auto` runs anything: the other modes need no store.
        if self.door_switch.mode() == auto::Mode::Auto {
            tasks.spawn(
                self.door_switch
                    .clone()
                    .run(store.clone(), shutdown.clone()),
            );
        }
        #[cfg(feature = "demo-orders")]
        if let Some(orders) = state.orders() {
            if self.config.stock_from_orders {
                tasks.spawn(tasks::orders::report_stock(
                    store.clone(),
                    orders.clone(),
                    state.queue_names(),
                ));
            }
            tasks.spawn(tasks::orders::reconcile(
                orders.clone(),
                state.gate().clone(),
                shutdown.clone(),
            ));
        }
    }
}

/// Opens the store `config` names (Redis, or memory), with the secret
/// shared through Redis when no `--ticket-secret` is set.
async fn open_store(config: &Config) -> Result<(SharedStore, Option<String>), StartError> {
    let Some(url) = &config.redis_url else {
        let memory = MemoryStore::new().with_audit_max_len(config.audit_max_len);
        return Ok((Arc::new(memory), None));
    };
    let options = RedisOptions {
        topology: Topology::from_flags(url, config.redis_cluster).map_err(config::ConfigError)?,
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
    Ok((Arc::new(redis), secret))
}

/// The ticket secret: `--ticket-secret`, else the one shared through the
/// store, else a random one (a single instance on the memory store).
fn ticket_secret(config: &Config, shared_secret: Option<String>) -> Vec<u8> {
    match (&config.ticket_secret, shared_secret) {
        (Some(secret), _) => secret.as_bytes().to_vec(),
        (None, Some(shared)) => shared.into_bytes(),
        (None, None) => {
            let mut random = vec![0u8; 32];
            rand::fill(&mut random[..]);
            random
        }
    }
}

/// Who requests are for, from `--identity` (visitor cookies signed with a
/// key derived from `secret`).
fn open_identity(config: &Config, secret: &[u8]) -> Result<Identity, StartError> {
    Ok(match config.signed_identity()? {
        Some(signed) => Identity::signed(&signed).map_err(config::ConfigError)?,
        None if config.identity == config::IdentityMode::Header => Identity::header(),
        None => Identity::visitor(secret),
    })
}

/// `(max_streams, max_connections)`. Every stream is a connection: unset,
/// either cap follows the other one set explicitly.
fn caps(config: &Config) -> Result<(usize, usize), StartError> {
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
    Ok((max_streams, max_connections))
}

/// The live queue catalog, seeded from the flags.
async fn open_catalog(
    config: &Config,
    store: &SharedStore,
) -> Result<Arc<Catalog>, config::ConfigError> {
    let seeds = config.seed_settings()?;
    Ok(Arc::new(
        Catalog::open_with(store.clone(), seeds, config.seed_defaults()).await,
    ))
}

/// The per-buyer and per-address request limits.
fn request_limits(config: &Config) -> RequestLimits {
    RequestLimits::new(
        PER_SECOND,
        BURST,
        AddressPolicy {
            joins_per_minute: config.joins_per_address_per_minute,
            places: config.places_per_address,
            visitors_per_minute: config.visitors_per_address_per_minute,
        },
    )
}

/// The order gate, following the catalog's queues from the start.
fn open_gate(
    config: &Config,
    store: &SharedStore,
    queues: &[QueueName],
    catalog: &Catalog,
    shutdown: &CancellationToken,
) -> gate::Gate {
    let lease = Duration::from_secs(config.claim_lease_secs);
    let gate = gate::Gate::new(
        store.clone(),
        queues.to_vec(),
        lease,
        Duration::from_millis(config.policy().token_ttl_ms) + lease,
        shutdown.clone(),
    );
    gate.set_queues(gate_queues(&catalog.current()));
    gate.set_adaptive(gate_adaptive(&catalog.current()));
    gate
}

/// The built-in reverse proxy, when `--origin` or `[[rooms]]` ask for one.
fn open_front(config: &Config, state: &AppState) -> Result<Option<Arc<front::Front>>, StartError> {
    let rooms = config.front_rooms()?;
    if rooms.is_empty() {
        return Ok(None);
    }
    let timeouts = front::Timeouts {
        connect: Duration::from_millis(config.origin_connect_timeout_ms),
        response: Duration::from_secs(config.origin_timeout_secs),
    };
    for room in &rooms {
        tracing::info!(room = %room.name, queue = %room.queue, origin = %format!("{}://{}", room.origin.scheme(), room.origin.authority), prefix = %room.path_prefix, "in front of a site");
    }
    let tls = rooms.iter().any(|r| r.origin.tls);
    let mut proxy = front::Front::new(
        front::Rooms::new(rooms),
        timeouts,
        config.client_address_header,
        state.settings().base_path.clone(),
        front_passes(state),
    );
    if tls {
        let ca = config.origin_ca_certs()?;
        proxy = proxy.with_origin_tls(front::OriginTls::new(timeouts, ca));
    }
    Ok(Some(Arc::new(proxy)))
}

/// What the proxy checks passes with: the instance's pass service (the
/// configured key ring, the ended sessions, the activity batch), so a
/// pass from the proxy and one from the gateway check are the same.
fn front_passes(state: &AppState) -> Arc<dyn front::Passes> {
    Arc::new(front::PassGate::new(
        state.passes().clone(),
        state.settings().pass_cookie.name.clone(),
    ))
}

/// What the handlers read of `config`.
fn http_settings(config: &Config, max_streams: usize) -> Result<HttpSettings, StartError> {
    Ok(HttpSettings {
        base_path: config.effective_base_path(),
        ticket_in_query: config.ticket_in_query,
        ticket_ttl_secs: config.ticket_ttl_secs,
        allowed_origins: config.allowed_origins.clone(),
        drain: Duration::from_secs(config.drain_secs),
        keep_alive: Duration::from_secs(config.keep_alive_secs),
        streams_per_address: config.streams_per_address,
        shop_url: config.shop_url.clone(),
        claim_lease_secs: config.claim_lease_secs,
        stock_from_orders: config.stock_from_orders,
        admin_hosts: config.admin_host_names()?,
        cookie_secure: config.cookie_secure,
        service_token: config.service_token.clone(),
        admin_token: config
            .admin_token
            .clone()
            .unwrap_or_else(|| queue::EntryToken::generate().as_str().to_owned()),
        max_streams,
        pass_cookie: config.pass_cookie_settings(),
        sessions: config.session_policy(),
        protected_origins: config.protected_origins(),
        pass_page_url: config.pass_page_url.clone(),
    })
}

/// The admission passes' service: the key ring from `--pass-key` (and the
/// previous keys), or a key generated now, warned about: no other
/// instance knows it, and a restart forgets it.
fn open_passes(config: &Config) -> Result<crate::pass::PassService, StartError> {
    let now = crate::clock::now_ms() / 1000;
    let (ring, generated) = config.pass_key_ring(now)?;
    if generated {
        if config.redis_url.is_some() {
            tracing::warn!(
                "no --pass-key: passes are signed with a key generated at start, which no other instance accepts and a restart forgets; give every instance the same --pass-key"
            );
        } else {
            tracing::warn!(
                "no --pass-key: passes are signed with a key generated at start; a restart forgets it (every pass issued before is refused)"
            );
        }
    }
    Ok(crate::pass::PassService::new(Arc::new(ring)))
}

/// What the transport reads of `config`.
fn server_settings(config: &Config, max_connections: usize) -> server::Settings {
    server::Settings {
        body_timeout: config.body_timeout(),
        first_byte_timeout: config.first_byte_timeout(),
        idle_timeout: config.idle_timeout(),
        drain: Duration::from_secs(config.drain_secs),
        max_connections,
        connections_per_address: config.connections_per_address(max_connections),
        admin_reserved_connections: config.admin_reserved_connections,
        // Store calls from a serving thread go over a connection of the
        // thread's own (a single Redis; the other stores ignore it).
        thread_start: Some(crate::store::redis::serve_calls_from_this_thread),
    }
}

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
