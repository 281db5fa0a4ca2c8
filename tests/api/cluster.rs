//! Redis Cluster: the binary on a 3-master cluster the tests start, queues
//! spread over every master, streams fanned out by sharded pub/sub across
//! two instances, and the flags' mistakes refused at start.

use std::sync::Arc;
use std::time::Duration;

use waitroom::Config;
use waitroom::store::redis::{RedisOptions, RedisStore, Topology};

use crate::common::cluster::shared_cluster;
use crate::common::{BinApp, TestApp, config, eventually, unique_prefix};
use crate::sse::every_ready_exactly_once;

async fn cluster() -> &'static crate::common::cluster::SharedCluster {
    tokio::task::spawn_blocking(shared_cluster).await.unwrap()
}

async fn store(prefix: &str) -> Arc<RedisStore> {
    let options = RedisOptions {
        topology: Topology::from_flags(&cluster().await.seeds, true).unwrap(),
        wait_replicas: 0,
    };
    Arc::new(RedisStore::open(&options, prefix).await.unwrap())
}

/// Before cluster support the binary exited at start with `MOVED`. Now it
/// serves one queue on each master: a join, a wait, an admission, on every
/// one.
#[tokio::test]
async fn the_binary_serves_a_queue_on_every_master() {
    crate::needs_redis!();
    let cluster = cluster().await;
    let prefix = unique_prefix("bin-cluster");
    let queues = cluster.queues.join(",");
    let app = BinApp::spawn(&[
        "--redis-cluster",
        "--redis-url",
        &cluster.seeds,
        "--key-prefix",
        &prefix,
        "--queues",
        &queues,
        "--admission-interval-ms",
        "100",
        "--admission-batch",
        "1",
    ])
    .await;
    let client = reqwest::Client::new();
    for queue in &cluster.queues {
        let mut tickets = Vec::new();
        for user in ["first", "second"] {
            let r = client
                .post(app.url(&format!("/api/queues/{queue}/entries")))
                .header("X-User-Id", user)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201, "join {queue}");
            let body: serde_json::Value = r.json().await.unwrap();
            tickets.push(body["ticket"].as_str().unwrap().to_owned());
        }
        // The second waited behind the first; admission reaches them.
        eventually(
            Duration::from_secs(10),
            "the second user is admitted",
            || async {
                let body: serde_json::Value = client
                    .get(app.url(&format!("/api/queues/{queue}/position")))
                    .header("X-User-Id", "second")
                    .header("X-Queue-Ticket", &tickets[1])
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                (body["status"] == "READY").then_some(())
            },
        )
        .await;
    }
}

/// Two instances, one queue on each of the three masters at once: every
/// stream gets exactly one `ready`, whichever instance it is on and
/// whichever master holds its queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_deliver_every_ready_exactly_once_on_every_master() {
    crate::needs_redis!();
    let cluster = cluster().await;
    let prefix = unique_prefix("sse-cluster");
    let queues = cluster.queues.join(",");
    let args = [
        "--key-prefix",
        &prefix,
        "--queues",
        &queues,
        "--admission-interval-ms",
        "200",
        "--admission-batch",
        "10",
        "--ticket-secret",
        "sse-cluster-secret-0123456789",
    ];
    let a = TestApp::spawn_with(config(&args), store(&prefix).await).await;
    let b = TestApp::spawn_with(config(&args), store(&prefix).await).await;
    futures::future::join_all(
        cluster
            .queues
            .iter()
            .map(|q| every_ready_exactly_once(&a, &b, q)),
    )
    .await;
    a.stop().await;
    b.stop().await;
}

/// Events go over sharded pub/sub: the queue's master has our sharded
/// subscriber, and no node has a classic subscriber on the channel (a
/// plain `PUBLISH` would be copied to every node of the cluster).
#[tokio::test]
async fn events_ride_sharded_pub_sub_on_the_queues_master() {
    crate::needs_redis!();
    let cluster = cluster().await;
    let prefix = unique_prefix("sharded");
    let queue = &cluster.queues[1];
    let app = TestApp::spawn_with(
        config(&["--key-prefix", &prefix, "--queues", queue]),
        store(&prefix).await,
    )
    .await;
    let channel = format!("{prefix}:{{{queue}}}:events");
    let seeds: Vec<String> = cluster.seeds.split(',').map(str::to_owned).collect();
    let count = |sub: &'static str| {
        let seeds = seeds.clone();
        let channel = channel.clone();
        async move {
            let mut total = 0;
            for seed in &seeds {
                let client = redis::Client::open(seed.as_str()).unwrap();
                let mut c = client.get_multiplexed_async_connection().await.unwrap();
                let (_, n): (String, i64) = redis::cmd("PUBSUB")
                    .arg(sub)
                    .arg(&channel)
                    .query_async(&mut c)
                    .await
                    .unwrap();
                total += n;
            }
            total
        }
    };
    eventually(Duration::from_secs(5), "one sharded subscriber", || async {
        (count("SHARDNUMSUB").await == 1).then_some(())
    })
    .await;
    assert_eq!(count("NUMSUB").await, 0, "no classic subscription");
    app.stop().await;
}

/// The cluster flags without a Redis, or seeds without `--redis-cluster`,
/// are refused at start rather than half-working.
#[test]
fn cluster_flags_that_cannot_work_are_refused() {
    crate::needs_redis!();
    for args in [
        vec!["--redis-cluster"],
        vec!["--redis-wait-replicas", "1"],
        vec!["--redis-url", "redis://a:1,redis://b:2"],
        vec!["--redis-url", "redis://a:1", "--redis-wait-replicas", "17"],
    ] {
        let c = Config::from_args(args.clone()).expect("parses");
        assert!(c.validate().is_err(), "{args:?} must be refused");
    }
    let ok = Config::from_args([
        "--redis-cluster",
        "--redis-url",
        "redis://a:1,redis://b:2",
        "--redis-wait-replicas",
        "1",
    ])
    .unwrap();
    ok.validate().unwrap();
    assert_eq!(
        Topology::from_flags(ok.redis_url.as_deref().unwrap(), ok.redis_cluster).unwrap(),
        Topology::Cluster(vec!["redis://a:1".into(), "redis://b:2".into()])
    );
}
