//! A Redis node that lags behind the store of record — the old master
//! restarted before a failover settles, which says `ROLE master` with what
//! it had when it died — must not tell a buyer whose place is alive that it
//! is over. A ticket it has not seen (an entry above its counter, or a
//! later entry than the place it still holds for the user) is answered
//! `503 store_unavailable`, which the page retries until the store of
//! record answers; never `401 ticket_ended`, which the page takes as final.
//! Found by the fault campaign (docs/faults.md); here the lag is made on
//! purpose: two `redis-server`s of the test's own, the second a replica
//! detached (`REPLICAOF NO ONE`) so it keeps an older copy as a master.

use std::sync::Arc;
use std::time::{Duration, Instant};

use waitroom::store::redis::RedisStore;

use crate::common::redis_proc::query;
use crate::common::{IDLE, RedisProcess, SseStream, TestApp, config, unique_prefix};

const SECRET: &str = "lagging-node-secret-0123456789abcdef";

/// An instance on the Redis at `url` under `prefix` (both instances of the
/// test share the prefix and the ticket secret, as a deployment's do).
async fn instance(url: &str, prefix: &str) -> TestApp {
    let mut args = vec!["--key-prefix", prefix, "--ticket-secret", SECRET];
    args.extend_from_slice(IDLE);
    let store = Arc::new(RedisStore::connect(url, prefix).await.unwrap());
    TestApp::spawn_with(config(&args), store).await
}

/// Makes `replica` copy `master` and waits until it holds every write so far.
fn follow(replica: &RedisProcess, master: &RedisProcess) {
    let _: () = query(
        replica.port,
        redis::cmd("REPLICAOF").arg("127.0.0.1").arg(master.port),
    )
    .expect("REPLICAOF");
    // By offsets, not `WAIT`: a `WAIT` on a connection that wrote nothing
    // returns at once, whatever the replica holds.
    let offset = |port: u16, field: &str| -> Option<u64> {
        let info = query::<String>(port, redis::cmd("INFO").arg("replication"))?;
        info.lines()
            .find_map(|l| l.strip_prefix(field)?.trim().parse().ok())
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let written = offset(master.port, "master_repl_offset:");
        let held = offset(replica.port, "slave_repl_offset:");
        let up = query::<String>(replica.port, redis::cmd("INFO").arg("replication"))
            .is_some_and(|i| i.contains("master_link_status:up"));
        if up && written.is_some() && held >= written {
            return;
        }
        assert!(Instant::now() < deadline, "the replica did not catch up");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Cuts `node` loose: a master again, with what it holds now.
fn detach(node: &RedisProcess) {
    let _: () = query(node.port, redis::cmd("REPLICAOF").arg("NO").arg("ONE")).expect("detach");
}

async fn join(app: &TestApp, user: &str) -> String {
    let (code, body) = app.enter("default", user).await;
    assert!(code == 200 || code == 201, "join {user}: {code} {body}");
    body["ticket"].as_str().unwrap().to_owned()
}

/// `GET /position` with `ticket`: the status code, the error code (if any)
/// and whether a `Retry-After` came with it.
async fn position(app: &TestApp, user: &str, ticket: &str) -> (u16, String, bool) {
    let r = app
        .client
        .get(app.url("/api/queues/default/position"))
        .header("x-user-id", user)
        .header("x-queue-ticket", ticket)
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    let retry = r.headers().contains_key("retry-after");
    let body: serde_json::Value = r.json().await.unwrap_or_default();
    let error = body["error"]
        .as_str()
        .unwrap_or(body["status"].as_str().unwrap_or(""))
        .to_owned();
    (code, error, retry)
}

/// `waitroom_stale_ticket_reads_total` as the instance's `/metrics` shows
/// it (the recorder is the test process's own, so other tests add to it
/// too: only its growth by at least what this test caused is checked).
async fn stale_reads(app: &TestApp) -> f64 {
    let text = app
        .client
        .get(app.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let name = "waitroom_stale_ticket_reads_total";
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_node_answers_tickets_it_has_not_seen_with_503_not_ended() {
    crate::needs_redis!();
    let record = RedisProcess::start(false);
    let lagging = RedisProcess::start(false);
    follow(&lagging, &record);
    let prefix = unique_prefix("lagging");
    let front = instance(&record.url(), &prefix).await;

    // Before the lag: the first joiner takes the one slot (READY), the
    // others wait. The lagging node gets all of it.
    join(&front, "first").await;
    let kept = join(&front, "kept").await;
    let mover_old = join(&front, "mover").await;
    follow(&lagging, &record);
    detach(&lagging);

    // What only the store of record sees: a new arrival, and the mover
    // leaving and joining again (a later entry).
    let late = join(&front, "late").await;
    assert_eq!(front.leave("default", &mover_old).await, 204);
    let mover_new = join(&front, "mover").await;
    assert_ne!(mover_new, mover_old);

    let behind = instance(&lagging.url(), &prefix).await;
    let stale_before = stale_reads(&behind).await;

    // Tickets the lagging node has not seen: stale, retried, not over.
    for (user, ticket, what) in [
        ("late", &late, "an entry above its counter"),
        ("mover", &mover_new, "a later entry than the place it holds"),
    ] {
        let (code, error, retry) = position(&behind, user, ticket).await;
        assert_eq!(
            (code, error.as_str(), retry),
            (503, "store_unavailable", true),
            "{what}: a lagging node must not end the ticket"
        );
        let stream = SseStream::open(&behind, "default", ticket, None).await;
        assert_eq!(stream.status, 503, "{what}: the stream's opening, too");
    }
    // What it holds it answers, as it holds it.
    assert_eq!(position(&behind, "kept", &kept).await.0, 200);
    assert!(
        stale_reads(&behind).await >= stale_before + 4.0,
        "each stale answer is counted"
    );

    // The store of record answers the same tickets, and still ends what is
    // over: the mover's first ticket (they joined again), a place left.
    assert_eq!(position(&front, "late", &late).await.0, 200);
    assert_eq!(position(&front, "mover", &mover_new).await.0, 200);
    let (code, error, _) = position(&front, "mover", &mover_old).await;
    assert_eq!((code, error.as_str()), (401, "ticket_ended"));
    assert_eq!(front.leave("default", &late).await, 204);
    let (code, error, _) = position(&front, "late", &late).await;
    assert_eq!((code, error.as_str()), (401, "ticket_ended"));

    // Caught up (and a master again), the node that lagged answers as the
    // store of record does: the 503 was the lag's, nothing more.
    follow(&lagging, &record);
    detach(&lagging);
    let (code, error, _) = position(&behind, "late", &late).await;
    assert_eq!((code, error.as_str()), (401, "ticket_ended"));
    assert_eq!(position(&behind, "mover", &mover_new).await.0, 200);
    let (code, error, _) = position(&behind, "mover", &mover_old).await;
    assert_eq!((code, error.as_str()), (401, "ticket_ended"));

    behind.stop().await;
    front.stop().await;
}
