//! Failover: `kill -9` of the master that holds a queue while buyers join
//! and admission runs, on a 3-master + 3-replica cluster of the test's own.
//! The replica is promoted, admission resumes, open streams heal, and the
//! test counts what was lost: acknowledged places (a join answered `201`
//! or `200`) that are gone, and announced tokens (published to streams)
//! that are gone. Redis replicates asynchronously; the test widens the lag
//! a real one would have (the replica frozen and its link cut for 300 ms
//! before the kill), so without `--redis-wait-replicas` something is lost,
//! and with `--redis-wait-replicas 1` nothing may be.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use waitroom::queue::{QueueName, Standing, UserId};
use waitroom::store::redis::{RedisOptions, RedisStore, Topology};
use waitroom::store::{EventStore, LineStore, QueueEvent, StoreEvent};

use crate::common::cluster::ClusterProcess;
use crate::common::{SseStream, TestApp, config, unique_prefix};

/// What a master kill cost.
#[derive(Debug)]
struct Loss {
    /// Joins answered 200/201.
    acknowledged: usize,
    /// Of those, users with neither a place nor a token afterwards.
    lost_places: usize,
    /// Tokens published to streams.
    announced: usize,
    /// Of those, tokens their user no longer holds afterwards.
    lost_tokens: usize,
}

/// Everything the subscriber saw: tokens announced, passes after the kill.
#[derive(Default)]
struct Seen {
    tokens: HashMap<String, String>,
    passes: Vec<Instant>,
    resyncs: usize,
}

async fn kill_the_master_during_admission(wait_replicas: u32) -> Loss {
    // Started on the test's own thread, which lives as long as the test
    // (the nodes die with the thread that spawned them).
    let mut cluster = ClusterProcess::start(3, 1, 1000);
    let queue = cluster.queues_on_distinct_masters(3).remove(0);
    let victim = cluster.master_of(&format!("{{{queue}}}"));
    let prefix = unique_prefix("failover");
    let options = |wait_replicas| RedisOptions {
        topology: Topology::Cluster(cluster.seed_list()),
        wait_replicas,
    };
    let store = Arc::new(
        RedisStore::open(&options(wait_replicas), &prefix)
            .await
            .unwrap(),
    );
    let app = Arc::new(
        TestApp::spawn_with(
            config(&[
                "--key-prefix",
                &prefix,
                "--queues",
                &queue,
                "--admission-interval-ms",
                "100",
                "--admission-batch",
                "3",
                "--ticket-secret",
                "failover-secret-0123456789abcdef",
            ]),
            store.clone(),
        )
        .await,
    );
    let q = QueueName::parse(&queue).unwrap();

    // A subscriber of its own: the tokens announced to streams.
    let watcher = RedisStore::open(&options(0), &prefix).await.unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut events = watcher.subscribe(std::slice::from_ref(&q));
    let recorder = {
        let seen = seen.clone();
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
                let mut seen = seen.lock().unwrap();
                match event {
                    StoreEvent::Queue {
                        event: QueueEvent::Pass(pass),
                        ..
                    } => {
                        seen.passes.push(Instant::now());
                        for a in pass.admitted {
                            seen.tokens.insert(a.user.as_str().to_owned(), a.token);
                        }
                    }
                    StoreEvent::Resync => seen.resyncs += 1,
                    _ => {}
                }
            }
        })
    };

    // Buyers join all along, 10 ms apart; a refused join is retried.
    let acked: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let stop_joining = tokio_util::sync::CancellationToken::new();
    let joiner = {
        let (app, acked, stop) = (app.clone(), acked.clone(), stop_joining.clone());
        let queue = queue.clone();
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.is_cancelled() {
                let user = format!("b{i:05}");
                let (code, body) = app.enter(&queue, &user).await;
                if code == 200 || code == 201 {
                    let ticket = body["ticket"].as_str().unwrap().to_owned();
                    acked.lock().unwrap().push((user, ticket));
                    i += 1;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };

    tokio::time::sleep(Duration::from_millis(1000)).await;
    // Streams of buyers still waiting at the kill: they must heal.
    let waiting: Vec<(String, String)> = acked
        .lock()
        .unwrap()
        .iter()
        .rev()
        .take(5)
        .cloned()
        .collect();
    let mut streams = Vec::new();
    for (_, ticket) in &waiting {
        let s = SseStream::open(&app, &queue, ticket, None).await;
        assert_eq!(s.status, 200);
        streams.push(s);
    }
    // The replication gap asynchronous replication allows, made wide
    // enough to see: the replica stops reading, its link is cut, the master
    // goes on acknowledging for 300 ms, then dies; the replica wakes up
    // with what it had and is promoted.
    let replica = cluster.replicas_of(victim)[0];
    cluster.freeze(replica);
    cluster.cut_replication(victim);
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.kill(victim);
    cluster.thaw(replica);
    let killed_at = Instant::now();
    if wait_replicas > 0 {
        // The promoted replica has no replica of its own until the old
        // master comes back (as an orchestrator restarts it): until then
        // WAIT cannot be satisfied and writes fail closed. It must come back
        // only after the failover: a master without persistence restarted
        // before it is empty, still owns its slots, and its replica would
        // copy the emptiness.
        let deadline = killed_at + Duration::from_secs(15);
        while cluster.masters().len() != 3 || cluster.masters().contains(&victim) {
            assert!(Instant::now() < deadline, "no replica was promoted");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        cluster.restart(victim);
    }

    // Admission resumes by itself: passes are published again.
    let deadline = killed_at + Duration::from_secs(25);
    loop {
        let resumed = {
            let seen = seen.lock().unwrap();
            seen.passes.iter().filter(|t| **t > killed_at).count() >= 3
        };
        if resumed {
            break;
        }
        if Instant::now() >= deadline {
            let stats = tokio::time::timeout(Duration::from_secs(6), store.stats(&q)).await;
            let seen = seen.lock().unwrap();
            panic!(
                "admission did not resume within 25 s of the kill: masters {:?}, victim {victim}, resyncs {}, passes after kill {}, stats {stats:?}",
                cluster.masters(),
                seen.resyncs,
                seen.passes.iter().filter(|t| **t > killed_at).count(),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("admission resumed {:?} after the kill", killed_at.elapsed());
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_joining.cancel();
    joiner.await.unwrap();

    // Each stream open across the kill reaches `ready` (reconnecting when
    // the server closed it, as the page does).
    for (i, mut s) in streams.into_iter().enumerate() {
        let until = Instant::now() + Duration::from_secs(20);
        let mut ready = false;
        while Instant::now() < until {
            match s.next(Duration::from_secs(20)).await {
                Some(e) if e.event == "ready" => {
                    ready = true;
                    break;
                }
                Some(e) if e.event == "gone" => panic!("stream {i} gone: {:?}", e.data),
                Some(_) => {}
                None => s = SseStream::open(&app, &queue, &waiting[i].1, None).await,
            }
        }
        assert!(ready, "stream {i} opened before the kill got ready");
    }

    store.set_paused(&q, true).await.unwrap();
    let acked = acked.lock().unwrap().clone();
    let tokens = seen.lock().unwrap().tokens.clone();
    let mut lost_places = 0;
    for (user, _) in &acked {
        let s = store
            .status(&q, &UserId::parse(user).unwrap(), false)
            .await
            .unwrap();
        if s.standing == Standing::NotEntered {
            lost_places += 1;
        }
    }
    let mut lost_tokens = 0;
    for (user, token) in &tokens {
        let s = store
            .status(&q, &UserId::parse(user).unwrap(), false)
            .await
            .unwrap();
        match s.standing {
            Standing::Ready { token: held, .. } if held.as_str() == token => {}
            _ => lost_tokens += 1,
        }
    }
    recorder.abort();
    let loss = Loss {
        acknowledged: acked.len(),
        lost_places,
        announced: tokens.len(),
        lost_tokens,
    };
    eprintln!("--redis-wait-replicas {wait_replicas}: {loss:?}");
    assert!(loss.acknowledged > 40, "joins ran: {loss:?}");
    assert!(loss.announced > 15, "admissions ran: {loss:?}");
    if let Ok(app) = Arc::try_unwrap(app) {
        app.stop().await;
    }
    loss
}

/// Without WAIT: admission and streams recover by themselves, but what the
/// master acknowledged while its replica lagged is gone (counted, printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_kill_without_wait_recovers_and_measures_the_loss() {
    crate::needs_redis!();
    let loss = kill_the_master_during_admission(0).await;
    assert!(
        loss.lost_places + loss.lost_tokens > 0,
        "what the master acknowledged in the gap is gone: {loss:?}"
    );
}

/// With `--redis-wait-replicas 1`, a join is answered and a pass is
/// published only once the replica holds it: across the kill nobody loses
/// a place and no announced token is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_replicas_a_master_kill_loses_nobody() {
    crate::needs_redis!();
    let loss = kill_the_master_during_admission(1).await;
    assert_eq!(loss.lost_places, 0, "{loss:?}");
    assert_eq!(loss.lost_tokens, 0, "{loss:?}");
}

/// On one Redis, `--redis-wait-replicas 1` without a replica fails closed
/// (`503`, nothing acknowledged); once a replica follows, the join is
/// answered, and the replica holds the place when it is.
#[tokio::test]
async fn wait_replicas_on_one_redis_fails_closed_until_a_replica_holds_the_write() {
    crate::needs_redis!();
    let master = crate::common::RedisProcess::start(false);
    let options = RedisOptions {
        topology: Topology::Single(master.url()),
        wait_replicas: 1,
    };
    let prefix = unique_prefix("wait1");
    let store = Arc::new(RedisStore::open(&options, &prefix).await.unwrap());
    let app = TestApp::spawn_with(
        config(&[
            "--key-prefix",
            &prefix,
            "--ticket-secret",
            "wait-one-secret-0123456789abcdef",
        ]),
        store,
    )
    .await;
    let (code, body) = app.enter("default", "alone").await;
    assert_eq!(code, 503, "no replica to acknowledge: {body}");

    let replica = crate::common::RedisProcess::start(false);
    let mut r = follow(&replica, &master).await;
    let (code, body) = app.enter("default", "followed").await;
    assert_eq!(code, 201, "{body}");
    // Acknowledged means on the replica already, not soon.
    let token = crate::common::stored_token(&mut r, &prefix, "default", "followed")
        .await
        .unwrap();
    assert!(token.is_some(), "the fast-track token is on the replica");
    app.stop().await;
}

/// With `--redis-wait-replicas`, the token API's claim and consume are
/// answered only once a replica holds them, as joins are: a consume a
/// failover lost would give the token back for a second order (the fault
/// campaign saw a claim succeed after its token's consume, past a master
/// killed before it replicated). With the replica frozen both fail closed
/// (`503`); thawed, each answer means the replica already has it.
#[tokio::test]
async fn with_wait_replicas_claims_and_consumes_are_answered_once_a_replica_holds_them() {
    crate::needs_redis!();
    const SERVICE: &str = "service-token-for-wait-0123456789";
    let master = crate::common::RedisProcess::start(false);
    let replica = crate::common::RedisProcess::start(false);
    let r = follow(&replica, &master).await;
    let options = RedisOptions {
        topology: Topology::Single(master.url()),
        wait_replicas: 1,
    };
    let prefix = unique_prefix("wait-claims");
    let store = Arc::new(RedisStore::open(&options, &prefix).await.unwrap());
    let app = TestApp::spawn_with(
        config(&[
            "--key-prefix",
            &prefix,
            "--ticket-secret",
            "wait-claims-secret-0123456789abc",
            "--service-token",
            SERVICE,
        ]),
        store,
    )
    .await;
    let token = crate::common::ready(&app, "buyer").await;
    let post = |path: &'static str, body: serde_json::Value| {
        let request = app
            .client
            .post(app.admin_url(path))
            .bearer_auth(SERVICE)
            .json(&body);
        async move {
            let r = request.send().await.unwrap();
            let code = r.status().as_u16();
            (
                code,
                r.json::<serde_json::Value>().await.unwrap_or_default(),
            )
        }
    };
    let on_replica = |user: &'static str, field: &'static str| {
        let mut r = r.clone();
        let prefix = prefix.clone();
        async move {
            crate::common::stored_token(&mut r, &prefix, "default", user)
                .await
                .unwrap()
                .and_then(|mut t| t.remove(field))
        }
    };
    let claim_body = serde_json::json!({"userId": "buyer", "token": token});

    // A claim with the replica frozen fails closed.
    replica.freeze();
    let (code, body) = post("/api/tokens/claim", claim_body.clone()).await;
    assert_eq!(
        (code, body["error"].as_str()),
        (503, Some("store_unavailable"))
    );
    replica.thaw();

    // Another buyer's claim, answered: on the replica already.
    let token = crate::common::ready(&app, "second").await;
    let claim_body = serde_json::json!({"userId": "second", "token": token});
    let (code, claim) = post("/api/tokens/claim", claim_body.clone()).await;
    assert_eq!(code, 200, "{claim}");
    let claim_id = claim["claimId"].as_str().unwrap().to_owned();
    // The API's claim id is the stored one and its lease's end.
    assert_eq!(
        on_replica("second", "claim").await.as_deref(),
        claim_id.split('.').next(),
        "the answered claim is on the replica"
    );

    // Its consume with the replica frozen fails closed; the master ran it,
    // so once the replica catches up the token is gone there too (a
    // consume answered 204 would have meant that at once).
    let consume_body =
        serde_json::json!({"userId": "second", "queue": "default", "claimId": claim_id});
    replica.freeze();
    let (code, body) = post("/api/tokens/consume", consume_body.clone()).await;
    assert_eq!(
        (code, body["error"].as_str()),
        (503, Some("store_unavailable"))
    );
    replica.thaw();
    crate::common::eventually(
        Duration::from_secs(10),
        "the replica drops the token",
        || {
            let gone = on_replica("second", "token");
            async move { gone.await.is_none().then_some(()) }
        },
    )
    .await;
    let (code, _) = post("/api/tokens/claim", claim_body).await;
    assert_eq!(code, 401, "a consumed token is no one's");
    app.stop().await;
}

/// Makes `replica` a replica of `master` and waits until it is in sync: a
/// connection to the replica, to read what it holds.
async fn follow(
    replica: &crate::common::RedisProcess,
    master: &crate::common::RedisProcess,
) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(replica.url()).unwrap();
    let mut r = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port)
        .query_async(&mut r)
        .await
        .unwrap();
    crate::common::eventually(Duration::from_secs(10), "the replica syncs", || {
        let mut r = r.clone();
        async move {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut r)
                .await
                .ok()?;
            info.contains("master_link_status:up").then_some(())
        }
    })
    .await;
    r
}
