//! Claims in Redis: an order's lease on an entry token (`claim.lua`,
//! `renew_claim.lua`), and its commit (`consume.lua`) or rollback
//! (`release.lua`), each one atomic step on the user's field of the
//! queue's token HASH; and whose a live token is (`token_holder.lua`, a
//! read of the HASH's index field).
//!
//! With `--redis-wait-replicas`, a claim, its renewal and its consume are
//! answered only once the replicas hold them, as joins and admissions are:
//! a consume a failover lost would give the token back (a second order on
//! it), and a lost claim or renewal would free the lease while its order
//! is still being committed (the fault campaign saw the first: a claim
//! succeeding after its token's consume, past a master killed before it
//! replicated). A release stays as it is: losing one only keeps the lease
//! until it runs out.

use async_trait::async_trait;

use super::RedisStore;
use crate::queue::{EntryToken, QueueName, UserId};
use crate::store::{ClaimOutcome, ClaimStore, StoreError, StoreResult};

#[async_trait]
impl ClaimStore for RedisStore {
    async fn claim(
        &self,
        queue: &QueueName,
        user: &UserId,
        presented: &str,
        lease_ms: u64,
    ) -> StoreResult<ClaimOutcome> {
        let claim_id = EntryToken::generate();
        let reply: Vec<String> = self
            .run_durable(&self.scripts.claim, queue, &[user], Vec::new(), |inv| {
                inv.arg(user.as_str())
                    .arg(presented)
                    .arg(lease_ms)
                    .arg(claim_id.as_str());
            })
            .await?;
        match reply.first().map(String::as_str) {
            Some("claimed") => Ok(ClaimOutcome::Claimed {
                claim_id: claim_id.as_str().to_owned(),
            }),
            Some("invalid") => Ok(ClaimOutcome::Invalid),
            Some("in_use") => Ok(ClaimOutcome::InUse),
            other => Err(StoreError::Protocol(format!("claim returned {other:?}"))),
        }
    }

    async fn token_holder(
        &self,
        queue: &QueueName,
        presented: &str,
    ) -> StoreResult<Option<UserId>> {
        let user: Option<String> = self
            .run_for(&self.scripts.token_holder, queue, &[], Vec::new(), |inv| {
                inv.arg(presented);
            })
            .await?;
        user.map(|u| {
            UserId::parse(&u).map_err(|e| {
                StoreError::Protocol(format!("token_holder returned a bad user id: {}", e.0))
            })
        })
        .transpose()
    }

    async fn consume(&self, queue: &QueueName, user: &UserId, claim_id: &str) -> StoreResult<bool> {
        let stock = vec![self.keys(queue).stock(), self.keys(queue).audit()];
        let n: i64 = self
            .run_durable(&self.scripts.consume, queue, &[user], stock, |inv| {
                inv.arg(user.as_str()).arg(claim_id);
            })
            .await?;
        Ok(n == 1)
    }

    async fn release(&self, queue: &QueueName, user: &UserId, claim_id: &str) -> StoreResult<bool> {
        let n: i64 = self
            .run_for(
                &self.scripts.release,
                queue,
                &[user],
                vec![self.keys(queue).audit()],
                |inv| {
                    inv.arg(user.as_str()).arg(claim_id);
                },
            )
            .await?;
        Ok(n == 1)
    }

    async fn renew_claim(
        &self,
        queue: &QueueName,
        user: &UserId,
        claim_id: &str,
        lease_ms: u64,
    ) -> StoreResult<bool> {
        let n: i64 = self
            .run_durable(
                &self.scripts.renew_claim,
                queue,
                &[user],
                Vec::new(),
                |inv| {
                    inv.arg(user.as_str()).arg(claim_id).arg(lease_ms);
                },
            )
            .await?;
        Ok(n == 1)
    }
}
