//! Fairness anyone can check (`--fairness-log`, docs/fairness.md): joins
//! answer signed receipts, the public admission log grows with signed
//! heads and proofs, and `tools/verify-queue` — built from its own crate,
//! sharing no code with the server — passes an honest run and catches a
//! tampering operator, each way its own test with its own message: an
//! admission reordered (a buyer held back while later ones go first), an
//! entry removed, inserted or changed, a head rewritten, history rewritten
//! under the same key, a receipt forged. Bad queries to the log are `400`
//! and change nothing; with Redis down the log fails closed (`503`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{Value, json};
use waitroom::Config;
use waitroom::store::redis::RedisStore;

use crate::common::{RedisProcess, TestApp, config, eventually, redis_url, unique_prefix};

const ADMIN: &str = "admin-token-for-fairness-tests-01";
const WAIT: Duration = Duration::from_secs(20);

fn args() -> Vec<&'static str> {
    vec![
        "--fairness-log",
        "--admission-interval-ms",
        "100",
        "--admission-batch",
        "1",
        "--abandon-after-secs",
        "600",
        "--admin-token",
        ADMIN,
        "--ticket-secret",
        "fairness-test-ticket-secret-0123456789",
    ]
}

/// The verifier, built once from its own crate.
fn verifier() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let status = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "verify-queue"])
            .current_dir(&root)
            .status()
            .expect("cargo runs");
        assert!(status.success(), "verify-queue builds");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        target.join("debug/verify-queue")
    })
}

/// Runs the verifier off the test's runtime (which serves the app).
async fn verify(args: Vec<String>) -> Output {
    let bin = tokio::task::spawn_blocking(verifier).await.unwrap();
    tokio::task::spawn_blocking(move || Command::new(bin).args(args).output().unwrap())
        .await
        .unwrap()
}

fn passed(out: &Output) -> bool {
    out.status.code() == Some(0)
}

/// Asserts the verifier caught the operator (exit 1) saying `message`.
fn caught(out: &Output, message: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(message), "expected {message:?} in {stderr}");
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "waitroom-fairness-{tag}-{:016x}",
        rand::random::<u64>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

async fn get(app: &TestApp, path: &str) -> (u16, Value) {
    let r = app.client.get(app.url(path)).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Joins `users` one after the other; their receipts.
async fn join_all(app: &TestApp, users: &[&str]) -> Vec<String> {
    let mut receipts = Vec::new();
    for user in users {
        let (code, body) = app.enter("default", user).await;
        assert!(code == 201 || code == 200, "{body}");
        receipts.push(body["receipt"].as_str().expect("a receipt").to_owned());
    }
    receipts
}

/// Waits until the signed head covers `size` leaves; the head document.
async fn head_of(app: &TestApp, size: u64) -> Value {
    eventually(WAIT, "a signed head of the log", || async {
        let (code, head) = get(app, "/api/queues/default/log").await;
        (code == 200 && head["payload"]["size"].as_u64() >= Some(size)).then_some(head)
    })
    .await
}

async fn admin_post(app: &TestApp, path: &str) {
    let r = app
        .client
        .post(app.admin_url(path))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{path}: {}", r.status());
}

/// The honest run: receipts verify, the log matches its head, extends a
/// head saved earlier, proofs check, and nobody went ahead of anyone.
#[tokio::test]
async fn an_honest_run_verifies_for_every_buyer() {
    let app = TestApp::memory(&args()).await;
    let receipts = join_all(&app, &["h0", "h1", "h2"]).await;
    let early = head_of(&app, 3).await;
    let dir = temp_dir("honest");
    let saved = write(&dir, "early-head.json", &early.to_string());
    let more = join_all(&app, &["h3", "h4"]).await;
    head_of(&app, 5).await;
    for (i, receipt) in receipts.iter().chain(&more).enumerate() {
        let path = write(&dir, &format!("receipt-{i}.txt"), receipt);
        let out = verify(vec![
            "--receipt".into(),
            path,
            "--url".into(),
            app.url(""),
            "--saved-head".into(),
            saved.clone(),
        ])
        .await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            passed(&out),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("inclusion proof verified"), "{stdout}");
        assert!(stdout.contains("extends the head you saved"), "{stdout}");
    }
    // The receipt says what the join was: the queue, the entry, the store's time.
    let payload: Value = serde_json::from_slice(
        &base64::Engine::decode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            receipts[0].split('.').nth(1).unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(payload["queue"], "default");
    assert!(
        payload["seq"].is_u64() && payload["at"].is_u64(),
        "{payload}"
    );
    assert_eq!(payload["fp"].as_str().unwrap().len(), 32);
    // Saved documents verify offline, the same.
    let saved_dir = dir.join("saved");
    let receipt = dir.join("receipt-1.txt").display().to_string();
    let out = verify(vec![
        "--receipt".into(),
        receipt.clone(),
        "--url".into(),
        app.url(""),
        "--save".into(),
        saved_dir.display().to_string(),
    ])
    .await;
    assert!(passed(&out), "{}", String::from_utf8_lossy(&out.stderr));
    let out = verify(vec![
        "--receipt".into(),
        receipt,
        "--dir".into(),
        saved_dir.display().to_string(),
    ])
    .await;
    assert!(passed(&out), "{}", String::from_utf8_lossy(&out.stderr));
    app.stop().await;
}

/// A copy of the honest log's documents, and a buyer's receipt.
async fn saved_log(tag: &str) -> (TestApp, PathBuf, String) {
    let app = TestApp::memory(&args()).await;
    let receipts = join_all(&app, &["t0", "t1", "t2", "t3", "t4"]).await;
    head_of(&app, 5).await;
    let dir = temp_dir(tag);
    let receipt = write(&dir, "receipt.txt", &receipts[4]);
    let out = verify(vec![
        "--receipt".into(),
        receipt.clone(),
        "--url".into(),
        app.url(""),
        "--save".into(),
        dir.display().to_string(),
    ])
    .await;
    assert!(passed(&out), "{}", String::from_utf8_lossy(&out.stderr));
    (app, dir, receipt)
}

fn leaves(dir: &Path) -> Vec<Value> {
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("entries.json")).unwrap()).unwrap();
    doc["leaves"].as_array().unwrap().clone()
}

fn set_leaves(dir: &Path, leaves: Vec<Value>) {
    write(
        dir,
        "entries.json",
        &json!({"start": 0, "leaves": leaves}).to_string(),
    );
}

async fn verify_dir(dir: &Path, receipt: &str) -> Output {
    verify(vec![
        "--receipt".into(),
        receipt.into(),
        "--dir".into(),
        dir.display().to_string(),
    ])
    .await
}

#[tokio::test]
async fn an_entry_removed_is_caught() {
    let (app, dir, receipt) = saved_log("removed").await;
    let mut all = leaves(&dir);
    all.remove(1);
    set_leaves(&dir, all);
    caught(
        &verify_dir(&dir, &receipt).await,
        "SHORTER THAN ITS SIGNED HEAD",
    );
    app.stop().await;
}

#[tokio::test]
async fn an_entry_inserted_is_caught() {
    let (app, dir, receipt) = saved_log("inserted").await;
    let mut all = leaves(&dir);
    let mut forged = all[0].as_str().unwrap().to_owned();
    forged = forged.replace("\"seq\":", "\"seq\":1");
    all.insert(1, Value::String(forged));
    set_leaves(&dir, all);
    caught(
        &verify_dir(&dir, &receipt).await,
        "DOES NOT MATCH ITS SIGNED HEAD",
    );
    app.stop().await;
}

#[tokio::test]
async fn entries_reordered_are_caught() {
    let (app, dir, receipt) = saved_log("reordered").await;
    let mut all = leaves(&dir);
    all.swap(1, 3);
    set_leaves(&dir, all);
    caught(
        &verify_dir(&dir, &receipt).await,
        "DOES NOT MATCH ITS SIGNED HEAD",
    );
    app.stop().await;
}

#[tokio::test]
async fn a_head_rewritten_is_caught() {
    let (app, dir, receipt) = saved_log("head").await;
    let head: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("head.json")).unwrap()).unwrap();
    let jws = head["head"].as_str().unwrap();
    let parts: Vec<&str> = jws.split('.').collect();
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut payload: Value =
        serde_json::from_slice(&base64::Engine::decode(&b64, parts[1]).unwrap()).unwrap();
    payload["root"] = json!("00".repeat(32));
    let payload = base64::Engine::encode(&b64, payload.to_string());
    let forged = format!("{}.{payload}.{}", parts[0], parts[2]);
    write(&dir, "head.json", &json!({"head": forged}).to_string());
    caught(
        &verify_dir(&dir, &receipt).await,
        "HEAD'S SIGNATURE DOES NOT VERIFY",
    );
    app.stop().await;
}

/// A receipt altered (another entry claimed) fails its signature; one
/// signed by another key (another server) names a key the queue never
/// published.
#[tokio::test]
async fn a_receipt_forged_is_caught() {
    let (app, dir, receipt) = saved_log("receipt").await;
    let jws = std::fs::read_to_string(&receipt).unwrap();
    let parts: Vec<&str> = jws.split('.').collect();
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut payload: Value =
        serde_json::from_slice(&base64::Engine::decode(&b64, parts[1]).unwrap()).unwrap();
    payload["seq"] = json!(1);
    let altered = format!(
        "{}.{}.{}",
        parts[0],
        base64::Engine::encode(&b64, payload.to_string()),
        parts[2]
    );
    let altered = write(&dir, "altered.txt", &altered);
    caught(
        &verify_dir(&dir, &altered).await,
        "RECEIPT'S SIGNATURE DOES NOT VERIFY",
    );
    let other = TestApp::memory_with(Config {
        ticket_secret: Some("another-servers-secret-0123456789".into()),
        ..config(&args())
    })
    .await;
    let (_, body) = other.enter("default", "elsewhere").await;
    let foreign = write(&dir, "foreign.txt", body["receipt"].as_str().unwrap());
    caught(&verify_dir(&dir, &foreign).await, "UNPUBLISHED KEY");
    other.stop().await;
    app.stop().await;
}

/// History rewritten and signed with the same key (a second log under the
/// same secret, other buyers in it): every signature checks, but the log
/// does not extend the head a buyer saved.
#[tokio::test]
async fn history_rewritten_under_the_same_key_is_caught_by_a_saved_head() {
    let first = TestApp::memory(&args()).await;
    join_all(&first, &["r0", "r1", "r2"]).await;
    let saved = head_of(&first, 3).await;
    let rewritten = TestApp::memory(&args()).await;
    let receipts = join_all(&rewritten, &["x0", "x1", "x2", "x3"]).await;
    head_of(&rewritten, 4).await;
    let dir = temp_dir("rewritten");
    let saved = write(&dir, "saved-head.json", &saved.to_string());
    let receipt = write(&dir, "receipt.txt", &receipts[3]);
    let out = verify(vec![
        "--receipt".into(),
        receipt,
        "--url".into(),
        rewritten.url(""),
        "--saved-head".into(),
        saved,
    ])
    .await;
    caught(&out, "THE LOG WAS REWRITTEN");
    first.stop().await;
    rewritten.stop().await;
}

/// The operator holds a buyer back (takes them out of the line in Redis
/// while a pass admits the next one, then puts them back): the log
/// honestly records that a later arrival was admitted first, and the
/// held-back buyer's verifier says so.
#[tokio::test]
async fn an_admission_reordered_by_the_operator_is_caught() {
    let app = TestApp::redis("fair-reorder", &args()).await;
    admin_post(&app, "/api/admin/queues/default/pause").await;
    let receipts = join_all(&app, &["o0", "o1", "o2"]).await;
    // Tampering: o0 leaves the line's sorted set, keeping its score.
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let line = format!("{}:{{default}}:waiting", app.config.key_prefix);
    let score: f64 = redis::cmd("ZSCORE")
        .arg(&line)
        .arg("o0")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: i64 = redis::cmd("ZREM")
        .arg(&line)
        .arg("o0")
        .query_async(&mut conn)
        .await
        .unwrap();
    admin_post(&app, "/api/admin/queues/default/resume").await;
    head_of(&app, 1).await;
    let _: i64 = redis::cmd("ZADD")
        .arg(&line)
        .arg(score)
        .arg("o0")
        .query_async(&mut conn)
        .await
        .unwrap();
    head_of(&app, 3).await;
    let dir = temp_dir("reorder");
    let held_back = write(&dir, "receipt.txt", &receipts[0]);
    let out = verify(vec![
        "--receipt".into(),
        held_back,
        "--url".into(),
        app.url(""),
    ])
    .await;
    caught(&out, "UNFAIR: entry");
    // The buyers who were not held back find nothing wrong.
    let fine = write(&dir, "fine.txt", &receipts[1]);
    let out = verify(vec!["--receipt".into(), fine, "--url".into(), app.url("")]).await;
    assert!(passed(&out), "{}", String::from_utf8_lossy(&out.stderr));
    app.stop().await;
}

/// Bad queries are `400 invalid_log_query` and read nothing; the log is
/// the same after them; off, every route is `404 fairness_log_off`.
#[tokio::test]
async fn bad_log_queries_are_refused_and_change_nothing() {
    let app = TestApp::memory(&args()).await;
    join_all(&app, &["b0", "b1", "b2"]).await;
    let head = head_of(&app, 3).await;
    let (_, before) = get(&app, "/api/queues/default/log/entries").await;
    for bad in [
        "/log/entries?count=0",
        "/log/entries?count=1001",
        "/log/entries?start=-1",
        "/log/entries?start=%2B1",
        "/log/entries?start=1&start=2",
        "/log/entries?page=1",
        "/log/entries?start=99999999999999999999",
        "/log/inclusion",
        "/log/inclusion?index=3&size=3",
        "/log/inclusion?index=0&size=4",
        "/log/inclusion?index=a&size=3",
        "/log/consistency?first=0&second=3",
        "/log/consistency?first=3&second=2",
        "/log/consistency?first=1&second=9",
        "/log/consistency?first=1",
    ] {
        let (code, body) = get(&app, &format!("/api/queues/default{bad}")).await;
        assert_eq!(code, 400, "{bad}: {body}");
        assert_eq!(body["error"], "invalid_log_query", "{bad}: {body}");
    }
    let (code, body) = get(&app, "/api/queues/nope/log").await;
    assert_eq!((code, body["error"].as_str()), (404, Some("unknown_queue")));
    // Past the end: an empty page, not an error.
    let (code, body) = get(&app, "/api/queues/default/log/entries?start=50").await;
    assert_eq!(code, 200);
    assert_eq!(body["leaves"], json!([]));
    let (_, after) = get(&app, "/api/queues/default/log/entries").await;
    assert_eq!(before, after);
    assert_eq!(
        head_of(&app, 3).await["payload"]["size"],
        head["payload"]["size"]
    );
    app.stop().await;

    let off = TestApp::memory(&[]).await;
    let (code, body) = off.enter("default", "nobody").await;
    assert_eq!(code, 201);
    assert!(body.get("receipt").is_none(), "{body}");
    for path in [
        "/.well-known/waitroom-keys.json",
        "/api/queues/default/log",
        "/api/queues/default/log/entries",
        "/api/queues/default/log/inclusion?index=0&size=1",
        "/api/queues/default/log/consistency?first=1&second=1",
    ] {
        let (code, body) = get(&off, path).await;
        assert_eq!(
            (code, body["error"].as_str()),
            (404, Some("fairness_log_off")),
            "{path}"
        );
    }
    off.stop().await;
}

/// With Redis gone the log answers `503 store_unavailable`, never a
/// made-up head or proof.
#[tokio::test]
async fn the_log_fails_closed_while_redis_is_down() {
    let mut redis = RedisProcess::start(false);
    let prefix = unique_prefix("fair-down");
    let store = Arc::new(RedisStore::connect(&redis.url(), &prefix).await.unwrap());
    let app = TestApp::spawn_with(
        Config {
            key_prefix: prefix,
            ..config(&args())
        },
        store,
    )
    .await;
    join_all(&app, &["d0", "d1"]).await;
    head_of(&app, 2).await;
    redis.kill();
    for path in [
        "/api/queues/default/log",
        "/api/queues/default/log/entries",
        "/api/queues/default/log/inclusion?index=0&size=1",
        "/api/queues/default/log/consistency?first=1&second=2",
    ] {
        let (code, body) = get(&app, path).await;
        assert_eq!(
            (code, body["error"].as_str()),
            (503, Some("store_unavailable")),
            "{path}"
        );
    }
    app.stop().await;
}

/// A lottery's entry code comes from the buyer's browser (`lotteryNonce`),
/// so the server does not choose the fingerprints the draw sorts; a code
/// that is not 16 random bytes in hex is `400 invalid_body` and joins
/// nobody.
#[tokio::test]
async fn the_lottery_draws_the_code_the_browser_chose() {
    let app = TestApp::memory(&args()).await;
    let opens_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 60_000;
    let r = app
        .client
        .put(app.admin_url("/api/admin/queues/default/lottery"))
        .bearer_auth(ADMIN)
        .json(&json!({ "opensAt": opens_at }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let join = |user: &'static str, body: Value| {
        let app = &app;
        async move {
            let r = app
                .client
                .post(app.url("/api/queues/default/entries"))
                .header("x-user-id", user)
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    for bad in [
        json!({"lotteryNonce": "ABCDEF0123456789abcdef0123456789"}),
        json!({"lotteryNonce": "abc"}),
        json!({"lotteryNonce": 7}),
    ] {
        let (code, body) = join("picky", bad.clone()).await;
        assert_eq!(
            (code, body["error"].as_str()),
            (400, Some("invalid_body")),
            "{bad}"
        );
    }
    let nonce = "0123456789abcdef0123456789abcdef";
    let (code, body) = join("picky", json!({ "lotteryNonce": nonce })).await;
    assert_eq!(
        (code, body["status"].as_str()),
        (201, Some("PRE_QUEUE")),
        "{body}"
    );
    assert_eq!(body["lottery"]["nonce"], nonce);
    use sha2::Digest;
    let expected = hex::encode(sha2::Sha256::digest(format!(
        "waitroom-lottery-v1\ndefault\n{nonce}"
    )));
    assert_eq!(body["lottery"]["fingerprint"], expected.as_str());
    // Without one, the server draws a code, as before.
    let (code, body) = join("plain", json!({})).await;
    assert_eq!(code, 201);
    assert_eq!(body["lottery"]["nonce"].as_str().unwrap().len(), 32);
    assert_ne!(body["lottery"]["nonce"], nonce);
    app.stop().await;
}

/// Redis's own time for all commands since the last `CONFIG RESETSTAT`
/// (µs, `INFO commandstats`).
async fn redis_usec(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| l.split("usec=").nth(1))
        .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// What the log costs Redis per join and per admission: the same build
/// with `--fairness-log` on and off, A B B A, each run on a private
/// `redis-server` of its own (so `INFO commandstats` counts nothing else):
/// 2,000 joins over HTTP (admission held), the log's ticks, then every
/// buyer admitted, the log's ticks again. Also the bytes a leaf takes.
/// `loadtest/fairness-cost.sh` runs it; ignored in the normal run.
#[tokio::test]
#[ignore = "a measurement: loadtest/fairness-cost.sh"]
async fn cost_of_the_log_per_join_and_admission() {
    crate::needs_redis!();
    const N: usize = 2_000;
    let mut rows: Vec<(bool, f64, f64, f64)> = Vec::new();
    let mut leaf_bytes = 0.0;
    for on in [true, false, false, true] {
        let redis = RedisProcess::start(false);
        let client = redis::Client::open(redis.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let prefix = unique_prefix("fair-cost");
        let store = Arc::new(RedisStore::connect(&redis.url(), &prefix).await.unwrap());
        let mut flags = args();
        if !on {
            flags.retain(|f| *f != "--fairness-log");
        }
        let flags: Vec<&str> = flags
            .into_iter()
            .map(|f| if f == "1" { "500" } else { f })
            .collect();
        let app = TestApp::spawn_with(
            Config {
                key_prefix: prefix.clone(),
                ..config(&flags)
            },
            store,
        )
        .await;
        admin_post(&app, "/api/admin/queues/default/pause").await;
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .unwrap();
        // Bursts of 50 on a fixed schedule, so both runs last as long and
        // what runs by the clock (the held admission loop's passes, the
        // catalog) costs both the same: the difference is the log's.
        let started = tokio::time::Instant::now();
        let mut burst_ms = 0.0;
        for chunk in 0..N / 50 {
            tokio::time::sleep_until(started + Duration::from_millis(400) * chunk as u32).await;
            let burst = std::time::Instant::now();
            let joins = (0..50).map(|i| {
                let app = &app;
                async move {
                    let user = format!("c{chunk}-{i}");
                    let (code, _) = app.enter("default", &user).await;
                    assert_eq!(code, 201);
                }
            });
            futures::future::join_all(joins).await;
            burst_ms += burst.elapsed().as_secs_f64() * 1000.0;
        }
        let join_ms = burst_ms / (N / 50) as f64;
        // The log's ticks take the joins in (nothing to log: no admission yet).
        tokio::time::sleep_until(
            started + Duration::from_millis(400) * (N / 50) as u32 + Duration::from_millis(2_000),
        )
        .await;
        let per_join = redis_usec(&mut conn).await as f64 / N as f64;
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .unwrap();
        admin_post(&app, "/api/admin/queues/default/resume").await;
        eventually(WAIT, "every buyer admitted", || async {
            let waiting: u64 = redis::cmd("ZCARD")
                .arg(format!("{prefix}:{{default}}:waiting"))
                .query_async(&mut conn.clone())
                .await
                .unwrap();
            (waiting == 0).then_some(())
        })
        .await;
        // A fixed time again; the log has caught up well within it.
        tokio::time::sleep(Duration::from_millis(3_000)).await;
        if on {
            head_of(&app, N as u64).await;
        }
        let per_admission = redis_usec(&mut conn).await as f64 / N as f64;
        if on {
            let mut bytes = 0u64;
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{prefix}:{{default}}:fair*"))
                .query_async(&mut conn)
                .await
                .unwrap();
            for key in keys {
                let b: Option<u64> = redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(&key)
                    .arg("SAMPLES")
                    .arg(0)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                bytes += b.unwrap_or(0);
            }
            leaf_bytes = bytes as f64 / N as f64;
        }
        rows.push((on, join_ms, per_join, per_admission));
        app.stop().await;
        drop(redis);
    }
    let mean = |on: bool, f: fn(&(bool, f64, f64, f64)) -> f64| {
        let v: Vec<f64> = rows.iter().filter(|r| r.0 == on).map(f).collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    let (join_on, join_off) = (mean(true, |r| r.1), mean(false, |r| r.1));
    let (rj_on, rj_off) = (mean(true, |r| r.2), mean(false, |r| r.2));
    let (ra_on, ra_off) = (mean(true, |r| r.3), mean(false, |r| r.3));
    println!(
        "a burst of 50 joins over HTTP: on {join_on:.1} ms, off {join_off:.1} ms, ratio {:.2}",
        join_on / join_off
    );
    println!(
        "Redis time per join: on {rj_on:.1} us, off {rj_off:.1} us, ratio {:.2}",
        rj_on / rj_off
    );
    println!(
        "Redis time per admission: on {ra_on:.1} us, off {ra_off:.1} us, ratio {:.2}",
        ra_on / ra_off
    );
    println!("Redis bytes per leaf (leaves + nodes + head): {leaf_bytes:.0}");
    println!("runs (on, burst ms, Redis us/join, Redis us/admission): {rows:?}");
}
