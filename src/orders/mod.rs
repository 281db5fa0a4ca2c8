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

pub mod reconcile;
pub mod slowdown;
pub mod stock;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions, AnyRow};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{AnyPool, AssertSqlSafe, ConnectOptions, Executor, Row};
use time::OffsetDateTime;
use tokio::sync::Notify;

use crate::gate::PendingConsume;
use crate::queue::{QueueName, UserId};

/// The product every fresh database starts with.
pub const DEMO_PRODUCT: &str = "demo-sneaker";

/// A product's `max_per_order` unless set: the waiting-room page's own cap.
pub const DEFAULT_MAX_PER_ORDER: i64 = 10;

/// How long a request waits for a PostgreSQL connection before it is
/// refused (`503`): a server that is down must not hold buyers for the
/// pool's default 30 s, while a burst of orders queueing for the pool's
/// connections must still get through.
const PG_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// The same for SQLite, where waiting for the connection is queueing
/// behind the one writer, never an outage.
const SQLITE_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections to a SQLite file. SQLite lets one writer in at a time, so
/// more connections only queue inside SQLite instead of in the pool, and
/// each costs two descriptors (the file and its WAL) that sqlx does not
/// give back reliably: the idle ones are handed out in turn, so the
/// reconciler's sweep keeps every one of them younger than any idle
/// timeout. One connection keeps an instance's descriptors constant.
const SQLITE_FILE_CONNECTIONS: u32 = 1;

/// The page cache of a SQLite file's connection, in KiB. SQLite's default
/// is 2,000 KiB (`cache_size = -2000`), and the cache keeps every page it
/// read or wrote until it reaches that cap: orders are only ever added, so
/// an instance's memory grew for as long as the file was under ~2 MiB
/// (about 16 minutes at the soak's 6 orders a second per instance, well
/// after its warm-up) before it levelled off. A quarter of that fills
/// within a few minutes of orders and costs nothing measurable: an order
/// touches one leaf of each index and the table's last page, and a page
/// not in this cache is a read from the kernel's file cache (see
/// `cache_size_bench`).
pub const SQLITE_CACHE_KIB: i64 = 512;

/// How long a SQLite file's connection lives at most before it is
/// replaced (sqlx's default).
const SQLITE_MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// The columns [`product_of`] reads, for `concat!` into queries (sqlx takes
/// only static SQL).
macro_rules! product_columns {
    () => {
        "id, name, queue, price_cents, stock, max_per_order"
    };
}
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

/// An order whose token delete is not confirmed yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unconfirmed {
    pub order_id: String,
    /// What to delete; `None` if the record cannot be read back (a queue or
    /// user name this version refuses), so there is nothing to retry.
    pub consume: Option<PendingConsume>,
}

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS products (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        queue TEXT NOT NULL,
        price_cents BIGINT NOT NULL CHECK (price_cents >= 0),
        stock BIGINT NOT NULL CHECK (stock >= 0),
        max_per_order BIGINT NOT NULL DEFAULT 10 CHECK (max_per_order > 0)
    )",
    "CREATE TABLE IF NOT EXISTS orders (
        id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL,
        product_id TEXT NOT NULL REFERENCES products(id),
        quantity BIGINT NOT NULL CHECK (quantity > 0),
        created_at TEXT NOT NULL,
        token_sha256 TEXT NOT NULL UNIQUE,
        claim_queue TEXT,
        claim_id TEXT,
        consume_confirmed INTEGER NOT NULL DEFAULT 1 CHECK (consume_confirmed IN (0, 1))
    )",
    "CREATE INDEX IF NOT EXISTS orders_by_user ON orders(user_id)",
];

/// Columns added to `orders` since its first version, each with the
/// `ALTER TABLE` that adds it to an older database. Older orders get no
/// claim and count as confirmed: nothing of theirs is left to delete.
const ORDER_COLUMNS: &[(&str, &str)] = &[
    (
        "claim_queue",
        "ALTER TABLE orders ADD COLUMN claim_queue TEXT",
    ),
    ("claim_id", "ALTER TABLE orders ADD COLUMN claim_id TEXT"),
    (
        "consume_confirmed",
        "ALTER TABLE orders ADD COLUMN consume_confirmed INTEGER NOT NULL DEFAULT 1
         CHECK (consume_confirmed IN (0, 1))",
    ),
];

/// The reconciler's index: only unconfirmed orders, so it stays tiny
/// however many orders there are. Created after the columns exist.
const UNCONFIRMED_INDEX: &str = "CREATE INDEX IF NOT EXISTS orders_unconfirmed
    ON orders(created_at) WHERE consume_confirmed = 0";

/// The lock two instances starting at once on one PostgreSQL database
/// take around the schema, so their `CREATE … IF NOT EXISTS` cannot race.
const SCHEMA_LOCK: &str = "SELECT 1 FROM pg_advisory_xact_lock(7290143061)";

impl OrderStore {
    /// The knob slowing this instance's demo service on purpose.
    pub fn slowdown(&self) -> &slowdown::Slowdown {
        &self.slowdown
    }

    /// Opens the database `db` names (see [`Backend::of`]), creating the
    /// schema and the demo product (sold in `queue`) if they are missing.
    /// A SQLite file is created on first start; `:memory:` keeps it in
    /// memory. A PostgreSQL database must exist; every instance pointed at
    /// it shares its products and orders.
    pub async fn open(db: &str, queue: &str) -> Result<Self, sqlx::Error> {
        Self::open_with(db, queue, SQLITE_FILE_CONNECTIONS, SQLITE_CACHE_KIB).await
    }

    /// [`OrderStore::open`] with `file_connections` to a SQLite file, each
    /// with a page cache of `cache_kib` (the benchmarks compare sizes in
    /// one run).
    async fn open_with(
        db: &str,
        queue: &str,
        file_connections: u32,
        cache_kib: i64,
    ) -> Result<Self, sqlx::Error> {
        sqlx::any::install_default_drivers();
        let backend = Backend::of(db);
        let pool = match backend {
            Backend::Postgres => {
                AnyPoolOptions::new()
                    .max_connections(8)
                    .acquire_timeout(PG_ACQUIRE_TIMEOUT)
                    .connect_with(AnyConnectOptions::from_str(db)?)
                    .await?
            }
            Backend::Sqlite => {
                let in_memory = db == ":memory:";
                let url = if in_memory {
                    "sqlite::memory:".to_owned()
                } else {
                    SqliteConnectOptions::new()
                        .filename(db)
                        .create_if_missing(true)
                        .to_url_lossy()
                        .to_string()
                };
                // An in-memory database is per connection: its one
                // connection is never recycled, or the orders would go
                // with it. A file's is replaced now and then.
                let lifetime = (!in_memory).then_some(SQLITE_MAX_LIFETIME);
                AnyPoolOptions::new()
                    .max_connections(if in_memory {
                        1
                    } else {
                        file_connections.max(1)
                    })
                    .min_connections(1)
                    .idle_timeout(None)
                    .max_lifetime(lifetime)
                    .acquire_timeout(SQLITE_ACQUIRE_TIMEOUT)
                    .after_connect(move |conn, _| {
                        Box::pin(async move {
                            if !in_memory {
                                conn.execute("PRAGMA journal_mode = WAL").await?;
                                // An in-memory database's pages are its
                                // cache: no cap applies there.
                                // A number: nothing to inject.
                                conn.execute(AssertSqlSafe(format!(
                                    "PRAGMA cache_size = -{cache_kib}"
                                )))
                                .await?;
                            }
                            conn.execute("PRAGMA foreign_keys = ON").await?;
                            conn.execute("PRAGMA busy_timeout = 10000").await?;
                            Ok(())
                        })
                    })
                    .connect_with(AnyConnectOptions::from_str(&url)?)
                    .await?
            }
        };
        let store = Self {
            pool,
            backend,
            doorbell: Arc::new(Notify::new()),
            slowdown: Arc::default(),
        };
        store.prepare(queue).await?;
        Ok(store)
    }

    /// Which engine this is.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Creates what is missing: tables, columns added since an old SQLite
    /// file was made, the reconciler's index, the demo product. One
    /// transaction, so a half-made schema is never left behind.
    async fn prepare(&self, queue: &str) -> Result<(), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        if self.backend == Backend::Postgres {
            sqlx::query(SCHEMA_LOCK).execute(&mut *tx).await?;
        }
        for statement in SCHEMA {
            sqlx::query(*statement).execute(&mut *tx).await?;
        }
        // Only SQLite files can predate these columns: PostgreSQL support
        // came after them.
        if self.backend == Backend::Sqlite {
            // Databases created before the per-order cap get it, defaulted.
            let has_cap = sqlx::query(
                "SELECT 1 FROM pragma_table_info('products') WHERE name = 'max_per_order'",
            )
            .fetch_optional(&mut *tx)
            .await?
            .is_some();
            if !has_cap {
                sqlx::query(
                    "ALTER TABLE products ADD COLUMN max_per_order INTEGER NOT NULL DEFAULT 10
                     CHECK (max_per_order > 0)",
                )
                .execute(&mut *tx)
                .await?;
            }
            // Databases created before the consume record get its columns.
            for (column, add) in ORDER_COLUMNS {
                let present =
                    sqlx::query("SELECT 1 FROM pragma_table_info('orders') WHERE name = $1")
                        .bind(*column)
                        .fetch_optional(&mut *tx)
                        .await?
                        .is_some();
                if !present {
                    sqlx::query(*add).execute(&mut *tx).await?;
                }
            }
        }
        sqlx::query(UNCONFIRMED_INDEX).execute(&mut *tx).await?;
        sqlx::query(
            "INSERT INTO products (id, name, queue, price_cents, stock)
             VALUES ($1, 'Limited sneaker drop', $2, 12900, 1000)
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(DEMO_PRODUCT)
        .bind(queue)
        .execute(&mut *tx)
        .await?;
        tx.commit().await
    }

    /// Every product.
    pub async fn products(&self) -> Result<Vec<Product>, sqlx::Error> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            product_columns!(),
            " FROM products ORDER BY id"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(product_of).collect()
    }

    /// One product.
    pub async fn product(&self, id: &str) -> Result<Option<Product>, sqlx::Error> {
        let row = sqlx::query(concat!(
            "SELECT ",
            product_columns!(),
            " FROM products WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(product_of).transpose()
    }

    /// The stock on sale through `queue`'s entry tokens: the units its
    /// products have left, and the most one order may take of any of them
    /// still in stock (1 when none is).
    pub async fn queue_stock(&self, queue: &str) -> Result<(i64, i64), sqlx::Error> {
        let row = sqlx::query(
            "SELECT CAST(COALESCE(SUM(stock), 0) AS BIGINT) AS units,
                    CAST(COALESCE(MAX(CASE WHEN stock > 0 THEN max_per_order END), 1) AS BIGINT)
                      AS per
             FROM products WHERE queue = $1",
        )
        .bind(queue)
        .fetch_one(&self.pool)
        .await?;
        Ok((row.try_get("units")?, row.try_get("per")?))
    }

    /// Adds or updates a product (operators restock through the admin
    /// API) and returns it as stored.
    pub async fn upsert_product(&self, update: &ProductUpdate) -> Result<Product, sqlx::Error> {
        let row = sqlx::query(concat!(
            "INSERT INTO products (id, name, queue, price_cents, stock, max_per_order)
             VALUES ($1, $2, $3, $4, $5, COALESCE($6, $7))
             ON CONFLICT (id) DO UPDATE SET name = excluded.name, queue = excluded.queue,
               price_cents = excluded.price_cents, stock = excluded.stock,
               max_per_order = COALESCE($6, products.max_per_order)
             RETURNING ",
            product_columns!()
        ))
        .bind(&update.id)
        .bind(&update.name)
        .bind(&update.queue)
        .bind(update.price_cents)
        .bind(update.stock)
        .bind(update.max_per_order)
        .bind(DEFAULT_MAX_PER_ORDER)
        .fetch_one(&self.pool)
        .await?;
        product_of(&row)
    }

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
    async fn rung(&self) {
        self.doorbell.notified().await;
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

fn product_of(r: &AnyRow) -> Result<Product, sqlx::Error> {
    Ok(Product {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        queue: r.try_get("queue")?,
        price_cents: r.try_get("price_cents")?,
        stock: r.try_get("stock")?,
        max_per_order: r.try_get("max_per_order")?,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    async fn store() -> OrderStore {
        OrderStore::open(":memory:", "default").await.unwrap()
    }

    fn pending(user: &str) -> PendingConsume {
        PendingConsume {
            queue: QueueName::parse("default").unwrap(),
            user: UserId::parse(user).unwrap(),
            claim_id: format!("claim-of-{user}"),
        }
    }

    fn update(p: &Product, stock: i64, max_per_order: Option<i64>) -> ProductUpdate {
        ProductUpdate {
            id: p.id.clone(),
            name: p.name.clone(),
            queue: p.queue.clone(),
            price_cents: p.price_cents,
            stock,
            max_per_order,
        }
    }

    #[tokio::test]
    async fn seeds_the_demo_product() {
        let s = store().await;
        let p = s.products().await.unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(
            (
                p[0].id.as_str(),
                p[0].queue.as_str(),
                p[0].stock,
                p[0].max_per_order
            ),
            (DEMO_PRODUCT, "default", 1000, DEFAULT_MAX_PER_ORDER)
        );
    }

    #[tokio::test]
    async fn stock_never_goes_below_zero_and_tokens_buy_once() {
        let s = store().await;
        let p = s.product(DEMO_PRODUCT).await.unwrap().unwrap();
        s.upsert_product(&update(&p, 3, None)).await.unwrap();
        assert!(matches!(
            s.place(DEMO_PRODUCT, 4, "k1", &pending("a")).await,
            Err(OrderError::OutOfStock)
        ));
        let o = s.place(DEMO_PRODUCT, 2, "k1", &pending("a")).await.unwrap();
        assert!(o.order_id.starts_with("ord_"));
        assert!(matches!(
            s.place(DEMO_PRODUCT, 1, "k1", &pending("a")).await,
            Err(OrderError::TokenAlreadyUsed)
        ));
        assert_eq!(
            s.product(DEMO_PRODUCT).await.unwrap().unwrap().stock,
            1,
            "the refused order took nothing"
        );
        assert!(matches!(
            s.place("nope", 1, "k2", &pending("b")).await,
            Err(OrderError::UnknownProduct)
        ));
        assert_eq!(s.order(&o.order_id).await.unwrap().unwrap().user_id, "a");
        assert_eq!(s.order_count(DEMO_PRODUCT).await.unwrap(), 1);
    }

    #[tokio::test]
    async fn one_order_takes_at_most_max_per_order_and_stock_comes_first() {
        let s = store().await;
        let p = s.product(DEMO_PRODUCT).await.unwrap().unwrap();
        // Stock 1000, cap 10: 999 is over the cap, 10**9 over the stock.
        assert!(matches!(
            s.place(DEMO_PRODUCT, 999, "k1", &pending("a")).await,
            Err(OrderError::OverLimit { max: 10 })
        ));
        assert!(matches!(
            s.place(DEMO_PRODUCT, 1_000_000_000, "k1", &pending("a"))
                .await,
            Err(OrderError::OutOfStock)
        ));
        assert_eq!(s.product(DEMO_PRODUCT).await.unwrap().unwrap().stock, 1000);
        assert_eq!(s.order_count(DEMO_PRODUCT).await.unwrap(), 0);
        s.place(DEMO_PRODUCT, 10, "k1", &pending("a"))
            .await
            .unwrap();
        // A restock keeps the cap; an explicit one replaces it.
        let kept = s.upsert_product(&update(&p, 50, None)).await.unwrap();
        assert_eq!((kept.stock, kept.max_per_order), (50, 10));
        let raised = s.upsert_product(&update(&p, 50, Some(40))).await.unwrap();
        assert_eq!(raised.max_per_order, 40);
        s.place(DEMO_PRODUCT, 40, "k2", &pending("b"))
            .await
            .unwrap();
        assert_eq!(s.product(DEMO_PRODUCT).await.unwrap().unwrap().stock, 10);
    }

    #[tokio::test]
    async fn an_order_records_its_consume_until_confirmed() {
        let s = store().await;
        let o = s.place(DEMO_PRODUCT, 1, "k1", &pending("a")).await.unwrap();
        // Refused orders record nothing to consume.
        s.place(DEMO_PRODUCT, 1, "k1", &pending("a"))
            .await
            .unwrap_err();
        s.place(DEMO_PRODUCT, 999, "k2", &pending("b"))
            .await
            .unwrap_err();
        let due = s.unconfirmed(10).await.unwrap();
        assert_eq!(
            due,
            vec![Unconfirmed {
                order_id: o.order_id.clone(),
                consume: Some(pending("a")),
            }]
        );
        assert_eq!(s.unconfirmed_count().await.unwrap(), 1);
        assert!(s.confirm_consume(&o.order_id).await.unwrap());
        assert!(!s.confirm_consume(&o.order_id).await.unwrap(), "once");
        assert!(s.unconfirmed(10).await.unwrap().is_empty());
        assert_eq!(s.unconfirmed_count().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn unconfirmed_reads_a_bounded_batch_oldest_first() {
        let s = store().await;
        let mut placed = Vec::new();
        for i in 0..5 {
            let o = s
                .place(
                    DEMO_PRODUCT,
                    1,
                    &format!("k{i}"),
                    &pending(&format!("u{i}")),
                )
                .await
                .unwrap();
            placed.push(o.order_id);
        }
        let first: Vec<String> = s
            .unconfirmed(3)
            .await
            .unwrap()
            .into_iter()
            .map(|u| u.order_id)
            .collect();
        assert_eq!(first.len(), 3);
        assert!(first.iter().all(|id| placed.contains(id)));
        for id in &first {
            s.confirm_consume(id).await.unwrap();
        }
        let rest = s.unconfirmed(3).await.unwrap();
        assert_eq!(rest.len(), 2);
        assert!(rest.iter().all(|u| !first.contains(&u.order_id)));
    }

    /// A database file made by an earlier version: `statements` run on a
    /// fresh file in a folder of its own (removed by the caller).
    async fn old_database(statements: &[&'static str]) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("waitroom-orders-{:x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("orders.db");
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true);
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .connect_with(options)
            .await
            .unwrap();
        for statement in statements {
            sqlx::query(*statement).execute(&pool).await.unwrap();
        }
        pool.close().await;
        (dir, path)
    }

    #[tokio::test]
    async fn a_database_from_before_the_consume_record_gets_it() {
        let (dir, path) = old_database(&[
            "CREATE TABLE products (id TEXT PRIMARY KEY, name TEXT NOT NULL,
             queue TEXT NOT NULL, price_cents INTEGER NOT NULL, stock INTEGER NOT NULL,
             max_per_order INTEGER NOT NULL DEFAULT 10)",
            "INSERT INTO products VALUES ('demo-sneaker', 'Old', 'default', 100, 5, 10)",
            "CREATE TABLE orders (id TEXT PRIMARY KEY, user_id TEXT NOT NULL,
             product_id TEXT NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL,
             created_at TEXT NOT NULL, token_sha256 TEXT NOT NULL UNIQUE)",
            "INSERT INTO orders VALUES ('ord_old', 'a', 'demo-sneaker', 1,
             '2026-01-01T00:00:00Z', 'k-old')",
        ])
        .await;
        let s = OrderStore::open(path.to_str().unwrap(), "default")
            .await
            .unwrap();
        // The old order has nothing left to delete; a new one records its own.
        assert!(s.unconfirmed(10).await.unwrap().is_empty());
        assert_eq!(s.order("ord_old").await.unwrap().unwrap().user_id, "a");
        let o = s
            .place(DEMO_PRODUCT, 1, "k-new", &pending("b"))
            .await
            .unwrap();
        let due = s.unconfirmed(10).await.unwrap();
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].order_id, o.order_id);
        drop(s);
        // Opening again changes nothing.
        let s = OrderStore::open(path.to_str().unwrap(), "default")
            .await
            .unwrap();
        assert_eq!(s.unconfirmed_count().await.unwrap(), 1);
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_database_from_before_the_cap_gets_it() {
        let (dir, path) = old_database(&[
            "CREATE TABLE products (id TEXT PRIMARY KEY, name TEXT NOT NULL,
             queue TEXT NOT NULL, price_cents INTEGER NOT NULL, stock INTEGER NOT NULL)",
            "INSERT INTO products VALUES ('old', 'Old', 'default', 100, 5)",
        ])
        .await;
        let s = OrderStore::open(path.to_str().unwrap(), "default")
            .await
            .unwrap();
        let old = s.product("old").await.unwrap().unwrap();
        assert_eq!((old.stock, old.max_per_order), (5, DEFAULT_MAX_PER_ORDER));
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A fresh SQLite file in its own temp dir, opened with `connections`,
    /// stocked for `stock` orders.
    async fn file_store(connections: u32, stock: i64) -> (std::path::PathBuf, OrderStore) {
        file_store_cached(connections, SQLITE_CACHE_KIB, stock).await
    }

    /// [`file_store`] with a page cache of `cache_kib` per connection.
    async fn file_store_cached(
        connections: u32,
        cache_kib: i64,
        stock: i64,
    ) -> (std::path::PathBuf, OrderStore) {
        let dir = std::env::temp_dir().join(format!("waitroom-orders-{:x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("orders.db");
        let s = OrderStore::open_with(path.to_str().unwrap(), "default", connections, cache_kib)
            .await
            .unwrap();
        let p = s.product(DEMO_PRODUCT).await.unwrap().unwrap();
        s.upsert_product(&update(&p, stock, None)).await.unwrap();
        (dir, s)
    }

    /// `buyers` concurrent buyers, each placing an order and reading the
    /// product back; returns how long they took together.
    async fn order_burst(s: &OrderStore, tag: &str, buyers: usize) -> Duration {
        let started = std::time::Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..buyers {
            let s = s.clone();
            let user = format!("{tag}-{i}");
            tasks.spawn(async move {
                s.place(DEMO_PRODUCT, 1, &format!("key-{user}"), &pending(&user))
                    .await
                    .unwrap();
                s.product(DEMO_PRODUCT).await.unwrap().unwrap();
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
        started.elapsed()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_file_database_keeps_its_one_connection_under_concurrent_orders() {
        let (dir, s) = file_store(SQLITE_FILE_CONNECTIONS, 1000).await;
        order_burst(&s, "c", 64).await;
        assert_eq!(
            s.order_count(DEMO_PRODUCT).await.unwrap(),
            64,
            "every order went through"
        );
        assert_eq!(
            s.pool.size(),
            1,
            "concurrent orders opened no further connection (descriptors)"
        );
        assert_eq!(
            s.product(DEMO_PRODUCT).await.unwrap().unwrap().stock,
            1000 - 64
        );
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Orders per second through one connection against four, in the same
    /// run: `cargo test --lib orders::tests::pool_size_bench --
    /// --ignored --nocapture`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a benchmark: run by hand"]
    async fn pool_size_bench() {
        const ROUNDS: usize = 5;
        const BUYERS: usize = 400;
        let mut best = [f64::MAX; 2];
        for round in 0..ROUNDS {
            for (i, connections) in [1u32, 4].into_iter().enumerate() {
                let (dir, s) = file_store(connections, 1_000_000).await;
                let took = order_burst(&s, &format!("r{round}"), BUYERS).await;
                best[i] = best[i].min(took.as_secs_f64());
                s.pool.close().await;
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
        let rate = |secs: f64| BUYERS as f64 / secs;
        println!(
            "orders/s (best of {ROUNDS} x {BUYERS} concurrent): 1 connection {:.0}, 4 connections {:.0}, one against four {:.2}",
            rate(best[0]),
            rate(best[1]),
            best[1] / best[0]
        );
    }

    /// SQLite's page cache is what it keeps of the file in the process'
    /// memory; its default cap (2,000 KiB) was reached only ~16 minutes
    /// into the soak, so the instance's memory grew that long.
    #[tokio::test]
    async fn a_file_database_caps_its_page_cache_on_every_connection() {
        let (dir, s) = file_store(SQLITE_FILE_CONNECTIONS, 1000).await;
        let cache_size = || async {
            sqlx::query("PRAGMA cache_size")
                .fetch_one(&s.pool)
                .await
                .unwrap()
                .try_get::<i64, _>(0)
                .unwrap()
        };
        assert_eq!(cache_size().await, -SQLITE_CACHE_KIB, "KiB, negative");
        // A connection that replaces the first (the lifetime ran out) gets
        // the same cap.
        let first = s.pool.acquire().await.unwrap();
        first.close().await.unwrap();
        order_burst(&s, "cap", 8).await;
        assert_eq!(cache_size().await, -SQLITE_CACHE_KIB);
        s.pool.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Orders per second with SQLite's default page cache, half of it and
    /// [`SQLITE_CACHE_KIB`], in the same run, on a file that already holds
    /// `FILLED` orders (~8 MiB, larger than any of the caches); the sizes
    /// take turns, in reverse order every other round, and the median
    /// round counts (a commit waits for an fsync, which other work on the
    /// machine's disk makes noisy): `cargo test --release --lib
    /// orders::tests::cache_size_bench -- --ignored --nocapture`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a benchmark: run by hand"]
    async fn cache_size_bench() {
        const ROUNDS: usize = 11;
        const BUYERS: usize = 400;
        const FILLED: i64 = 20_000;
        let sizes = [2000, 1024, SQLITE_CACHE_KIB];
        let mut took = vec![Vec::new(); sizes.len()];
        for round in 0..ROUNDS {
            let mut turn: Vec<usize> = (0..sizes.len()).collect();
            if round % 2 == 1 {
                turn.reverse();
            }
            for i in turn {
                let (dir, s) = file_store_cached(1, sizes[i], 1_000_000).await;
                sqlx::query(
                    "INSERT INTO orders (id, user_id, product_id, quantity, created_at,
                       token_sha256, claim_queue, claim_id, consume_confirmed)
                     WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < $1)
                     SELECT 'ord_' || hex(randomblob(16)), 'u' || hex(randomblob(8)),
                       'demo-sneaker', 1, '2026-12-01T00:00:00Z', hex(randomblob(32)),
                       'default', hex(randomblob(16)), 1 FROM n",
                )
                .bind(FILLED)
                .execute(&s.pool)
                .await
                .unwrap();
                let secs = order_burst(&s, &format!("r{round}"), BUYERS).await;
                took[i].push(secs.as_secs_f64());
                s.pool.close().await;
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
        let rates: Vec<String> = sizes
            .iter()
            .zip(&mut took)
            .map(|(kib, secs)| {
                secs.sort_by(f64::total_cmp);
                let rate = |secs: f64| BUYERS as f64 / secs;
                format!(
                    "{kib} KiB {:.0} (best {:.0})",
                    rate(secs[secs.len() / 2]),
                    rate(secs[0])
                )
            })
            .collect();
        println!(
            "orders/s, median of {ROUNDS} x {BUYERS} concurrent, {FILLED} orders before; page cache: {}",
            rates.join(", ")
        );
    }
}
