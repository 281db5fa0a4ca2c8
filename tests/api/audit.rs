//! The audit log through the admin API: the actions of a sale, each logged
//! once and in order, paged with `after`/`limit` and filtered by `kind`;
//! bad queries are `400` and read nothing; the admin token first; an
//! unknown queue `404`; `--audit-max-len 0` writes no stream at all; Redis
//! away → `503`. Memory store and Redis.

use std::sync::Arc;

use serde_json::Value;
use waitroom::Config;
use waitroom::store::SharedStore;
use waitroom::store::memory::MemoryStore;
use waitroom::store::redis::RedisStore;

use crate::common::{IDLE, RedisProcess, TestApp, config, redis_url, unique_prefix};

const ADMIN: &str = "admin-token-for-audit-tests-012345";

fn args() -> Vec<&'static str> {
    let mut a = vec!["--admin-token", ADMIN];
    a.extend_from_slice(IDLE);
    a
}

async fn get(app: &TestApp, path: &str, bearer: Option<&str>) -> (u16, Value) {
    let mut req = app.client.get(app.admin_url(path));
    if let Some(t) = bearer {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn audit(app: &TestApp, query: &str) -> (u16, Value) {
    get(
        app,
        &format!("/api/admin/queues/default/audit{query}"),
        Some(ADMIN),
    )
    .await
}

/// (kind, user) of each entry of a page.
fn kinds(page: &Value) -> Vec<(String, Option<String>)> {
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_owned(),
                e["user"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

/// A fast track (admitted), two waiting, one of them leaving.
async fn sale(app: &TestApp) {
    assert_eq!(app.enter("default", "ann").await.0, 201);
    let (_, bob) = app.enter("default", "bob").await;
    assert_eq!(app.enter("default", "cy").await.0, 201);
    assert_eq!(
        app.leave("default", bob["ticket"].as_str().unwrap()).await,
        204
    );
}

async fn pages_filters_and_refusals(app: TestApp) {
    sale(&app).await;
    let (code, page) = audit(&app, "").await;
    assert_eq!(code, 200, "{page}");
    let s = |k: &str, u: &str| (k.to_owned(), Some(u.to_owned()));
    assert_eq!(kinds(&page), [s("admitted", "ann"), s("left", "bob")]);
    assert_eq!(page["next"], Value::Null);
    let first = &page["entries"][0];
    assert!(first["id"].as_str().unwrap().contains('-'));
    assert!(first["entry"].as_u64().is_some() && first["at"].as_u64().is_some());
    assert_eq!(first["pass"], Value::Null, "a fast track has no pass");

    // Paging: one at a time, each once.
    let (_, one) = audit(&app, "?limit=1").await;
    assert_eq!(kinds(&one), [s("admitted", "ann")]);
    let next = one["next"].as_str().unwrap().to_owned();
    let (_, two) = audit(&app, &format!("?limit=1&after={next}")).await;
    assert_eq!(kinds(&two), [s("left", "bob")]);
    let (_, kind) = audit(&app, "?kind=left").await;
    assert_eq!(kinds(&kind), [s("left", "bob")]);

    // Bad queries: 400 JSON, and nothing changed.
    for bad in [
        "?after=12",
        "?after=a-1",
        "?limit=0",
        "?limit=1001",
        "?limit=x",
        "?kind=sold_out",
        "?limit=1&limit=2",
        "?cursor=1-0",
    ] {
        let (code, body) = audit(&app, bad).await;
        assert_eq!(
            (code, body["error"].as_str()),
            (400, Some("invalid_audit_query")),
            "{bad}"
        );
    }
    let (code, body) = get(&app, "/api/admin/queues/nope/audit", Some(ADMIN)).await;
    assert_eq!((code, body["error"].as_str()), (404, Some("unknown_queue")));
    let (code, body) = get(&app, "/api/admin/queues/NOPE!/audit?limit=0", Some(ADMIN)).await;
    assert_eq!((code, body["error"].as_str()), (404, Some("unknown_queue")));
    for bearer in [None, Some("wrong-token-wrong-token")] {
        let (code, _) = get(&app, "/api/admin/queues/default/audit?limit=0", bearer).await;
        assert_eq!(code, 401, "the token is checked first");
    }
    // The public listener does not serve it.
    let public = app
        .client
        .get(app.url("/api/admin/queues/default/audit"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(public.status().as_u16(), 404);
    let (_, again) = audit(&app, "").await;
    assert_eq!(again, page, "reads changed nothing");
    app.stop().await;
}

#[tokio::test]
async fn memory_pages_filters_and_refusals() {
    pages_filters_and_refusals(TestApp::memory(&args()).await).await;
}

#[tokio::test]
async fn redis_pages_filters_and_refusals() {
    crate::needs_redis!();
    pages_filters_and_refusals(TestApp::redis("audit-api", &args()).await).await;
}

/// `--audit-max-len 0`: no XADD anywhere, so no stream key; the endpoint
/// answers an empty log.
#[tokio::test]
async fn a_log_turned_off_writes_no_stream() {
    crate::needs_redis!();
    let prefix = unique_prefix("audit-off");
    let store = RedisStore::connect(&redis_url(), &prefix)
        .await
        .unwrap()
        .with_audit_max_len(0);
    let mut cfg: Config = config(&args());
    cfg.audit_max_len = 0;
    cfg.key_prefix = prefix.clone();
    let app = TestApp::spawn_with(cfg, Arc::new(store)).await;
    sale(&app).await;
    let (code, page) = audit(&app, "").await;
    assert_eq!(
        (code, page["entries"].as_array().map(Vec::len)),
        (200, Some(0))
    );
    let client = redis::Client::open(redis_url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let key = format!("{prefix}:{{default}}:audit");
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(exists, 0, "no stream key with the log off");
    // The same instance with the log on does write one: the check can fail.
    let on = TestApp::redis("audit-on", &args()).await;
    sale(&on).await;
    let key = format!("{}:{{default}}:audit", on.config.key_prefix);
    let len: i64 = redis::cmd("XLEN")
        .arg(&key)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(len, 2);
    on.stop().await;

    // The memory store, off: nothing either.
    let memory: SharedStore = Arc::new(MemoryStore::new().with_audit_max_len(0));
    let mut cfg: Config = config(&args());
    cfg.audit_max_len = 0;
    let app2 = TestApp::spawn_with(cfg, memory).await;
    sale(&app2).await;
    let (_, page) = audit(&app2, "").await;
    assert_eq!(page["entries"].as_array().map(Vec::len), Some(0));
    app2.stop().await;
    app.stop().await;
}

/// Redis away: the audit read is `503 store_unavailable`, a bad query is
/// still `400` (checked before the store is asked).
#[tokio::test]
async fn the_audit_read_fails_closed_while_redis_is_down() {
    crate::needs_redis!();
    let mut redis = RedisProcess::start(false);
    let store = Arc::new(
        RedisStore::connect(&redis.url(), "audit-down")
            .await
            .unwrap(),
    );
    let app = TestApp::spawn_with(config(&args()), store).await;
    sale(&app).await;
    assert_eq!(audit(&app, "").await.0, 200);
    redis.kill();
    let (code, body) = audit(&app, "").await;
    assert_eq!(
        (code, body["error"].as_str()),
        (503, Some("store_unavailable"))
    );
    assert_eq!(audit(&app, "?limit=0").await.0, 400);
    app.stop().await;
}

/// What the log costs an admission pass: `admit` of 5,000 waiting buyers
/// with the log on and off, A B B A on the shared Redis, as a ratio
/// (`loadtest/audit-cost.sh` runs it; ignored in the normal run).
#[tokio::test]
#[ignore = "a measurement: loadtest/audit-cost.sh"]
async fn cost_of_the_log_per_admission_pass() {
    crate::needs_redis!();
    use waitroom::queue::{EntryToken, Policy, QueueName, UserId};
    const N: usize = 5_000;
    let queue = QueueName::parse("default").unwrap();
    let policy = Policy {
        batch: N as u32,
        interval_ms: 3_600_000,
        token_ttl_ms: 300_000,
        max_active: None,
        abandon_after_ms: None,
    };
    let mut times: Vec<(u64, std::time::Duration)> = Vec::new();
    for max_len in [100_000u64, 0, 0, 100_000, 100_000, 0, 0, 100_000] {
        let store = RedisStore::connect(&redis_url(), &unique_prefix("audit-cost"))
            .await
            .unwrap()
            .with_audit_max_len(max_len);
        let store: SharedStore = Arc::new(store);
        store.set_paused(&queue, true).await.unwrap();
        for chunk in 0..N / 500 {
            let joins = (0..500).map(|i| {
                let user = UserId::parse(&format!("c{chunk}-{i}")).unwrap();
                let store = store.clone();
                let (queue, policy) = (queue.clone(), policy.clone());
                async move {
                    store
                        .enter(&queue, &user, &policy, &EntryToken::generate())
                        .await
                        .unwrap()
                }
            });
            futures::future::join_all(joins).await;
        }
        store.set_paused(&queue, false).await.unwrap();
        let tokens: Vec<EntryToken> = (0..N).map(|_| EntryToken::generate()).collect();
        let started = std::time::Instant::now();
        let pass = store.admit(&queue, &policy, &tokens).await.unwrap();
        times.push((max_len, started.elapsed()));
        assert_eq!(pass.admitted.len(), N);
    }
    let mean = |on: bool| {
        let t: Vec<f64> = times
            .iter()
            .filter(|(m, _)| (*m > 0) == on)
            .map(|(_, d)| d.as_secs_f64() * 1000.0)
            .collect();
        t.iter().sum::<f64>() / t.len() as f64
    };
    let (on, off) = (mean(true), mean(false));
    println!(
        "admit of {N} buyers: log on {on:.1} ms, off {off:.1} ms, ratio {:.2} (runs: {times:?})",
        on / off
    );
}
