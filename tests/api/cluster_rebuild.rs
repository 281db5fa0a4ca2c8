//! A Redis Cluster connection that stays open but silent is built anew
//! (docs/faults.md, "an instance stuck after a Cluster failover"), and one
//! that is merely slow for a moment is kept.
//!
//! A one-node cluster of the test's own sits behind a TCP proxy
//! (`tests/common/proxy.rs`), and the node announces the proxy's port, so
//! every connection the store makes goes through it. The proxy silences
//! the connections open at one moment while new ones work: the store's
//! connection then times out every call, as the stuck instance's did, and
//! only a new connection gets answers.
//!
//! The proxy also carries the instance's pub/sub subscriber, which makes
//! its own connections when its health check times out. Those speak RESP3
//! (they open with `HELLO`), the store's RESP2: the tests count only the
//! latter ([`SilenceProxy::resp2_accepted`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use waitroom::store::redis::{RedisOptions, RedisStore, Topology};

use crate::common::cluster::ClusterProcess;
use crate::common::proxy::SilenceProxy;
use crate::common::{IDLE, TestApp, config, unique_prefix};

/// From the silence on, how long the store may answer `503` before it
/// must answer again. The connection is rebuilt on the third timeout in a
/// row once they span 5 s (`src/store/redis/conn/cluster.rs`); a timeout
/// comes back 2 s after its call was sent, so with one join at a time
/// (0.5 s apart) the first lands at about 2 s and the one that triggers the
/// rebuild by about 9.5 s. A rebuild takes milliseconds on loopback and at
/// most 4 s. 20 s leaves the rest for a loaded machine; without the
/// rebuild the store never answers again.
const REBUILT_WITHIN: Duration = Duration::from_secs(20);

/// A one-node cluster behind a proxy, and an instance on it.
struct Setup {
    // Dropped last: the app first, then the proxy, then the node.
    app: TestApp,
    proxy: SilenceProxy,
    _cluster: ClusterProcess,
}

async fn setup(tag: &str) -> Setup {
    // Started on the test's own thread, which lives as long as the test
    // (the node dies with the thread that spawned it).
    let cluster = ClusterProcess::start_single();
    let node = cluster.ports()[0];
    let proxy = SilenceProxy::start(node).await;
    cluster.announce_port(node, proxy.port);
    let prefix = unique_prefix(tag);
    let options = RedisOptions {
        topology: Topology::Cluster(vec![format!("redis://127.0.0.1:{}", proxy.port)]),
        wait_replicas: 0,
    };
    let store = Arc::new(RedisStore::open(&options, &prefix).await.unwrap());
    let mut args = vec![
        "--key-prefix",
        &prefix,
        "--ticket-secret",
        "rebuild-secret-0123456789abcdef0",
    ];
    args.extend_from_slice(IDLE);
    let app = TestApp::spawn_with(config(&args), store).await;
    Setup {
        app,
        proxy,
        _cluster: cluster,
    }
}

/// Joins as `user`: the status, and how long the answer took.
async fn join(app: &TestApp, user: &str) -> (u16, Duration) {
    let sent = Instant::now();
    let (code, _) = app.enter("default", user).await;
    (code, sent.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_cluster_connection_is_rebuilt() {
    crate::needs_redis!();
    let s = setup("rebuild").await;
    assert_eq!(join(&s.app, "before").await.0, 201);
    let connections = s.proxy.resp2_accepted();

    s.proxy.silence();
    let silenced = Instant::now();
    let mut answers = Vec::new();
    let mut i = 0;
    loop {
        let (code, took) = join(&s.app, &format!("b{i}")).await;
        i += 1;
        answers.push((silenced.elapsed().as_millis(), code, took.as_millis()));
        if (200..300).contains(&code) {
            break;
        }
        assert_eq!(code, 503, "a silent store fails closed: {answers:?}");
        assert!(
            silenced.elapsed() < REBUILT_WITHIN,
            "the store still answers nothing {REBUILT_WITHIN:?} after its connection went silent \
             (ms since the silence, status, ms taken): {answers:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("answers after the silence (ms since, status, ms taken): {answers:?}");
    assert_eq!(
        answers[0].1, 503,
        "the silence reached the store's connection: {answers:?}"
    );
    assert!(
        s.proxy.resp2_accepted() > connections,
        "the store answers again over a new connection ({} before, {} now)",
        connections,
        s.proxy.resp2_accepted()
    );
    // And keeps answering.
    for j in 0..3 {
        assert_eq!(join(&s.app, &format!("after{j}")).await.0, 201);
    }
    s.app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_slow_for_fewer_calls_keeps_its_connection() {
    crate::needs_redis!();
    let s = setup("keep").await;
    assert_eq!(join(&s.app, "before").await.0, 201);
    let connections = s.proxy.resp2_accepted();

    // One call times out (2 s); the silence ends well before the timeouts
    // could span the 5 s that makes a rebuild.
    s.proxy.silence();
    let (code, took) = join(&s.app, "during").await;
    assert_eq!(code, 503, "the silence reached the store's connection");
    s.proxy.heal();
    eprintln!("the join during the silence took {took:?}");

    let (code, took) = join(&s.app, "after").await;
    assert_eq!(code, 201, "the store answers again once healed");
    assert!(
        took < Duration::from_secs(1),
        "at once, not after a timeout: {took:?}"
    );
    // A rebuild would have been started by a timeout already seen; give
    // one the time to connect before counting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(join(&s.app, "later").await.0, 201);
    assert_eq!(
        s.proxy.resp2_accepted(),
        connections,
        "the connection was kept: the store made no new one"
    );
    s.app.stop().await;
}
