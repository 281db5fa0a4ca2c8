//! The outbox: each order records, in its own transaction, the entry
//! token's delete it owes, until the token store confirms it. What is
//! still owed after a failure or a restart is read here by the reconciler
//! (`reconcile.rs`), which is rung to retry soon when a delete just failed.

use sqlx::Row;

use super::OrderStore;
use crate::gate::PendingConsume;
use crate::queue::{QueueName, UserId};

/// An order whose token delete is not confirmed yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unconfirmed {
    pub order_id: String,
    /// What to delete; `None` if the record cannot be read back (a queue or
    /// user name this version refuses), so there is nothing to retry.
    pub consume: Option<PendingConsume>,
}

impl OrderStore {
    /// Marks `order_id`'s token delete as done. True if it was pending.
    pub async fn confirm_consume(&self, order_id: &str) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE orders SET consume_confirmed = 1 WHERE id = $1 AND consume_confirmed = 0",
        )
        .bind(order_id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// At most `limit` orders whose token delete is not confirmed, oldest
    /// first.
    pub async fn unconfirmed(&self, limit: u32) -> Result<Vec<Unconfirmed>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT id, user_id, claim_queue, claim_id FROM orders
             WHERE consume_confirmed = 0 ORDER BY created_at, id LIMIT $1",
        )
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let order_id: String = r.try_get("id")?;
                let user: String = r.try_get("user_id")?;
                let queue: Option<String> = r.try_get("claim_queue")?;
                let claim_id: Option<String> = r.try_get("claim_id")?;
                let consume = match (queue, claim_id) {
                    (Some(queue), Some(claim_id)) => {
                        match (QueueName::parse(&queue), UserId::parse(&user)) {
                            (Ok(queue), Ok(user)) => Some(PendingConsume {
                                queue,
                                user,
                                claim_id,
                            }),
                            _ => None,
                        }
                    }
                    _ => None,
                };
                Ok(Unconfirmed { order_id, consume })
            })
            .collect()
    }

    /// How many orders' token deletes are not confirmed yet.
    pub async fn unconfirmed_count(&self) -> Result<i64, sqlx::Error> {
        sqlx::query("SELECT COUNT(*) AS n FROM orders WHERE consume_confirmed = 0")
            .fetch_one(&self.pool)
            .await?
            .try_get("n")
    }

    /// Asks the reconciler to retry unconfirmed deletes soon (an order's
    /// delete just failed). Never lost: a ring while it is busy counts.
    pub fn ring_reconciler(&self) {
        self.doorbell.notify_one();
    }

    /// Waits for [`OrderStore::ring_reconciler`].
    pub(super) async fn rung(&self) {
        self.doorbell.notified().await;
    }
}
