//! Queue tickets end with their place and expire; identity headers come
//! once; neither a ticket nor an entry token ever reaches the logs.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use waitroom::store::redis::RedisStore;

use crate::common::{
    IDLE, SseStream, TestApp, config, eventually, free_port, redis_url, unique_prefix,
};

async fn both(args: &[&str]) -> Vec<TestApp> {
    let mut apps = vec![TestApp::memory(args).await];
    if !crate::common::skip_redis("both stores") {
        apps.push(TestApp::redis("tickets", args).await);
    }
    apps
}

/// One request on a fresh connection (so an event-stream request is the
/// first of its connection, as a browser's usually is): (status, JSON body).
async fn call(app: &TestApp, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut req = client.request(method.parse().unwrap(), app.url(path));
    for (name, value) in headers {
        // `header` appends: a name given twice is sent twice.
        req = req.header(*name, *value);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Joins `user`: (status code, body); the body carries the ticket.
async fn join(app: &TestApp, user: &str) -> (u16, Value, String) {
    let (code, body) = app.enter("default", user).await;
    assert!(code == 200 || code == 201, "join {user}: {code} {body}");
    let ticket = body["ticket"].as_str().unwrap().to_owned();
    (code, body, ticket)
}

/// The error code of a `401` (panics on anything else).
fn unauthorized(answer: (u16, Value)) -> String {
    assert_eq!(answer.0, 401, "{}", answer.1);
    answer.1["error"].as_str().unwrap().to_owned()
}

/// The three ticket-authenticated endpoints with `ticket`: their answers.
async fn ticket_uses(app: &TestApp, ticket: &str) -> [(u16, Value); 3] {
    let h = [("x-queue-ticket", ticket)];
    [
        call(app, "GET", "/api/queues/default/position", &h).await,
        call(app, "GET", "/api/queues/default/events", &h).await,
        call(app, "DELETE", "/api/queues/default/entries/me", &h).await,
    ]
}

#[tokio::test]
async fn a_ticket_ends_with_its_place() {
    for app in both(IDLE).await {
        join(&app, "holder").await; // the fast track: the rest wait
        let (_, _, ticket) = join(&app, "bob").await;
        assert_eq!(app.leave("default", &ticket).await, 204);
        for answer in ticket_uses(&app, &ticket).await {
            assert_eq!(unauthorized(answer), "ticket_ended");
        }
        app.stop().await;
    }
}

#[tokio::test]
async fn a_new_join_gets_a_new_ticket_that_the_old_one_cannot_touch() {
    for app in both(IDLE).await {
        join(&app, "holder").await;
        let (_, _, old) = join(&app, "carol").await;
        join(&app, "dave").await;
        assert_eq!(app.leave("default", &old).await, 204);
        let (code, back, new) = join(&app, "carol").await;
        assert_eq!(code, 201, "a new place");
        assert_ne!(new, old, "a new place gets a new ticket");
        assert_eq!(back["rank"], 1, "behind dave now");

        // The old ticket can neither remove nor read the new place.
        let (_, before) = app.position("default", &new).await;
        assert_eq!(
            unauthorized(app.position("default", &old).await),
            "ticket_ended"
        );
        assert_eq!(app.leave("default", &old).await, 401);
        let (code, after) = app.position("default", &new).await;
        assert_eq!(code, 200);
        assert_eq!(
            (&after["status"], &after["rank"], &after["totalWaiting"]),
            (&before["status"], &before["rank"], &before["totalWaiting"])
        );
        assert_eq!(after["status"], "WAITING");

        // A repeat join of the same place keeps it and may refresh the
        // ticket; both stand for the same place.
        let (code, _, again) = join(&app, "carol").await;
        assert_eq!(code, 200);
        assert_eq!(app.position("default", &again).await.1["rank"], 1);
        assert_eq!(app.position("default", &new).await.1["rank"], 1);
        assert_eq!(app.leave("default", &again).await, 204);
        assert_eq!(
            unauthorized(app.position("default", &new).await),
            "ticket_ended"
        );
        app.stop().await;
    }
}

#[tokio::test]
async fn an_expired_ticket_is_refused_and_a_join_renews_it() {
    let mut args = IDLE.to_vec();
    args.extend(["--ticket-ttl-secs", "2"]);
    for app in both(&args).await {
        join(&app, "holder").await;
        let r = app
            .client
            .post(app.url("/api/queues/default/entries"))
            .header("x-user-id", "erin")
            .send()
            .await
            .unwrap();
        let cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
        assert!(cookie.contains("Max-Age=2"), "{cookie}");
        let ticket = r.json::<Value>().await.unwrap()["ticket"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(app.position("default", &ticket).await.0, 200);
        // Polled no faster than the buyer's budget refills (2 a second), so
        // the checks below are not answered 429.
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            let (code, body) = app.position("default", &ticket).await;
            if code == 401 && body["error"] == "ticket_expired" {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the ticket expires");
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        for answer in ticket_uses(&app, &ticket).await {
            assert_eq!(unauthorized(answer), "ticket_expired");
        }
        // The place outlived its ticket: a join keeps it, with a fresh one.
        let (code, body, fresh) = join(&app, "erin").await;
        assert_eq!((code, &body["rank"]), (200, &json!(0)));
        assert_eq!(app.position("default", &fresh).await.1["rank"], 0);
        app.stop().await;
    }
}

#[tokio::test]
async fn an_expired_token_ends_the_ticket() {
    for app in both(&["--token-ttl-secs", "1"]).await {
        // Straight to READY (empty queue): the join answers the token.
        let (_, body, ticket) = join(&app, "frank").await;
        assert_eq!(body["status"], "READY");
        assert_eq!(app.position("default", &ticket).await.0, 200);
        eventually(Duration::from_secs(10), "the token expires", || async {
            let (code, body) = app.position("default", &ticket).await;
            (code == 401 && body["error"] == "ticket_ended").then_some(())
        })
        .await;
        app.stop().await;
    }
}

#[tokio::test]
async fn a_used_token_ends_the_ticket() {
    for app in both(&[]).await {
        let (_, body, ticket) = join(&app, "grace").await;
        assert_eq!(body["status"], "READY");
        let token = body["entryToken"].as_str().unwrap().to_owned();
        let product = app
            .client
            .get(app.url("/api/products"))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()[0]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let r = app
            .client
            .post(app.url("/api/orders"))
            .header("x-user-id", "grace")
            .header("x-entry-token", &token)
            .json(&json!({ "productId": product, "quantity": 1 }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        for answer in ticket_uses(&app, &ticket).await {
            assert_eq!(unauthorized(answer), "ticket_ended");
        }
        app.stop().await;
    }
}

#[tokio::test]
async fn a_token_from_before_entry_ids_gets_one_on_the_next_join() {
    crate::needs_redis!();
    let app = TestApp::redis("legacy", IDLE).await;
    let (_, body, _) = join(&app, "legacy").await;
    let token = body["entryToken"].as_str().unwrap().to_owned();
    // What an instance of a version without entry ids wrote: the token in
    // a HASH of its own (the earlier layout), no entry id.
    let prefix = &app.config.key_prefix;
    let mut redis = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let stored = crate::common::stored_token(&mut redis, prefix, "default", "legacy")
        .await
        .unwrap()
        .expect("the fast-tracked token");
    let tokens = format!("{prefix}:{{default}}:token:#tokens");
    let fields: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(&tokens)
        .query_async(&mut redis)
        .await
        .unwrap();
    for (field, value) in fields {
        if field == "legacy" || value == "legacy" {
            let _: i64 = redis::cmd("HDEL")
                .arg(&tokens)
                .arg(field)
                .query_async(&mut redis)
                .await
                .unwrap();
        }
    }
    let key = format!("{prefix}:{{default}}:token:legacy");
    let _: () = redis::pipe()
        .cmd("HSET")
        .arg(&key)
        .arg("token")
        .arg(&stored["token"])
        .arg("enteredAt")
        .arg(&stored["enteredAt"])
        .arg("exp")
        .arg(&stored["exp"])
        .ignore()
        .cmd("PEXPIREAT")
        .arg(&key)
        .arg(&stored["exp"])
        .ignore()
        .query_async(&mut redis)
        .await
        .unwrap();
    let (code, body, ticket) = join(&app, "legacy").await;
    assert_eq!(code, 200, "{body}");
    let (code, p) = app.position("default", &ticket).await;
    assert_eq!(
        (code, p["entryToken"].as_str()),
        (200, Some(token.as_str()))
    );
    app.stop().await;
}

#[tokio::test]
async fn instances_with_one_secret_take_each_others_tickets() {
    crate::needs_redis!();
    let prefix = unique_prefix("tix");
    let secret = "tickets-across-instances-0123456789";
    let args = |s: &'static str| {
        let mut v = vec!["--key-prefix", prefix.as_str(), "--ticket-secret", s];
        v.extend_from_slice(IDLE);
        config(&v)
    };
    let store = || async { Arc::new(RedisStore::connect(&redis_url(), &prefix).await.unwrap()) };
    let a = TestApp::spawn_with(args(secret), store().await).await;
    let b = TestApp::spawn_with(args(secret), store().await).await;
    let other = TestApp::spawn_with(args("another-secret-entirely-0123456"), store().await).await;

    join(&a, "holder").await;
    let (_, _, ticket) = join(&a, "hana").await;
    assert_eq!(b.position("default", &ticket).await.1["status"], "WAITING");
    let mut stream = SseStream::open(&b, "default", &ticket, None).await;
    assert_eq!(
        stream.next(Duration::from_secs(5)).await.unwrap().event,
        "waiting"
    );
    drop(stream);
    assert_eq!(
        unauthorized(other.position("default", &ticket).await),
        "invalid_ticket"
    );
    assert_eq!(b.leave("default", &ticket).await, 204);
    assert_eq!(
        unauthorized(a.position("default", &ticket).await),
        "ticket_ended"
    );
    for app in [a, b, other] {
        app.stop().await;
    }
}

#[tokio::test]
async fn repeated_identity_headers_are_refused_and_change_nothing() {
    for app in both(IDLE).await {
        let (_, body, holder_ticket) = join(&app, "holder").await;
        let token = body["entryToken"].as_str().unwrap().to_owned();
        let (_, _, ticket) = join(&app, "ivan").await;
        let duplicate = |answer: (u16, Value)| {
            assert_eq!(answer.0, 400, "{}", answer.1);
            assert_eq!(answer.1["error"], "duplicate_header", "{}", answer.1);
            assert!(answer.1["message"].as_str().is_some_and(|m| !m.is_empty()));
        };

        // Join: neither user is put in line.
        duplicate(
            call(
                &app,
                "POST",
                "/api/queues/default/entries",
                &[("x-user-id", "mallory"), ("x-user-id", "victim")],
            )
            .await,
        );
        for ticket in [&ticket, &holder_ticket] {
            for path in ["/api/queues/default/position", "/api/queues/default/events"] {
                duplicate(
                    call(
                        &app,
                        "GET",
                        path,
                        &[("x-queue-ticket", ticket), ("x-queue-ticket", ticket)],
                    )
                    .await,
                );
                duplicate(
                    call(
                        &app,
                        "GET",
                        path,
                        &[
                            ("x-queue-ticket", ticket),
                            ("x-user-id", "ivan"),
                            ("x-user-id", "holder"),
                        ],
                    )
                    .await,
                );
            }
            duplicate(
                call(
                    &app,
                    "DELETE",
                    "/api/queues/default/entries/me",
                    &[
                        ("x-queue-ticket", ticket),
                        ("x-queue-ticket", "forged.AAAA"),
                    ],
                )
                .await,
            );
        }
        duplicate(
            call(
                &app,
                "POST",
                "/api/orders",
                &[
                    ("x-user-id", "holder"),
                    ("x-entry-token", &token),
                    ("x-entry-token", &token),
                    ("content-type", "application/json"),
                ],
            )
            .await,
        );
        // Nothing changed: both places stand, the token is unused, and
        // neither name of the refused join is in line.
        let (code, ivan) = app.position("default", &ticket).await;
        assert_eq!(
            (code, &ivan["rank"], &ivan["totalWaiting"]),
            (200, &json!(0), &json!(1))
        );
        let (_, holder) = app.position("default", &holder_ticket).await;
        assert_eq!(holder["entryToken"].as_str(), Some(token.as_str()));
        for user in ["mallory", "victim"] {
            assert_eq!(
                app.enter("default", user).await.0,
                201,
                "{user} was not in line"
            );
        }
        // One of each is fine.
        assert_eq!(
            call(
                &app,
                "GET",
                "/api/queues/default/position",
                &[("x-queue-ticket", &ticket), ("x-user-id", "ivan")],
            )
            .await
            .0,
            200
        );
        app.stop().await;
    }
}

/// The binary at `RUST_LOG=trace`, its stdout and stderr in one file.
struct LoggedBin {
    port: u16,
    log: std::path::PathBuf,
    child: std::process::Child,
}

impl LoggedBin {
    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }
}

impl Drop for LoggedBin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

#[tokio::test]
async fn no_ticket_or_token_reaches_the_logs() {
    let port = free_port();
    let dir = std::env::temp_dir();
    let log = dir.join(format!("waitroom-log-{port}.txt"));
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args([
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--orders-db",
            ":memory:",
            "--identity",
            "header",
        ])
        .args(["--admission-interval-ms", "200", "--admission-batch", "1"])
        // Opted in, so a ticket travels in the query too and must still
        // stay out of the log.
        .arg("--ticket-in-query")
        .env("RUST_LOG", "trace")
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("spawn waitroom");
    let bin = LoggedBin { port, log, child };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    eventually(Duration::from_secs(20), "the binary answers", || async {
        client
            .get(bin.url("/healthz"))
            .send()
            .await
            .ok()
            .filter(|r| r.status() == 200)
            .map(|_| ())
    })
    .await;

    let join = |user: &'static str| {
        let client = client.clone();
        let url = bin.url("/api/queues/default/entries");
        async move {
            let r = client
                .post(url)
                .header("x-user-id", user)
                .send()
                .await
                .unwrap();
            r.json::<Value>().await.unwrap()
        }
    };
    let mut secrets = Vec::new();
    // READY at once: the join answers a token, the position repeats it.
    let first = join("logged-first").await;
    let first_ticket = first["ticket"].as_str().unwrap().to_owned();
    let first_token = first["entryToken"].as_str().unwrap().to_owned();
    // The next waits, then is admitted by a pass.
    let second = join("logged-second").await;
    let ticket = second["ticket"].as_str().unwrap().to_owned();
    let position = bin.url("/api/queues/default/position");
    let token = eventually(Duration::from_secs(10), "READY", || {
        let r = client.get(format!("{position}?ticket={ticket}")).send();
        async move {
            let body: Value = r.await.ok()?.json().await.ok()?;
            body["entryToken"].as_str().map(str::to_owned)
        }
    })
    .await;
    // The ticket in each place it may travel, on both stream paths.
    client
        .get(&position)
        .header("x-queue-ticket", &ticket)
        .send()
        .await
        .unwrap();
    client
        .get(&position)
        .header("cookie", format!("waitroom_ticket={ticket}"))
        .send()
        .await
        .unwrap();
    for query in [format!("?ticket={first_ticket}"), String::new()] {
        let r = reqwest::Client::new()
            .get(bin.url(&format!("/api/queues/default/events{query}")))
            .header("x-queue-ticket", &first_ticket)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    client
        .get(bin.url(&format!("/api/queues/default/events?ticket={ticket}")))
        .send()
        .await
        .unwrap();
    // An order with the token, and one with a token already used.
    let product = client
        .get(bin.url("/api/products"))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for _ in 0..2 {
        client
            .post(bin.url("/api/orders"))
            .header("x-user-id", "logged-second")
            .header("x-entry-token", &token)
            .json(&json!({ "productId": product, "quantity": 1 }))
            .send()
            .await
            .unwrap();
    }
    client
        .delete(bin.url(&format!(
            "/api/queues/default/entries/me?ticket={first_ticket}"
        )))
        .send()
        .await
        .unwrap();
    secrets.extend([first_ticket, first_token, ticket, token]);

    // The last request is logged before the process is stopped.
    let text = eventually(
        Duration::from_secs(10),
        "the requests are logged",
        || async {
            let text = std::fs::read_to_string(&bin.log).unwrap_or_default();
            text.contains("/api/queues/default/entries/me")
                .then_some(text)
        },
    )
    .await;
    assert!(
        text.contains("/api/queues/default/position"),
        "trace logs requests"
    );
    for secret in &secrets {
        let mut forms = vec![secret.clone()];
        // A ticket's parts on their own: the signed payload, the tag.
        if let Some((payload, tag)) = secret.split_once('.') {
            forms.extend([payload.to_owned(), tag.to_owned()]);
        }
        for form in forms {
            assert!(
                !text.contains(&form),
                "the log contains a ticket or token ({form}):\n{}",
                text.lines()
                    .filter(|l| l.contains(&form))
                    .take(3)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
}
