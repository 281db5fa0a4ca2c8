//! Redis Sentinel: `--redis-url redis+sentinel://…` on a master with two
//! replicas and three sentinels of the test's own. `kill -9` of the master
//! while buyers join and admission runs: the sentinels promote a replica,
//! the store finds it (calls fail closed meanwhile), admission resumes,
//! open streams heal, and with `--redis-wait-replicas 1` nothing that was
//! acknowledged is lost — though the test widens the replication lag a real
//! master could die with (both replicas frozen and their links cut for
//! 300 ms before the kill).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use waitroom::config::Config;
use waitroom::queue::{QueueName, Standing, UserId};
use waitroom::store::redis::{RedisOptions, RedisStore, Topology};
use waitroom::store::{EventStore, LineStore, QueueEvent, StoreEvent};

use crate::common::sentinel::SentinelGroup;
use crate::common::{RedisProcess, SseStream, TestApp, config, unique_prefix};

/// Tokens announced to streams, and when passes were published.
#[derive(Default)]
struct Seen {
    tokens: HashMap<String, String>,
    passes: Vec<Instant>,
}

/// What a master kill cost: users whose acknowledged place, or announced
/// token, is gone.
struct Loss {
    lost_places: Vec<String>,
    lost_tokens: Vec<String>,
}

async fn kill_the_master_during_admission(wait_replicas: u32) -> Loss {
    // The server's warnings (why a call failed closed) go with the test's
    // output, which is shown only when it fails.
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_test_writer()
        .try_init();
    let mut group = SentinelGroup::start(2, 1000);
    let url = group.url();
    let prefix = unique_prefix("sentinel");
    let options = |wait_replicas| RedisOptions {
        topology: Topology::from_flags(&url, false).unwrap(),
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
                "--admission-interval-ms",
                "100",
                "--admission-batch",
                "3",
                "--ticket-secret",
                "sentinel-secret-0123456789abcdef",
            ]),
            store.clone(),
        )
        .await,
    );
    let q = QueueName::parse("default").unwrap();

    let watcher = RedisStore::open(&options(0), &prefix).await.unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut events = watcher.subscribe(std::slice::from_ref(&q));
    let recorder = {
        let seen = seen.clone();
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
                if let StoreEvent::Queue {
                    event: QueueEvent::Pass(pass),
                    ..
                } = event
                {
                    let mut seen = seen.lock().unwrap();
                    seen.passes.push(Instant::now());
                    for a in pass.admitted {
                        seen.tokens.insert(a.user.as_str().to_owned(), a.token);
                    }
                }
            }
        })
    };

    // Buyers join all along, 10 ms apart; a refused join is retried.
    let acked: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    // When each refusal came, and its body: what a slow recovery shows.
    let refused: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    let stop_joining = tokio_util::sync::CancellationToken::new();
    let joiner = {
        let (app, acked, refused, stop) = (
            app.clone(),
            acked.clone(),
            refused.clone(),
            stop_joining.clone(),
        );
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.is_cancelled() {
                let user = format!("s{i:05}");
                let (code, body) = app.enter("default", &user).await;
                if code == 200 || code == 201 {
                    let ticket = body["ticket"].as_str().unwrap().to_owned();
                    acked.lock().unwrap().push((user, ticket));
                    i += 1;
                } else {
                    assert_eq!(code, 503, "a store outage fails closed: {body}");
                    refused
                        .lock()
                        .unwrap()
                        .push((Instant::now(), body.to_string()));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };

    tokio::time::sleep(Duration::from_millis(1500)).await;
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
        let s = SseStream::open(&app, "default", ticket, None).await;
        assert_eq!(s.status, 200);
        streams.push(s);
    }

    let victim = group.master_port().expect("the sentinels name a master");
    let replicas: Vec<u16> = group
        .nodes
        .iter()
        .map(|n| n.port)
        .filter(|p| *p != victim)
        .collect();
    for &r in &replicas {
        group.node(r).freeze();
    }
    group.cut_replication(victim);
    tokio::time::sleep(Duration::from_millis(300)).await;
    group.node(victim).kill();
    for &r in &replicas {
        group.node(r).thaw();
    }
    let killed_at = Instant::now();

    let deadline = killed_at + Duration::from_secs(30);
    loop {
        let promoted = group.master_port().filter(|p| *p != victim);
        let resumed = seen
            .lock()
            .unwrap()
            .passes
            .iter()
            .filter(|t| **t > killed_at)
            .count()
            >= 3;
        if promoted.is_some() && resumed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no failover within 30 s: master {:?}, victim {victim}",
            group.master_port()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("admission resumed {:?} after the kill", killed_at.elapsed());
    // Joins are acknowledged again, on the promoted master. A loaded
    // machine may take a while (each refused join can wait out `WAIT`'s
    // timeout); if they never are, say how they were refused.
    let resumed_at = Instant::now();
    let before = acked.lock().unwrap().len();
    while acked.lock().unwrap().len() < before + 5 {
        if resumed_at.elapsed() > Duration::from_secs(30) {
            let refused = refused.lock().unwrap();
            let mut since: Vec<&String> = refused
                .iter()
                .filter(|(at, _)| *at > resumed_at)
                .map(|(_, body)| body)
                .collect();
            since.dedup();
            panic!(
                "joins not acknowledged again 30 s after admission resumed ({} acknowledged \
                 since, {} refused since: {since:?}; promoted master {:?})",
                acked.lock().unwrap().len() - before,
                refused.iter().filter(|(at, _)| *at > resumed_at).count(),
                group.master_port(),
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_joining.cancel();
    joiner.await.unwrap();

    for (i, mut s) in streams.into_iter().enumerate() {
        let until = Instant::now() + Duration::from_secs(30);
        let mut ready = false;
        while Instant::now() < until {
            match s.next(Duration::from_secs(20)).await {
                Some(e) if e.event == "ready" => {
                    ready = true;
                    break;
                }
                Some(e) if e.event == "gone" => panic!("stream {i} gone: {:?}", e.data),
                Some(_) => {}
                None => s = SseStream::open(&app, "default", &waiting[i].1, None).await,
            }
        }
        assert!(ready, "stream {i} opened before the kill got ready");
    }

    store.set_paused(&q, true).await.unwrap();
    let acked = acked.lock().unwrap().clone();
    let tokens = seen.lock().unwrap().tokens.clone();
    let mut lost_places = Vec::new();
    for (user, _) in &acked {
        let s = store
            .status(&q, &UserId::parse(user).unwrap(), false)
            .await
            .unwrap();
        if s.standing == Standing::NotEntered {
            lost_places.push(user.clone());
        }
    }
    let mut lost_tokens = Vec::new();
    for (user, token) in &tokens {
        let s = store
            .status(&q, &UserId::parse(user).unwrap(), false)
            .await
            .unwrap();
        match s.standing {
            Standing::Ready { token: held, .. } if held.as_str() == token => {}
            _ => lost_tokens.push(user.clone()),
        }
    }
    recorder.abort();
    let refused = refused.lock().unwrap().len();
    eprintln!(
        "acknowledged {}, announced {}, refused {refused}, lost places {lost_places:?}, lost tokens {lost_tokens:?}",
        acked.len(),
        tokens.len()
    );
    assert!(acked.len() > 40, "joins ran: {}", acked.len());
    assert!(tokens.len() > 15, "admissions ran: {}", tokens.len());
    assert!(refused > 0, "the outage was seen (and failed closed)");
    if let Ok(app) = Arc::try_unwrap(app) {
        app.stop().await;
    }
    Loss {
        lost_places,
        lost_tokens,
    }
}

/// With `--redis-wait-replicas 1` a join is answered, and a pass
/// published, only once a replica holds it: across the failover nobody
/// loses a place and no announced token is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_kill_behind_sentinel_is_failed_over_and_loses_nobody_with_wait() {
    crate::needs_redis!();
    let loss = kill_the_master_during_admission(1).await;
    assert_eq!(loss.lost_places, Vec::<String>::new());
    assert_eq!(loss.lost_tokens, Vec::<String>::new());
}

/// Without `WAIT` the failover works the same, but what the master
/// acknowledged while its replicas lagged is gone: the gap the test opens
/// is real, so the test above is not luck.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_wait_a_master_kill_behind_sentinel_loses_the_lagging_writes() {
    crate::needs_redis!();
    let loss = kill_the_master_during_admission(0).await;
    assert!(
        !loss.lost_places.is_empty() || !loss.lost_tokens.is_empty(),
        "the writes of the last 300 ms before the kill reached no replica"
    );
}

/// A node that says `master` but is not the one the sentinels name — an
/// old master restarted before the failover finished, until a sentinel
/// demotes it — must not keep the store: reads there are stale (a buyer
/// admitted on the new master reads as waiting, a ticket it never issued
/// as over) and writes there are lost. The store follows the sentinels
/// within seconds, whatever the old node says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_leaves_a_master_the_sentinels_no_longer_name() {
    crate::needs_redis!();
    let group = SentinelGroup::start(1, 1000);
    let elsewhere = RedisProcess::start(false);
    let prefix = unique_prefix("sentinel-moved");
    let options = RedisOptions {
        topology: Topology::from_flags(&group.url(), false).unwrap(),
        wait_replicas: 0,
    };
    let store = Arc::new(RedisStore::open(&options, &prefix).await.unwrap());
    let app = TestApp::spawn_with(
        config(&[
            "--key-prefix",
            &prefix,
            "--ticket-secret",
            "sentinel-secret-0123456789abcdef",
        ]),
        store.clone(),
    )
    .await;
    let q = QueueName::parse("default").unwrap();
    let (code, _) = app.enter("default", "before").await;
    assert!(code == 200 || code == 201, "joined on the first master");
    let before = UserId::parse("before").unwrap();
    let on_first = store.status(&q, &before, false).await.unwrap();
    assert_ne!(on_first.standing, Standing::NotEntered);

    // The sentinels now name the other node; the first stays up, a master.
    group.monitor_instead(elsewhere.port, 1000);
    let moved_at = Instant::now();
    loop {
        // A store read: answered by the node the store is connected to.
        if let Ok(s) = store.status(&q, &before, false).await
            && s.standing == Standing::NotEntered
        {
            break;
        }
        assert!(
            moved_at.elapsed() < Duration::from_secs(10),
            "the store still reads the node the sentinels no longer name"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("moved to the named master after {:?}", moved_at.elapsed());
    // Writes land there too: a join is a place on the named master.
    let (code, _) = app.enter("default", "after").await;
    assert!(code == 200 || code == 201);
    let named: Option<i64> =
        crate::common::redis_proc::query(elsewhere.port, &redis::cmd("DBSIZE"));
    assert!(
        named.is_some_and(|n| n > 0),
        "the join wrote to the named master"
    );
    app.stop().await;
}

/// A sentinel URL is checked at start: the forms that work, and clear
/// refusals for the ones that do not.
#[test]
fn sentinel_urls_are_checked_at_start() {
    crate::needs_redis!();
    let parse = |url: &str, cluster: bool| {
        let mut args = vec!["--redis-url", url];
        if cluster {
            args.push("--redis-cluster");
        }
        let config = Config::from_args(args).expect("parses");
        config.validate().map_err(|e| e.to_string())
    };
    parse(
        "redis+sentinel://10.0.0.1:26379,10.0.0.2,10.0.0.3:5000/main",
        false,
    )
    .unwrap();
    parse("redis+sentinel://:secret@s1:26379/main/2", false).unwrap();
    let Topology::Sentinel(url) =
        Topology::from_flags("redis+sentinel://app:pw@s1,[::1]:5000/main/2", false).unwrap()
    else {
        panic!("a sentinel topology");
    };
    assert_eq!(
        url.sentinels,
        vec![
            "redis://s1:26379".to_owned(),
            "redis://[::1]:5000".to_owned()
        ]
    );
    assert_eq!(
        (
            url.master.as_str(),
            url.db,
            url.username.as_deref(),
            url.password.as_deref()
        ),
        ("main", 2, Some("app"), Some("pw"))
    );
    for (bad, why) in [
        ("redis+sentinel://s1:26379", "master's name"),
        ("redis+sentinel://s1:26379/", "master's name"),
        ("redis+sentinel://s1:notaport/main", "port"),
        ("redis+sentinel://s1:0/main", "port"),
        ("redis+sentinel://:26379/main", "host"),
        ("redis+sentinel://s1/main/x", "database"),
        ("redis+sentinel://s1/main/0/extra", "path"),
        ("redis+sentinel://nopassword@s1/main", "credentials"),
    ] {
        let err = parse(bad, false).expect_err(bad);
        assert!(err.contains(why), "{bad}: {err}");
    }
    let err = parse("redis+sentinel://s1/main", true).expect_err("not a cluster");
    assert!(err.contains("--redis-cluster"), "{err}");
}

/// `WAIT n` counts any `n` replicas and Sentinel may promote any of them,
/// so fewer than all can lose what was answered (docs/faults.md: a master
/// paused past the down-after time resumes with the other replica still
/// acknowledging). An instance started that way says so once, naming the
/// number that loses nothing; one waiting for every replica does not.
#[tokio::test]
async fn fewer_wait_replicas_than_sentinel_replicas_is_warned_at_start() {
    crate::needs_redis!();
    let group = SentinelGroup::start(2, 5000);
    let url = group.url();
    let client = reqwest::Client::new();
    let warning = "may promote a replica that did not acknowledge";
    for (wait, warned) in [("1", true), ("2", false)] {
        let prefix = unique_prefix("wait-cover");
        let app = crate::common::BinApp::spawn(&[
            "--redis-url",
            &url,
            "--redis-wait-replicas",
            wait,
            "--key-prefix",
            &prefix,
        ])
        .await;
        // A join answered: the store was opened (and checked) before.
        app.enter(&client, "u1").await;
        let log = app.log.lock().unwrap().clone();
        let says = log
            .iter()
            .any(|l| l.contains(warning) && l.contains("set --redis-wait-replicas 2"));
        assert_eq!(says, warned, "--redis-wait-replicas {wait}: {log:#?}");
    }
}
