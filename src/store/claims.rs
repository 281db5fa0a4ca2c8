//! Claims: how an order takes an entry token (a lease), then deletes it on
//! commit or gives it back on rollback. The order gate's half of the store
//! (with adaptive admission's counting of its outcomes).

use async_trait::async_trait;

use super::StoreResult;
use crate::queue::{QueueName, UserId};

/// The outcome of claiming an entry token for one order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The token is now claimed under `claim_id` until the lease ends.
    Claimed { claim_id: String },
    /// No such token for this user (missing, wrong, foreign or expired).
    Invalid,
    /// Another order holds a live claim on it.
    InUse,
}

/// Claiming, renewing, consuming and releasing entry tokens for orders.
#[async_trait]
pub trait ClaimStore: Send + Sync + 'static {
    /// Claims `user`'s token for one order if `presented` matches it and no
    /// live claim holds it; the claim is a lease of `lease_ms`, and the
    /// token lives at least until the lease ends.
    async fn claim(
        &self,
        queue: &QueueName,
        user: &UserId,
        presented: &str,
        lease_ms: u64,
    ) -> StoreResult<ClaimOutcome>;

    /// The user whose live (unexpired, unused) token `presented` is, if
    /// any, so the token API can claim with the token alone. Only a
    /// look-up: [`ClaimStore::claim`] checks the token again, atomically,
    /// when it claims.
    async fn token_holder(&self, queue: &QueueName, presented: &str)
    -> StoreResult<Option<UserId>>;

    /// Deletes the token claimed under `claim_id` (the order committed) and
    /// frees the user's active slot. Idempotent, so it can be retried at
    /// any time, also long after the order (a recorded consume finished
    /// after a restart):
    /// - `true`: deleted now. The claim's lease need not be live: a lapsed
    ///   claim still deletes its token while no newer claim holds it.
    /// - `false`: nothing for this claim to delete: the token is gone
    ///   (consumed already, expired, left) or a newer claim holds it (that
    ///   order settles it). Either way the caller is done.
    /// - `Err`: the store did not answer; whether it deleted is unknown,
    ///   and retrying is safe.
    async fn consume(&self, queue: &QueueName, user: &UserId, claim_id: &str) -> StoreResult<bool>;

    /// Returns a claimed token to READY (the order rolled back). True if the
    /// claim was still held.
    async fn release(&self, queue: &QueueName, user: &UserId, claim_id: &str) -> StoreResult<bool>;

    /// Extends a live order's claim: if `claim_id` still holds `user`'s
    /// token (not consumed, released, expired or taken over by a newer
    /// claim), the lease runs `lease_ms` from now and the token lives at
    /// least as long. True if it held. A working order keeps its claim by
    /// calling this well within the lease; a dead one's claim lapses.
    async fn renew_claim(
        &self,
        queue: &QueueName,
        user: &UserId,
        claim_id: &str,
        lease_ms: u64,
    ) -> StoreResult<bool>;
}
