//! The demo order service's data: products and orders in a real SQL
//! database with real transactions: an embedded SQLite file for one
//! instance, or a PostgreSQL server that every instance shares (one stock
//! and one order table, so two instances never show two stocks, and an
//! order placed through one is found through any).
//!
//! Both run the same statements through sqlx's `Any` driver: `$n`
//! placeholders, `ON CONFLICT`, `RETURNING` and partial indexes mean the
//! same to both engines, so no statement is written twice. What differs is
//! in [`Backend`]: opening, the upgrade of SQLite files made by older
//! versions, and the advisory lock around PostgreSQL's schema creation.
//!
//! Stock is decremented inside the order's transaction by a guarded
//! `UPDATE … WHERE stock >= ? AND max_per_order >= ?`, so it never goes
//! below zero however many orders race, and one order (one entry token)
//! takes at most the product's `max_per_order`. Each order records the
//! entry token's idempotency key (its SHA-256) under a `UNIQUE`
//! constraint: even if the token store lost track of a used token, the
//! database refuses a second order with it.
//!
//! Each order also records, in the same transaction, what deleting its
//! entry token takes (queue, user, claim id) and whether that delete is
//! confirmed: an outbox. A delete the token store could not take before a
//! shutdown is finished after the restart by [`reconcile`], instead of the
//! used token returning to READY when its claim lapses.
//!
//! The service, file by file: `open.rs` connects and creates or upgrades
//! the schema; `catalogue.rs` reads and restocks the products; `place.rs`
//! takes an order in one transaction and reads orders back; `outbox.rs`
//! keeps the token deletes still owed, which [`reconcile`] finishes;
//! [`stock`] reports what is left to the store; [`slowdown`] is the
//! operator's knob slowing the service on purpose.

mod catalogue;
mod open;
mod outbox;
mod place;
pub mod reconcile;
pub mod slowdown;
pub mod stock;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use serde::Serialize;
use sqlx::AnyPool;
use tokio::sync::Notify;

pub use outbox::Unconfirmed;

/// The product every fresh database starts with.
pub const DEMO_PRODUCT: &str = "demo-sneaker";

/// A product's `max_per_order` unless set: the waiting-room page's own cap.
pub const DEFAULT_MAX_PER_ORDER: i64 = 10;

/// A product on sale.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Product {
    pub id: String,
    pub name: String,
    /// The queue whose entry tokens buy it.
    pub queue: String,
    pub price_cents: i64,
    pub stock: i64,
    /// The most one order (one entry token) may buy.
    pub max_per_order: i64,
}

/// A product to add or update. `max_per_order: None` keeps an existing
/// product's cap (a restock does not reset it) and gives a new one
/// [`DEFAULT_MAX_PER_ORDER`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProductUpdate {
    pub id: String,
    pub name: String,
    pub queue: String,
    pub price_cents: i64,
    pub stock: i64,
    pub max_per_order: Option<i64>,
}

/// A committed order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Order {
    pub order_id: String,
    pub product_id: String,
    pub quantity: i64,
    pub user_id: String,
    pub created_at: String,
    pub status: &'static str,
}

/// Why an order was not placed.
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    /// `404`: no such product.
    #[error("no such product")]
    UnknownProduct,
    /// `409`: not enough stock; the transaction rolled back.
    #[error("not enough stock left")]
    OutOfStock,
    /// `400`: more than the product's `max_per_order`; rolled back.
    #[error("at most {max} per order")]
    OverLimit { max: i64 },
    /// `401`: this entry token was already used for an order.
    #[error("this entry token was already used")]
    TokenAlreadyUsed,
    /// `503`: the database failed or cannot be reached; nothing was sold.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// Which database engine holds the orders. The statements are the same
/// for both (`$n` placeholders, `ON CONFLICT`, `RETURNING`, partial
/// indexes: each engine reads them alike); only opening, the schema's
/// upgrades of old SQLite files and the schema lock differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// An embedded SQLite file (or memory): one instance's own database.
    Sqlite,
    /// A PostgreSQL server every instance shares: one stock, one order
    /// table, whichever instance takes the order.
    Postgres,
}

impl Backend {
    /// The backend `--orders-db` names: a `postgres://` (or
    /// `postgresql://`) URL, anything else a SQLite path.
    pub fn of(db: &str) -> Self {
        if db.starts_with("postgres://") || db.starts_with("postgresql://") {
            Self::Postgres
        } else {
            Self::Sqlite
        }
    }
}

/// The order database.
#[derive(Clone)]
pub struct OrderStore {
    pool: AnyPool,
    backend: Backend,
    /// Rung when an order's token delete failed, so the reconciler retries
    /// it soon rather than at its next sweep.
    doorbell: Arc<Notify>,
    /// The operator's knob slowing the demo service on purpose.
    slowdown: Arc<slowdown::Slowdown>,
}

impl OrderStore {
    /// The knob slowing this instance's demo service on purpose.
    pub fn slowdown(&self) -> &slowdown::Slowdown {
        &self.slowdown
    }

    /// Which engine this is.
    pub fn backend(&self) -> Backend {
        self.backend
    }
}
