//! Identity modes (`--identity`): visitor cookies minted by waitroom,
//! `X-User-Id` from a gateway, and JWTs from the site's login. Each mode
//! is the one source of the join, the ticket-user binding and the orders,
//! so an entry token is only good for the buyer it was issued to.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use waitroom::Config;
use waitroom::config::IdentityMode;
use waitroom::store::memory::MemoryStore;

use crate::common::{IDLE, TestApp, config};

const SECRET: &str = "an identity secret of 32 bytes!!";

/// What a request presents.
#[derive(Default, Clone)]
struct As<'a> {
    cookie: Option<&'a str>,
    user: Option<&'a str>,
    bearer: Option<&'a str>,
    ticket: Option<&'a str>,
    token: Option<&'a str>,
}

/// An answer: status, every `Set-Cookie` and the JSON body.
struct Answer {
    status: u16,
    cookies: Vec<String>,
    body: Value,
}

impl Answer {
    /// The `name=value` pair of the visitor cookie set, if one was.
    fn visitor(&self) -> Option<String> {
        self.set_cookie("waitroom_visitor")
            .map(|c| c.split(';').next().unwrap().to_owned())
    }

    fn set_cookie(&self, name: &str) -> Option<&String> {
        self.cookies
            .iter()
            .find(|c| c.starts_with(&format!("{name}=")))
    }

    fn error(&self) -> &str {
        self.body["error"].as_str().unwrap_or("<none>")
    }
}

async fn call(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    who: &As<'_>,
    body: Option<Value>,
) -> Answer {
    let mut req = app.client.request(method, app.url(path));
    if let Some(c) = who.cookie {
        req = req.header("cookie", c);
    }
    if let Some(u) = who.user {
        req = req.header("x-user-id", u);
    }
    if let Some(b) = who.bearer {
        req = req.header("authorization", format!("Bearer {b}"));
    }
    if let Some(t) = who.ticket {
        req = req.header("x-queue-ticket", t);
    }
    if let Some(t) = who.token {
        req = req.header("x-entry-token", t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let cookies = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    let body = r.json().await.unwrap_or(Value::Null);
    Answer {
        status,
        cookies,
        body,
    }
}

async fn join(app: &TestApp, who: &As<'_>) -> Answer {
    call(
        app,
        reqwest::Method::POST,
        "/api/queues/default/entries",
        who,
        None,
    )
    .await
}

async fn position(app: &TestApp, who: &As<'_>) -> Answer {
    call(
        app,
        reqwest::Method::GET,
        "/api/queues/default/position",
        who,
        None,
    )
    .await
}

async fn leave(app: &TestApp, who: &As<'_>) -> Answer {
    call(
        app,
        reqwest::Method::DELETE,
        "/api/queues/default/entries/me",
        who,
        None,
    )
    .await
}

async fn order(app: &TestApp, who: &As<'_>) -> Answer {
    call(
        app,
        reqwest::Method::POST,
        "/api/orders",
        who,
        Some(json!({"productId": "demo-sneaker", "quantity": 1})),
    )
    .await
}

async fn read_order(app: &TestApp, id: &str, who: &As<'_>) -> Answer {
    call(
        app,
        reqwest::Method::GET,
        &format!("/api/orders/{id}"),
        who,
        None,
    )
    .await
}

fn mode(identity: IdentityMode, extra: &[&str]) -> Config {
    let mut args: Vec<&str> = IDLE.to_vec();
    args.extend_from_slice(extra);
    Config {
        identity,
        ..config(&args)
    }
}

async fn visitor_app() -> TestApp {
    TestApp::memory_with(mode(IdentityMode::Visitor, &[])).await
}

// ---------------------------------------------------------------- visitor

#[tokio::test]
async fn visitor_first_join_mints_a_cookie_that_keeps_the_place() {
    let app = visitor_app().await;
    let first = join(&app, &As::default()).await;
    assert_eq!(first.status, 201, "{}", first.body);
    let set = first
        .set_cookie("waitroom_visitor")
        .expect("a visitor cookie");
    for attribute in ["HttpOnly", "SameSite=Lax", "Path=/", "Max-Age="] {
        assert!(set.contains(attribute), "{attribute} in {set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP: {set}");
    let cookie = first.visitor().unwrap();

    // The same cookie is the same buyer: the same place, no new visitor.
    let again = join(
        &app,
        &As {
            cookie: Some(&cookie),
            ..As::default()
        },
    )
    .await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["enteredAt"], first.body["enteredAt"]);
    assert!(again.visitor().is_none(), "no second visitor");

    // `X-Forwarded-Proto` from a peer that is not a trusted proxy says
    // nothing (the client could send it itself).
    let r = app
        .client
        .post(app.url("/api/queues/default/entries"))
        .header("x-forwarded-proto", "https")
        .send()
        .await
        .unwrap();
    let plain = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|c| c.starts_with("waitroom_visitor="))
        .unwrap();
    assert!(!plain.contains("Secure"), "{plain}");
    app.stop().await;

    // Behind a trusted TLS proxy the cookie is Secure, and `__Host-`.
    let app = TestApp::memory_with(mode(
        IdentityMode::Visitor,
        &["--trusted-proxies", "127.0.0.0/8"],
    ))
    .await;
    let r = app
        .client
        .post(app.url("/api/queues/default/entries"))
        .header("x-forwarded-proto", "https")
        .send()
        .await
        .unwrap();
    let secure = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|c| c.starts_with("__Host-waitroom_visitor="))
        .expect("a __Host- visitor cookie");
    assert!(
        secure.contains("Secure") && secure.contains("Path=/"),
        "{secure}"
    );
    app.stop().await;
}

#[tokio::test]
async fn visitor_mode_ignores_x_user_id() {
    let app = visitor_app().await;
    let a = join(
        &app,
        &As {
            user: Some("alice"),
            ..As::default()
        },
    )
    .await;
    let b = join(
        &app,
        &As {
            user: Some("alice"),
            ..As::default()
        },
    )
    .await;
    assert_eq!((a.status, b.status), (201, 201), "two visitors, not alice");
    assert_ne!(a.visitor(), b.visitor());
    assert_eq!(b.body["position"], 1, "b waits behind a: {}", b.body);

    // A's ticket and cookie with X-User-Id naming someone else is still
    // A's place.
    let a_cookie = a.visitor().unwrap();
    let mine = position(
        &app,
        &As {
            cookie: Some(&a_cookie),
            ticket: a.body["ticket"].as_str(),
            user: Some("mallory"),
            ..As::default()
        },
    )
    .await;
    assert_eq!(mine.status, 200, "{}", mine.body);
    app.stop().await;
}

/// `waitroom_visitor=<id>.<mac>` with the id or the MAC changed.
fn altered(cookie: &str) -> Vec<String> {
    let (name, value) = cookie.split_once('=').unwrap();
    let (id, tag) = value.rsplit_once('.').unwrap();
    let flip = |s: &str| {
        let first = if s.ends_with('A') { 'B' } else { 'A' };
        format!("{}{first}", &s[..s.len() - 1])
    };
    vec![
        format!("{name}={}.{tag}", flip(id)),
        format!("{name}={id}.{}", flip(tag)),
        format!("{name}={id}"),
        format!("{name}={id}.{}", "A".repeat(43)),
    ]
}

#[tokio::test]
async fn a_forged_visitor_cookie_is_a_new_visitor_never_the_original() {
    let app = visitor_app().await;
    let victim = join(&app, &As::default()).await;
    let victim_cookie = victim.visitor().unwrap();
    let victim_ticket = victim.body["ticket"].as_str().unwrap().to_owned();
    let victim_entered = victim.body["enteredAt"].clone();

    for forged in altered(&victim_cookie) {
        let as_forged = As {
            cookie: Some(&forged),
            ..As::default()
        };
        let j = join(&app, &as_forged).await;
        assert_eq!(j.status, 201, "a new place for {forged}: {}", j.body);
        assert_ne!(j.body["enteredAt"], victim_entered);
        let minted = j.visitor().expect("a new visitor cookie");
        assert_ne!(minted, victim_cookie);

        // Neither the forged cookie nor the attacker's new one reads or
        // removes the victim's place without the victim's ticket...
        assert_eq!(position(&app, &as_forged).await.error(), "missing_ticket");
        assert_eq!(leave(&app, &as_forged).await.error(), "missing_ticket");
        // ...and with a stolen ticket, the attacker's own valid cookie
        // does not match the ticket's visitor.
        let stolen = As {
            cookie: Some(&minted),
            ticket: Some(&victim_ticket),
            ..As::default()
        };
        assert_eq!(
            position(&app, &stolen).await.error(),
            "ticket_user_mismatch"
        );
        assert_eq!(leave(&app, &stolen).await.error(), "ticket_user_mismatch");
    }
    // The victim's place is untouched.
    let mine = position(
        &app,
        &As {
            cookie: Some(&victim_cookie),
            ticket: Some(&victim_ticket),
            ..As::default()
        },
    )
    .await;
    assert_eq!(mine.status, 200, "{}", mine.body);
    assert_eq!(mine.body["enteredAt"], victim_entered);
    app.stop().await;
}

#[tokio::test]
async fn visitor_cookies_are_shared_by_instances_with_one_ticket_secret() {
    let store: waitroom::store::SharedStore = Arc::new(MemoryStore::new());
    let shared = Config {
        ticket_secret: Some("a ticket secret of some length".into()),
        ..mode(IdentityMode::Visitor, &[])
    };
    let one = TestApp::spawn_with(shared.clone(), store.clone()).await;
    let two = TestApp::spawn_with(shared, store.clone()).await;
    let other = TestApp::spawn_with(
        Config {
            ticket_secret: Some("another ticket secret entirely".into()),
            ..mode(IdentityMode::Visitor, &[])
        },
        store,
    )
    .await;
    let first = join(&one, &As::default()).await;
    let cookie = first.visitor().unwrap();
    let with = As {
        cookie: Some(&cookie),
        ..As::default()
    };
    assert_eq!(join(&two, &with).await.status, 200, "the same visitor");
    assert_eq!(
        join(&other, &with).await.status,
        201,
        "another secret: a new visitor"
    );
    for app in [one, two, other] {
        app.stop().await;
    }
}

#[tokio::test]
async fn visitor_orders_are_the_visitors_own() {
    let app = visitor_app().await;
    let buyer = join(&app, &As::default()).await;
    let token = buyer.body["entryToken"]
        .as_str()
        .expect("the first joiner is fast-tracked")
        .to_owned();
    let cookie = buyer.visitor().unwrap();
    let other = join(&app, &As::default()).await.visitor().unwrap();
    let visitor_id = cookie
        .split_once('=')
        .unwrap()
        .1
        .rsplit_once('.')
        .unwrap()
        .0
        .to_owned();

    let refused = [
        (
            As {
                cookie: Some(&other),
                token: Some(&token),
                ..As::default()
            },
            "invalid_token",
        ),
        (
            As {
                token: Some(&token),
                user: Some(&visitor_id),
                ..As::default()
            },
            "missing_identity",
        ),
    ];
    for (who, code) in refused {
        let r = order(&app, &who).await;
        assert_eq!((r.status, r.error()), (401, code), "{}", r.body);
    }
    for forged in altered(&cookie) {
        let r = order(
            &app,
            &As {
                cookie: Some(&forged),
                token: Some(&token),
                ..As::default()
            },
        )
        .await;
        assert_eq!((r.status, r.error()), (401, "missing_identity"), "{forged}");
    }

    let mine = As {
        cookie: Some(&cookie),
        token: Some(&token),
        ..As::default()
    };
    let placed = order(&app, &mine).await;
    assert_eq!(placed.status, 201, "{}", placed.body);
    assert_eq!(placed.body["userId"], visitor_id.as_str());
    let id = placed.body["orderId"].as_str().unwrap();
    assert_eq!(read_order(&app, id, &mine).await.status, 200);
    let theirs = read_order(
        &app,
        id,
        &As {
            cookie: Some(&other),
            ..As::default()
        },
    )
    .await;
    assert_eq!((theirs.status, theirs.error()), (404, "unknown_order"));
    for who in [
        As::default(),
        As {
            user: Some(&visitor_id),
            ..As::default()
        },
    ] {
        let r = read_order(&app, id, &who).await;
        assert_eq!((r.status, r.error()), (401, "missing_identity"));
    }
    app.stop().await;
}

// ----------------------------------------------------------------- header

#[tokio::test]
async fn header_mode_trusts_x_user_id_as_before() {
    let app = TestApp::memory_with(mode(IdentityMode::Header, &[])).await;
    let none = join(&app, &As::default()).await;
    assert_eq!((none.status, none.error()), (400, "missing_user_id"));
    assert!(none.visitor().is_none());
    let alice = As {
        user: Some("alice"),
        ..As::default()
    };
    let a = join(&app, &alice).await;
    assert_eq!(a.status, 201);
    assert!(a.visitor().is_none(), "no visitor cookie behind a gateway");
    let token = a.body["entryToken"].as_str().unwrap().to_owned();
    let bob = order(
        &app,
        &As {
            user: Some("bob"),
            token: Some(&token),
            ..As::default()
        },
    )
    .await;
    assert_eq!((bob.status, bob.error()), (401, "invalid_token"));
    let placed = order(
        &app,
        &As {
            token: Some(&token),
            ..alice.clone()
        },
    )
    .await;
    assert_eq!(placed.status, 201, "{}", placed.body);
    assert_eq!(placed.body["userId"], "alice");
    app.stop().await;
}

// ----------------------------------------------------------------- signed

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn hs256(claims: &Value, secret: &str) -> String {
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret.as_bytes()).unwrap(),
    )
    .unwrap()
}

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/identity")
        .join(name)
}

fn sign_with_file(alg: Algorithm, file: &str, claims: &Value) -> String {
    let pem = std::fs::read(fixture(file)).unwrap();
    let key = match alg {
        Algorithm::EdDSA => EncodingKey::from_ed_pem(&pem).unwrap(),
        _ => EncodingKey::from_rsa_pem(&pem).unwrap(),
    };
    jsonwebtoken::encode(&Header::new(alg), claims, &key).unwrap()
}

async fn signed_app(extra: &[&str]) -> TestApp {
    let mut args = vec![
        "--identity-secret",
        SECRET,
        "--identity-issuer",
        "https://shop.example",
        "--identity-audience",
        "waitroom",
    ];
    args.extend_from_slice(extra);
    TestApp::memory_with(mode(IdentityMode::Signed, &args)).await
}

fn claims(sub: &str) -> Value {
    json!({"sub": sub, "exp": now() + 3600, "iss": "https://shop.example", "aud": "waitroom"})
}

#[tokio::test]
async fn signed_hs256_joins_as_sub_and_orders_only_for_it() {
    let app = signed_app(&[]).await;
    let alice_jwt = hs256(&claims("alice"), SECRET);
    let alice = As {
        bearer: Some(&alice_jwt),
        user: Some("mallory"),
        ..As::default()
    };
    let joined = join(&app, &alice).await;
    assert_eq!(joined.status, 201, "{}", joined.body);
    assert!(joined.visitor().is_none());
    let ticket = joined.body["ticket"].as_str().unwrap().to_owned();
    let token = joined.body["entryToken"].as_str().unwrap().to_owned();
    // The ticket is alice's: readable with her login, not with none or
    // with bob's.
    let read = position(
        &app,
        &As {
            ticket: Some(&ticket),
            ..alice.clone()
        },
    )
    .await;
    assert_eq!(read.status, 200, "{}", read.body);
    let bob_jwt = hs256(&claims("bob"), SECRET);
    let as_bob = As {
        bearer: Some(&bob_jwt),
        ticket: Some(&ticket),
        ..As::default()
    };
    assert_eq!(
        position(&app, &as_bob).await.error(),
        "ticket_user_mismatch"
    );
    let anonymous = As {
        ticket: Some(&ticket),
        ..As::default()
    };
    assert_eq!(position(&app, &anonymous).await.error(), "missing_identity");

    // Orders: bob cannot use alice's token; alice can, as alice.
    let r = order(
        &app,
        &As {
            bearer: Some(&bob_jwt),
            token: Some(&token),
            ..As::default()
        },
    )
    .await;
    assert_eq!((r.status, r.error()), (401, "invalid_token"));
    let r = order(
        &app,
        &As {
            user: Some("alice"),
            token: Some(&token),
            ..As::default()
        },
    )
    .await;
    assert_eq!((r.status, r.error()), (401, "missing_identity"));
    let mine = As {
        token: Some(&token),
        ..alice.clone()
    };
    let placed = order(&app, &mine).await;
    assert_eq!(placed.status, 201, "{}", placed.body);
    assert_eq!(placed.body["userId"], "alice");
    let id = placed.body["orderId"].as_str().unwrap();
    assert_eq!(read_order(&app, id, &alice).await.status, 200);
    let bob = As {
        bearer: Some(&bob_jwt),
        ..As::default()
    };
    assert_eq!(read_order(&app, id, &bob).await.status, 404);
    assert_eq!(read_order(&app, id, &As::default()).await.status, 401);
    app.stop().await;
}

#[tokio::test]
async fn signed_mode_refuses_bad_tokens_with_401_json() {
    let app = signed_app(&[]).await;
    let mut no_exp = claims("alice");
    no_exp.as_object_mut().unwrap().remove("exp");
    let mut expired = claims("alice");
    expired["exp"] = json!(now() - 3600);
    let mut wrong_aud = claims("alice");
    wrong_aud["aud"] = json!("another-service");
    let mut wrong_iss = claims("alice");
    wrong_iss["iss"] = json!("https://evil.example");
    let mut bad_sub = claims("alice");
    bad_sub["sub"] = json!("not a user id!");
    let mut no_sub = claims("alice");
    no_sub.as_object_mut().unwrap().remove("sub");
    let cases: Vec<(&str, Option<String>, &str)> = vec![
        ("no token", None, "missing_identity"),
        (
            "forged signature",
            Some(hs256(&claims("alice"), "another secret of 32 bytes!!!!!")),
            "invalid_identity",
        ),
        ("expired", Some(hs256(&expired, SECRET)), "identity_expired"),
        (
            "wrong audience",
            Some(hs256(&wrong_aud, SECRET)),
            "invalid_identity",
        ),
        (
            "wrong issuer",
            Some(hs256(&wrong_iss, SECRET)),
            "invalid_identity",
        ),
        ("no exp", Some(hs256(&no_exp, SECRET)), "invalid_identity"),
        ("no sub", Some(hs256(&no_sub, SECRET)), "invalid_identity"),
        ("bad sub", Some(hs256(&bad_sub, SECRET)), "invalid_identity"),
        ("garbage", Some("not.a.jwt".into()), "invalid_identity"),
        (
            "another algorithm",
            Some(sign_with_file(
                Algorithm::EdDSA,
                "ed25519-private.pem",
                &claims("alice"),
            )),
            "invalid_identity",
        ),
    ];
    for (what, jwt, code) in cases {
        let who = As {
            bearer: jwt.as_deref(),
            user: Some("alice"),
            ..As::default()
        };
        let r = join(&app, &who).await;
        assert_eq!((r.status, r.error()), (401, code), "{what}: {}", r.body);
        assert!(
            r.body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: a message"
        );
        let o = order(
            &app,
            &As {
                token: Some("A-token-of-no-one"),
                ..who.clone()
            },
        )
        .await;
        assert_eq!((o.status, o.error()), (401, code), "{what} (order)");
    }
    app.stop().await;
}

/// `claims(sub)` with `set` merged in and the fields of `unset` taken out.
fn claims_with(sub: &str, set: Value, unset: &[&str]) -> Value {
    let mut c = claims(sub);
    for (k, v) in set.as_object().unwrap() {
        c[k] = v.clone();
    }
    for k in unset {
        c.as_object_mut().unwrap().remove(*k);
    }
    c
}

/// Joins with each token: (what, claims, refused?). A refused join is
/// `401 invalid_identity` with a message and no ticket; an accepted one
/// joins as its `sub`.
async fn joins_as_expected(app: &TestApp, cases: &[(&str, Value, bool)]) {
    for (what, claims, refused) in cases {
        let jwt = hs256(claims, SECRET);
        let r = join(
            app,
            &As {
                bearer: Some(&jwt),
                ..As::default()
            },
        )
        .await;
        if *refused {
            assert_eq!(
                (r.status, r.error()),
                (401, "invalid_identity"),
                "{what}: {}",
                r.body
            );
            assert!(r.body["message"].as_str().is_some_and(|m| !m.is_empty()));
            assert!(r.body.get("ticket").is_none(), "{what}: nothing joined");
        } else {
            assert_eq!(r.status, 201, "{what}: {}", r.body);
        }
    }
}

/// `nbf` is honoured and `iat` may not be in the future, both with the
/// leeway `exp` has (30 s); `--identity-max-lifetime-secs` refuses a token
/// whose `exp - iat` is longer, and one without `iat`.
#[tokio::test]
async fn signed_mode_honours_nbf_iat_and_a_maximum_lifetime() {
    let app = signed_app(&[]).await;
    let t = now();
    joins_as_expected(
        &app,
        &[
            (
                "valid from tomorrow",
                claims_with("nbf1", json!({"nbf": t + 86_400}), &[]),
                true,
            ),
            (
                "valid in a minute",
                claims_with("nbf2", json!({"nbf": t + 60}), &[]),
                true,
            ),
            (
                "nbf within the leeway",
                claims_with("nbf3", json!({"nbf": t + 10}), &[]),
                false,
            ),
            (
                "nbf past",
                claims_with("nbf4", json!({"nbf": t - 60}), &[]),
                false,
            ),
            (
                "nbf not a number",
                claims_with("nbf5", json!({"nbf": "tomorrow"}), &[]),
                true,
            ),
            (
                "issued in an hour",
                claims_with("iat1", json!({"iat": t + 3_600}), &[]),
                true,
            ),
            (
                "iat within the leeway",
                claims_with("iat2", json!({"iat": t + 10}), &[]),
                false,
            ),
            (
                "iat not a number",
                claims_with("iat3", json!({"iat": "now"}), &[]),
                true,
            ),
            (
                "a week long without a maximum",
                claims_with("life1", json!({"iat": t, "exp": t + 7 * 86_400}), &[]),
                false,
            ),
            (
                "no iat without a maximum",
                claims_with("life2", json!({}), &["iat"]),
                false,
            ),
        ],
    )
    .await;
    app.stop().await;

    let app = signed_app(&["--identity-max-lifetime-secs", "3600"]).await;
    joins_as_expected(
        &app,
        &[
            (
                "two hours long",
                claims_with("max1", json!({"iat": t, "exp": t + 7_200}), &[]),
                true,
            ),
            (
                "no iat",
                claims_with("max2", json!({"exp": t + 600}), &["iat"]),
                true,
            ),
            (
                "exactly the maximum",
                claims_with("max3", json!({"iat": t - 100, "exp": t + 3_500}), &[]),
                false,
            ),
            (
                "short",
                claims_with("max4", json!({"iat": t, "exp": t + 300}), &[]),
                false,
            ),
        ],
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn signed_tokens_may_come_in_the_named_cookie() {
    let app = signed_app(&["--identity-cookie", "shop_session"]).await;
    let jwt = hs256(&claims("carol"), SECRET);
    let cookie = format!("other=1; shop_session={jwt}");
    let r = join(
        &app,
        &As {
            cookie: Some(&cookie),
            ..As::default()
        },
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let ticket = r.body["ticket"].as_str().unwrap();
    let read = position(
        &app,
        &As {
            cookie: Some(&cookie),
            ticket: Some(ticket),
            ..As::default()
        },
    )
    .await;
    assert_eq!(read.status, 200, "{}", read.body);
    app.stop().await;
}

#[tokio::test]
async fn signed_public_keys_from_files_ed25519_and_rsa() {
    for (alg, private, public) in [
        (
            Algorithm::EdDSA,
            "ed25519-private.pem",
            "ed25519-public.pem",
        ),
        (Algorithm::RS256, "rsa-private.pem", "rsa-public.pem"),
    ] {
        let path = fixture(public);
        let app = TestApp::memory_with(mode(
            IdentityMode::Signed,
            &["--identity-public-key", path.to_str().unwrap()],
        ))
        .await;
        let mut no_aud = claims("dave");
        no_aud.as_object_mut().unwrap().remove("aud");
        let good = sign_with_file(alg, private, &no_aud);
        let r = join(
            &app,
            &As {
                bearer: Some(&good),
                ..As::default()
            },
        )
        .await;
        assert_eq!(r.status, 201, "{alg:?}: {}", r.body);
        let token = r.body["entryToken"].as_str().unwrap().to_owned();
        let placed = order(
            &app,
            &As {
                bearer: Some(&good),
                token: Some(&token),
                ..As::default()
            },
        )
        .await;
        assert_eq!(placed.status, 201, "{alg:?}: {}", placed.body);
        assert_eq!(placed.body["userId"], "dave");

        // Another key of the same kind, and an HS256 token keyed with
        // the public key's own bytes (the algorithm-confusion attack).
        let forged = match alg {
            Algorithm::EdDSA => sign_with_file(alg, "ed25519-other-private.pem", &claims("dave")),
            _ => hs256(
                &claims("dave"),
                &String::from_utf8(std::fs::read(&path).unwrap()).unwrap(),
            ),
        };
        let confused = hs256(
            &claims("dave"),
            &String::from_utf8(std::fs::read(&path).unwrap()).unwrap(),
        );
        for bad in [forged, confused] {
            let r = join(
                &app,
                &As {
                    bearer: Some(&bad),
                    ..As::default()
                },
            )
            .await;
            assert_eq!((r.status, r.error()), (401, "invalid_identity"), "{alg:?}");
        }
        app.stop().await;
    }
}

#[tokio::test]
async fn the_page_makes_the_visitor_so_tabs_opened_together_join_as_one() {
    let app = visitor_app().await;
    let page = call(&app, reqwest::Method::GET, "/", &As::default(), None).await;
    assert_eq!(page.status, 200);
    let cookie = page.visitor().expect("the page sets a visitor cookie");
    let with = As {
        cookie: Some(&cookie),
        ..As::default()
    };
    let again = call(&app, reqwest::Method::GET, "/", &with, None).await;
    assert!(again.visitor().is_none(), "a known visitor keeps theirs");
    let (a, b) = tokio::join!(join(&app, &with), join(&app, &with));
    let mut codes = [a.status, b.status];
    codes.sort();
    assert_eq!(codes, [200, 201], "one place for both tabs");
    assert!(a.visitor().is_none() && b.visitor().is_none());
    app.stop().await;

    let header = TestApp::memory_with(mode(IdentityMode::Header, &[])).await;
    let page = call(&header, reqwest::Method::GET, "/", &As::default(), None).await;
    assert!(
        page.visitor().is_none(),
        "no visitor cookie behind a gateway"
    );
    header.stop().await;
}

// ------------------------------------------------ cookies over HTTPS, tickets

/// Like [`call`], as a client that spoke HTTPS to the trusted proxy in
/// front (`X-Forwarded-Proto: https` from a peer in `--trusted-proxies`).
async fn call_https(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    cookie: Option<&str>,
) -> Answer {
    let mut req = app
        .client
        .request(method, app.url(path))
        .header("x-forwarded-proto", "https");
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let cookies = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    let body = r.json().await.unwrap_or(Value::Null);
    Answer {
        status,
        cookies,
        body,
    }
}

/// The `value` of the `name=value; ...` cookie `name` set by `answer`.
fn set_value(answer: &Answer, name: &str) -> Option<String> {
    answer
        .set_cookie(name)
        .and_then(|c| c.split(';').next())
        .and_then(|pair| pair.split_once('='))
        .map(|(_, v)| v.to_owned())
}

/// Cookie tossing: a page on a sibling subdomain (or any plain-HTTP page
/// of the site) can set `waitroom_visitor` for the whole domain, but never
/// `__Host-waitroom_visitor`. Over HTTPS only the prefixed name counts, so
/// a buyer carrying a planted cookie becomes a new visitor of their own
/// rather than joining as the attacker, who would then read their token.
#[tokio::test]
async fn over_https_a_planted_unprefixed_visitor_cookie_is_ignored() {
    let app = TestApp::memory_with(mode(
        IdentityMode::Visitor,
        &["--trusted-proxies", "127.0.0.0/8"],
    ))
    .await;
    // The attacker gets a valid visitor of their own from the page.
    let page = call_https(&app, reqwest::Method::GET, "/", None).await;
    let planted = set_value(&page, "__Host-waitroom_visitor").expect("a __Host- visitor");

    // The buyer's browser carries the planted cookie under the plain name.
    let tossed = format!("waitroom_visitor={planted}");
    let victim = call_https(
        &app,
        reqwest::Method::POST,
        "/api/queues/default/entries",
        Some(&tossed),
    )
    .await;
    assert_eq!(victim.status, 201, "{}", victim.body);
    let own = set_value(&victim, "__Host-waitroom_visitor")
        .expect("a fresh __Host- visitor for the buyer");
    assert_ne!(
        own, planted,
        "the buyer must not join as the planted visitor"
    );
    assert!(
        victim.set_cookie("waitroom_visitor").is_none(),
        "never an unprefixed cookie over HTTPS: {:?}",
        victim.cookies
    );
    let victim_token = victim.body["entryToken"]
        .as_str()
        .expect("the first joiner is fast-tracked")
        .to_owned();

    // The attacker, as the planted visitor, holds a place of their own:
    // neither the buyer's place nor the buyer's token.
    let mine = format!("__Host-waitroom_visitor={planted}");
    let attacker = call_https(
        &app,
        reqwest::Method::POST,
        "/api/queues/default/entries",
        Some(&mine),
    )
    .await;
    // 201: a place made now, not the buyer's (whose repeat would be 200;
    // two joins in one millisecond may share an entry time).
    assert_eq!(attacker.status, 201, "a new place: {}", attacker.body);
    assert_ne!(
        attacker.body["entryToken"].as_str(),
        Some(victim_token.as_str())
    );
    assert!(
        !attacker.body.to_string().contains(&victim_token),
        "{}",
        attacker.body
    );

    // Over plain HTTP the plain name is the one in force, as before.
    let plain = format!("waitroom_visitor={planted}");
    let again = join(
        &app,
        &As {
            cookie: Some(&plain),
            ..As::default()
        },
    )
    .await;
    assert_eq!(again.status, 200, "the planted visitor's own place");
    assert!(again.visitor().is_none());
    app.stop().await;
}

/// The same for the ticket cookie: over HTTPS only
/// `__Secure-waitroom_ticket` is read, so a ticket planted under the
/// plain name is not a ticket at all.
#[tokio::test]
async fn over_https_an_unprefixed_ticket_cookie_is_not_read() {
    let app = TestApp::memory_with(mode(
        IdentityMode::Header,
        &["--trusted-proxies", "127.0.0.0/8"],
    ))
    .await;
    let r = app
        .client
        .post(app.url("/api/queues/default/entries"))
        .header("x-forwarded-proto", "https")
        .header("x-user-id", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let ticket = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find_map(|c| {
            c.strip_prefix("__Secure-waitroom_ticket=")
                .map(|rest| rest.split(';').next().unwrap().to_owned())
        })
        .expect("a __Secure- ticket cookie");
    let read = |cookie: String, https: bool| {
        let mut req = app
            .client
            .get(app.url("/api/queues/default/position"))
            .header("x-user-id", "alice")
            .header("cookie", cookie);
        if https {
            req = req.header("x-forwarded-proto", "https");
        }
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, body) = read(format!("waitroom_ticket={ticket}"), true).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("missing_ticket")),
        "{body}"
    );
    let (status, body) = read(format!("__Secure-waitroom_ticket={ticket}"), true).await;
    assert_eq!(status, 200, "{body}");
    // Plain HTTP reads the plain name, as before.
    let (status, body) = read(format!("waitroom_ticket={ticket}"), false).await;
    assert_eq!(status, 200, "{body}");
    app.stop().await;
}

/// Visitor mode: a ticket is only good with its own visitor's cookie. A
/// ticket alone (copied out of a log, a screenshot, a shared link) or
/// with someone else's cookie neither reads the place (and its entry
/// token) nor leaves it, nor opens its stream.
#[tokio::test]
async fn visitor_tickets_need_their_own_visitor_cookie() {
    let app = visitor_app().await;
    let victim = join(&app, &As::default()).await;
    assert_eq!(victim.status, 201, "{}", victim.body);
    let cookie = victim.visitor().unwrap();
    let ticket = victim.body["ticket"].as_str().unwrap().to_owned();
    let token = victim.body["entryToken"].as_str().unwrap().to_owned();
    let other = join(&app, &As::default()).await.visitor().unwrap();
    let forged = altered(&cookie).remove(1);

    let cases = [
        (None, "missing_identity"),
        (Some(forged.as_str()), "missing_identity"),
        (Some(other.as_str()), "ticket_user_mismatch"),
    ];
    for (with, code) in cases {
        let who = As {
            cookie: with,
            ticket: Some(&ticket),
            ..As::default()
        };
        let read = position(&app, &who).await;
        assert_eq!(
            (read.status, read.error()),
            (401, code),
            "{with:?}: {}",
            read.body
        );
        assert!(!read.body.to_string().contains(&token), "{}", read.body);
        assert!(read.body["message"].as_str().is_some_and(|m| !m.is_empty()));
        let left = leave(&app, &who).await;
        assert_eq!(
            (left.status, left.error()),
            (401, code),
            "{with:?}: {}",
            left.body
        );

        // The stream, as EventSource would open it.
        let mut req = app
            .client
            .get(app.url("/api/queues/default/events"))
            .header("accept", "text/event-stream")
            .header("x-queue-ticket", &ticket);
        if let Some(c) = with {
            req = req.header("cookie", c);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401, "stream with {with:?}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], code, "stream with {with:?}");
    }

    // With its own cookie the ticket still reads, streams and leaves.
    let mine = As {
        cookie: Some(&cookie),
        ticket: Some(&ticket),
        ..As::default()
    };
    let read = position(&app, &mine).await;
    assert_eq!(read.status, 200, "the place stands: {}", read.body);
    assert_eq!(read.body["entryToken"], token.as_str());
    let stream = app
        .client
        .get(app.url("/api/queues/default/events"))
        .header("accept", "text/event-stream")
        .header("x-queue-ticket", &ticket)
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    drop(stream);
    assert_eq!(leave(&app, &mine).await.status, 204);
    app.stop().await;
}
