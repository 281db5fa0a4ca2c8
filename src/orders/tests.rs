//! The order service's own tests, on SQLite (in memory and in files):
//! its guards, the outbox, the upgrade of old files, the connection and
//! page-cache limits, and two benchmarks run by hand.

use std::time::Duration;

use sqlx::Row;
use sqlx::sqlite::SqliteConnectOptions;

use super::open::{SQLITE_CACHE_KIB, SQLITE_FILE_CONNECTIONS};
use super::*;
use crate::gate::PendingConsume;
use crate::queue::{QueueName, UserId};

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
