//! Taking an order: stock, order and the token's delete in one
//! transaction (see the module's root for why each guard is there), and
//! reading orders back.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sqlx::Row;
use time::OffsetDateTime;

use super::{Order, OrderError, OrderStore};
use crate::gate::PendingConsume;

impl OrderStore {
    /// Places `consume.user`'s order in one transaction: takes the stock,
    /// records the order, the idempotency key of the entry token it used
    /// and the token's delete (`consume`, unconfirmed), commits. Nothing is
    /// written unless all of it is. More than the stock left is
    /// `OutOfStock`; otherwise more than `max_per_order` is `OverLimit`.
    pub async fn place(
        &self,
        product_id: &str,
        quantity: i64,
        idempotency_key: &str,
        consume: &PendingConsume,
    ) -> Result<Order, OrderError> {
        let user = consume.user.as_str();
        let mut tx = self.pool.begin().await?;
        let taken = sqlx::query(
            "UPDATE products SET stock = stock - $1
             WHERE id = $2 AND stock >= $1 AND max_per_order >= $1",
        )
        .bind(quantity)
        .bind(product_id)
        .execute(&mut *tx)
        .await?;
        if taken.rows_affected() == 0 {
            let row = sqlx::query("SELECT stock, max_per_order FROM products WHERE id = $1")
                .bind(product_id)
                .fetch_optional(&mut *tx)
                .await?;
            tx.rollback().await?;
            let Some(row) = row else {
                return Err(OrderError::UnknownProduct);
            };
            let (stock, max): (i64, i64) = (row.try_get("stock")?, row.try_get("max_per_order")?);
            return Err(if quantity > stock {
                OrderError::OutOfStock
            } else {
                debug_assert!(quantity > max);
                OrderError::OverLimit { max }
            });
        }
        let order = Order {
            order_id: new_order_id(),
            product_id: product_id.to_owned(),
            quantity,
            user_id: user.to_owned(),
            created_at: now_rfc3339(),
            status: "CONFIRMED",
        };
        let inserted = sqlx::query(
            "INSERT INTO orders (id, user_id, product_id, quantity, created_at, token_sha256,
               claim_queue, claim_id, consume_confirmed)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 0)",
        )
        .bind(&order.order_id)
        .bind(&order.user_id)
        .bind(&order.product_id)
        .bind(order.quantity)
        .bind(&order.created_at)
        .bind(idempotency_key)
        .bind(consume.queue.as_str())
        .bind(&consume.claim_id)
        .execute(&mut *tx)
        .await;
        match inserted {
            Ok(_) => {}
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                tx.rollback().await?;
                return Err(OrderError::TokenAlreadyUsed);
            }
            Err(e) => return Err(e.into()),
        }
        tx.commit().await?;
        Ok(order)
    }

    /// One order.
    pub async fn order(&self, id: &str) -> Result<Option<Order>, sqlx::Error> {
        let row = sqlx::query(
            "SELECT id, user_id, product_id, quantity, created_at FROM orders WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            Ok(Order {
                order_id: r.try_get("id")?,
                user_id: r.try_get("user_id")?,
                product_id: r.try_get("product_id")?,
                quantity: r.try_get("quantity")?,
                created_at: r.try_get("created_at")?,
                status: "CONFIRMED",
            })
        })
        .transpose()
    }

    /// How many orders exist for `product_id`.
    pub async fn order_count(&self, product_id: &str) -> Result<i64, sqlx::Error> {
        sqlx::query("SELECT COUNT(*) AS n FROM orders WHERE product_id = $1")
            .bind(product_id)
            .fetch_one(&self.pool)
            .await?
            .try_get("n")
    }
}

/// 128 random bits: order ids are unguessable, so knowing one is needed to
/// read it.
fn new_order_id() -> String {
    let mut bytes = [0u8; 16];
    rand::fill(&mut bytes);
    format!("ord_{}", URL_SAFE_NO_PAD.encode(bytes))
}

fn now_rfc3339() -> String {
    OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}
