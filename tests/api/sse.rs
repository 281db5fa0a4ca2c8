//! The event stream over real HTTP with a real SSE client.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use waitroom::store::redis::RedisStore;

use crate::common::{
    BinApp, IDLE, RedisProcess, SseStream, TestApp, config, event_id, eventually, redis_url,
    unique_prefix,
};

const SECS: Duration = Duration::from_secs(1);

async fn ticket(app: &TestApp, user: &str) -> String {
    let (code, body) = app.enter("default", user).await;
    assert!(code == 201 || code == 200, "{code} {body}");
    body["ticket"].as_str().unwrap().to_owned()
}

/// Users `prefix0..n` in line after a first one who takes the fast track.
async fn line(app: &TestApp, prefix: &str, n: usize) -> Vec<String> {
    ticket(app, &format!("{prefix}-first")).await;
    let mut tickets = Vec::new();
    for i in 0..n {
        tickets.push(ticket(app, &format!("{prefix}{i:03}")).await);
    }
    tickets
}

#[tokio::test]
async fn waiting_at_once_then_rank_falls_then_ready_with_the_position_token() {
    crate::needs_redis!();
    for app in [
        TestApp::memory(&["--admission-interval-ms", "250", "--admission-batch", "2"]).await,
        TestApp::redis(
            "sse1",
            &["--admission-interval-ms", "250", "--admission-batch", "2"],
        )
        .await,
    ] {
        let tickets = line(&app, "w", 10).await;
        let last = tickets.last().unwrap();
        let mut s = SseStream::open(&app, "default", last, None).await;
        assert_eq!(s.status, 200);
        assert!(
            s.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        assert_eq!(s.headers["cache-control"], "no-cache, no-store");
        assert_eq!(s.headers["x-accel-buffering"], "no");
        assert!(s.headers.get("content-encoding").is_none());

        let first = s.next(SECS).await.unwrap();
        assert_eq!(first.event, "waiting");
        let retry = first.retry.expect("first frame sets retry");
        assert!((2..=5).contains(&retry.as_secs()), "{retry:?}");
        assert!(!first.id.is_empty());
        let events = s.until("ready", Duration::from_secs(10)).await;
        let ranks: Vec<u64> = std::iter::once(&first)
            .chain(&events)
            .filter(|e| e.event == "waiting")
            .map(|e| e.data["rank"].as_u64().unwrap())
            .collect();
        assert!(ranks.len() >= 3, "several rank updates: {ranks:?}");
        assert!(
            ranks.windows(2).all(|w| w[0] > w[1]),
            "rank only falls: {ranks:?}"
        );
        assert!(ranks[0] <= 9, "{ranks:?}");
        let waiting = &events.iter().find(|e| e.event == "waiting").unwrap().data;
        assert_eq!(
            waiting["position"].as_u64(),
            Some(waiting["rank"].as_u64().unwrap() + 1)
        );
        assert!(
            waiting.get("totalWaiting").is_some() && waiting.get("estimatedWaitSeconds").is_some()
        );

        let ready = events.last().unwrap();
        let (_, pos) = app.position("default", last).await;
        assert_eq!(pos["status"], "READY");
        assert_eq!(ready.data["entryToken"], pos["entryToken"]);
        assert!(ready.data["tokenExpiresInSeconds"].as_u64().unwrap() > 290);
        // Ids only grow, compared as (pass, n): "7.10" comes after "7.9".
        let ids: Vec<(u64, u64)> = std::iter::once(&first)
            .chain(&events)
            .map(|e| event_id(&e.id))
            .collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
        app.stop().await;
    }
}

#[tokio::test]
async fn two_instances_deliver_every_ready_exactly_once() {
    crate::needs_redis!();
    let prefix = unique_prefix("sse2");
    let args = [
        "--key-prefix",
        &prefix,
        "--admission-interval-ms",
        "200",
        "--admission-batch",
        "10",
        "--ticket-secret",
        "sse-two-instances-secret-0123456789",
    ];
    let store = || async { Arc::new(RedisStore::connect(&redis_url(), &prefix).await.unwrap()) };
    let a = TestApp::spawn_with(config(&args), store().await).await;
    let b = TestApp::spawn_with(config(&args), store().await).await;
    every_ready_exactly_once(&a, &b, "default").await;
    a.stop().await;
    b.stop().await;
}

/// 110 users join `queue` alternately on `a` and `b` (budget 10: the first
/// ten take the fast track), each of the other 100 opens a stream on the
/// instance that did not take the join; every stream gets exactly one
/// `ready`, 100 distinct tokens in all. The instances must admit 10 per
/// pass and share one store.
pub(crate) async fn every_ready_exactly_once(a: &TestApp, b: &TestApp, queue: &str) {
    // Hold the line until every stream is open: fill the budget first.
    let mut tickets = Vec::new();
    for i in 0..110 {
        let app = if i % 2 == 0 { a } else { b };
        let (code, body) = app.enter(queue, &format!("m{i:03}")).await;
        assert!(code == 201 || code == 200, "{code} {body}");
        tickets.push(body["ticket"].as_str().unwrap().to_owned());
    }
    let tickets = tickets.split_off(10); // the first ten took the fast track
    let mut readers = Vec::new();
    for (i, t) in tickets.into_iter().enumerate() {
        // Streams on the instance that did NOT take the join.
        let app = if i % 2 == 0 { b } else { a };
        let mut s = SseStream::open(app, queue, &t, None).await;
        assert_eq!(s.status, 200);
        readers.push(tokio::spawn(async move {
            let mut readies = Vec::new();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            while tokio::time::Instant::now() < deadline {
                match tokio::time::timeout(Duration::from_millis(1500), async {
                    s.next(Duration::from_secs(30)).await
                })
                .await
                {
                    Ok(Some(e)) if e.event == "ready" => {
                        readies.push(e.data["entryToken"].as_str().unwrap().to_owned())
                    }
                    Ok(Some(e)) if e.event == "gone" => break,
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    // Quiet for 1.5 s after the token: nothing more comes.
                    Err(_) if !readies.is_empty() => break,
                    Err(_) => {}
                }
            }
            readies
        }));
    }
    let results: Vec<Vec<String>> = futures::future::join_all(readers)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let mut tokens = HashMap::new();
    for r in &results {
        assert_eq!(r.len(), 1, "exactly one ready per stream: {r:?}");
        *tokens.entry(r[0].clone()).or_insert(0) += 1;
    }
    assert_eq!(tokens.len(), 100, "100 distinct tokens in {queue}");
}

#[tokio::test]
async fn restarting_redis_keeps_streams_and_every_ready_arrives() {
    crate::needs_redis!();
    let mut redis = RedisProcess::start(true);
    let store = Arc::new(RedisStore::connect(&redis.url(), "pubsub").await.unwrap());
    let app = TestApp::spawn_with(
        config(&[
            "--admission-interval-ms",
            "300",
            "--admission-batch",
            "3",
            "--ticket-secret",
            "restart-secret-0123456789abc",
        ]),
        store,
    )
    .await;
    let tickets = line(&app, "p", 12).await;
    let mut streams = Vec::new();
    for t in &tickets {
        let s = SseStream::open(&app, "default", t, None).await;
        assert_eq!(s.status, 200);
        streams.push(s);
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    redis.kill();
    tokio::time::sleep(Duration::from_millis(800)).await;
    redis.restart(); // AOF: the line survives; pub/sub must resubscribe
    let mut got = 0;
    for (i, mut s) in streams.into_iter().enumerate() {
        let mut ready = false;
        for _ in 0..200 {
            match s.next(Duration::from_secs(20)).await {
                Some(e) if e.event == "ready" => {
                    ready = true;
                    break;
                }
                Some(e) if e.event == "gone" => panic!("stream {i} gone: {:?}", e.data),
                Some(_) => {}
                None => {
                    // The stream closed: a client reconnects and is healed.
                    s = SseStream::open(&app, "default", &tickets[i], None).await;
                }
            }
        }
        assert!(ready, "stream {i} got ready");
        got += 1;
    }
    assert_eq!(got, 12);
    app.stop().await;
}

#[tokio::test]
async fn reconnect_gets_current_state_and_a_second_stream_replaces_the_first() {
    let app = TestApp::memory(IDLE).await;
    let tickets = line(&app, "r", 3).await;
    let mut first = SseStream::open(&app, "default", &tickets[2], None).await;
    let e = first.next(SECS).await.unwrap();
    assert_eq!(
        (e.event.as_str(), e.data["rank"].as_u64()),
        ("waiting", Some(2))
    );

    let mut second = SseStream::open(&app, "default", &tickets[2], Some(&e.id)).await;
    let now = second.next(SECS).await.unwrap();
    assert_eq!(
        now.event, "waiting",
        "current state first, whatever Last-Event-ID says"
    );
    assert_eq!(now.data["rank"], 2);
    let gone = first.next(SECS).await.unwrap();
    assert_eq!(gone.event, "gone");
    assert_eq!(gone.data["reason"], "replaced");
    assert!(first.next(SECS).await.is_none(), "the replaced stream ends");

    // Someone ahead leaves: the live stream moves up (with the next pass
    // or, admission being idle here, the next re-read, about a second near
    // the front), then its own leave ends it.
    assert_eq!(app.leave("default", &tickets[0]).await, 204);
    let moved = second.next(Duration::from_secs(3)).await.unwrap();
    assert_eq!(
        (moved.event.as_str(), moved.data["rank"].as_u64()),
        ("waiting", Some(1))
    );
    app.leave("default", &tickets[2]).await;
    let gone = second.next(SECS).await.unwrap();
    assert_eq!(
        (gone.event.as_str(), gone.data["reason"].as_str()),
        ("gone", Some("left"))
    );
    assert!(second.next(SECS).await.is_none());

    // A ticket whose place has ended: 401 ticket_ended, no stream.
    let s = SseStream::open(&app, "default", &tickets[2], None).await;
    assert_eq!(s.status, 401);
    let forged = SseStream::open(&app, "default", "forged.AAAA", None).await;
    assert_eq!(forged.status, 401);
    app.stop().await;
}

#[tokio::test]
async fn a_thousand_disconnects_leave_nothing_behind() {
    // A thousand client sockets at once, beside the other tests' sockets:
    // more than a default soft limit of 1,024 open files allows.
    rlimit::increase_nofile_limit(8_192).expect("raise the open-file limit");
    let server = BinApp::spawn(IDLE).await;
    let client = reqwest::Client::new();
    let mut tickets = Vec::new();
    for i in 0..1000 {
        tickets.push(server.enter(&client, &format!("d{i:04}")).await);
    }
    let round = || async {
        let mut streams = Vec::new();
        for t in &tickets {
            let r = client
                .get(server.url("/api/queues/default/events"))
                .header("x-queue-ticket", t)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let mut body = r.bytes_stream();
            body.next().await.unwrap().unwrap(); // the first frame
            streams.push(body);
        }
        let open = server.metric("waitroom_streams_open").await;
        assert_eq!(open, 1000.0);
        drop(streams);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while server.metric("waitroom_streams_open").await > 0.0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "streams still registered"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.rss_kib()
    };
    // Warm-up rounds fill allocator pools and arenas (their growth decays
    // round by round). After that, 4,000 more streams opened and dropped
    // may cost allocator slack, but not what a leaked stream holds: its
    // socket, session and registry entry come to over 3 KiB (the measured
    // RSS per open stream), so a leak of even a quarter of them would add
    // over 3 MiB. The bound sits at half of that: 0.5 KiB per stream.
    for _ in 0..4 {
        round().await;
    }
    let after_warmup = round().await;
    let mut last = after_warmup;
    for _ in 0..4 {
        last = round().await;
    }
    assert!(
        last <= after_warmup + 2_000,
        "server RSS grew from {after_warmup} KiB to {last} KiB over 4,000 more streams"
    );
}

#[tokio::test]
async fn keep_alive_comments_arrive() {
    let app = TestApp::memory(&[
        "--admission-interval-ms",
        "600000",
        "--admission-batch",
        "1",
        "--keep-alive-secs",
        "1",
    ])
    .await;
    let tickets = line(&app, "k", 1).await;
    let r = reqwest::Client::new()
        .get(app.url("/api/queues/default/events"))
        .header("x-queue-ticket", &tickets[0])
        .send()
        .await
        .unwrap();
    let mut body = r.bytes_stream();
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !text.contains("\n:") && !text.starts_with(':') {
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .expect("a keep-alive within 5 s")
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    app.stop().await;
}

#[tokio::test]
async fn over_the_cap_streams_are_shed_with_a_long_retry() {
    let app = TestApp::memory(&[
        "--admission-interval-ms",
        "600000",
        "--admission-batch",
        "1",
        "--max-streams",
        "2",
    ])
    .await;
    let tickets = line(&app, "c", 3).await;
    let mut s1 = SseStream::open(&app, "default", &tickets[0], None).await;
    let mut s2 = SseStream::open(&app, "default", &tickets[1], None).await;
    s1.next(SECS).await.unwrap();
    s2.next(SECS).await.unwrap();
    let r = reqwest::Client::new()
        .get(app.url("/api/queues/default/events"))
        .header("x-queue-ticket", &tickets[2])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "a non-200 would stop EventSource for good");
    let body = tokio::time::timeout(Duration::from_secs(2), r.text())
        .await
        .expect("closed at once")
        .unwrap();
    let retry: u64 = body
        .lines()
        .find_map(|l| l.strip_prefix("retry:"))
        .map(|v| v.trim().parse().unwrap())
        .expect("a retry field");
    assert!((20_000..=40_000).contains(&retry), "{retry}");
    assert!(!body.contains("event:"), "no state to an unserved stream");
    drop(s1);
    eventually(Duration::from_secs(5), "a slot frees", || async {
        (app.state.hub().open_streams() < 2).then_some(())
    })
    .await;
    let mut s3 = SseStream::open(&app, "default", &tickets[2], None).await;
    assert_eq!(s3.next(SECS).await.unwrap().event, "waiting");
    app.stop().await;
}

#[tokio::test]
async fn streaming_counts_as_presence_and_absent_users_are_told() {
    crate::needs_redis!();
    let app = TestApp::redis(
        "presence",
        &[
            "--admission-interval-ms",
            "200",
            "--admission-batch",
            "1",
            "--abandon-after-secs",
            "1",
            "--max-active",
            "1",
            "--token-ttl-secs",
            "60",
        ],
    )
    .await;
    // The fast-track holder keeps maxActive full: nobody is admitted, so
    // only presence decides who stays.
    let tickets = line(&app, "pr", 2).await;
    let mut streaming = SseStream::open(&app, "default", &tickets[0], None).await;
    assert_eq!(streaming.next(SECS).await.unwrap().event, "waiting");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (code, absent) = app.position("default", &tickets[1]).await;
    assert_eq!(
        (code, absent["error"].as_str()),
        (401, Some("ticket_ended")),
        "the silent user was dropped"
    );
    let (_, present) = app.position("default", &tickets[0]).await;
    assert_eq!(
        present["status"], "WAITING",
        "the streaming user kept the place"
    );
    assert_eq!(present["rank"], 0);

    // Streams of dropped users hear why.
    let app2 = TestApp::memory(&[
        "--admission-interval-ms",
        "200",
        "--admission-batch",
        "1",
        "--abandon-after-secs",
        "1",
        "--max-active",
        "1",
    ])
    .await;
    let tickets = line(&app2, "ab", 1).await;
    let mut s = SseStream::open(&app2, "default", &tickets[0], None).await;
    s.next(SECS).await.unwrap();
    drop(s); // the buyer closes the tab
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let (code, p) = app2.position("default", &tickets[0]).await;
    assert_eq!((code, p["error"].as_str()), (401, Some("ticket_ended")));
    let (code, again) = app2.enter("default", "ab000").await;
    assert_eq!(code, 201, "an abandoned user may re-enter: {again}");
    app.stop().await;
    app2.stop().await;
}

#[tokio::test]
async fn shutdown_closes_streams_within_the_drain_window() {
    let app = TestApp::memory(&[
        "--admission-interval-ms",
        "600000",
        "--admission-batch",
        "1",
        "--drain-secs",
        "2",
    ])
    .await;
    let tickets = line(&app, "s", 20).await;
    let mut streams = Vec::new();
    for t in &tickets {
        let mut s = SseStream::open(&app, "default", t, None).await;
        s.next(SECS).await.unwrap();
        streams.push(s);
    }
    let started = std::time::Instant::now();
    let watchers: Vec<_> = streams
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                assert!(s.next(Duration::from_secs(5)).await.is_none());
                started.elapsed()
            })
        })
        .collect();
    app.stop().await;
    let closed_at: Vec<Duration> = futures::future::join_all(watchers)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let last = closed_at.iter().max().unwrap();
    assert!(
        *last <= Duration::from_millis(3000),
        "all closed within the window: {last:?}"
    );
    let first = closed_at.iter().min().unwrap();
    assert!(
        *last - *first >= Duration::from_millis(300),
        "closes are spread out: {closed_at:?}"
    );
}

/// Streams on a kept-alive connection (after other requests) are handed to
/// the lean writer at the message boundary, as on fresh connections; both
/// transports speak the same SSE (tests/api/transport.rs covers the hyper
/// fallback).
#[tokio::test]
async fn streams_on_reused_connections_behave_the_same() {
    let app = TestApp::memory(&["--admission-interval-ms", "300", "--admission-batch", "1"]).await;
    let tickets = line(&app, "h", 2).await;
    let client = reqwest::Client::new();
    for t in &tickets {
        let r = client
            .get(app.url("/api/queues/default/position"))
            .header("x-queue-ticket", t)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    // The pooled connection is reused for the stream.
    let r = client
        .get(app.url("/api/queues/default/events"))
        .header("x-queue-ticket", &tickets[1])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    assert_eq!(r.headers()["x-accel-buffering"], "no");
    let mut body = r.bytes_stream();
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !text.contains("event: ready") {
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .expect("ready within 10 s")
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(text.starts_with("retry: "), "{text}");
    assert!(text.contains("event: waiting"));

    // Errors on the lean path are the same JSON errors.
    let raw = |path: &str, ticket: &str| {
        let path = path.to_owned();
        let ticket = ticket.to_owned();
        let addr = app.addr;
        async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nX-Queue-Ticket: {ticket}\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        }
    };
    let unknown = raw("/api/queues/nope/events", "x").await;
    assert!(unknown.starts_with("HTTP/1.1 404"), "{unknown}");
    assert!(unknown.contains("\"error\":\"unknown_queue\""));
    let forged = raw("/api/queues/default/events", "forged.x").await;
    assert!(forged.starts_with("HTTP/1.1 401"), "{forged}");
    assert!(forged.contains("invalid_ticket"));
    app.stop().await;
}

/// A Redis that stops answering without closing anything (a partition):
/// the subscriber notices by its unanswered ping, resubscribes once Redis
/// answers again, re-reads every stream, and buyers still get `ready`.
#[tokio::test]
async fn a_frozen_redis_is_noticed_and_streams_resync() {
    crate::needs_redis!();
    let redis = RedisProcess::start(false);
    let store = Arc::new(RedisStore::connect(&redis.url(), "frozen").await.unwrap());
    let app = TestApp::spawn_with(
        config(&[
            "--admission-interval-ms",
            "300",
            "--admission-batch",
            "1",
            "--max-active",
            "1",
        ]),
        store,
    )
    .await;
    let tickets = line(&app, "fz", 2).await;
    let mut s = SseStream::open(&app, "default", &tickets[0], None).await;
    assert_eq!(s.next(SECS).await.unwrap().event, "waiting");
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.freeze();
    let (code, _) = app.enter("default", "during-freeze").await;
    assert_eq!(code, 503, "fail closed while Redis does not answer");
    // The subscriber notices the silence by itself (its ping goes
    // unanswered), before Redis answers again.
    eventually(
        Duration::from_secs(30),
        "the subscriber to notice the partition",
        || async { (app.state.hub().interruptions() >= 1).then_some(()) },
    )
    .await;
    redis.thaw();
    eventually(
        Duration::from_secs(20),
        "a resync after the freeze",
        || async { (app.state.hub().resyncs() >= 1).then_some(()) },
    )
    .await;
    // The fast-track holder leaves: the slot frees and fz000 is admitted.
    let first = ticket(&app, "fz-first").await;
    assert_eq!(app.leave("default", &first).await, 204);
    let events = s.until("ready", Duration::from_secs(10)).await;
    assert_eq!(events.last().unwrap().event, "ready");
    app.stop().await;
}
