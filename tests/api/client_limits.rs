//! Per-client limits: the client's address (socket peer, or what a trusted
//! proxy says), the per-address limits shared by every instance (new
//! places, places held, new visitors, streams), the per-buyer budget
//! shared by every instance, and the cookies' `Secure` and names.
//!
//! Distinct clients are client sockets bound to distinct loopback source
//! addresses (127.0.0.x) or, behind a trusted proxy, distinct
//! `X-Forwarded-For` values.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use waitroom::store::SharedStore;
use waitroom::store::memory::MemoryStore;
use waitroom::store::redis::RedisStore;

use crate::common::{
    IDLE, RedisProcess, TestApp, config, get_from, read_to_close, redis_url, socket_from,
    unique_prefix,
};

/// A client whose connections come from `source` (127.0.0.x).
fn client_from(source: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(source.parse::<IpAddr>().unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// [`IDLE`] and `args`.
fn with_idle(args: &[&'static str]) -> Vec<&'static str> {
    let mut all = IDLE.to_vec();
    all.extend_from_slice(args);
    all
}

/// A join of `user` through `client`, with extra headers.
async fn join(
    app: &TestApp,
    client: &reqwest::Client,
    user: &str,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut r = client
        .post(app.url("/api/queues/default/entries"))
        .header("x-user-id", user);
    for (n, v) in headers {
        r = r.header(*n, *v);
    }
    r.send().await.unwrap()
}

/// Asserts `r` is a `429` with `code`, a sane `Retry-After` and the JSON
/// error shape; the `Retry-After`.
async fn assert_429(r: reqwest::Response, code: &str) -> u64 {
    assert_eq!(r.status().as_u16(), 429);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .expect("Retry-After in seconds");
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], code, "{body}");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert!(body.get("ticket").is_none() && body.get("entryToken").is_none());
    retry
}

#[tokio::test]
async fn a_thousand_joins_from_one_address_are_limited_as_configured() {
    let app = TestApp::memory(&with_idle(&["--joins-per-address-per-minute", "100"])).await;
    let client = client_from("127.0.0.1");
    let mut created = 0;
    let mut refused = 0;
    let mut first_ticket = None;
    for chunk in (0..1000).collect::<Vec<_>>().chunks(50) {
        let users: Vec<String> = chunk.iter().map(|i| format!("many{i:04}")).collect();
        let answers =
            futures::future::join_all(users.iter().map(|u| join(&app, &client, u, &[]))).await;
        for r in answers {
            match r.status().as_u16() {
                201 => {
                    created += 1;
                    let body: Value = r.json().await.unwrap();
                    if body["ticket"].is_string() && first_ticket.is_none() {
                        first_ticket = body["ticket"].as_str().map(str::to_owned);
                    }
                }
                429 => {
                    assert_429(r, "address_rate_limited").await;
                    refused += 1;
                }
                other => panic!("unexpected {other}"),
            }
        }
    }
    // 100 at once, then one every 0.6 s: the run may earn a few more.
    assert!((100..=110).contains(&created), "{created} places");
    assert_eq!(created + refused, 1000);
    // Another address is untouched, and the refused address's buyers
    // already in line keep their places (a repeat join is not counted).
    let other = client_from("127.0.0.2");
    assert_eq!(join(&app, &other, "elsewhere", &[]).await.status(), 201);
    let ticket = first_ticket.unwrap();
    let r = join(&app, &client, "many0000", &[("x-queue-ticket", &ticket)]).await;
    assert_eq!(r.status(), 200, "a repeat join with its ticket");
    // Without the ticket this instance cannot tell it from a newcomer.
    let r = join(&app, &client, "many0000", &[]).await;
    assert_429(r, "address_rate_limited").await;
    app.stop().await;
}

#[tokio::test]
async fn places_held_per_address_count_only_live_places() {
    let app = TestApp::memory(&with_idle(&["--places-per-address", "3"])).await;
    let client = client_from("127.0.0.1");
    let mut tickets = Vec::new();
    for i in 0..3 {
        let r = join(&app, &client, &format!("held{i}"), &[]).await;
        assert_eq!(r.status(), 201);
        let body: Value = r.json().await.unwrap();
        tickets.push(body["ticket"].as_str().unwrap().to_owned());
    }
    // A place that ends frees its slot.
    assert_eq!(app.leave("default", &tickets[0]).await, 204);
    assert_eq!(join(&app, &client, "held3", &[]).await.status(), 201);
    let r = join(&app, &client, "held4", &[]).await;
    assert_429(r, "address_places_limited").await;
    // Polls of the address's buyers and their repeat joins go on.
    let (code, _) = app.position("default", &tickets[1]).await;
    assert_eq!(code, 200);
    let r = join(&app, &client, "held1", &[("x-queue-ticket", &tickets[1])]).await;
    assert_eq!(r.status(), 200);
    // Another address is not touched.
    let other = client_from("127.0.0.3");
    assert_eq!(join(&app, &other, "held4", &[]).await.status(), 201);
    app.stop().await;
}

#[tokio::test]
async fn a_trusted_proxys_clients_are_counted_apart_and_an_untrusted_header_is_ignored() {
    let app = TestApp::memory(&with_idle(&[
        "--joins-per-address-per-minute",
        "2",
        "--trusted-proxies",
        "127.0.0.1",
    ]))
    .await;
    let proxy = client_from("127.0.0.1");
    let xff = |ip: &'static str| [("x-forwarded-for", ip)];
    // Two clients behind the proxy: two buckets.
    for i in 0..2 {
        let r = join(&app, &proxy, &format!("pa{i}"), &xff("203.0.113.1")).await;
        assert_eq!(r.status(), 201);
    }
    assert_429(
        join(&app, &proxy, "pa2", &xff("203.0.113.1")).await,
        "address_rate_limited",
    )
    .await;
    for i in 0..2 {
        let r = join(&app, &proxy, &format!("pb{i}"), &xff("203.0.113.2")).await;
        assert_eq!(r.status(), 201);
    }
    // The client's own left part of the chain is not believed: the proxy
    // appended the real address on the right.
    let r = join(&app, &proxy, "pa3", &xff("198.51.100.9, 203.0.113.1")).await;
    assert_429(r, "address_rate_limited").await;

    // IPv6 neighbours in one /64 share a bucket; the next /64 does not.
    for (i, ip) in ["2001:db8:1:2::1", "[2001:db8:1:2:ffff::9]:4711"]
        .iter()
        .enumerate()
    {
        let r = join(&app, &proxy, &format!("v6a{i}"), &[("x-forwarded-for", ip)]).await;
        assert_eq!(r.status(), 201, "{ip}");
    }
    let r = join(&app, &proxy, "v6a2", &xff("2001:db8:1:2::abcd")).await;
    assert_429(r, "address_rate_limited").await;
    let r = join(&app, &proxy, "v6b0", &xff("2001:db8:1:3::1")).await;
    assert_eq!(r.status(), 201);

    // Garbage from the proxy counts as the proxy itself, never as a fresh
    // address each time.
    let mut statuses = Vec::new();
    for (i, junk) in ["unknown", "not-an-ip", "999.1.1.1", "[::1", "_hidden"]
        .iter()
        .enumerate()
    {
        let r = join(
            &app,
            &proxy,
            &format!("junk{i}"),
            &[("x-forwarded-for", junk)],
        )
        .await;
        statuses.push(r.status().as_u16());
    }
    assert_eq!(
        statuses,
        [201, 201, 429, 429, 429],
        "one bucket: the proxy's"
    );

    // A peer that is not a trusted proxy: its header is ignored, it is
    // counted as itself whatever it claims.
    let stranger = client_from("127.0.0.5");
    let spoofed = ["192.0.2.1", "192.0.2.2", "192.0.2.3"];
    let mut statuses = Vec::new();
    for (i, ip) in spoofed.iter().enumerate() {
        let r = join(
            &app,
            &stranger,
            &format!("spoof{i}"),
            &[("x-forwarded-for", ip)],
        )
        .await;
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [201, 201, 429]);
    // … and the addresses it named were not charged.
    let r = join(&app, &proxy, "real1", &xff("192.0.2.1")).await;
    assert_eq!(r.status(), 201);
    app.stop().await;
}

#[tokio::test]
async fn forwarded_mode_reads_rfc_7239_only() {
    let app = TestApp::memory(&with_idle(&[
        "--joins-per-address-per-minute",
        "1",
        "--trusted-proxies",
        "127.0.0.0/8",
        "--client-address-header",
        "forwarded",
    ]))
    .await;
    let proxy = client_from("127.0.0.1");
    let fwd = |v: &'static str| [("forwarded", v)];
    let r = join(
        &app,
        &proxy,
        "f0",
        &fwd("for=\"[2001:db8:cafe::17]:4711\";proto=https"),
    )
    .await;
    assert_eq!(r.status(), 201);
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.starts_with("__Secure-waitroom_ticket="), "{cookie}");
    let r = join(&app, &proxy, "f1", &fwd("for=198.51.100.17")).await;
    assert_eq!(r.status(), 201);
    let r = join(&app, &proxy, "f2", &fwd("for=198.51.100.17;proto=http")).await;
    assert_429(r, "address_rate_limited").await;
    // X-Forwarded-For is not read in this mode: both count as the proxy.
    let r = join(&app, &proxy, "x0", &[("x-forwarded-for", "192.0.2.50")]).await;
    assert_eq!(r.status(), 201);
    let r = join(&app, &proxy, "x1", &[("x-forwarded-for", "192.0.2.51")]).await;
    assert_429(r, "address_rate_limited").await;
    app.stop().await;
}

/// Two instances on one store, with `args`.
async fn two_on_redis(tag: &str, args: &[&'static str]) -> (TestApp, TestApp) {
    let prefix = unique_prefix(tag);
    let cfg = waitroom::Config {
        key_prefix: prefix.clone(),
        ticket_secret: Some("a ticket secret shared by both".into()),
        ..config(&with_idle(args))
    };
    let one: SharedStore = Arc::new(RedisStore::connect(&redis_url(), &prefix).await.unwrap());
    let two: SharedStore = Arc::new(RedisStore::connect(&redis_url(), &prefix).await.unwrap());
    (
        TestApp::spawn_with(cfg.clone(), one).await,
        TestApp::spawn_with(cfg, two).await,
    )
}

#[tokio::test]
async fn two_instances_on_one_redis_share_every_limit() {
    crate::needs_redis!();
    let (a, b) = two_on_redis(
        "shared-limits",
        &[
            "--joins-per-address-per-minute",
            "4",
            "--places-per-address",
            "6",
        ],
    )
    .await;
    let client = client_from("127.0.0.1");
    // New places per address: 4 in all, not 4 per instance.
    let mut statuses = Vec::new();
    let mut ticket = String::new();
    for i in 0..6 {
        let app = if i % 2 == 0 { &a } else { &b };
        let r = join(app, &client, &format!("s{i}"), &[]).await;
        statuses.push(r.status().as_u16());
        if i == 0 {
            ticket = r.json::<Value>().await.unwrap()["ticket"]
                .as_str()
                .unwrap()
                .to_owned();
        }
    }
    assert_eq!(statuses, [201, 201, 201, 201, 429, 429]);

    // The per-buyer budget: 10 at once in all, not 10 per instance.
    let mut ok = 0;
    for i in 0..30 {
        let app = if i % 2 == 0 { &a } else { &b };
        let (code, _) = app.position("default", &ticket).await;
        match code {
            200 => ok += 1,
            429 => {}
            other => panic!("unexpected {other}"),
        }
    }
    // The burst, the repeat join above, and the refill of the run (2/s).
    assert!((9..=14).contains(&ok), "{ok} polls through two instances");
    a.stop().await;
    b.stop().await;

    // Places held: 2 in all.
    let (a, b) = two_on_redis("shared-places", &["--places-per-address", "2"]).await;
    assert_eq!(join(&a, &client, "p0", &[]).await.status(), 201);
    assert_eq!(join(&b, &client, "p1", &[]).await.status(), 201);
    assert_429(join(&a, &client, "p2", &[]).await, "address_places_limited").await;
    a.stop().await;
    b.stop().await;

    // New visitors: 2 in all.
    let (a, b) = two_on_redis(
        "shared-visitors",
        &[
            "--identity",
            "visitor",
            "--visitors-per-address-per-minute",
            "2",
        ],
    )
    .await;
    let anon = |app: &TestApp| client.post(app.url("/api/queues/default/entries")).send();
    assert_eq!(anon(&a).await.unwrap().status(), 201);
    assert_eq!(anon(&b).await.unwrap().status(), 201);
    assert_429(anon(&a).await.unwrap(), "visitor_rate_limited").await;
    assert_429(anon(&b).await.unwrap(), "visitor_rate_limited").await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn new_visitors_per_address_are_limited_and_the_page_still_loads() {
    let app = TestApp::memory(&with_idle(&[
        "--identity",
        "visitor",
        "--visitors-per-address-per-minute",
        "2",
    ]))
    .await;
    let client = client_from("127.0.0.1");
    let page = || client.get(app.url("/")).send();
    let minted = |r: &reqwest::Response| {
        r.headers()
            .get_all("set-cookie")
            .iter()
            .any(|c| c.to_str().unwrap().starts_with("waitroom_visitor="))
    };
    let r = page().await.unwrap();
    assert!(r.status().is_success() && minted(&r));
    let r = client
        .post(app.url("/api/queues/default/entries"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert!(minted(&r));
    // Over the limit: the page is served without a visitor, the join is
    // refused.
    let r = page().await.unwrap();
    assert!(
        r.status().is_success() && !minted(&r),
        "the page without a cookie"
    );
    let r = client
        .post(app.url("/api/queues/default/entries"))
        .send()
        .await
        .unwrap();
    assert_429(r, "visitor_rate_limited").await;
    // Another address mints.
    let other = client_from("127.0.0.4");
    let r = other
        .post(app.url("/api/queues/default/entries"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    app.stop().await;
}

#[tokio::test]
async fn a_dead_redis_is_503_not_an_open_door() {
    crate::needs_redis!();
    let mut redis = RedisProcess::start(false);
    let store: SharedStore = Arc::new(
        RedisStore::connect(&redis.url(), "dead-limits")
            .await
            .unwrap(),
    );
    let app = TestApp::spawn_with(
        config(&with_idle(&[
            "--identity",
            "visitor",
            "--joins-per-address-per-minute",
            "5",
            "--places-per-address",
            "5",
            "--visitors-per-address-per-minute",
            "5",
        ])),
        store,
    )
    .await;
    let client = client_from("127.0.0.1");
    let r = client
        .post(app.url("/api/queues/default/entries"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    // A ticket reads its place only with its visitor's cookie.
    let visitor = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with("waitroom_visitor="))
        .and_then(|c| c.split(';').next())
        .expect("a visitor cookie")
        .to_owned();
    let ticket = r.json::<Value>().await.unwrap()["ticket"]
        .as_str()
        .unwrap()
        .to_owned();
    redis.kill();
    // A new visitor's join, a poll: 503 each, never let through unlimited.
    let r = client
        .post(app.url("/api/queues/default/entries"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"],
        "store_unavailable"
    );
    let r = client
        .get(app.url("/api/queues/default/position"))
        .header("x-queue-ticket", &ticket)
        .header("cookie", &visitor)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    app.stop().await;
}

/// Opens a stream with `ticket` from `client`: the response, first chunk
/// read.
async fn open(
    app: &TestApp,
    client: &reqwest::Client,
    ticket: &str,
) -> (
    String,
    futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
) {
    let r = client
        .get(app.url("/api/queues/default/events"))
        .header("x-queue-ticket", ticket)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut body = r.bytes_stream().boxed();
    let first = tokio::time::timeout(Duration::from_secs(10), body.next())
        .await
        .expect("a first frame")
        .unwrap()
        .unwrap();
    (String::from_utf8_lossy(&first).into_owned(), body)
}

async fn ticket_of(app: &TestApp, client: &reqwest::Client, user: &str) -> String {
    let r = join(app, client, user, &[]).await;
    assert!(r.status().is_success());
    r.json::<Value>().await.unwrap()["ticket"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn streams_per_address_are_capped_and_the_heaviest_address_is_shed_first() {
    let app = TestApp::memory(&with_idle(&[
        "--streams-per-address",
        "3",
        "--max-streams",
        "4",
        "--max-connections",
        "50",
    ]))
    .await;
    let heavy = client_from("127.0.0.1");
    let mut held = Vec::new();
    for i in 0..3 {
        let t = ticket_of(&app, &heavy, &format!("h{i}")).await;
        let (first, body) = open(&app, &heavy, &t).await;
        assert!(first.contains("event:"), "a live stream: {first}");
        held.push(body);
    }
    // The address's cap: the fourth is shed (a long retry, no event).
    let t = ticket_of(&app, &heavy, "h3").await;
    let (first, _) = open(&app, &heavy, &t).await;
    assert!(
        first.starts_with("retry: ") && !first.contains("event:"),
        "{first}"
    );

    // The instance's cap (4): a second address fills it, a third takes a
    // slot from the heaviest address.
    let light = client_from("127.0.0.2");
    let t = ticket_of(&app, &light, "l0").await;
    let (first, _light_stream) = open(&app, &light, &t).await;
    assert!(first.contains("event:"), "{first}");
    let third = client_from("127.0.0.3");
    let t = ticket_of(&app, &third, "t0").await;
    let (first, _third_stream) = open(&app, &third, &t).await;
    assert!(
        first.contains("event:"),
        "the newcomer is admitted: {first}"
    );
    // Exactly one of the heavy address's streams was told to go.
    let mut shed = 0;
    for body in held.iter_mut() {
        let next = tokio::time::timeout(Duration::from_millis(1500), body.next()).await;
        if let Ok(Some(Ok(frame))) = next {
            let text = String::from_utf8_lossy(&frame).into_owned();
            if text.starts_with("retry: ") {
                shed += 1;
                // … and its stream ends.
                let end = tokio::time::timeout(Duration::from_secs(5), body.next()).await;
                assert!(matches!(end, Ok(None) | Ok(Some(Err(_)))), "{end:?}");
            }
        }
    }
    assert_eq!(shed, 1);
    app.stop().await;
}

#[tokio::test]
async fn secure_cookies_follow_the_flag_and_trusted_proxies() {
    // `always`: Secure and prefixed, over plain HTTP too; the prefixed
    // ticket cookie is read back.
    let app = TestApp::memory(&with_idle(&["--cookie-secure", "always"])).await;
    let client = client_from("127.0.0.1");
    let r = join(&app, &client, "c0", &[]).await;
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        cookie.starts_with("__Secure-waitroom_ticket=") && cookie.contains("Secure"),
        "{cookie}"
    );
    let value = cookie.split(';').next().unwrap().to_owned();
    let r = client
        .get(app.url("/api/queues/default/position"))
        .header("cookie", value)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the __Secure- name is read");
    app.stop().await;

    // `auto` behind a trusted proxy: X-Forwarded-Proto read properly.
    let app = TestApp::memory(&with_idle(&["--trusted-proxies", "127.0.0.1"])).await;
    let cases: [(&[(&str, &str)], bool); 6] = [
        (&[("x-forwarded-proto", "https")], true),
        (&[("x-forwarded-proto", "https, https")], true),
        (&[("x-forwarded-proto", "HTTPS")], true),
        (
            &[
                ("x-forwarded-for", "203.0.113.5"),
                ("x-forwarded-proto", "https"),
            ],
            true,
        ),
        (&[("x-forwarded-proto", "http")], false),
        (&[("forwarded", "for=203.0.113.5;proto=https")], false),
    ];
    for (i, (headers, secure)) in cases.iter().enumerate() {
        let r = join(&app, &client, &format!("auto{i}"), headers).await;
        let cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
        assert_eq!(cookie.contains("Secure"), *secure, "{headers:?}: {cookie}");
        assert_eq!(cookie.starts_with("__Secure-"), *secure, "{cookie}");
    }
    // The same header from a peer that is not the proxy: not Secure.
    let stranger = client_from("127.0.0.7");
    let r = join(&app, &stranger, "auto-x", &[("x-forwarded-proto", "https")]).await;
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(!cookie.contains("Secure"), "{cookie}");
    app.stop().await;

    // `never`: not even behind a trusted TLS proxy.
    let app = TestApp::memory(&with_idle(&[
        "--trusted-proxies",
        "127.0.0.1",
        "--cookie-secure",
        "never",
    ]))
    .await;
    let r = join(&app, &client, "n0", &[("x-forwarded-proto", "https")]).await;
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.starts_with("waitroom_ticket=") && !cookie.contains("Secure"));
    app.stop().await;
}

#[tokio::test]
async fn a_memory_instance_counts_addresses_like_redis() {
    // The same rule on the embedded store (one instance): the limit of
    // one address does not touch another's.
    let store: SharedStore = Arc::new(MemoryStore::new());
    let app = TestApp::spawn_with(
        config(&with_idle(&["--joins-per-address-per-minute", "1"])),
        store,
    )
    .await;
    for (source, user) in [
        ("127.0.0.11", "m1"),
        ("127.0.0.12", "m2"),
        ("127.0.0.13", "m3"),
    ] {
        let c = client_from(source);
        assert_eq!(join(&app, &c, user, &[]).await.status(), 201, "{source}");
        assert_429(
            join(&app, &c, &format!("{user}x"), &[]).await,
            "address_rate_limited",
        )
        .await;
    }
    app.stop().await;
}

// ------------------------------------------------- connections per address

/// The defaults, not the tests' usual limits-off flags: what an instance
/// started with `args` alone does.
fn defaults_with(args: &[&str]) -> waitroom::Config {
    let mut all = vec!["--orders-db", ":memory:", "--identity", "header"];
    all.extend_from_slice(args);
    waitroom::Config::from_args(all).unwrap()
}

/// Sockets that connect and never send a byte cannot hold a whole
/// instance: with `--max-connections 40`, forty of them from 127.0.0.1 get
/// at most their address's share (half the cap, by default; the rest are
/// answered `429 address_connections_limited` and closed), and a client
/// from 127.0.0.2 is still served.
#[tokio::test]
async fn idle_sockets_from_one_address_leave_room_for_other_addresses() {
    let app = TestApp::memory_with(defaults_with(&["--max-connections", "40"])).await;
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(socket_from("127.0.0.1", app.addr).await);
    }
    // Accepted in order: the forty before this one.
    let (status, answer) = get_from("127.0.0.2", app.addr, "/healthz", &[]).await;
    assert_eq!(status, 200, "{answer}");
    let over = read_to_close(idle.last_mut().unwrap()).await;
    assert!(over.starts_with("HTTP/1.1 429 "), "{over}");
    assert!(
        over.contains("\"error\":\"address_connections_limited\""),
        "{over}"
    );
    assert!(
        over.to_ascii_lowercase().contains("\r\nretry-after: "),
        "{over}"
    );
    drop(idle);
    app.stop().await;
}

/// `--connections-per-address`: at the cap the next connection from that
/// address is refused (another address is not touched), and once the
/// address's sockets close it is served again.
#[tokio::test]
async fn the_connection_cap_per_address_refuses_then_lets_through_again() {
    let app = TestApp::memory(&with_idle(&["--connections-per-address", "3"])).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(socket_from("127.0.0.3", app.addr).await);
    }
    let (status, answer) = get_from("127.0.0.3", app.addr, "/healthz", &[]).await;
    assert_eq!(status, 429, "{answer}");
    assert!(answer.contains("address_connections_limited"), "{answer}");
    let (status, answer) = get_from("127.0.0.4", app.addr, "/healthz", &[]).await;
    assert_eq!(status, 200, "another address: {answer}");
    // Still at the cap: still refused.
    let (status, _) = get_from("127.0.0.3", app.addr, "/healthz", &[]).await;
    assert_eq!(status, 429);
    // One closes: its slot comes back (once the server has read the close).
    drop(held.pop());
    crate::common::eventually(Duration::from_secs(5), "a slot again", || async {
        let (status, _) = get_from("127.0.0.3", app.addr, "/healthz", &[]).await;
        (status == 200).then_some(())
    })
    .await;
    drop(held);
    app.stop().await;
}

/// Behind a trusted proxy every client arrives from the proxy's address,
/// which holds connections for all of them: its connections are not
/// capped per address. A peer that is not a trusted proxy still is.
#[tokio::test]
async fn a_trusted_proxys_connections_are_not_capped_per_address() {
    let app = TestApp::memory(&with_idle(&[
        "--connections-per-address",
        "2",
        "--trusted-proxies",
        "127.0.0.5",
    ]))
    .await;
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(socket_from("127.0.0.5", app.addr).await);
    }
    let (status, answer) = get_from("127.0.0.5", app.addr, "/healthz", &[]).await;
    assert_eq!(status, 200, "the proxy: {answer}");
    for _ in 0..2 {
        held.push(socket_from("127.0.0.6", app.addr).await);
    }
    let (status, answer) = get_from("127.0.0.6", app.addr, "/healthz", &[]).await;
    assert_eq!(status, 429, "not a proxy: {answer}");
    drop(held);
    app.stop().await;
}
