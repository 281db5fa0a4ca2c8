//! Group commit of joins on a Redis of the test's own (so its command
//! counts are the test's alone): many joins per script call, each with its
//! own outcome, in arrival order, with every limit counted per join, and
//! a dying Redis failing every join of a group alike; several groups in
//! flight at once (Redis held with `CLIENT PAUSE WRITE`, so they queue up
//! on the connection) run in the order made, a failing one fails alone,
//! and a group sent again behind a later one is refused.
//!
//! The joins are polled by `join_all` on the test's one-threaded runtime:
//! each reaches the queue's grouping task in the order of the list before
//! the task runs, so the order they must be placed in is known.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use waitroom::queue::{EntryToken, Policy, QueueName, Standing, UserId};
use waitroom::store::redis::{JoinBatch, RedisStore};
use waitroom::store::{
    AddressLimits, BuyerBudget, EnterOutcome, JoinLimits, LimitKind, Limited, LineStore, Rate,
    StoreError,
};

use crate::common::{RedisProcess, eventually};

fn q() -> QueueName {
    QueueName::parse("hot").unwrap()
}

fn u(name: &str) -> UserId {
    UserId::parse(name).unwrap()
}

/// Nobody is admitted or fast-tracked: every join waits.
fn closed() -> Policy {
    Policy {
        batch: 1,
        interval_ms: 3_600_000,
        token_ttl_ms: 300_000,
        max_active: Some(0),
        abandon_after_ms: None,
    }
}

async fn grouped(redis: &RedisProcess, max: usize) -> Arc<RedisStore> {
    deep(redis, "group", max, JoinBatch::default().depth).await
}

/// A store grouping at most `max` joins a call, with up to `depth` groups
/// of a queue in flight, its keys under `prefix`.
async fn deep(redis: &RedisProcess, prefix: &str, max: usize, depth: usize) -> Arc<RedisStore> {
    let store = RedisStore::connect(&redis.url(), prefix)
        .await
        .unwrap()
        .with_join_batch(Some(JoinBatch {
            window: Duration::from_millis(2),
            max,
            depth,
        }));
    Arc::new(store)
}

/// Script calls (`EVALSHA`, and `EVAL` after a cache miss) since the last
/// reset of the server's statistics.
fn script_calls(redis: &RedisProcess) -> u64 {
    let mut c = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut c)
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

fn reset_stats(redis: &RedisProcess) {
    let mut c = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut c).unwrap();
}

/// Loads the scripts (a first call may miss the cache): a group of two
/// (`enter_many.lua`), then a group of one (`enter.lua`); and resets the
/// counts, so a test counts its own calls only.
async fn warmed(redis: &RedisProcess, store: &RedisStore) {
    let other = QueueName::parse("warm").unwrap();
    let enter = |who: &'static str| {
        let other = &other;
        async move {
            let policy = closed();
            store
                .enter(other, &u(who), &policy, &EntryToken::generate())
                .await
        }
    };
    for joined in futures::future::join_all([enter("warm0"), enter("warm1")]).await {
        joined.unwrap();
    }
    enter("warm2").await.unwrap();
    reset_stats(redis);
}

/// One join of `user` that nobody is admitted with (see [`closed`]).
async fn join(
    store: &RedisStore,
    user: String,
    limits: JoinLimits,
) -> Result<Result<EnterOutcome, Limited>, StoreError> {
    store
        .enter_limited(&q(), &u(&user), &closed(), &EntryToken::generate(), &limits)
        .await
}

fn waiting(o: &EnterOutcome) -> (u64, u64) {
    match o.snapshot.standing {
        Standing::Waiting { rank, seq } => (rank, seq),
        ref other => panic!("expected a waiting place, got {other:?}"),
    }
}

/// The default group (256 joins, each with an address's four keys: over a
/// thousand keys a call) keeps arrival order and counts every limit per
/// join: 1,200 joins from three addresses allowed 300 places each place
/// the first 900 in order and refuse the rest, in a handful of calls.
#[tokio::test]
async fn default_groups_of_256_with_address_limits_keep_order_and_limits() {
    crate::needs_redis!();
    let redis = RedisProcess::start(false);
    let defaults = JoinBatch::default();
    assert_eq!(defaults.max, 256);
    let store = deep(&redis, "group", defaults.max, defaults.depth).await;
    warmed(&redis, &store).await;
    let limits = |i: usize| JoinLimits {
        buyer: None,
        address: Some(AddressLimits {
            key: format!("192.0.2.{}", 20 + i % 3),
            joins: None,
            places: Some(300),
        }),
    };
    let outcomes =
        futures::future::join_all((0..1200).map(|i| join(&store, format!("big{i:04}"), limits(i))))
            .await;
    for (i, outcome) in outcomes.iter().enumerate() {
        match outcome.as_ref().unwrap() {
            Ok(placed) => {
                assert!(i < 900, "join {i} is past its address's 300 places");
                assert_eq!(
                    waiting(placed).0,
                    i as u64,
                    "join {i} keeps its arrival order"
                );
            }
            Err(limited) => {
                assert!(i >= 900, "join {i} was refused within its address's places");
                assert_eq!(limited.kind, LimitKind::AddressPlaces);
            }
        }
    }
    let calls = script_calls(&redis);
    assert!(
        (1200 / 256..=10).contains(&calls),
        "1,200 joins in groups of at most 256 took {calls} calls"
    );
    let total = store.statuses(&q(), &[u("big0000")]).await.unwrap()[0].total_waiting;
    assert_eq!(total, 900);
}

#[tokio::test]
async fn five_hundred_joins_keep_their_order_in_few_calls() {
    crate::needs_redis!();
    let redis = RedisProcess::start(false);
    let store = grouped(&redis, 64).await;
    warmed(&redis, &store).await;
    let none = JoinLimits::default();
    let joins = (0..500).map(|i| {
        let store = store.clone();
        let none = none.clone();
        async move { join(&store, format!("g{i:03}"), none).await }
    });
    let outcomes = futures::future::join_all(joins).await;
    let mut last_seq = 0;
    for (i, outcome) in outcomes.iter().enumerate() {
        let outcome = outcome.as_ref().unwrap().as_ref().unwrap();
        assert!(outcome.created, "join {i} is new");
        let (rank, seq) = waiting(outcome);
        // Rank at the join: everyone sent before it, nobody after.
        assert_eq!(rank, i as u64, "join {i} keeps its arrival order");
        assert!(seq > last_seq, "entry ids follow the arrival order");
        last_seq = seq;
    }
    let calls = script_calls(&redis);
    assert!(
        (500 / 64..=250).contains(&calls),
        "500 joins in groups of at most 64 took {calls} calls"
    );
    // Read back afterwards: the same ranks, every join answered once.
    let users: Vec<UserId> = (0..500).map(|i| u(&format!("g{i:03}"))).collect();
    let now = store.statuses(&q(), &users).await.unwrap();
    for (i, s) in now.iter().enumerate() {
        assert!(matches!(s.standing, Standing::Waiting { rank, .. } if rank == i as u64));
        assert_eq!(s.total_waiting, 500);
    }
}

#[tokio::test]
async fn one_user_twice_in_a_group_takes_one_place() {
    crate::needs_redis!();
    let redis = RedisProcess::start(false);
    let store = grouped(&redis, 64).await;
    warmed(&redis, &store).await;
    let none = JoinLimits::default();
    let names = ["a", "b", "a", "c", "a"];
    let outcomes = futures::future::join_all(
        names
            .iter()
            .map(|name| join(&store, name.to_string(), none.clone())),
    )
    .await;
    assert_eq!(script_calls(&redis), 1, "all five in one group");
    let outcomes: Vec<EnterOutcome> = outcomes.into_iter().map(|o| o.unwrap().unwrap()).collect();
    let created: Vec<bool> = outcomes.iter().map(|o| o.created).collect();
    assert_eq!(created, [true, true, false, true, false]);
    let ranks: Vec<u64> = outcomes.iter().map(|o| waiting(o).0).collect();
    assert_eq!(ranks, [0, 1, 0, 2, 0]);
    let a_seq = waiting(&outcomes[0]).1;
    assert!(outcomes.iter().step_by(2).all(|o| waiting(o).1 == a_seq));
    assert_eq!(outcomes[4].snapshot.total_waiting, 3);
}

fn only(burst: u32) -> Rate {
    Rate {
        period_ms: 3_600_000,
        burst,
    }
}

#[tokio::test]
async fn limits_count_every_join_of_a_group() {
    crate::needs_redis!();
    let redis = RedisProcess::start(false);
    let store = grouped(&redis, 64).await;
    warmed(&redis, &store).await;
    let address = |key: &str, joins, places| JoinLimits {
        buyer: None,
        address: Some(AddressLimits {
            key: key.into(),
            joins,
            places,
        }),
    };
    // Places: six joins from one address, three places.
    let places = address("192.0.2.1", None, Some(3));
    let outcomes =
        futures::future::join_all((0..6).map(|i| join(&store, format!("p{i}"), places.clone())))
            .await;
    let kinds: Vec<Option<LimitKind>> = outcomes
        .into_iter()
        .map(|o| o.unwrap().err().map(|l| l.kind))
        .collect();
    let refused = Some(LimitKind::AddressPlaces);
    assert_eq!(kinds, [None, None, None, refused, refused, refused]);
    // Join rate: four joins from another address, a burst of two.
    let rate = address("192.0.2.2", Some(only(2)), None);
    let outcomes =
        futures::future::join_all((0..4).map(|i| join(&store, format!("r{i}"), rate.clone())))
            .await;
    let kinds: Vec<Option<LimitKind>> = outcomes
        .into_iter()
        .map(|o| o.unwrap().err().map(|l| l.kind))
        .collect();
    let refused = Some(LimitKind::AddressJoins);
    assert_eq!(kinds, [None, None, refused, refused]);
    // A buyer's budget: repeat joins past the grace spend it one by one.
    let budget = JoinLimits {
        buyer: Some(BuyerBudget {
            rate: only(2),
            grace_ms: 0,
        }),
        address: None,
    };
    let outcomes =
        futures::future::join_all((0..4).map(|_| join(&store, "p0".into(), budget.clone()))).await;
    let kinds: Vec<Option<LimitKind>> = outcomes
        .into_iter()
        .map(|o| o.unwrap().err().map(|l| l.kind))
        .collect();
    let refused = Some(LimitKind::Buyer);
    assert_eq!(kinds, [None, None, refused, refused]);
    assert_eq!(script_calls(&redis), 3, "each batch of joins was one group");
    let total = store.stats(&q()).await.unwrap().waiting;
    assert_eq!(total, 5, "three places and two joins at the rate");
}

/// Redis is killed (SIGKILL, AOF fsynced on every write) under a stream of
/// grouped joins: every join is answered, a place or a `503`, none hangs;
/// after the restart every acknowledged place is still there.
#[tokio::test]
async fn killing_redis_mid_group_fails_its_joins_and_loses_no_acknowledged_place() {
    crate::needs_redis!();
    let mut redis = RedisProcess::start(true);
    let store = grouped(&redis, 32).await;
    let placed = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let failed = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..16 {
        let (store, placed, failed) = (store.clone(), placed.clone(), failed.clone());
        workers.push(tokio::spawn(async move {
            for i in 0..10_000 {
                let user = format!("k{w}-{i}");
                match join(&store, user.clone(), JoinLimits::default()).await {
                    Ok(Ok(o)) => {
                        assert!(o.created);
                        placed.lock().unwrap().push(user);
                    }
                    Ok(Err(limited)) => panic!("no limits here: {limited:?}"),
                    Err(StoreError::Unavailable(_)) => {
                        failed.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    Err(other) => panic!("a dead Redis is unavailable, not {other}"),
                }
            }
        }));
    }
    eventually(Duration::from_secs(20), "some joins placed", || {
        let n = placed.lock().unwrap().len();
        async move { (n >= 500).then_some(()) }
    })
    .await;
    redis.kill();
    for w in futures::future::join_all(workers).await {
        w.unwrap();
    }
    assert!(
        failed.load(Ordering::SeqCst) > 0,
        "joins after the kill failed"
    );
    redis.restart();
    let store = RedisStore::connect(&redis.url(), "group").await.unwrap();
    let placed = placed.lock().unwrap().clone();
    let users: Vec<UserId> = placed.iter().map(|p| u(p)).collect();
    let snapshots = store.statuses(&q(), &users).await.unwrap();
    for (user, s) in placed.iter().zip(&snapshots) {
        assert!(
            matches!(s.standing, Standing::Waiting { .. }),
            "{user} was told it had a place: {s:?}"
        );
    }
}

/// A group on a line that is not empty (where a new buyer's join goes
/// straight to its place in `enter_many.lua`) mixing new buyers, repeats
/// of users already in line, a user new in the group joining again, and a
/// repeat past the buyer's budget: each join keeps its own outcome, and
/// the new places keep the order sent.
#[tokio::test]
async fn new_repeat_and_limited_joins_in_one_group_keep_their_outcomes() {
    crate::needs_redis!();
    let redis = RedisProcess::start(false);
    let store = grouped(&redis, 64).await;
    warmed(&redis, &store).await;
    let budget = JoinLimits {
        buyer: Some(BuyerBudget {
            rate: only(1),
            grace_ms: 0,
        }),
        address: None,
    };
    for name in ["x0", "x1"] {
        join(&store, name.into(), budget.clone())
            .await
            .unwrap()
            .unwrap();
    }
    reset_stats(&redis);
    let names = ["n0", "x0", "n1", "n0", "x0", "n2", "n1", "x1"];
    let outcomes = futures::future::join_all(
        names
            .iter()
            .map(|name| join(&store, name.to_string(), budget.clone())),
    )
    .await;
    assert_eq!(script_calls(&redis), 1, "all eight in one group");
    let mut kinds = Vec::new();
    let mut rows = Vec::new();
    for outcome in outcomes {
        match outcome.unwrap() {
            Ok(o) => {
                kinds.push(None);
                rows.push(Some((o.created, waiting(&o).0, waiting(&o).1)));
            }
            Err(limited) => {
                kinds.push(Some(limited.kind));
                rows.push(None);
            }
        }
    }
    let buyer = Some(LimitKind::Buyer);
    assert_eq!(kinds, [None, None, None, None, buyer, None, None, None]);
    let created: Vec<Option<bool>> = rows.iter().map(|r| r.map(|r| r.0)).collect();
    let (t, f) = (Some(true), Some(false));
    assert_eq!(created, [t, f, t, f, None, t, f, f]);
    let ranks: Vec<Option<u64>> = rows.iter().map(|r| r.map(|r| r.1)).collect();
    let r = Some;
    assert_eq!(ranks, [r(2), r(0), r(3), r(2), None, r(4), r(3), r(1)]);
    let seq = |i: usize| rows[i].unwrap().2;
    assert_eq!(seq(0), seq(3), "n0 again: the same place");
    assert_eq!(seq(2), seq(6), "n1 again: the same place");
    assert!(
        seq(1) < seq(7) && seq(7) < seq(0),
        "x0, x1 were placed first"
    );
    assert!(
        seq(0) < seq(2) && seq(2) < seq(5),
        "new places in the order sent"
    );
    assert_eq!(store.stats(&q()).await.unwrap().waiting, 5);
}

/// Joins whose shared arguments differ (here: their address limits) cannot
/// share a call: each change starts the next group, and the order holds
/// across them.
/// Token holders joining again in a group behind a line: each keeps their
/// token (the group's token check reads the queue's token HASH), and the
/// new buyers of the same group still take their places in order.
#[tokio::test]
async fn holders_joining_again_in_a_group_keep_their_tokens() {
    crate::needs_redis!();
    let redis = RedisProcess::start(false);
    let store = grouped(&redis, 64).await;
    warmed(&redis, &store).await;
    let none = JoinLimits::default();
    for name in ["h0", "h1", "w0", "w1"] {
        join(&store, name.into(), none.clone())
            .await
            .unwrap()
            .unwrap();
    }
    let open = Policy {
        max_active: None,
        interval_ms: 1,
        batch: 2,
        ..closed()
    };
    let tokens = [EntryToken::generate(), EntryToken::generate()];
    let pass = store.admit(&q(), &open, &tokens).await.unwrap();
    assert_eq!(pass.admitted.len(), 2, "h0 and h1 hold tokens");
    reset_stats(&redis);
    let names = ["h0", "n0", "h1", "n1"];
    let outcomes = futures::future::join_all(
        names
            .iter()
            .map(|name| join(&store, name.to_string(), none.clone())),
    )
    .await;
    assert_eq!(script_calls(&redis), 1, "all four in one group");
    let outcomes: Vec<EnterOutcome> = outcomes.into_iter().map(|o| o.unwrap().unwrap()).collect();
    for (i, held) in [(0, &tokens[0]), (2, &tokens[1])] {
        match &outcomes[i].snapshot.standing {
            Standing::Ready { token, .. } => assert_eq!(token, held, "{}", names[i]),
            other => panic!("{} holds a token: {other:?}", names[i]),
        }
        assert!(!outcomes[i].created);
    }
    assert_eq!(waiting(&outcomes[1]).0, 2, "n0 behind w0 and w1");
    assert_eq!(waiting(&outcomes[3]).0, 3, "n1 behind n0");
    assert_eq!(store.stats(&q()).await.unwrap().waiting, 4);
}

#[tokio::test]
async fn joins_with_other_limits_start_the_next_group_in_order() {
    crate::needs_redis!();
    let redis = RedisProcess::start(false);
    let store = grouped(&redis, 64).await;
    warmed(&redis, &store).await;
    let none = JoinLimits::default();
    let one_place = JoinLimits {
        buyer: None,
        address: Some(AddressLimits {
            key: "192.0.2.9".into(),
            joins: None,
            places: Some(1),
        }),
    };
    let plan = [
        ("m0", &none),
        ("m1", &one_place),
        ("m2", &one_place),
        ("m3", &none),
        ("m4", &none),
        ("m5", &one_place),
    ];
    let outcomes = futures::future::join_all(
        plan.iter()
            .map(|(name, limits)| join(&store, name.to_string(), (*limits).clone())),
    )
    .await;
    assert_eq!(
        script_calls(&redis),
        4,
        "none | two limited | none, none | limited"
    );
    let refused = Some(LimitKind::AddressPlaces);
    let mut kinds = Vec::new();
    let mut placed = Vec::new();
    for outcome in outcomes {
        match outcome.unwrap() {
            Ok(o) => {
                kinds.push(None);
                placed.push(waiting(&o));
            }
            Err(limited) => kinds.push(Some(limited.kind)),
        }
    }
    assert_eq!(kinds, [None, None, refused, None, None, refused]);
    let ranks: Vec<u64> = placed.iter().map(|p| p.0).collect();
    assert_eq!(ranks, [0, 1, 2, 3], "placed in the order sent");
    assert!(placed.windows(2).all(|w| w[0].1 < w[1].1), "entry ids grow");
    assert_eq!(store.stats(&q()).await.unwrap().waiting, 4);
}

/// With grouping off (`--join-batch-max 1`), each join is its own
/// `enter.lua` call and keeps every limit: a repeat join spends the
/// buyer's budget, an address's last place refuses the next.
#[tokio::test]
async fn one_call_per_join_keeps_every_limit() {
    crate::needs_redis!();
    let redis = RedisProcess::start(false);
    let store = RedisStore::connect(&redis.url(), "single")
        .await
        .unwrap()
        .with_join_batch(None);
    warmed(&redis, &store).await;
    let budget = JoinLimits {
        buyer: Some(BuyerBudget {
            rate: only(1),
            grace_ms: 0,
        }),
        address: Some(AddressLimits {
            key: "192.0.2.10".into(),
            joins: None,
            places: Some(2),
        }),
    };
    let mut kinds = Vec::new();
    for name in ["s0", "s0", "s0", "s1", "s2"] {
        let outcome = join(&store, name.into(), budget.clone()).await.unwrap();
        kinds.push(outcome.as_ref().err().map(|l| l.kind));
        if let Ok(o) = outcome {
            assert_eq!(o.created, name != "s0" || kinds.len() == 1, "{name}");
        }
    }
    assert_eq!(script_calls(&redis), 5, "one call per join");
    assert_eq!(
        kinds,
        [
            None,
            None,
            Some(LimitKind::Buyer),
            None,
            Some(LimitKind::AddressPlaces)
        ]
    );
    let now = store.statuses(&q(), &[u("s0"), u("s1")]).await.unwrap();
    let ranks: Vec<Standing> = now.into_iter().map(|s| s.standing).collect();
    assert!(matches!(ranks[0], Standing::Waiting { rank: 0, .. }));
    assert!(matches!(ranks[1], Standing::Waiting { rank: 1, .. }));
    assert_eq!(store.stats(&q()).await.unwrap().waiting, 2);
}

fn redis_cmd<T: redis::FromRedisValue>(redis: &RedisProcess, cmd: &redis::Cmd) -> T {
    let mut c = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    cmd.query(&mut c).unwrap()
}

/// Bytes Redis has read from its clients so far.
fn bytes_in(redis: &RedisProcess) -> u64 {
    let info: String = redis_cmd(redis, redis::cmd("INFO").arg("stats"));
    info.lines()
        .find_map(|l| l.strip_prefix("total_net_input_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO stats has total_net_input_bytes")
}

type Outcome = Result<Result<EnterOutcome, Limited>, StoreError>;

/// `users` join in this order while Redis runs no script (`CLIENT PAUSE
/// WRITE`): the groups the store sends queue up on its connection. Returns
/// every join's outcome and the bytes Redis read while paused (the groups
/// sent before any answered).
async fn paused_burst(
    redis: &RedisProcess,
    store: &Arc<RedisStore>,
    users: Vec<String>,
) -> (Vec<Outcome>, u64) {
    let _: () = redis_cmd(
        redis,
        redis::cmd("CLIENT").arg("PAUSE").arg(10_000).arg("WRITE"),
    );
    let before = bytes_in(redis);
    let store2 = store.clone();
    // One task polls the joins in list order: they reach the queue's
    // grouping task in that order.
    let burst = tokio::spawn(async move {
        let joins = users
            .into_iter()
            .map(|user| join(&store2, user, JoinLimits::default()));
        futures::future::join_all(joins).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = bytes_in(redis) - before;
    let _: () = redis_cmd(redis, redis::cmd("CLIENT").arg("UNPAUSE"));
    (burst.await.unwrap(), sent)
}

/// With a depth of 4, four groups are on the connection at once (four
/// times the bytes of a depth of 1 while Redis holds them), and they run
/// in the order made: every join's rank is its place in the list.
#[tokio::test]
async fn groups_in_flight_together_run_in_the_order_made() {
    crate::needs_redis!();
    let redis = RedisProcess::start(false);
    let one = deep(&redis, "one", 8, 1).await;
    let four = deep(&redis, "four", 8, 4).await;
    warmed(&redis, &one).await;
    warmed(&redis, &four).await;
    // The queue's task pipelines only once a call of its own went through
    // (see `a_cold_script_cache_costs_no_join_with_groups_in_flight`): one
    // join, then its leave, so the line is empty again.
    let first = join(&four, "w".into(), JoinLimits::default()).await;
    let (_, entry) = waiting(&first.unwrap().unwrap());
    assert!(four.leave(&q(), &u("w"), entry).await.unwrap());
    let users = |p: &str| (0..40).map(|i| format!("{p}{i:02}")).collect::<Vec<_>>();
    let (_, one_group) = paused_burst(&redis, &one, users("a")).await;
    reset_stats(&redis);
    let (outcomes, four_groups) = paused_burst(&redis, &four, users("b")).await;
    assert!(
        four_groups >= 3 * one_group,
        "depth 4 sent {four_groups} bytes before an answer, depth 1 {one_group}"
    );
    assert_eq!(script_calls(&redis), 5, "40 joins in groups of 8");
    let mut last_seq = 0;
    for (i, outcome) in outcomes.iter().enumerate() {
        let outcome = outcome.as_ref().unwrap().as_ref().unwrap();
        let (rank, seq) = waiting(outcome);
        assert_eq!(rank, i as u64, "join {i} keeps its arrival order");
        assert!(seq > last_seq, "entry ids follow the arrival order");
        last_seq = seq;
    }
}

/// Three groups in flight, the middle one failing in Redis (its first
/// buyer's token key is not a hash): its joins fail, every other join is
/// answered with its place, in the order sent, right behind the first
/// group's.
#[tokio::test]
async fn a_failing_group_among_those_in_flight_fails_alone() {
    crate::needs_redis!();
    let redis = RedisProcess::start(false);
    let store = deep(&redis, "mid", 8, 4).await;
    warmed(&redis, &store).await;
    let _: () = redis_cmd(
        &redis,
        redis::cmd("SET").arg("mid:{hot}:token:f08").arg("x"),
    );
    let users = (0..24).map(|i| format!("f{i:02}")).collect();
    let (outcomes, _) = paused_burst(&redis, &store, users).await;
    let mut placed = Vec::new();
    for (i, outcome) in outcomes.into_iter().enumerate() {
        match (i / 8, outcome) {
            (1, Err(StoreError::Protocol(_))) => {}
            (1, other) => panic!("join {i} is in the failing group: {other:?}"),
            (_, Ok(Ok(o))) => placed.push(waiting(&o)),
            (_, other) => panic!("join {i} is in a good group: {other:?}"),
        }
    }
    let ranks: Vec<u64> = placed.iter().map(|p| p.0).collect();
    assert_eq!(ranks, (0..16).collect::<Vec<u64>>(), "in the order sent");
    assert!(placed.windows(2).all(|w| w[0].1 < w[1].1), "entry ids grow");
    assert_eq!(store.stats(&q()).await.unwrap().waiting, 16);
}

/// Redis is killed while four groups wait in it unrun: every join is
/// answered `503`, none hangs; after the restart nothing of them is in
/// line and the next joins are placed from the head, in order.
#[tokio::test]
async fn killing_redis_with_groups_in_flight_answers_every_join() {
    crate::needs_redis!();
    let mut redis = RedisProcess::start(true);
    let store = deep(&redis, "gone", 8, 4).await;
    warmed(&redis, &store).await;
    let _: () = redis_cmd(
        &redis,
        redis::cmd("CLIENT").arg("PAUSE").arg(10_000).arg("WRITE"),
    );
    let store2 = store.clone();
    let burst = tokio::spawn(async move {
        let joins = (0..32).map(|i| join(&store2, format!("d{i:02}"), JoinLimits::default()));
        futures::future::join_all(joins).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.kill();
    let outcomes = tokio::time::timeout(Duration::from_secs(20), burst)
        .await
        .expect("every join answered")
        .unwrap();
    for (i, outcome) in outcomes.iter().enumerate() {
        assert!(
            matches!(outcome, Err(StoreError::Unavailable(_))),
            "join {i}: {outcome:?}"
        );
    }
    redis.restart();
    let again = eventually(Duration::from_secs(20), "joins placed again", || {
        let store = store.clone();
        async move { join(&store, "e00".into(), JoinLimits::default()).await.ok() }
    })
    .await
    .unwrap();
    assert_eq!(waiting(&again).0, 0, "nothing of the unrun groups in line");
    let next = futures::future::join_all(
        (1..10).map(|i| join(&store, format!("e{i:02}"), JoinLimits::default())),
    )
    .await;
    for (i, o) in next.into_iter().enumerate() {
        assert_eq!(waiting(&o.unwrap().unwrap()).0, i as u64 + 1);
    }
}

/// The task's fence key of `store` (made with `prefix`), once written:
/// a lone join (number 1: with nothing in flight it only reads the fence,
/// so there is none yet), then three in a paused burst (numbers 2 to 4:
/// the first sent alone, the two behind it write the fence, 4). Their
/// places are ranks 0 to 3.
async fn fence_of(redis: &RedisProcess, store: &Arc<RedisStore>, prefix: &str) -> String {
    let pattern = format!("{prefix}:{{hot}}:fence:*");
    let first = join(store, "a".into(), JoinLimits::default()).await;
    assert_eq!(waiting(&first.unwrap().unwrap()).0, 0);
    let none: Vec<String> = redis_cmd(redis, redis::cmd("KEYS").arg(&pattern));
    assert!(none.is_empty(), "a lone group writes no fence: {none:?}");
    let users = ["b1", "b2", "b3"].map(String::from).to_vec();
    let (outcomes, _) = paused_burst(redis, store, users).await;
    for (i, o) in outcomes.into_iter().enumerate() {
        assert_eq!(waiting(&o.unwrap().unwrap()).0, i as u64 + 1);
    }
    let fences: Vec<String> = redis_cmd(redis, redis::cmd("KEYS").arg(&pattern));
    assert_eq!(fences.len(), 1, "one task, one fence: {fences:?}");
    let number: u64 = redis_cmd(redis, redis::cmd("GET").arg(&fences[0]));
    assert_eq!(number, 4, "the last group sent behind one in flight");
    fences[0].clone()
}

/// A group that reaches Redis after a later group of its task (here: the
/// task's fence moved past it by hand, as a later group run would) is
/// refused, changing nothing, and its joins fail `503`, though it only
/// reads the fence (sent alone, no failure before it). After that failure
/// the task's groups write the fence again, and run.
#[tokio::test]
async fn a_group_overtaken_by_a_later_one_is_refused() {
    crate::needs_redis!();
    let redis = RedisProcess::start(false);
    let store = deep(&redis, "fence", 1, 8).await;
    let fence = fence_of(&redis, &store, "fence").await;
    let _: () = redis_cmd(&redis, redis::cmd("SET").arg(&fence).arg(6));
    let fifth = join(&store, "c".into(), JoinLimits::default()).await;
    assert!(
        matches!(fifth, Err(StoreError::Unavailable(_))),
        "group 5 after group 6: {fifth:?}"
    );
    assert_eq!(store.stats(&q()).await.unwrap().waiting, 4, "c not placed");
    let sixth = join(&store, "d".into(), JoinLimits::default()).await;
    assert_eq!(waiting(&sixth.unwrap().unwrap()).0, 4);
    let seventh = join(&store, "e".into(), JoinLimits::default()).await;
    assert_eq!(waiting(&seventh.unwrap().unwrap()).0, 5);
    let number: u64 = redis_cmd(&redis, redis::cmd("GET").arg(&fence));
    assert_eq!(number, 7, "written again after a failed group");
}

/// A lone group that only reads the fence is refused when it holds a
/// later number on each of `enter.lua`'s ways: a repeat join (its lean
/// head's second `MGET`) and a join into an empty line (past the lean
/// head: a `GET` of its own), changing nothing.
#[tokio::test]
async fn a_lone_group_reading_a_passed_fence_is_refused_on_every_path() {
    crate::needs_redis!();
    let redis = RedisProcess::start(false);

    let store = deep(&redis, "again", 1, 8).await;
    let fence = fence_of(&redis, &store, "again").await;
    let _: () = redis_cmd(&redis, redis::cmd("SET").arg(&fence).arg(6));
    let before = store.status(&q(), &u("b2"), false).await.unwrap();
    let again = join(&store, "b2".into(), JoinLimits::default()).await;
    assert!(
        matches!(again, Err(StoreError::Unavailable(_))),
        "a repeat join overtaken: {again:?}"
    );
    let after = store.status(&q(), &u("b2"), false).await.unwrap();
    assert_eq!(after.standing, before.standing, "b2 kept their place");

    let store = deep(&redis, "empty", 1, 8).await;
    let fence = fence_of(&redis, &store, "empty").await;
    for who in ["a", "b1", "b2", "b3"] {
        let s = store.status(&q(), &u(who), false).await.unwrap();
        let Standing::Waiting { seq, .. } = s.standing else {
            panic!("{who} waits: {s:?}");
        };
        assert!(store.leave(&q(), &u(who), seq).await.unwrap());
    }
    let _: () = redis_cmd(&redis, redis::cmd("SET").arg(&fence).arg(6));
    let into_empty = join(&store, "z".into(), JoinLimits::default()).await;
    assert!(
        matches!(into_empty, Err(StoreError::Unavailable(_))),
        "a join into an empty line overtaken: {into_empty:?}"
    );
    assert_eq!(store.stats(&q()).await.unwrap().waiting, 0, "z not placed");
}

/// Many joins at once against a script cache without `enter_many.lua` (a
/// fresh Redis; later a flushed cache and a restart, as after a failover):
/// with four groups allowed in flight, the task sends one group alone until
/// a call has gone through, so no group is reloaded out of order and every
/// join is placed, in a line without gaps or repeats. Pipelining groups
/// into a cold cache refused the overtaken ones (`503`).
#[tokio::test]
async fn a_cold_script_cache_costs_no_join_with_groups_in_flight() {
    crate::needs_redis!();
    let mut redis = RedisProcess::start(false);
    // As `RedisStore::connect` makes it, but for the depth.
    let store = Arc::new(
        RedisStore::connect(&redis.url(), "cold")
            .await
            .unwrap()
            .with_join_batch(Some(JoinBatch {
                depth: 4,
                ..JoinBatch::default()
            })),
    );
    async fn burst(
        store: &Arc<RedisStore>,
        from: usize,
    ) -> Vec<Result<Result<EnterOutcome, Limited>, StoreError>> {
        let mut all = Vec::new();
        for chunk in (from..from + 300).collect::<Vec<_>>().chunks(100) {
            let joins = chunk.iter().map(|i| {
                let store = store.clone();
                async move { join(&store, format!("cold{i:04}"), JoinLimits::default()).await }
            });
            all.extend(futures::future::join_all(joins).await);
        }
        all
    }
    let mut ranks: Vec<u64> = burst(&store, 0)
        .await
        .into_iter()
        .map(|r| waiting(&r.expect("placed").unwrap()).0)
        .collect();
    ranks.sort_unstable();
    assert_eq!(
        ranks,
        (0..300).collect::<Vec<u64>>(),
        "one place each, no gaps"
    );

    // The cache flushed, then Redis gone and back empty (no AOF): the
    // joins in the outage fail, and the first burst after it is whole.
    let _: () = redis_cmd(&redis, redis::cmd("SCRIPT").arg("FLUSH"));
    redis.kill();
    let lost = burst(&store, 300).await;
    assert!(lost.iter().all(|r| r.is_err()), "Redis was down");
    redis.restart();
    let mut placed = Vec::new();
    for attempt in 0.. {
        let results = burst(&store, 1_000 + attempt * 300).await;
        if results.iter().all(|r| r.is_ok()) {
            placed = results;
            break;
        }
        // The connection's first calls after the restart may still fail
        // while it reconnects; never a refused overtaken group once one
        // call went through.
        assert!(attempt < 5, "joins still failing after the restart");
        for r in &results {
            if let Err(e) = r {
                assert!(!e.to_string().contains("overtaken"), "{e}");
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(placed.len(), 300);
}

/// A burst of new places writes no presence (the dearest per-join write
/// it would otherwise make): a buyer counts as seen at their entry time
/// until a stream's touch or a poll adds them. A touch for a buyer who
/// left the line adds nothing, so once everyone is gone the queue keeps no
/// presence at all.
#[tokio::test]
async fn a_burst_writes_no_presence_until_a_buyer_is_seen() {
    crate::needs_redis!();
    let redis = RedisProcess::start(false);
    let store = deep(&redis, "presence", 64, 1).await;
    let joins = (0..100).map(|i| {
        let store = store.clone();
        async move { join(&store, format!("p{i:03}"), JoinLimits::default()).await }
    });
    for outcome in futures::future::join_all(joins).await {
        assert!(outcome.unwrap().unwrap().created);
    }
    let seen = || -> u64 { redis_cmd(&redis, redis::cmd("ZCARD").arg("presence:{hot}:seen")) };
    assert_eq!(seen(), 0, "new places write no presence");
    store.touch(&q(), &[u("p000"), u("p001")]).await.unwrap();
    store.status(&q(), &u("p002"), true).await.unwrap();
    assert_eq!(seen(), 3, "a touch and a poll add their buyer");
    let entry = match store
        .status(&q(), &u("p003"), false)
        .await
        .unwrap()
        .standing
    {
        Standing::Waiting { seq, .. } => seq,
        other => panic!("p003 waits: {other:?}"),
    };
    assert!(store.leave(&q(), &u("p003"), entry).await.unwrap());
    store.touch(&q(), &[u("p003"), u("nobody")]).await.unwrap();
    store.status(&q(), &u("p003"), true).await.unwrap();
    assert_eq!(seen(), 3, "no presence for who is not in line");
    let member: Option<f64> = redis_cmd(
        &redis,
        redis::cmd("ZSCORE").arg("presence:{hot}:seen").arg("p003"),
    );
    assert_eq!(member, None);
}
