//! The order gate: how an order service uses an entry token for exactly
//! one order.
//!
//! The gate itself knows no HTTP framework: its axum extractor,
//! [`EntryPass`](crate::http::EntryPass), lives with the API (`crate::http::gate`).
//!
//! [`EntryPass`](crate::http::EntryPass) is an axum extractor. It reads the buyer from the gate's
//! identity source ([`Gate::with_identity`]; `X-User-Id` from a trusted
//! gateway unless told otherwise) and the `X-Entry-Token` header (`401`
//! when missing, `400 duplicate_header` when sent twice), then the whole
//! request body
//! (bounded, see [`Gate::with_body_limit`]: `413` past it; `408` when it
//! does not arrive within a `tower_http` body timeout in front, as
//! waitroom's `--body-timeout-secs`), and only then claims the token
//! (`401` for a wrong, foreign or expired token, `409 token_in_use` while
//! another order holds it, `503` when the store is away). Claiming after
//! the body is in means a slow upload never holds a claim; a bad token is
//! still answered `401` before any body error.
//!
//! While the handler runs, the pass renews the claim's lease every third of
//! it, so a working handler never loses its claim however long its
//! transaction takes; a dead process stops renewing and its claim lapses,
//! returning the token to READY. The handler then calls
//! [`EntryPass::commit_succeeded`](crate::http::EntryPass::commit_succeeded) after its transaction commits (the token
//! is deleted, durably) or [`EntryPass::rolled_back`](crate::http::EntryPass::rolled_back) (the token is kept
//! for a retry). Dropping the pass without either releases the claim, so an
//! early return or a panic never burns a token.
//!
//! Store [`EntryPass::idempotency_key`](crate::http::EntryPass::idempotency_key) with the order under a `UNIQUE`
//! constraint. The gate makes one token buy once while its store keeps
//! track; the key makes the database refuse a second order even when the
//! store could not (it was away longer than a lease, or the delete after a
//! commit never landed).
//!
//! # A durable consume (outbox)
//!
//! [`EntryPass::commit_succeeded`](crate::http::EntryPass::commit_succeeded) retries a failed delete in the
//! background, but only in this process: a restart or a deploy in between
//! loses it, the claim lapses, and the used token is READY again (the
//! buyer's page shows a token that cannot buy; a service without the
//! `UNIQUE` key would sell twice). To make the delete survive restarts,
//! record it with the order:
//!
//! 1. In the order's transaction, store [`EntryPass::pending_consume`](crate::http::EntryPass::pending_consume)
//!    (queue, user, claim id) with the order, marked unconfirmed.
//! 2. After `COMMIT`, call [`EntryPass::commit_recorded`](crate::http::EntryPass::commit_recorded); when it returns
//!    `Ok`, mark the record confirmed.
//! 3. A reconciler (at start-up, then periodically, in bounded batches with
//!    backoff while the store is away) calls [`Gate::consume_pending`] for
//!    each unconfirmed record and marks it confirmed on `Ok`.
//!
//! Both `Ok(true)` (deleted now) and `Ok(false)` (nothing left for this
//! claim to delete: consumed already, expired, or claimed anew by a later
//! order, which settles it itself) mean done; only `Err` means retry. The
//! consume is idempotent, so a record retried twice, or by two instances,
//! is harmless. The idempotency key under `UNIQUE` stays the safety net for
//! the window before the reconciler gets through (the demo service in
//! `src/orders/` does all of this).
//!
//! ```no_run
//! use axum::extract::{FromRef, State};
//! use axum::http::StatusCode;
//! use axum::{routing::post, Router};
//! use serde::Deserialize;
//! use sqlx::SqlitePool;
//! use waitroom::gate::Gate;
//! use waitroom::http::EntryPass;
//!
//! // `idempotency_key` is UNIQUE: one entry token, one order row, even if
//! // the token store ever lost track of a claim or a used token.
//! const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS orders (
//!     id INTEGER PRIMARY KEY,
//!     user_id TEXT NOT NULL,
//!     product_id TEXT NOT NULL,
//!     quantity INTEGER NOT NULL,
//!     idempotency_key TEXT NOT NULL UNIQUE)";
//!
//! #[derive(Clone)]
//! struct Shop {
//!     gate: Gate,
//!     db: SqlitePool,
//! }
//!
//! impl FromRef<Shop> for Gate {
//!     fn from_ref(shop: &Shop) -> Gate {
//!         shop.gate.clone()
//!     }
//! }
//!
//! #[derive(Deserialize)]
//! #[serde(rename_all = "camelCase")]
//! struct NewOrder {
//!     product_id: String,
//!     quantity: i64,
//! }
//!
//! // The pass is the last argument: it takes the body, and hands it over
//! // only once the token is claimed.
//! async fn place_order(State(shop): State<Shop>, pass: EntryPass) -> (StatusCode, &'static str) {
//!     let Ok(order) = pass.json::<NewOrder>() else {
//!         pass.rolled_back().await; // keeps the token for a corrected retry
//!         return (StatusCode::BAD_REQUEST, "bad order");
//!     };
//!     let inserted = sqlx::query(
//!         "INSERT INTO orders (user_id, product_id, quantity, idempotency_key)
//!          VALUES (?, ?, ?, ?)",
//!     )
//!     .bind(pass.user().as_str())
//!     .bind(&order.product_id)
//!     .bind(order.quantity)
//!     .bind(pass.idempotency_key())
//!     .execute(&shop.db)
//!     .await;
//!     match inserted {
//!         Ok(_) => {
//!             pass.commit_succeeded().await; // deletes the token (see the outbox above)
//!             (StatusCode::CREATED, "ordered")
//!         }
//!         Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
//!             pass.commit_succeeded().await; // this token bought already: finish deleting it
//!             (StatusCode::UNAUTHORIZED, "this entry token was already used")
//!         }
//!         Err(_) => {
//!             pass.rolled_back().await; // keeps the token for a retry
//!             (StatusCode::SERVICE_UNAVAILABLE, "try again")
//!         }
//!     }
//! }
//!
//! # async fn build(gate: Gate, db: SqlitePool) {
//! sqlx::query(SCHEMA).execute(&db).await.unwrap();
//! let app: Router = Router::new()
//!     .route("/orders", post(place_order))
//!     .with_state(Shop { gate, db });
//! # }
//! ```

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::identity::{Identity, IdentityError};
use crate::queue::{QueueName, UserId};
use crate::store::{ClaimOutcome, OrderSignal, SharedStore, StoreError};

/// Claims entry tokens and deletes them after commit. Cheap to clone.
#[derive(Clone)]
pub struct Gate {
    store: SharedStore,
    /// The queues whose tokens it accepts, each with its claim lease;
    /// shared by every clone and replaced as queues come and go
    /// ([`Gate::set_queues`]).
    queues: Arc<RwLock<Vec<(QueueName, Duration)>>>,
    /// How long a failed delete is retried: a token cannot outlive this.
    retry_for: Duration,
    retries: TaskTracker,
    shutdown: CancellationToken,
    /// The largest order body [`EntryPass`](crate::http::EntryPass) reads.
    body_limit: usize,
    /// Who an order is for: the same source the queue reads.
    identity: Identity,
    /// Queues with adaptive admission on, each with its window (ms): their
    /// orders' outcomes are counted for the controller.
    adaptive: Arc<RwLock<HashMap<QueueName, u64>>>,
}

/// The order body [`EntryPass`](crate::http::EntryPass) reads at most unless
/// [`Gate::with_body_limit`] says otherwise (the rest of the API's cap).
pub const DEFAULT_BODY_LIMIT: usize = 16 * 1024;

/// Why a token could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// `401`: no `X-User-Id`, or a malformed one.
    #[error("the X-User-Id header is missing or malformed")]
    MissingUser,
    /// `401`: the identity source refused the request (visitor or signed
    /// mode: no, a forged or an expired credential).
    #[error(transparent)]
    Identity(IdentityError),
    /// `401`: no `X-Entry-Token`.
    #[error("the X-Entry-Token header is required")]
    MissingToken,
    /// `401`: the token is not this user's valid token in any queue.
    #[error("the entry token is invalid, expired or not yours")]
    InvalidToken,
    /// `400`: an identity header was sent more than once, so which one
    /// names the buyer is ambiguous (a gateway that appends instead of
    /// replacing would let a client pick).
    #[error("the {0} header must be sent once")]
    DuplicateHeader(&'static str),
    /// `413`: the order body is larger than the gate reads.
    #[error("the request body is too large")]
    BodyTooLarge,
    /// `408`: the order body did not arrive within the server's body
    /// timeout (the claim taken meanwhile is released).
    #[error("the request body did not arrive in time")]
    BodyTimeout,
    /// `400`: the order body could not be read (the client broke it off).
    #[error("the request body could not be read")]
    BodyUnreadable,
    /// `409`: another order holds a live claim on the token.
    #[error("the entry token is being used by another order")]
    InUse,
    /// `503`: the store is unreachable; refused (fail-closed).
    #[error("store unavailable")]
    Store(#[from] StoreError),
}

/// A token to delete once its order has committed: what an order service
/// records with the order, in the same transaction, so the delete can be
/// retried after a restart (see the module docs: a durable consume).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingConsume {
    pub queue: QueueName,
    pub user: UserId,
    /// The claim the order holds; only it may delete the token.
    pub claim_id: String,
}

/// A live claim on one user's token in one queue.
pub struct Claim {
    pub queue: QueueName,
    pub user: UserId,
    pub claim_id: String,
    /// The token's fingerprint (see [`idempotency_key`]).
    pub idempotency_key: String,
}

/// How a claim is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// The order committed: delete the token. `claimed_ms`: how long
    /// after the claim, when known (for adaptive admission).
    Consume { claimed_ms: Option<u64> },
    /// The order rolled back: the token is READY again.
    Release,
}

/// The idempotency key of an entry token: its SHA-256, hex. Order services
/// store it with the order under a `UNIQUE` constraint so one token can
/// never make two orders, even if the token store lost track of it; being
/// a one-way hash, the stored key cannot be turned back into a token.
pub fn idempotency_key(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Gate {
    /// A gate over `store` accepting tokens of `queues`. A claim lives for
    /// `lease` unless committed or released; a failed delete after commit
    /// is retried for `retry_for` (the longest a token can live).
    pub fn new(
        store: SharedStore,
        queues: Vec<QueueName>,
        lease: Duration,
        retry_for: Duration,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            store,
            queues: Arc::new(RwLock::new(
                queues.into_iter().map(|q| (q, lease)).collect(),
            )),
            retry_for,
            retries: TaskTracker::new(),
            shutdown,
            body_limit: DEFAULT_BODY_LIMIT,
            identity: Identity::header(),
            adaptive: Arc::default(),
        }
    }

    /// Counts orders' outcomes of `queues` (queue → window, ms) for
    /// adaptive admission from now on; other queues' are not counted.
    pub fn set_adaptive(&self, queues: HashMap<QueueName, u64>) {
        *self.adaptive.write().unwrap_or_else(|e| e.into_inner()) = queues;
    }

    /// Counts one order's outcome in `queue`, if its admission follows the
    /// order service. In the background: the buyer's answer never waits
    /// for it, and a store away only loses the sample (the controller then
    /// sees fewer orders and leaves the rate alone).
    pub fn observe(&self, queue: &QueueName, signal: OrderSignal) {
        let window = self
            .adaptive
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(queue)
            .copied();
        let Some(window_ms) = window else { return };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, queue) = (self.store.clone(), queue.clone());
        handle.spawn(async move {
            if let Err(e) = store.record_order(&queue, signal, window_ms).await {
                tracing::debug!(%queue, error = %e, "order outcome not counted");
            }
        });
    }

    /// Accepts tokens of `queues` from now on, each claimed for its lease
    /// (every clone of the gate follows: queues opened or deleted live).
    pub fn set_queues(&self, queues: Vec<(QueueName, Duration)>) {
        *self.queues.write().unwrap_or_else(|e| e.into_inner()) = queues;
    }

    fn queues(&self) -> Vec<(QueueName, Duration)> {
        self.queues
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `queue`'s claim lease (the longest known, for a queue just deleted).
    fn lease_of(&self, queue: &QueueName) -> Duration {
        let known = self.queues();
        known
            .iter()
            .find(|(q, _)| q == queue)
            .or_else(|| known.iter().max_by_key(|(_, l)| *l))
            .map_or(Duration::from_secs(30), |(_, l)| *l)
    }

    /// The same gate reading the buyer with `identity`. Without it, the
    /// gate trusts `X-User-Id` (header mode), as a gate behind a gateway
    /// that sets it should; give it the waitroom server's own identity
    /// source (the same mode, and for visitor cookies the same ticket
    /// secret) so a token is only good for the buyer it was issued to.
    pub fn with_identity(mut self, identity: Identity) -> Self {
        self.identity = identity;
        self
    }

    /// The identity source orders are read with.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The largest order body the extractor reads.
    pub fn body_limit(&self) -> usize {
        self.body_limit
    }

    /// The same gate reading order bodies of at most `bytes` (`413` past it).
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// Claims `user`'s `token`: in `queue` if given, else in whichever
    /// configured queue it belongs to.
    pub async fn claim(
        &self,
        queue: Option<&QueueName>,
        user: &UserId,
        token: &str,
    ) -> Result<Claim, GateError> {
        self.claim_as(queue, Some(user), token).await
    }

    /// Claims `token` for whoever it was issued to, found by the token
    /// itself; the claim names them ([`Claim::user`]). For callers that
    /// cannot know the buyer (an order service behind visitor cookies).
    pub async fn claim_token(
        &self,
        queue: Option<&QueueName>,
        token: &str,
    ) -> Result<Claim, GateError> {
        self.claim_as(queue, None, token).await
    }

    /// [`Gate::claim`] with `user`, else [`Gate::claim_token`].
    async fn claim_as(
        &self,
        queue: Option<&QueueName>,
        user: Option<&UserId>,
        token: &str,
    ) -> Result<Claim, GateError> {
        // Tokens are 43 characters; anything far off is not worth a round trip.
        if token.is_empty() || token.len() > 128 {
            return Err(GateError::InvalidToken);
        }
        let known = self.queues();
        let candidates: Vec<&(QueueName, Duration)> = match queue {
            Some(q) => match known.iter().find(|(k, _)| k == q) {
                Some(found) => vec![found],
                None => return Err(GateError::InvalidToken),
            },
            None => known.iter().collect(),
        };
        let mut in_use = false;
        for (q, lease) in candidates {
            let lease_ms = lease.as_millis() as u64;
            let found;
            let user = match user {
                Some(user) => user,
                None => match self.store.token_holder(q, token).await? {
                    Some(holder) => {
                        found = holder;
                        &found
                    }
                    None => continue,
                },
            };
            match self.store.claim(q, user, token, lease_ms).await? {
                ClaimOutcome::Claimed { claim_id } => {
                    metrics::counter!("waitroom_token_claims_total", "result" => "claimed")
                        .increment(1);
                    return Ok(Claim {
                        queue: q.clone(),
                        user: user.clone(),
                        claim_id,
                        idempotency_key: idempotency_key(token),
                    });
                }
                ClaimOutcome::InUse => in_use = true,
                ClaimOutcome::Invalid => {}
            }
        }
        let result = if in_use { "in_use" } else { "invalid" };
        metrics::counter!("waitroom_token_claims_total", "result" => result).increment(1);
        Err(if in_use {
            GateError::InUse
        } else {
            GateError::InvalidToken
        })
    }

    /// Settles a claim: the one way every settle goes, the extractor's
    /// (`EntryPass`), the token API's and the reconciler's, so each is
    /// counted alike. The store's consume or release, then, only if the
    /// claim still held the token, its counter
    /// (`waitroom_tokens_consumed_total` or `waitroom_tokens_released_total`,
    /// which the console shows) and the order's outcome for adaptive
    /// admission. `Ok(false)`: the claim no longer held the token (already
    /// settled, lapsed and taken, expired): nothing done, nothing counted.
    pub async fn settle(
        &self,
        queue: &QueueName,
        user: &UserId,
        claim_id: &str,
        how: Settle,
    ) -> Result<bool, StoreError> {
        let held = match how {
            Settle::Consume { .. } => self.store.consume(queue, user, claim_id).await?,
            Settle::Release => self.store.release(queue, user, claim_id).await?,
        };
        if held {
            let labels = [("queue", queue.to_string())];
            match how {
                Settle::Consume { claimed_ms } => {
                    metrics::counter!("waitroom_tokens_consumed_total", &labels).increment(1);
                    if let Some(ms) = claimed_ms {
                        self.observe(queue, OrderSignal::Committed { ms });
                    }
                }
                Settle::Release => {
                    metrics::counter!("waitroom_tokens_released_total", &labels).increment(1);
                    self.observe(queue, OrderSignal::RolledBack);
                }
            }
        }
        Ok(held)
    }

    /// Deletes the claimed token after its order committed (`claimed_ms`
    /// after the claim). If the store is away, the delete is retried in the
    /// background until it succeeds or the token could no longer exist; the
    /// caller's answer does not wait.
    pub async fn consume(&self, claim: Claim, claimed_ms: Option<u64>) {
        let how = Settle::Consume { claimed_ms };
        match self
            .settle(&claim.queue, &claim.user, &claim.claim_id, how)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(queue = %claim.queue, user = %claim.user, "token already gone at consume")
            }
            Err(e) => {
                tracing::warn!(queue = %claim.queue, user = %claim.user, error = %e, "consume failed after commit; retrying");
                metrics::counter!("waitroom_consume_retries_total").increment(1);
                self.retries.spawn(retry_consume(self.clone(), claim, how));
            }
        }
    }

    /// Deletes a recorded token once, without background retries: the
    /// caller's record is the retry (see the module docs). `Ok(true)`: the
    /// token was deleted now. `Ok(false)`: this claim has nothing left to
    /// delete (already consumed, expired, or claimed anew by a later order,
    /// which settles it itself); done as well. A claim whose lease lapsed
    /// still deletes its token while no other order has claimed it, so a
    /// record retried after a restart still finishes the job. `Err`: the
    /// store did not answer (bounded by its call timeout); try again later.
    pub async fn consume_pending(
        &self,
        pending: &PendingConsume,
        claimed_ms: Option<u64>,
    ) -> Result<bool, StoreError> {
        let how = Settle::Consume { claimed_ms };
        let deleted = self
            .settle(&pending.queue, &pending.user, &pending.claim_id, how)
            .await?;
        if !deleted {
            tracing::debug!(queue = %pending.queue, user = %pending.user, "recorded consume: nothing left to delete");
        }
        Ok(deleted)
    }

    /// Returns a claimed token to READY after its order rolled back.
    pub async fn release(&self, claim: Claim) {
        let released = self
            .settle(&claim.queue, &claim.user, &claim.claim_id, Settle::Release)
            .await;
        if let Err(e) = released {
            // The lease lapses by itself; the token comes back then.
            tracing::warn!(queue = %claim.queue, user = %claim.user, error = %e, "release failed; the claim lease will lapse");
        }
    }

    /// Renews `claim`'s lease every third of it until the returned token is
    /// cancelled (the order settled or was dropped), the claim is lost, or
    /// the gate shuts down. Renewing well before the lease ends lets one
    /// renewal fail (a store blip) without losing the claim.
    pub fn keep_alive(&self, claim: &Claim) -> CancellationToken {
        let stop = self.shutdown.child_token();
        let store = self.store.clone();
        let (queue, user, claim_id) = (
            claim.queue.clone(),
            claim.user.clone(),
            claim.claim_id.clone(),
        );
        let lease = self.lease_of(&claim.queue);
        let lease_ms = lease.as_millis() as u64;
        let period = (lease / 3).max(Duration::from_millis(10));
        let stopped = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    _ = tokio::time::sleep(period) => {}
                }
                match store.renew_claim(&queue, &user, &claim_id, lease_ms).await {
                    Ok(true) => {}
                    Ok(false) => {
                        // Settled meanwhile, or lapsed and taken: nothing to keep.
                        if !stopped.is_cancelled() {
                            tracing::warn!(%queue, %user, "order claim lost before the order settled");
                        }
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(%queue, %user, error = %e, "claim renewal failed; retrying")
                    }
                }
            }
        });
        stop
    }

    /// Deletes still being retried (for tests and shutdown).
    pub fn pending_consumes(&self) -> usize {
        self.retries.len()
    }

    /// Waits for the background retries to finish (they stop at shutdown
    /// after one last attempt).
    pub async fn drain(&self) {
        self.retries.close();
        self.retries.wait().await;
    }
}

async fn retry_consume(gate: Gate, claim: Claim, how: Settle) {
    let deadline = tokio::time::Instant::now() + gate.retry_for;
    let mut backoff = Duration::from_millis(100);
    loop {
        let stopping = tokio::select! {
            _ = gate.shutdown.cancelled() => true,
            _ = tokio::time::sleep(backoff) => false,
        };
        match gate
            .settle(&claim.queue, &claim.user, &claim.claim_id, how)
            .await
        {
            Ok(deleted) => {
                tracing::info!(queue = %claim.queue, user = %claim.user, deleted, "consume retry succeeded");
                return;
            }
            Err(e) if stopping || tokio::time::Instant::now() >= deadline => {
                tracing::error!(queue = %claim.queue, user = %claim.user, error = %e, "giving up deleting a used token");
                return;
            }
            Err(_) => backoff = (backoff * 2).min(Duration::from_secs(2)),
        }
    }
}
