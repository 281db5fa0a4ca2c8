//! The admission pass: an admitted buyer takes one, the gateway check
//! accepts it and refuses everything else (forged, expired, other-room,
//! ended passes, `alg` confusion, unknown keys, oversized cookies), return
//! URLs are never open redirects, sessions hold `maxActive` slots until
//! they go idle or an operator ends them, and live passes outlast the
//! store.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde_json::Value;
use waitroom::pass::{KeyRing, PassClaims, PassService};
use waitroom::queue::{QueueName, SessionId, UserId};
use waitroom::store::redis::RedisStore;

use crate::common::{IDLE, RedisProcess, TestApp, config, eventually};

/// Follows no redirect: the tests read each one.
fn client() -> reqwest::Client {
    crate::front::no_redirects()
}

async fn both(args: &[&str]) -> Vec<TestApp> {
    let mut apps = vec![TestApp::memory(args).await];
    if !crate::common::skip_redis("both stores") {
        apps.push(TestApp::redis("pass", args).await);
    }
    apps
}

/// Joins `user` to `queue`: their ticket.
async fn join(app: &TestApp, queue: &str, user: &str) -> String {
    let (code, body) = app.enter(queue, user).await;
    assert!(code == 200 || code == 201, "join {user}: {code} {body}");
    body["ticket"].as_str().unwrap().to_owned()
}

/// `GET /api/queues/{queue}/pass` as JSON: (status, body).
async fn take_pass(
    app: &TestApp,
    queue: &str,
    user: &str,
    ticket: &str,
    back: &str,
) -> (u16, Value) {
    let back: String = form_urlencoded::byte_serialize(back.as_bytes()).collect();
    let r = client()
        .get(app.url(&format!("/api/queues/{queue}/pass?return={back}")))
        .header("x-user-id", user)
        .header("x-queue-ticket", ticket)
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The pass of an admitted `user` (READY at once: the first joiner).
pub(crate) async fn pass_of(app: &TestApp, queue: &str, user: &str) -> String {
    let ticket = join(app, queue, user).await;
    let (code, body) = take_pass(app, queue, user, &ticket, "/").await;
    assert_eq!(code, 200, "{body}");
    body["pass"].as_str().unwrap().to_owned()
}

/// The gateway check with `cookie` (a whole `Cookie` header) or none:
/// (status, `X-Waitroom-Reason`, `Location`).
async fn check(
    app: &TestApp,
    method: &str,
    query: &str,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    let mut req = client().request(
        method.parse().unwrap(),
        app.url(&format!("/api/gate/check{query}")),
    );
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    let h = |n: &str| {
        r.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    (r.status().as_u16(), h("x-waitroom-reason"), h("location"))
}

async fn check_cookie(app: &TestApp, pass: &str) -> (u16, String, String) {
    let cookie = format!("other=1; waitroom_pass={pass}");
    check(app, "GET", "?queue=default", &[("cookie", &cookie)]).await
}

#[tokio::test]
async fn an_admitted_buyer_takes_a_pass_and_the_gateway_lets_it_through() {
    for app in both(IDLE).await {
        let ticket = join(&app, "default", "alice").await;
        // Not a JSON caller: the cookie and a 303 back where they were.
        let r = client()
            .get(app.url("/api/queues/default/pass?return=/product/42%3Fsize%3D9"))
            .header("x-user-id", "alice")
            .header("x-queue-ticket", &ticket)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 303);
        assert_eq!(r.headers()["location"], "/product/42?size=9");
        let cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
        for part in [
            "waitroom_pass=",
            "HttpOnly",
            "SameSite=Lax",
            "Path=/",
            "Max-Age=",
        ] {
            assert!(cookie.contains(part), "{part} in {cookie}");
        }
        let pass = cookie["waitroom_pass=".len()..]
            .split(';')
            .next()
            .unwrap()
            .to_owned();
        // Asked again: the same session (a second tab, a lost cookie).
        let (code, again) = take_pass(&app, "default", "alice", &ticket, "/").await;
        assert_eq!(code, 200, "{again}");
        let claims = app.state.passes().verify(&pass, now()).unwrap();
        assert_eq!(again["session"], claims.jti.as_str());

        let r = client()
            .get(app.url("/api/gate/check?queue=default"))
            .header("cookie", format!("waitroom_pass={pass}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        assert_eq!(r.headers()["x-waitroom-visitor"], "alice");
        assert_eq!(r.headers()["x-waitroom-room"], "default");
        assert_eq!(r.headers()["x-waitroom-session"], claims.jti.as_str());
        // As a bearer, by HEAD, and by the method nginx forwards.
        let bearer = format!("Bearer {pass}");
        assert_eq!(
            check(&app, "GET", "", &[("authorization", &bearer)])
                .await
                .0,
            200
        );
        assert_eq!(
            check(
                &app,
                "HEAD",
                "?queue=default",
                &[("authorization", &bearer)]
            )
            .await
            .0,
            200
        );
        assert_eq!(
            check(
                &app,
                "POST",
                "?queue=default",
                &[("authorization", &bearer)]
            )
            .await
            .0,
            200
        );

        // No pass: 401, where to go, and why; HEAD and OPTIONS alike.
        let original = [
            ("x-original-uri", "/product/42?size=9"),
            ("host", "shop.test"),
        ];
        let (code, why, location) = check(&app, "GET", "?queue=default", &original).await;
        assert_eq!((code, why.as_str()), (401, "missing"));
        assert_eq!(
            location,
            "/?queue=default&return=%2Fproduct%2F42%3Fsize%3D9"
        );
        assert_eq!(
            check(&app, "HEAD", "?queue=default", &original).await.0,
            401
        );
        assert_eq!(
            check(&app, "OPTIONS", "?queue=default", &original).await.0,
            401
        );
        // redirect=1: a browser's page request gets a 303 (Caddy).
        let html = [
            ("accept", "text/html"),
            ("x-forwarded-uri", "/p"),
            ("host", "shop.test"),
        ];
        let (code, _, location) = check(&app, "GET", "?queue=default&redirect=1", &html).await;
        assert_eq!(
            (code, location.as_str()),
            (303, "/?queue=default&return=%2Fp")
        );
        assert_eq!(check(&app, "GET", "?queue=nope", &[]).await.0, 404);

        // A buyer still waiting has no pass to take.
        let waiting = join(&app, "default", "bob").await;
        let (code, body) = take_pass(&app, "default", "bob", &waiting, "/").await;
        assert_eq!((code, body["error"].as_str()), (409, Some("not_admitted")));
        // Another buyer's ticket is no way in either.
        let (code, _) = take_pass(&app, "default", "bob", &ticket, "/").await;
        assert_eq!(code, 401);
        app.stop().await;
    }
}

/// The check is served ahead of the public router's layers (it runs
/// before every request to the protected site): what those layers gave
/// it still holds. Every answer carries the security headers and is never
/// stored; a repeated identity header, an unreadable query and a method
/// it does not take are the JSON error shape; every method a gateway
/// forwards is checked alike; below `--base-path` it answers there and
/// only there.
#[tokio::test]
async fn the_check_outside_the_router_keeps_its_guards() {
    let app = TestApp::memory(&["--queues", "default,other"]).await;
    let pass = pass_of(&app, "default", "alice").await;
    let cookie = format!("waitroom_pass={pass}");
    let send = |method: &str, path: &str, headers: &[(&str, &str)]| {
        let mut req = client().request(method.parse().unwrap(), app.url(path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send()
    };
    let guarded = |r: &reqwest::Response| {
        let h = r.headers();
        for (name, value) in [
            ("cache-control", "no-store"),
            ("x-frame-options", "DENY"),
            ("x-content-type-options", "nosniff"),
            ("referrer-policy", "no-referrer"),
        ] {
            assert_eq!(
                h.get(name).map(|v| v.to_str().unwrap()),
                Some(value),
                "{name}"
            );
        }
        assert!(
            h["content-security-policy"]
                .to_str()
                .unwrap()
                .contains("frame-ancestors 'none'")
        );
    };
    let check = "/api/gate/check?queue=default";
    // Let through, refused, unknown room: each guarded.
    let r = send("GET", check, &[("cookie", &cookie)]).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    guarded(&r);
    let r = send("GET", check, &[]).await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    guarded(&r);
    let r = send("GET", "/api/gate/check?queue=nope", &[])
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    guarded(&r);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "unknown_queue");
    let r = send("HEAD", "/api/gate/check?queue=nope", &[])
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    guarded(&r);
    // Every method nginx may forward is checked; a valid pass of another
    // room is not one for this room whatever the method.
    let other = pass_of(&app, "other", "bob").await;
    let other = format!("waitroom_pass={other}");
    for method in [
        "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PROPFIND",
    ] {
        let r = send(method, check, &[("cookie", &cookie)]).await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{method}");
        let r = send(method, check, &[("cookie", &other)]).await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "{method}");
        assert_eq!(r.headers()["x-waitroom-reason"], "other_room", "{method}");
        let r = send(method, check, &[]).await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "{method}");
    }
    // `TRACE`: 405 with `Allow`, as the router answers it.
    let r = send("TRACE", check, &[("cookie", &cookie)]).await.unwrap();
    assert_eq!(r.status().as_u16(), 405);
    assert!(r.headers().contains_key("allow"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "method_not_allowed");
    // A repeated identity header is refused before the pass is looked at.
    let r = send(
        "GET",
        check,
        &[("cookie", &cookie), ("x-user-id", "a"), ("x-user-id", "b")],
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    guarded(&r);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "duplicate_header");
    // A room named twice has no one meaning: refused, as JSON.
    let r = send(
        "GET",
        "/api/gate/check?queue=default&queue=other",
        &[("cookie", &cookie)],
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "invalid_check_query");
    // A path that only looks like the check's is not checked.
    for path in ["/api/gate/check/", "/api/gate/checks?queue=default"] {
        let r = send("GET", path, &[("cookie", &cookie)]).await.unwrap();
        assert!(!r.headers().contains_key("x-waitroom-visitor"), "{path}");
    }
    app.stop().await;

    // Below a base path: there, and only there.
    let app = TestApp::memory(&["--base-path", "/shop"]).await;
    let r = client()
        .post(app.url("/shop/api/queues/default/entries"))
        .header("x-user-id", "carol")
        .send()
        .await
        .unwrap();
    let ticket = r.json::<Value>().await.unwrap()["ticket"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = client()
        .get(app.url("/shop/api/queues/default/pass"))
        .header("x-user-id", "carol")
        .header("x-queue-ticket", &ticket)
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    let pass = r.json::<Value>().await.unwrap()["pass"]
        .as_str()
        .unwrap()
        .to_owned();
    let cookie = format!("waitroom_pass={pass}");
    let r = send_to(&app, "/shop/api/gate/check?queue=default", &cookie).await;
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["x-waitroom-visitor"], "carol");
    guarded(&r);
    let r = send_to(
        &app,
        "/shop/api/gate/check?queue=default",
        "waitroom_pass=forged",
    )
    .await;
    assert_eq!(r.status().as_u16(), 401);
    assert!(
        r.headers()["location"]
            .to_str()
            .unwrap()
            .starts_with("/shop/?queue=default"),
        "the waiting page is below the base path"
    );
    for outside in [
        "/api/gate/check?queue=default",
        "/shopx/api/gate/check?queue=default",
    ] {
        let r = send_to(&app, outside, &cookie).await;
        assert_eq!(r.status().as_u16(), 404, "{outside}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], "not_found", "{outside}");
    }
    app.stop().await;
}

async fn send_to(app: &TestApp, path: &str, cookie: &str) -> reqwest::Response {
    client()
        .get(app.url(path))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
}

fn now() -> u64 {
    waitroom::clock::now_ms() / 1000
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[tokio::test]
async fn forged_expired_foreign_and_confused_passes_are_refused() {
    let app = TestApp::memory(&["--queues", "default,other"]).await;
    let good = pass_of(&app, "default", "alice").await;
    assert_eq!(check_cookie(&app, &good).await.0, 200);
    let passes = app.state.passes();
    let claims = |room: &str, iat: u64, exp: u64| PassClaims {
        sub: UserId::parse("mallory").unwrap(),
        room: QueueName::parse(room).unwrap(),
        iat,
        exp,
        jti: SessionId::generate(),
    };
    let t = now();
    let (head, rest) = good.split_once('.').unwrap();
    let (payload, signature) = rest.split_once('.').unwrap();
    let forged_payload = {
        let mut c: Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(payload)
                .unwrap(),
        )
        .unwrap();
        c["sub"] = "mallory".into();
        b64(c.to_string().as_bytes())
    };
    let kid = passes.ring().kid().to_owned();
    let jwks: Value = client()
        .get(app.url("/.well-known/jwks.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(jwks["keys"][0]["kid"], kid.as_str());
    assert_eq!(jwks["keys"][0]["kty"], "OKP");
    assert_eq!(jwks["keys"][0]["alg"], "EdDSA");
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(jwks["keys"][0]["x"].as_str().unwrap())
        .unwrap();
    let hs256 = {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some(kid.clone());
        header.typ = Some(waitroom::pass::PASS_TYP.into());
        let c = serde_json::json!({"sub": "mallory", "room": "default", "iat": t, "exp": t + 600, "jti": SessionId::generate().as_str()});
        jsonwebtoken::encode(
            &header,
            &c,
            &jsonwebtoken::EncodingKey::from_secret(&x).unwrap(),
        )
        .unwrap()
    };
    let none = format!(
        "{}.{}.",
        b64(format!(
            r#"{{"alg":"none","typ":"{}","kid":"{kid}"}}"#,
            waitroom::pass::PASS_TYP
        )
        .as_bytes()),
        b64(format!(
            r#"{{"sub":"mallory","room":"default","iat":{t},"exp":{},"jti":"{}"}}"#,
            t + 600,
            SessionId::generate()
        )
        .as_bytes())
    );
    let stranger = PassService::new(Arc::new(KeyRing::generated(3600)));
    let cases = [
        (format!("{head}.{forged_payload}.{signature}"), "signature"),
        (passes.issue(&claims("default", t - 100, t - 1)), "expired"),
        (passes.issue(&claims("other", t, t + 600)), "other_room"),
        (
            passes.issue(&claims("default", t + 3600, t + 7200)),
            "not_yet_valid",
        ),
        (hs256, "algorithm"),
        (none, "malformed"),
        (
            stranger.issue(&claims("default", t, t + 600)),
            "unknown_key",
        ),
        ("not-a-pass".to_owned(), "malformed"),
        ("a".repeat(5000), "oversized"),
    ];
    for (pass, reason) in cases {
        let (code, why, _) = check_cookie(&app, &pass).await;
        assert_eq!((code, why.as_str()), (401, reason), "{pass:.60}");
    }
    app.stop().await;
}

#[tokio::test]
async fn return_urls_are_never_open_redirects() {
    let app = TestApp::memory(&["--protected-origins", "https://shop.example"]).await;
    let ticket = join(&app, "default", "alice").await;
    for evil in [
        "//evil.example",
        "https:evil.example",
        "/\\evil.example",
        "/%2F%2Fevil.example",
        "/%5Cevil.example",
        "https://evil.example/",
        "https://shop.example@evil.example/",
        "/\u{FF0F}evil.example",
        "/\t/evil.example",
        "javascript:alert(1)",
    ] {
        let (code, body) = take_pass(&app, "default", "alice", &ticket, evil).await;
        assert_eq!(
            (code, body["error"].as_str()),
            (400, Some("invalid_return")),
            "{evil:?}"
        );
    }
    let (code, body) = take_pass(
        &app,
        "default",
        "alice",
        &ticket,
        "https://shop.example/p?x=1",
    )
    .await;
    assert_eq!(
        (code, body["return"].as_str()),
        (200, Some("https://shop.example/p?x=1"))
    );

    // The check: the original host only counts when it is protected;
    // otherwise only the path goes back (same host as the page).
    let (_, _, location) = check(
        &app,
        "GET",
        "",
        &[
            ("x-forwarded-uri", "/p"),
            ("x-forwarded-host", "shop.example"),
            ("x-forwarded-proto", "https"),
        ],
    )
    .await;
    assert_eq!(
        location,
        "/?queue=default&return=https%3A%2F%2Fshop.example%2Fp"
    );
    for (host, uri) in [
        ("evil.example", "/p"),
        ("shop.example.evil.example", "/p"),
        ("shop.example@evil.example", "/p"),
        ("shop.example", "//evil.example/p"),
        ("shop.example", "/\\evil.example"),
    ] {
        let (_, _, location) = check(
            &app,
            "GET",
            "",
            &[
                ("x-forwarded-uri", uri),
                ("x-forwarded-host", host),
                ("x-forwarded-proto", "https"),
            ],
        )
        .await;
        assert!(!location.contains("evil"), "{host} {uri}: {location}");
    }
    app.stop().await;
}

#[tokio::test]
async fn an_operator_ends_a_session_and_every_instance_refuses_its_pass() {
    for app in both(IDLE).await {
        let pass = pass_of(&app, "default", "alice").await;
        let id = app.state.passes().verify(&pass, now()).unwrap().jti.clone();
        let token = app.state.admin_token().to_owned();
        let r = client()
            .delete(app.admin_url(&format!("/api/admin/sessions/{id}")))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        eventually(Duration::from_secs(5), "the ended pass refused", || async {
            let (code, why, _) = check_cookie(&app, &pass).await;
            (code == 401 && why == "ended").then_some(())
        })
        .await;
        let again = client()
            .delete(app.admin_url(&format!("/api/admin/sessions/{id}")))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(again.status().as_u16(), 404);
        let anon = client()
            .delete(app.admin_url(&format!("/api/admin/sessions/{id}")))
            .send()
            .await
            .unwrap();
        assert_eq!(anon.status().as_u16(), 401);
        app.stop().await;
    }
}

#[tokio::test]
async fn a_full_room_waits_until_an_idle_session_frees_its_slot() {
    let args = [
        "--max-active",
        "1",
        "--admission-interval-ms",
        "200",
        "--admission-batch",
        "1",
        "--session-idle-secs",
        "2",
        "--session-max-secs",
        "60",
    ];
    for app in both(&args).await {
        let pass = pass_of(&app, "default", "alice").await;
        let bob = join(&app, "default", "bob").await;
        // Alice browses for longer than the idle time: her session lives,
        // and Bob waits.
        for _ in 0..8 {
            assert_eq!(check_cookie(&app, &pass).await.0, 200);
            tokio::time::sleep(Duration::from_millis(400)).await;
            let (code, body) = take_pass(&app, "default", "bob", &bob, "/").await;
            assert_eq!(code, 409, "bob let in while the room is full: {body}");
        }
        // Alice leaves: her slot frees, Bob gets in, her pass is refused.
        let bob_pass = eventually(Duration::from_secs(8), "bob admitted", || async {
            let (code, body) = take_pass(&app, "default", "bob", &bob, "/").await;
            (code == 200).then(|| body["pass"].as_str().unwrap().to_owned())
        })
        .await;
        assert_eq!(check_cookie(&app, &bob_pass).await.0, 200);
        eventually(
            Duration::from_secs(5),
            "alice's idle pass refused",
            || async {
                let (code, why, _) = check_cookie(&app, &pass).await;
                (code == 401 && why == "ended").then_some(())
            },
        )
        .await;
        app.stop().await;
    }
}

#[tokio::test]
async fn live_passes_outlast_a_dead_store_and_new_ones_wait_for_it() {
    if crate::common::skip_redis("a private redis-server") {
        return;
    }
    let mut redis = RedisProcess::start(false);
    let store = Arc::new(
        RedisStore::connect(&redis.url(), "pass-dies")
            .await
            .unwrap(),
    );
    let app = TestApp::spawn_with(config(IDLE), store).await;
    let pass = pass_of(&app, "default", "alice").await;
    let bob = join(&app, "default", "bob").await;
    redis.kill();
    for _ in 0..5 {
        assert_eq!(check_cookie(&app, &pass).await.0, 200);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (code, body) = take_pass(&app, "default", "bob", &bob, "/").await;
    assert_eq!(
        (code, body["error"].as_str()),
        (503, Some("store_unavailable"))
    );
    // A browser is sent back to the site (the waiting page), not to JSON.
    let r = client()
        .get(app.url("/api/queues/default/pass?return=/cart"))
        .header("x-user-id", "bob")
        .header("x-queue-ticket", &bob)
        .header("accept", "text/html")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(r.headers()["location"], "/cart");
    assert!(r.headers().get("set-cookie").is_none());
    app.stop().await;
}

#[tokio::test]
async fn a_rotated_key_still_accepts_its_passes_and_publishes_both() {
    let dir = std::env::temp_dir().join(format!("waitroom-pass-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let (old, new) = (dir.join("old.pem"), dir.join("new.pem"));
    std::fs::write(&old, waitroom::pass::generate_private_pem()).unwrap();
    std::fs::write(&new, waitroom::pass::generate_private_pem()).unwrap();
    let before = TestApp::memory(&["--pass-key", old.to_str().unwrap()]).await;
    let pass = pass_of(&before, "default", "alice").await;
    before.stop().await;
    let after = TestApp::memory(&[
        "--pass-key",
        new.to_str().unwrap(),
        "--pass-previous-keys",
        old.to_str().unwrap(),
    ])
    .await;
    let jwks: Value = client()
        .get(after.url("/.well-known/jwks.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(jwks["keys"].as_array().unwrap().len(), 2);
    assert_eq!(check_cookie(&after, &pass).await.0, 200);
    after.stop().await;
    // Without the old key: refused.
    let fresh = TestApp::memory(&["--pass-key", new.to_str().unwrap()]).await;
    let (code, why, _) = check_cookie(&fresh, &pass).await;
    assert_eq!((code, why.as_str()), (401, "unknown_key"));
    fresh.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A browser sent to the pass route when it cannot have one (no ticket, a
/// forged one, not admitted yet, the store away) is not left on a JSON
/// error: it goes back to where it was going, with no cookie, and the
/// gateway there shows it the waiting page. A bad return URL, a JSON
/// caller and a return URL that is the pass route itself (a loop) still
/// get the error.
#[tokio::test]
async fn a_browser_refused_a_pass_goes_back_to_the_waiting_page_not_to_json() {
    const HTML: &str = "text/html,application/xhtml+xml,*/*;q=0.8";
    let browse = |app: &TestApp, ticket: Option<&str>, back: &str| {
        let back: String = form_urlencoded::byte_serialize(back.as_bytes()).collect();
        let mut r = client()
            .get(app.url(&format!("/api/queues/default/pass?return={back}")))
            .header("x-user-id", "bob")
            .header("accept", HTML);
        if let Some(ticket) = ticket {
            r = r.header("x-queue-ticket", ticket);
        }
        async move { r.send().await.unwrap() }
    };
    let back_home = |r: &reqwest::Response| {
        r.status().as_u16() == 303
            && r.headers()["location"] == "/product/42?size=9"
            && r.headers().get("set-cookie").is_none()
            && r.headers()["cache-control"] == "no-store"
    };
    for app in both(IDLE).await {
        let _alice = pass_of(&app, "default", "alice").await;
        // Bob waits behind alice (admission is idle in IDLE): not admitted.
        let bob = join(&app, "default", "bob").await;
        for ticket in [Some(bob.as_str()), None, Some("forged.ticket")] {
            let r = browse(&app, ticket, "/product/42?size=9").await;
            assert!(
                back_home(&r),
                "{ticket:?}: {} {:?}",
                r.status(),
                r.headers()
            );
        }
        // Nowhere safe to send it: the error, as JSON.
        let r = browse(&app, Some(&bob), "https://evil.example/").await;
        assert_eq!(r.status().as_u16(), 400);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], "invalid_return");
        // The pass route as its own return URL would loop: the error.
        let r = browse(&app, Some(&bob), "/api/queues/default/pass").await;
        assert_eq!(r.status().as_u16(), 409);
        // A JSON caller keeps its error.
        let (code, body) = take_pass(&app, "default", "bob", &bob, "/").await;
        assert_eq!((code, body["error"].as_str()), (409, Some("not_admitted")));
    }
}
