//! What an earlier version left in Redis keeps working after an upgrade
//! (instances are replaced one at a time, the line stays in Redis):
//! entry-time marks in the earlier layout (spans of 128 entry ids under
//! `~`, the last mark without its `^`) are still read and dropped as the
//! line moves on, and a queue sold out before the sold-out flag had its
//! STRING copy reads as sold out from the next admission pass on.

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use waitroom::queue::{EntryToken, Policy, QueueName, Snapshot, Standing, StockReport, UserId};
use waitroom::store::redis::RedisStore;
use waitroom::store::{LineStore, StockStore};

use crate::common::{redis_url, unique_prefix};

fn user(name: &str) -> UserId {
    UserId::parse(name).unwrap()
}

/// A line that never fast-tracks (nobody may hold a token) and admits
/// `batch` a pass, nobody dropped as absent.
fn policy(batch: u32) -> Policy {
    Policy {
        batch,
        interval_ms: 1,
        token_ttl_ms: 60_000,
        max_active: Some(0),
        abandon_after_ms: None,
    }
}

async fn join(store: &RedisStore, q: &QueueName, who: &str) -> Snapshot {
    store
        .enter(q, &user(who), &policy(1), &EntryToken::generate())
        .await
        .unwrap()
        .snapshot
}

/// Admits `n` from the head (room for them: max active lifted).
async fn admit(store: &RedisStore, q: &QueueName, n: u32) -> usize {
    let open = Policy {
        max_active: None,
        ..policy(n)
    };
    let tokens: Vec<EntryToken> = (0..n).map(|_| EntryToken::generate()).collect();
    store.admit(q, &open, &tokens).await.unwrap().admitted.len()
}

fn entered_at(s: &Snapshot) -> u64 {
    assert!(matches!(s.standing, Standing::Waiting { .. }), "{s:?}");
    s.entered_at_ms.expect("an entry time")
}

/// A store of a prefix of its own on the shared Redis, its queue
/// `default`, a plain connection to write what an earlier version left,
/// and the queue's key base.
async fn fresh(tag: &str) -> (RedisStore, QueueName, MultiplexedConnection, String) {
    let prefix = unique_prefix(tag);
    let store = RedisStore::connect(&redis_url(), &prefix).await.unwrap();
    let conn = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let base = format!("{prefix}:{{default}}:");
    (store, QueueName::parse("default").unwrap(), conn, base)
}

#[tokio::test]
async fn marks_of_the_earlier_layout_are_read_and_dropped() {
    crate::needs_redis!();
    let (store, q, mut conn, base) = fresh("upgrade-marks").await;
    let entered = format!("{base}entered");

    // 300 buyers, then their marks rewritten as an earlier version kept
    // them: one field per 128 entry ids, each entry a mark of its own, a
    // time of our choosing so the test can tell them from fresh ones.
    let mut entries = Vec::new();
    for i in 0..300 {
        let s = join(&store, &q, &format!("old{i:03}")).await;
        entries.push(s.entry.unwrap());
    }
    let _: () = conn.del(&entered).await.unwrap();
    let t0: u64 = 1_700_000_000_000;
    let mut spans: std::collections::BTreeMap<u64, Vec<(u64, u64)>> = Default::default();
    for (i, e) in entries.iter().enumerate() {
        spans
            .entry(e / 128)
            .or_default()
            .push((e % 128, t0 + i as u64 * 7));
    }
    for (span, marks) in &spans {
        let first = marks[0].1;
        let mut text = format!("{},{first}", marks[0].0);
        for (o, t) in &marks[1..] {
            text.push_str(&format!(" {o},{}", t - first));
        }
        let _: () = conn.hset(&entered, format!("~{span}"), text).await.unwrap();
    }
    let lowest = *spans.keys().next().unwrap();
    let _: () = conn.hset(&entered, "~lo", lowest).await.unwrap();
    let last = entries.last().unwrap();
    let _: () = conn
        .set(format!("{base}seq:mark"), format!("{},{}", last / 128, t0))
        .await
        .unwrap();

    // Read as written, whichever span.
    for i in [0usize, 1, 127, 128, 200, 299] {
        let s = store
            .status(&q, &user(&format!("old{i:03}")), false)
            .await
            .unwrap();
        assert_eq!(entered_at(&s), t0 + i as u64 * 7, "old{i:03}");
    }

    // A join after the upgrade: the store clock's time, in the new layout.
    let fresh = join(&store, &q, "new000").await;
    let now = entered_at(&fresh);
    assert!(now > t0 + 1_000_000, "{fresh:?}");
    let again = store.status(&q, &user("new000"), false).await.unwrap();
    assert_eq!(entered_at(&again), now);
    let fields: Vec<String> = conn.hkeys(&entered).await.unwrap();
    assert!(fields.iter().any(|f| f.starts_with('^')), "{fields:?}");

    // Admission drops the old spans the head passed, and the rest keep
    // their times.
    assert_eq!(admit(&store, &q, 200).await, 200);
    let fields: Vec<String> = conn.hkeys(&entered).await.unwrap();
    assert!(
        !fields.contains(&format!("~{lowest}")),
        "the passed span is dropped: {fields:?}"
    );
    let s = store.status(&q, &user("old250"), false).await.unwrap();
    assert_eq!(entered_at(&s), t0 + 250 * 7);
    assert_eq!(
        entered_at(&store.status(&q, &user("new000"), false).await.unwrap()),
        now
    );

    // Past the last old entry, only the old span the head is in is left
    // (the spans are dropped as the head passes them).
    assert_eq!(admit(&store, &q, 100).await, 100);
    let fields: Vec<String> = conn.hkeys(&entered).await.unwrap();
    let head_span = format!("~{}", fresh.entry.unwrap() / 128);
    assert!(
        fields
            .iter()
            .all(|f| !f.starts_with('~')
                || ["~seen", "~lo", head_span.as_str()].contains(&f.as_str())),
        "no old span the head passed is left: {fields:?}"
    );
    assert_eq!(
        entered_at(&store.status(&q, &user("new000"), false).await.unwrap()),
        now
    );
    // Buyers joined after the upgrade alone: once the head passes two
    // spans of 128 of theirs, nothing of the old layout is left.
    for i in 1..=300 {
        join(&store, &q, &format!("new{i:03}")).await;
    }
    assert_eq!(admit(&store, &q, 140).await, 140);
    assert_eq!(admit(&store, &q, 130).await, 130);
    let fields: Vec<String> = conn.hkeys(&entered).await.unwrap();
    assert!(
        fields.iter().all(|f| !f.starts_with('~') || f == "~seen"),
        "the old layout is gone: {fields:?}"
    );
    let s = store.status(&q, &user("new299"), false).await.unwrap();
    assert!(entered_at(&s) >= now);

    // And once the line is empty, nothing of the marks is left.
    assert_eq!(admit(&store, &q, 50).await, 31);
    let left: bool = conn.exists(&entered).await.unwrap();
    assert!(!left, "the marks go with the line");
}

#[tokio::test]
async fn a_queue_sold_out_before_the_flag_had_its_copy_reads_sold_out_after_a_pass() {
    crate::needs_redis!();
    let (store, q, mut conn, base) = fresh("upgrade-sold").await;
    let stock = format!("{base}stock");

    join(&store, &q, "a").await;
    join(&store, &q, "b").await;
    store
        .set_stock(
            &q,
            StockReport {
                remaining: 0,
                per_buyer: 1,
            },
        )
        .await
        .unwrap();
    let polled = store.status(&q, &user("b"), false).await.unwrap();
    assert!(polled.sold_out, "a report reaches the poll at once");

    // As an earlier version left it: the flag in the hash, no copy.
    let _: () = conn.del(format!("{stock}:soldout")).await.unwrap();
    let polled = store.status(&q, &user("b"), false).await.unwrap();
    assert!(!polled.sold_out, "the poll reads the copy alone");
    assert_eq!(admit(&store, &q, 1).await, 0, "sold out: nobody admitted");
    let polled = store.status(&q, &user("b"), false).await.unwrap();
    assert!(polled.sold_out, "the pass set the copy right");

    // Restocked: the copy goes with the flag, and the pass leaves it so.
    store
        .set_stock(
            &q,
            StockReport {
                remaining: 5,
                per_buyer: 1,
            },
        )
        .await
        .unwrap();
    assert!(!store.status(&q, &user("b"), false).await.unwrap().sold_out);
    let _: () = conn.set(format!("{stock}:soldout"), "1").await.unwrap();
    admit(&store, &q, 1).await;
    assert!(!store.status(&q, &user("b"), false).await.unwrap().sold_out);
}
