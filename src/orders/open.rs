//! Opening the order database: the pool each engine gets (one connection
//! to a SQLite file, a few to a PostgreSQL server) and the schema, created
//! or upgraded in one transaction so a half-made schema is never left
//! behind.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Any, AnyPool, AssertSqlSafe, ConnectOptions, Executor, Transaction};
use tokio::sync::Notify;

use super::{Backend, DEMO_PRODUCT, OrderStore};

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
pub(super) const SQLITE_FILE_CONNECTIONS: u32 = 1;

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
pub(super) const SQLITE_CACHE_KIB: i64 = 512;

/// How long a SQLite file's connection lives at most before it is
/// replaced (sqlx's default).
const SQLITE_MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// The tables and the index every database starts with.
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
    pub(super) async fn open_with(
        db: &str,
        queue: &str,
        file_connections: u32,
        cache_kib: i64,
    ) -> Result<Self, sqlx::Error> {
        sqlx::any::install_default_drivers();
        let backend = Backend::of(db);
        let pool = match backend {
            Backend::Postgres => postgres_pool(db).await?,
            Backend::Sqlite => sqlite_pool(db, file_connections, cache_kib).await?,
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
            upgrade_old_sqlite(&mut tx).await?;
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
}

/// The pool to a PostgreSQL server: a few connections, and a short wait
/// for one (see [`PG_ACQUIRE_TIMEOUT`]).
async fn postgres_pool(db: &str) -> Result<AnyPool, sqlx::Error> {
    AnyPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(PG_ACQUIRE_TIMEOUT)
        .connect_with(AnyConnectOptions::from_str(db)?)
        .await
}

/// The pool to a SQLite file (`file_connections`, each with a page cache
/// of `cache_kib`), or to `:memory:`.
async fn sqlite_pool(
    db: &str,
    file_connections: u32,
    cache_kib: i64,
) -> Result<AnyPool, sqlx::Error> {
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
                    conn.execute(AssertSqlSafe(format!("PRAGMA cache_size = -{cache_kib}")))
                        .await?;
                }
                conn.execute("PRAGMA foreign_keys = ON").await?;
                conn.execute("PRAGMA busy_timeout = 10000").await?;
                Ok(())
            })
        })
        .connect_with(AnyConnectOptions::from_str(&url)?)
        .await
}

/// Gives a SQLite file made by an older version the columns added since.
async fn upgrade_old_sqlite(tx: &mut Transaction<'_, Any>) -> Result<(), sqlx::Error> {
    // Databases created before the per-order cap get it, defaulted.
    let has_cap =
        sqlx::query("SELECT 1 FROM pragma_table_info('products') WHERE name = 'max_per_order'")
            .fetch_optional(&mut **tx)
            .await?
            .is_some();
    if !has_cap {
        sqlx::query(
            "ALTER TABLE products ADD COLUMN max_per_order INTEGER NOT NULL DEFAULT 10
             CHECK (max_per_order > 0)",
        )
        .execute(&mut **tx)
        .await?;
    }
    // Databases created before the consume record get its columns.
    for (column, add) in ORDER_COLUMNS {
        let present = sqlx::query("SELECT 1 FROM pragma_table_info('orders') WHERE name = $1")
            .bind(*column)
            .fetch_optional(&mut **tx)
            .await?
            .is_some();
        if !present {
            sqlx::query(*add).execute(&mut **tx).await?;
        }
    }
    Ok(())
}
