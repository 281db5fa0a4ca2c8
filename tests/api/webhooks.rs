//! Webhooks against a local receiver (axum on port 0): signed bodies that
//! verify with the hook's secret and not with another; a receiver that
//! fails then recovers gets every entry, retried under the same
//! `Idempotency-Key`; a hook sees only its kinds; two instances on one
//! Redis deliver each entry once in all; a stopped instance's pending
//! entries are taken over by another; Redis going away and coming back
//! does not stop delivery.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;
use sha2::Sha256;
use waitroom::Config;
use waitroom::queue::{QueueName, UserId};
use waitroom::store::redis::RedisStore;
use waitroom::store::{ClaimOutcome, SharedStore};

use crate::common::{
    IDLE, RedisProcess, TestApp, config, config_with_file, eventually, redis_url, unique_prefix,
};

const ADMIN: &str = "admin-token-for-webhook-tests-0123";
pub(super) const SECRET: &str = "whsec-0123456789abcdef";
pub(super) const BOUND: Duration = Duration::from_secs(20);

/// One request the receiver got.
#[derive(Debug, Clone)]
pub(super) struct Got {
    pub(super) key: String,
    pub(super) signature: String,
    attempt: u32,
    pub(super) body: Vec<u8>,
    ok: bool,
}

/// A webhook endpoint: fails the first `fail_first` requests (and every
/// request while `down`), records them all.
#[derive(Clone, Default)]
pub(super) struct Receiver {
    pub(super) got: Arc<Mutex<Vec<Got>>>,
    fail_first: Arc<AtomicUsize>,
    down: Arc<AtomicBool>,
    /// Requests still to be answered only after [`SLOW`] (a hung receiver).
    slow_first: Arc<AtomicUsize>,
}

/// How long a slow receiver takes: well past the hooks' `timeout-ms`.
const SLOW: Duration = Duration::from_secs(3);

pub(super) async fn receive(
    State(r): State<Receiver>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let header = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let slow = r
        .slow_first
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if slow {
        tokio::time::sleep(SLOW).await;
    }
    let failing = slow
        || r.down.load(Ordering::SeqCst)
        || r.fail_first
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
    r.got.lock().unwrap().push(Got {
        key: header("idempotency-key"),
        signature: header("waitroom-signature"),
        attempt: header("waitroom-attempt").parse().unwrap_or(0),
        body: body.to_vec(),
        ok: !failing,
    });
    if failing {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::NO_CONTENT
    }
}

impl Receiver {
    async fn start(fail_first: usize) -> (String, Self) {
        let r = Receiver::default();
        r.fail_first.store(fail_first, Ordering::SeqCst);
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(r.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (url, r)
    }

    pub(super) fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    /// Idempotency keys answered 2xx, with how many times each.
    fn delivered(&self) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for g in self.got().into_iter().filter(|g| g.ok) {
            *out.entry(g.key).or_default() += 1;
        }
        out
    }
}

/// The receiver's side of the signature: `t=<unix>,v1=<hex>` over
/// `<unix>.<body>` with the shared secret.
pub(super) fn verifies(signature: &str, body: &[u8], secret: &str) -> bool {
    let Some((t, v1)) = signature
        .strip_prefix("t=")
        .and_then(|s| s.split_once(",v1="))
    else {
        return false;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    let Ok(given) = hex::decode(v1) else {
        return false;
    };
    mac.verify_slice(&given).is_ok()
}

/// A `[[webhooks]]` table's keys (`extra`: more `key = value` lines).
pub(super) fn hook(name: &str, url: &str, extra: &str) -> String {
    format!(
        "name = \"{name}\"\nurl = \"{url}\"\nsecret = \"{SECRET}\"\nbackoff_ms = 50\ntimeout_ms = 2000\n{extra}"
    )
}

pub(super) fn cfg(hooks: &[String], claim_ms: u64) -> Config {
    let mut a = vec!["--admin-token", ADMIN];
    a.extend_from_slice(IDLE);
    let mut c = config(&a);
    c.webhooks = hooks
        .iter()
        .map(|h| waitroom::webhook::WebhookSpec::from_toml(h).unwrap())
        .collect();
    c.webhook_claim_ms = claim_ms;
    c
}

/// The idempotency keys of every entry of the queue's log, as the hook
/// sends them (`<queue>:<id>`).
pub(super) async fn log_keys(app: &TestApp) -> HashSet<String> {
    let r = app
        .client
        .get(app.admin_url("/api/admin/queues/default/audit?limit=1000"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let page: Value = r.json().await.unwrap();
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| format!("default:{}", e["id"].as_str().unwrap()))
        .collect()
}

/// Users `prefix0..n` join and leave: n `left` entries, after an
/// `admitted` for the queue's very first joiner (the fast track; the
/// budget of [`IDLE`] then keeps everyone else waiting).
pub(super) async fn actions(app: &TestApp, prefix: &str, n: usize) {
    for i in 0..n {
        let (code, body) = app.enter("default", &format!("{prefix}{i}")).await;
        assert_eq!(code, 201);
        assert_eq!(
            app.leave("default", body["ticket"].as_str().unwrap()).await,
            204
        );
    }
}

pub(super) async fn every_entry_delivered(
    app: &TestApp,
    receiver: &Receiver,
    expected: usize,
) -> HashSet<String> {
    eventually(BOUND, "every entry delivered", || async {
        let keys = log_keys(app).await;
        let delivered: HashSet<String> = receiver.delivered().into_keys().collect();
        (keys.len() == expected && keys == delivered).then_some(keys)
    })
    .await
}

async fn retries_until_the_receiver_recovers(app: TestApp, receiver: Receiver) {
    actions(&app, "r", 3).await;
    let keys = every_entry_delivered(&app, &receiver, 4).await;
    let got = receiver.got();
    assert!(
        got.len() >= 3 + 3,
        "three failures, then each entry: {got:?}"
    );
    assert!(got.iter().any(|g| !g.ok), "the receiver failed at first");
    assert!(got.iter().any(|g| g.attempt > 1), "retries were made");
    for g in &got {
        assert!(
            keys.contains(&g.key),
            "a retry keeps its entry's key: {}",
            g.key
        );
        assert!(verifies(&g.signature, &g.body, SECRET), "{g:?}");
        assert!(!verifies(&g.signature, &g.body, "another-secret-0123456"));
        let mut tampered = g.body.clone();
        tampered.push(b' ');
        assert!(!verifies(&g.signature, &tampered, SECRET));
        let body: Value = serde_json::from_slice(&g.body).unwrap();
        assert_eq!(body["queue"], "default");
        assert_eq!(format!("default:{}", body["id"].as_str().unwrap()), g.key);
    }
    // The same body on every attempt of an entry.
    for key in &keys {
        let bodies: HashSet<&Vec<u8>> = got
            .iter()
            .filter(|g| &g.key == key)
            .map(|g| &g.body)
            .collect();
        assert_eq!(bodies.len(), 1, "{key}");
    }
    // The metrics saw the retries and the deliveries (the recorder is the
    // process's: other tests' counts of this hook name add up, never less).
    let text = app
        .client
        .get(app.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let count = |outcome: &str| -> f64 {
        text.lines()
            .find(|l| {
                l.starts_with("waitroom_webhook_deliveries_total{")
                    && l.contains("hook=\"crm\"")
                    && l.contains(&format!("outcome=\"{outcome}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    assert!(count("retried") >= 3.0, "{text}");
    assert!(count("ok") >= 4.0, "{text}");
    app.stop().await;
}

#[tokio::test]
async fn memory_retries_until_the_receiver_recovers() {
    let (url, receiver) = Receiver::start(3).await;
    let app = TestApp::memory_with(cfg(&[hook("crm", &url, "")], 60_000)).await;
    retries_until_the_receiver_recovers(app, receiver).await;
}

/// Hooks written as the configuration file's `[[webhooks]]` tables (what
/// replaced the `--webhook` string) deliver like any: every entry, signed
/// with the table's secret, only the kinds it names.
#[tokio::test]
async fn hooks_from_the_configuration_file_deliver() {
    let (all_url, all) = Receiver::start(0).await;
    let (left_url, left) = Receiver::start(0).await;
    let file = format!(
        "[audit]\nwebhook_claim_ms = 60000\n\n[[webhooks]]\n{}\n[[webhooks]]\n{}",
        hook("from-file", &all_url, ""),
        hook("left-only", &left_url, "kinds = [\"left\"]\n"),
    );
    let mut args = vec!["--admin-token", ADMIN];
    args.extend_from_slice(IDLE);
    let c = config_with_file(&file, &args);
    assert_eq!(c.webhooks.len(), 2);
    let app = TestApp::memory_with(c).await;
    actions(&app, "f", 2).await;
    every_entry_delivered(&app, &all, 3).await;
    eventually(BOUND, "the left entries delivered", || async {
        (left.delivered().len() == 2).then_some(())
    })
    .await;
    for g in all.got().iter().chain(left.got().iter()) {
        assert!(verifies(&g.signature, &g.body, SECRET), "{g:?}");
    }
    app.stop().await;
}

#[tokio::test]
async fn redis_retries_until_the_receiver_recovers() {
    crate::needs_redis!();
    let (url, receiver) = Receiver::start(3).await;
    let app = TestApp::redis_with("hooks-retry", cfg(&[hook("crm", &url, "")], 60_000)).await;
    retries_until_the_receiver_recovers(app, receiver).await;
}

/// An admission pass of six is one stream entry in Redis: each buyer is
/// delivered on its own, retried apart while the others succeed, and the
/// stream entry is acknowledged only once all six are delivered.
#[tokio::test]
async fn a_pass_of_many_is_delivered_buyer_by_buyer_and_acknowledged_whole() {
    crate::needs_redis!();
    let (url, receiver) = Receiver::start(3).await;
    let app = TestApp::redis_with("hooks-pass", cfg(&[hook("crm", &url, "")], 60_000)).await;
    for i in 0..7 {
        let (code, _) = app.enter("default", &format!("p{i}")).await;
        assert_eq!(code, 201);
    }
    // The operator opens the door to six a pass: the next pass (this
    // instance's own admission loop) admits the six waiting at once.
    let r = app
        .client
        .put(app.admin_url("/api/admin/queues/default"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"batch": 6, "intervalMs": 200}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let keys = every_entry_delivered(&app, &receiver, 7).await;
    assert!(
        receiver.got().iter().any(|g| !g.ok),
        "some deliveries failed first"
    );
    let mut users = HashSet::new();
    for g in receiver.got().iter().filter(|g| g.ok) {
        let body: Value = serde_json::from_slice(&g.body).unwrap();
        assert_eq!(body["kind"], "admitted");
        users.insert(body["user"].as_str().unwrap().to_owned());
    }
    assert_eq!(users.len(), 7, "every buyer once: {users:?}");
    assert_eq!(keys.len(), 7);
    let mut redis = redis::Client::open(crate::common::redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let stream = format!("{}:{{default}}:audit", app.config.key_prefix);
    let records: u64 = redis::cmd("XLEN")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(records, 2, "the fast track, then the pass in one entry");
    eventually(BOUND, "the pass acknowledged", || {
        let mut redis = redis.clone();
        let stream = stream.clone();
        async move {
            let groups: Vec<HashMap<String, redis::Value>> = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(&stream)
                .query_async(&mut redis)
                .await
                .unwrap();
            let pending = groups
                .first()
                .and_then(|g| g.get("pending"))
                .and_then(|v| redis::from_redis_value::<u64>(v.clone()).ok());
            (pending == Some(0)).then_some(())
        }
    })
    .await;
    app.stop().await;
}

/// A receiver that hangs is given up on after the hook's timeout and the
/// entry retried; the hung request counts as failed.
#[tokio::test]
async fn a_hung_receiver_times_out_and_the_entry_is_retried() {
    let (url, receiver) = Receiver::start(0).await;
    receiver.slow_first.store(1, Ordering::SeqCst);
    let c = cfg(
        &[hook("crm", &url, "").replace("timeout_ms = 2000", "timeout_ms = 300")],
        60_000,
    );
    let app = TestApp::memory_with(c).await;
    let started = std::time::Instant::now();
    actions(&app, "s", 1).await;
    every_entry_delivered(&app, &receiver, 2).await;
    assert!(
        started.elapsed() < SLOW,
        "delivered without waiting for the hung request: {:?}",
        started.elapsed()
    );
    app.stop().await;
}

/// A receiver that never recovers: each entry is tried `attempts` times,
/// then given up (acknowledged, counted as failed), never tried again.
#[tokio::test]
async fn an_entry_is_given_up_after_its_attempts() {
    crate::needs_redis!();
    let (url, receiver) = Receiver::start(0).await;
    receiver.down.store(true, Ordering::SeqCst);
    let app = TestApp::redis_with(
        "hooks-dead",
        cfg(&[hook("dead", &url, "attempts = 2")], 1_000),
    )
    .await;
    actions(&app, "x", 1).await;
    let keys = log_keys(&app).await;
    assert_eq!(keys.len(), 2);
    eventually(BOUND, "two attempts per entry", || async {
        (receiver.got().len() >= 4).then_some(())
    })
    .await;
    // Past the claim timeout: a pending entry would be taken and tried again.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let got = receiver.got();
    assert_eq!(got.len(), 4, "no attempt after the last: {got:?}");
    for key in &keys {
        let attempts: Vec<u32> = got
            .iter()
            .filter(|g| &g.key == key)
            .map(|g| g.attempt)
            .collect();
        assert_eq!(attempts, [1, 2], "{key}");
    }
    let text = app
        .client
        .get(app.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("waitroom_webhook_deliveries_total{")
                && l.contains("hook=\"dead\"")
                && l.contains("outcome=\"failed\"")
                && l.ends_with(" 2")),
        "{text}"
    );
    app.stop().await;
}

/// A hook for `consumed` only never gets the admissions and leaves.
#[tokio::test]
async fn a_hook_gets_only_its_kinds() {
    crate::needs_redis!();
    let (all_url, all) = Receiver::start(0).await;
    let (consumed_url, consumed) = Receiver::start(0).await;
    let hooks = [
        hook("all", &all_url, ""),
        hook("orders", &consumed_url, "kinds = [\"consumed\"]"),
    ];
    let app = TestApp::redis_with("hooks-kinds", cfg(&hooks, 60_000)).await;
    let (_, ann) = app.enter("default", "ann").await;
    actions(&app, "k", 3).await;
    let token = ann["entryToken"].as_str().unwrap();
    let (queue, user) = (
        QueueName::parse("default").unwrap(),
        UserId::parse("ann").unwrap(),
    );
    let store = app.state.store();
    let ClaimOutcome::Claimed { claim_id } =
        store.claim(&queue, &user, token, 5_000).await.unwrap()
    else {
        panic!("ann holds a token");
    };
    assert!(store.consume(&queue, &user, &claim_id).await.unwrap());
    every_entry_delivered(&app, &all, 1 + 3 + 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let kinds: Vec<String> = consumed
        .got()
        .iter()
        .map(|g| {
            serde_json::from_slice::<Value>(&g.body).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(kinds, ["consumed"]);
    app.stop().await;
}

/// Two instances on one Redis, one hook: every entry is delivered, and
/// once in all (no crash here, so no duplicate is allowed).
#[tokio::test]
async fn two_instances_deliver_each_entry_once() {
    crate::needs_redis!();
    let (url, receiver) = Receiver::start(0).await;
    let prefix = unique_prefix("hooks-two");
    let store: SharedStore = Arc::new(RedisStore::connect(&redis_url(), &prefix).await.unwrap());
    let mut c = cfg(&[hook("crm", &url, "")], 60_000);
    c.key_prefix = prefix;
    let one = TestApp::spawn_with(c.clone(), store.clone()).await;
    let two = TestApp::spawn_with(c, store).await;
    for i in 0..10 {
        let app = if i % 2 == 0 { &one } else { &two };
        actions(app, &format!("t{i}-"), 3).await;
    }
    every_entry_delivered(&one, &receiver, 31).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let counts = receiver.delivered();
    assert_eq!(counts.len(), 31);
    assert!(
        counts.values().all(|&n| n == 1),
        "each delivered once: {counts:?}"
    );
    one.stop().await;
    two.stop().await;
}

/// An instance stops with entries pending (its receiver was failing):
/// another instance takes them over after the claim timeout and delivers.
#[tokio::test]
async fn a_stopped_instances_entries_are_taken_over() {
    crate::needs_redis!();
    let (url, receiver) = Receiver::start(0).await;
    receiver.down.store(true, Ordering::SeqCst);
    let prefix = unique_prefix("hooks-takeover");
    let store: SharedStore = Arc::new(RedisStore::connect(&redis_url(), &prefix).await.unwrap());
    let mut c = cfg(&[hook("crm", &url, "attempts = 100")], 1_000);
    c.key_prefix = prefix;
    let first = TestApp::spawn_with(c.clone(), store.clone()).await;
    actions(&first, "d", 3).await;
    let keys = log_keys(&first).await;
    assert_eq!(keys.len(), 4);
    eventually(BOUND, "the first instance tried every entry", || async {
        let tried: HashSet<String> = receiver.got().into_iter().map(|g| g.key).collect();
        (tried == keys).then_some(())
    })
    .await;
    first.stop().await;
    receiver.down.store(false, Ordering::SeqCst);
    assert!(receiver.delivered().is_empty());
    let second = TestApp::spawn_with(c, store).await;
    let delivered = every_entry_delivered(&second, &receiver, 4).await;
    assert_eq!(delivered, keys);
    second.stop().await;
}

/// Redis goes away and comes back (same data): the delivery task carries
/// on, and entries written after the return are delivered too.
#[tokio::test]
async fn delivery_survives_redis_going_away() {
    crate::needs_redis!();
    let (url, receiver) = Receiver::start(0).await;
    let mut redis = RedisProcess::start(true);
    let store: SharedStore = Arc::new(
        RedisStore::connect(&redis.url(), "hooks-down")
            .await
            .unwrap(),
    );
    let app = TestApp::spawn_with(cfg(&[hook("crm", &url, "")], 60_000), store).await;
    actions(&app, "b", 2).await;
    every_entry_delivered(&app, &receiver, 3).await;
    redis.kill();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    redis.restart();
    eventually(BOUND, "joins again", || async {
        (app.enter("default", "after0").await.0 == 201).then_some(())
    })
    .await;
    let (_, body) = app.enter("default", "after1").await;
    assert_eq!(
        app.leave("default", body["ticket"].as_str().unwrap()).await,
        204
    );
    let keys = every_entry_delivered(&app, &receiver, 4).await;
    assert_eq!(keys.len(), 4);
    app.stop().await;
}

/// A receiver written to the documented recipe (docs/webhooks.md,
/// *Verifying a delivery*):
/// the signature over `<t>.<raw body>` checked, an old timestamp refused,
/// duplicates dropped by the body's signed `idempotencyKey`, everything
/// else processed once. Every request it got is kept, to be replayed.
#[derive(Clone, Default)]
struct RecipeReceiver {
    seen: Arc<Mutex<HashSet<String>>>,
    processed: Arc<Mutex<Vec<Value>>>,
    captured: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
}

async fn per_recipe(
    State(r): State<RecipeReceiver>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    r.captured
        .lock()
        .unwrap()
        .push((headers.clone(), body.clone()));
    let signature = headers
        .get("waitroom-signature")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let t: Option<u64> = signature
        .strip_prefix("t=")
        .and_then(|s| s.split(',').next())
        .and_then(|t| t.parse().ok());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    if !verifies(signature, &body, SECRET) || t.is_none_or(|t| now.abs_diff(t) > 300) {
        return StatusCode::UNAUTHORIZED;
    }
    let Ok(event) = serde_json::from_slice::<Value>(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    // What the signature covers, never the header.
    let Some(key) = event["idempotencyKey"].as_str() else {
        return StatusCode::BAD_REQUEST;
    };
    if !r.seen.lock().unwrap().insert(key.to_owned()) {
        return StatusCode::NO_CONTENT; // a retry of one already taken
    }
    r.processed.lock().unwrap().push(event);
    StatusCode::NO_CONTENT
}

/// A captured delivery replayed under another `Idempotency-Key` (within
/// the timestamp's five minutes) is dropped by a receiver that follows
/// the documented recipe: what it de-duplicates on is signed. Changing
/// the signed key instead breaks the signature.
#[tokio::test]
async fn a_replay_under_another_idempotency_key_is_not_processed_twice() {
    let r = RecipeReceiver::default();
    let router = axum::Router::new()
        .route("/hook", axum::routing::post(per_recipe))
        .with_state(r.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let app = TestApp::memory_with(cfg(&[hook("replay", &url, "")], 60_000)).await;
    actions(&app, "p", 1).await;
    eventually(BOUND, "both entries processed", || async {
        (r.processed.lock().unwrap().len() == 2).then_some(())
    })
    .await;
    let keys = log_keys(&app).await;
    let processed: HashSet<String> = r
        .processed
        .lock()
        .unwrap()
        .iter()
        .map(|e| e["idempotencyKey"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(processed, keys, "the signed key is the entry's");
    let (headers, body) = r.captured.lock().unwrap()[0].clone();
    assert_eq!(
        headers["idempotency-key"].to_str().unwrap(),
        serde_json::from_slice::<Value>(&body).unwrap()["idempotencyKey"],
        "the header carries the same key"
    );

    let client = reqwest::Client::new();
    let replay = |key: &str, body: Vec<u8>| {
        client
            .post(&url)
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .header("waitroom-signature", headers["waitroom-signature"].clone())
            .body(body)
            .send()
    };
    let status = replay("default:1-0", body.to_vec()).await.unwrap().status();
    assert_eq!(status, 204, "accepted as a duplicate");
    let mut event: Value = serde_json::from_slice(&body).unwrap();
    event["idempotencyKey"] = "default:1-0".into();
    let forged = serde_json::to_vec(&event).unwrap();
    let status = replay("default:1-0", forged).await.unwrap().status();
    assert_eq!(status, 401, "the signed key cannot be changed");
    assert_eq!(r.processed.lock().unwrap().len(), 2, "nothing twice");
    app.stop().await;
}
