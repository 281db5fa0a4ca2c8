//! The order gate: how an order service uses an entry token for exactly
//! one order.
//!
//! [`EntryPass`] is an axum extractor that claims the token from
//! `X-User-Id` + `X-Entry-Token` before the handler runs (`401` for a
//! missing, wrong, foreign or expired token, `409 token_in_use` while
//! another order holds it, `503` when the store is away). The handler gets
//! a pass to call [`EntryPass::commit_succeeded`] after its transaction
//! commits (the token is deleted, durably) or [`EntryPass::rolled_back`]
//! (the token is kept for a retry). Dropping the pass without either
//! releases the claim, so an early return or a panic never burns a token.
//!
//! ```no_run
//! use axum::{routing::post, Json, Router};
//! use waitroom::gate::{EntryPass, Gate};
//!
//! async fn place_order(pass: EntryPass, Json(order): Json<serde_json::Value>) -> &'static str {
//!     // ... validate `order`; returning early here releases the claim ...
//!     let committed = true; // your SQL transaction
//!     if committed {
//!         pass.commit_succeeded().await; // deletes the token
//!         "ordered"
//!     } else {
//!         pass.rolled_back().await; // keeps the token for a retry
//!         "try again"
//!     }
//! }
//!
//! # async fn build(gate: Gate) {
//! let app: Router = Router::new().route("/orders", post(place_order)).with_state(gate);
//! # }
//! ```

mod pass;

pub use pass::EntryPass;

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::queue::{QueueName, UserId};
use crate::store::{ClaimOutcome, SharedStore, StoreError};

/// Claims entry tokens and deletes them after commit. Cheap to clone.
#[derive(Clone)]
pub struct Gate {
    store: SharedStore,
    queues: Vec<QueueName>,
    lease: Duration,
    /// How long a failed delete is retried: a token cannot outlive this.
    retry_for: Duration,
    retries: TaskTracker,
    shutdown: CancellationToken,
}

/// Why a token could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// `401`: no `X-User-Id`, or a malformed one.
    #[error("the X-User-Id header is missing or malformed")]
    MissingUser,
    /// `401`: no `X-Entry-Token`.
    #[error("the X-Entry-Token header is required")]
    MissingToken,
    /// `401`: the token is not this user's valid token in any queue.
    #[error("the entry token is invalid, expired or not yours")]
    InvalidToken,
    /// `409`: another order holds a live claim on the token.
    #[error("the entry token is being used by another order")]
    InUse,
    /// `503`: the store is unreachable; refused (fail-closed).
    #[error("store unavailable")]
    Store(#[from] StoreError),
}

/// A live claim on one user's token in one queue.
pub struct Claim {
    pub queue: QueueName,
    pub user: UserId,
    pub claim_id: String,
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
            queues,
            lease,
            retry_for,
            retries: TaskTracker::new(),
            shutdown,
        }
    }

    /// Claims `user`'s `token`: in `queue` if given, else in whichever
    /// configured queue it belongs to.
    pub async fn claim(
        &self,
        queue: Option<&QueueName>,
        user: &UserId,
        token: &str,
    ) -> Result<Claim, GateError> {
        // Tokens are 43 characters; anything far off is not worth a round trip.
        if token.is_empty() || token.len() > 128 {
            return Err(GateError::InvalidToken);
        }
        let candidates: Vec<&QueueName> = match queue {
            Some(q) if self.queues.contains(q) => vec![q],
            Some(_) => return Err(GateError::InvalidToken),
            None => self.queues.iter().collect(),
        };
        let lease_ms = self.lease.as_millis() as u64;
        let mut in_use = false;
        for q in candidates {
            match self.store.claim(q, user, token, lease_ms).await? {
                ClaimOutcome::Claimed { claim_id } => {
                    metrics::counter!("waitroom_token_claims_total", "result" => "claimed")
                        .increment(1);
                    return Ok(Claim {
                        queue: q.clone(),
                        user: user.clone(),
                        claim_id,
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

    /// Deletes the claimed token after its order committed. If the store
    /// is away, the delete is retried in the background until it succeeds
    /// or the token could no longer exist; the caller's answer does not wait.
    pub async fn consume(&self, claim: Claim) {
        match self
            .store
            .consume(&claim.queue, &claim.user, &claim.claim_id)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(queue = %claim.queue, user = %claim.user, "token already gone at consume")
            }
            Err(e) => {
                tracing::warn!(queue = %claim.queue, user = %claim.user, error = %e, "consume failed after commit; retrying");
                metrics::counter!("waitroom_consume_retries_total").increment(1);
                self.retries.spawn(retry_consume(self.clone(), claim));
            }
        }
    }

    /// Returns a claimed token to READY after its order rolled back.
    pub async fn release(&self, claim: Claim) {
        if let Err(e) = self
            .store
            .release(&claim.queue, &claim.user, &claim.claim_id)
            .await
        {
            // The lease lapses by itself; the token comes back then.
            tracing::warn!(queue = %claim.queue, user = %claim.user, error = %e, "release failed; the claim lease will lapse");
        }
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

async fn retry_consume(gate: Gate, claim: Claim) {
    let deadline = tokio::time::Instant::now() + gate.retry_for;
    let mut backoff = Duration::from_millis(100);
    loop {
        let stopping = tokio::select! {
            _ = gate.shutdown.cancelled() => true,
            _ = tokio::time::sleep(backoff) => false,
        };
        match gate
            .store
            .consume(&claim.queue, &claim.user, &claim.claim_id)
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
