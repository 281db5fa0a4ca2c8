//! waitroom: a virtual waiting room in front of an order API.
//!
//! [`run`] serves a configured instance until its shutdown token fires;
//! [`app`] builds the router alone so tests can drive it without a socket.
//! The layout follows the architecture: `queue` holds the rules, `store`
//! the state (Redis or memory), `admission` the loop that lets people in,
//! `push` the per-instance event fan-out, `http` the API, `server` the
//! connections it is served on.

pub mod admission;
pub mod config;
pub mod gate;
pub mod http;
pub mod orders;
pub mod push;
pub mod queue;
pub mod server;
pub mod store;
pub mod telemetry;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::Config;
use queue::{Policy, QueueName, TicketSigner};
use store::memory::MemoryStore;
use store::redis::RedisStore;
use store::{SharedStore, StoreError};

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("cannot reach the store: {0}")]
    Store(#[from] StoreError),
    #[error("cannot open the order database: {0}")]
    Orders(#[from] sqlx::Error),
    #[error("cannot serve: {0}")]
    Io(#[from] std::io::Error),
}

/// Everything a request handler or background task needs; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    policy: Policy,
    queues: Vec<QueueName>,
    queue_set: HashSet<QueueName>,
    store: SharedStore,
    signer: TicketSigner,
    admin_token: String,
    hub: push::Hub,
    gate: gate::Gate,
    limits: http::limit::RequestLimits,
    orders: Option<orders::OrderStore>,
    max_streams: usize,
    max_connections: usize,
    shutdown: CancellationToken,
}

impl AppState {
    /// Validates `config`, connects the store and sets up the ticket secret.
    pub async fn new(config: Config, shutdown: CancellationToken) -> Result<Self, StartError> {
        config.validate()?;
        let (store, shared_secret): (SharedStore, Option<String>) = match &config.redis_url {
            Some(url) => {
                let redis = RedisStore::connect(url, &config.key_prefix).await?;
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
            None => (Arc::new(MemoryStore::new()), None),
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
        let signer = match (&config.ticket_secret, shared_secret) {
            (Some(secret), _) => TicketSigner::new(secret.as_bytes().to_vec()),
            (None, Some(shared)) => TicketSigner::new(shared.into_bytes()),
            (None, None) => TicketSigner::random(),
        };
        let admin_token = config
            .admin_token
            .clone()
            .unwrap_or_else(|| queue::EntryToken::generate().as_str().to_owned());
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
        let policy = config.policy();
        let gate = gate::Gate::new(
            store.clone(),
            queues.clone(),
            Duration::from_secs(config.claim_lease_secs),
            Duration::from_millis(policy.token_ttl_ms)
                + Duration::from_secs(config.claim_lease_secs),
            shutdown.clone(),
        );
        Ok(Self {
            inner: Arc::new(Inner {
                policy,
                gate,
                limits: http::limit::RequestLimits::default(),
                orders,
                queue_set: queues.iter().cloned().collect(),
                hub: push::Hub::new(&queues),
                max_streams,
                max_connections,
                queues,
                config,
                store,
                signer,
                admin_token,
                shutdown,
            }),
        })
    }

    /// The store.
    pub fn store(&self) -> &SharedStore {
        &self.inner.store
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The admission policy of every queue.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// The configured queues, in configuration order.
    pub fn queue_names(&self) -> &[QueueName] {
        &self.inner.queues
    }

    /// Whether `queue` is configured.
    pub fn has_queue(&self, queue: &QueueName) -> bool {
        self.inner.queue_set.contains(queue)
    }

    /// The ticket signer.
    pub fn signer(&self) -> &TicketSigner {
        &self.inner.signer
    }

    /// The bearer token of the admin and token APIs.
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

    /// Per-buyer request limits of this instance.
    pub fn limits(&self) -> &http::limit::RequestLimits {
        &self.inner.limits
    }

    /// The demo order database, when `--orders on`.
    pub fn orders(&self) -> Option<&orders::OrderStore> {
        self.inner.orders.as_ref()
    }

    /// The bearer token of the token API.
    pub fn service_token(&self) -> &str {
        self.inner
            .config
            .service_token
            .as_deref()
            .unwrap_or(&self.inner.admin_token)
    }

    /// The per-instance event hub.
    pub fn hub(&self) -> &push::Hub {
        &self.inner.hub
    }

    /// The shutdown signal shared by the server and every task.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.inner.shutdown
    }

    /// Admissions per second to estimate waits with: observed, or the
    /// configured rate until there is data.
    pub fn admission_rate(&self, queue: &QueueName) -> f64 {
        self.inner
            .hub
            .rate(queue, self.inner.policy.configured_rate())
    }

    /// Starts the admission loop, the event subscription and, with the
    /// demo order service, its token-delete reconciler on `tasks`.
    pub fn spawn_background(&self, tasks: &TaskTracker) {
        tasks.spawn(admission::run(self.clone()));
        tasks.spawn(push::run(self.clone()));
        if let Some(orders) = self.orders() {
            tasks.spawn(orders::reconcile::run(
                orders.clone(),
                self.gate().clone(),
                self.shutdown().clone(),
            ));
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

/// The router of the whole service.
pub fn app(state: AppState) -> Router {
    http::router(state)
}

/// Serves `config` on `listener` until `shutdown` fires, then stops every
/// background task before returning.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    telemetry::install_metrics();
    let state = AppState::new(config, shutdown.clone()).await?;
    if state.config().admin_token.is_none() {
        println!(
            "admin token (set --admin-token to choose one): {}",
            state.admin_token()
        );
    }
    serve(state, listener).await
}

/// Serves an already built state; see [`run`].
pub async fn serve(state: AppState, listener: TcpListener) -> Result<(), StartError> {
    let shutdown = state.shutdown().clone();
    let state_gate = state.gate().clone();
    // The whole shutdown fits in `--drain-secs` + 5 s from the signal: the
    // server's own hard cap, and what is left of it for the tasks below.
    let grace = Duration::from_secs(state.config().drain_secs) + SHUTDOWN_SLACK;
    let stop_by = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            tokio::time::Instant::now() + grace
        })
    };
    let tasks = TaskTracker::new();
    state.spawn_background(&tasks);
    tracing::info!(addr = %listener.local_addr()?, queues = state.queue_names().len(), "waitroom listening");
    let served = server::serve(state, listener).await;
    shutdown.cancel();
    let stop_by = stop_by
        .await
        .unwrap_or_else(|_| tokio::time::Instant::now());
    tasks.close();
    let stopped = async {
        state_gate.drain().await;
        tasks.wait().await;
    };
    // Whatever is cut off here is safe to drop: recorded token deletes are
    // finished by the next process, claims lapse by themselves.
    if tokio::time::timeout_at(stop_by, stopped).await.is_err() {
        tracing::warn!("background tasks still running at the end of the shutdown window");
    }
    Ok(served?)
}

/// What the shutdown window adds to `--drain-secs`: in-flight requests
/// finish and background tasks stop within it.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(5);
