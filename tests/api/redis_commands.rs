//! What each script costs Redis, per call, counted by Redis itself
//! (`INFO commandstats` after `CONFIG RESETSTAT`, on a redis-server of
//! the test's own): the `evalsha` row gives the script calls and the time
//! inside them, every other row the commands the scripts ran.
//!
//! `every_script_runs_the_commands_counted` checks the exact number of
//! Redis commands per call of each buyer-facing script, by command,
//! against [`EXPECTED`]: machine-independent, so a change that adds a
//! command to a script (a new feature's cost) fails here until the table
//! says so, and the cost is a decision made in review.
//!
//! `redis_cost` (ignored; `loadtest/redis-cost.sh` runs it on a private
//! redis-server) measures Redis µs per call of every buyer-facing script
//! through the store, next to the plain one-Lua-call join of
//! `loadtest/plain-join` measured in the same run, at the line lengths
//! asked for. With `REDIS_COST_CALLGRIND` (that redis-server run under
//! valgrind's callgrind) it counts the instructions Redis spent instead
//! of its µs: the same for the same scripts and data whatever else the
//! machine does, where µs move by a fifth from run to run.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use futures::StreamExt;
use redis::AsyncCommands;
use waitroom::queue::SessionId;
use waitroom::queue::audit::AuditId;
use waitroom::queue::fairness::{
    Hash, Leaf, LeafKind, Node, append_nodes, inclusion_ranges, leaf_hash, range_nodes, root_nodes,
};
use waitroom::queue::{EntryToken, Policy, QueueName, Snapshot, Standing, UserId};
use waitroom::store::redis::{JoinBatch, RedisStore};
use waitroom::store::{
    BuyerBudget, ClaimOutcome, ClaimStore, FairnessLogStore, JoinLimits, KnownEntry, LineStore,
    LogAppend, Rate, SessionLimits, SessionStart, SessionStore,
};

use crate::common::RedisProcess;

mod meter;
use meter::{Cost, Meter};

/// Commands per call of each script, by command ("name count, ..." in
/// `INFO commandstats` names, sorted), in the case the test
/// sets up (see [`every_script_runs_the_commands_counted`]: each join its
/// own time mark, a repeat join past its grace, a pass of 10 with the
/// absent sweep on and nobody absent...). A change to a script that
/// changes a count fails the test: measure what it costs
/// (`loadtest/redis-cost.sh`), then update the row here (the failure
/// prints the rows as they now are) and the "Redis µs per call" rows of
/// docs/performance.md.
///
/// Why the rows are as they are (2026-12-04): a group of one sent with
/// nothing of its task in flight (an idle queue's join) reads the task's
/// fence in its `MGET` where it set it (`SET … GET`): its row is a plain
/// join's; one sent behind another in flight adds that `set`
/// (`src/store/redis/batch.rs`, `fence_written`). A join that marks its entry
/// time writes the counter and the last mark (`seq:mark`, read in the
/// join's `MGET`) in one `MSET` where it wrote the counter alone with a
/// `SET`; a join within the millisecond of the span's last mark then
/// reads no marks at all (`hget`, `hset` 0: not this case, whose joins
/// are each in a millisecond of their own). A poll reads the stock's
/// sold-out flag from its STRING copy in the `MGET` it makes anyway (no
/// `HGET`), and writes no presence (no `ZADD`): the HTTP layer polls
/// without `touch`, its push loop marks polling buyers seen in its
/// batched `touch.lua` with the streaming ones. Nor does it read the entry
/// time (its marks' `HGET`) when the HTTP layer sends the one it answered
/// with before (`src/http/entry_times.rs`); the next row is a poll
/// without. A repeat join likewise, when the HTTP layer sends the time it
/// answered the buyer with (`enter.lua`'s `ARGV[5]` ending `|entry,ms|`). A stream re-read reads the
/// flag the same way; an admission pass reads the hold and the copy in one
/// `MGET` (where it made an `EXISTS` of the hold), to set the copy right.
/// Entry-time marks are kept per span of 16 entry ids (128 before: a
/// look-up reads its span whole, and a long one cost more than a command);
/// an admission pass, here 16 buyers from a span's first entry, reads no
/// marks for them: their tokens carry no entry time, the marks are kept
/// while those tokens may live and read when a holder asks (a holder's
/// poll: its token's `HGET`, and the marks' when the HTTP layer sends no
/// time). So a pass drops no span while its holders' tokens live (no
/// `HDEL`; its `HMGET` reads both layouts' lowest span and how long marks
/// stay, `zcard` whether anyone holds a token), and asks whether its
/// first buyer has a time of the oldest layout, kept per user (`hget`:
/// none here, so no other is asked). A holder's
/// poll reads the sold-out flag's copy with its STRINGs, as a waiting
/// buyer's does (no `HGET` of the stock). An admission pass's absence
/// walk copies a page of the line into a scratch set
/// (`zcount` for where it goes on, `zrangestore`, `del`), asks which of
/// it are absent from presence (`zdiff`: a present buyer's last sighting
/// is never printed, where `zmscore` printed each one's) and the entry ids
/// of the few it needs (`zscore`: here the buyer it stops at), and keeps
/// where it stopped (`hset`).
const EXPECTED: &[(&str, &str)] = &[
    (
        "join (enter.lua)",
        "exists 1, hexists 1, hget 1, hset 1, mget 1, mset 1, time 1, zadd 1, zcard 1, zscore 1",
    ),
    (
        "join, group of one, idle (enter.lua, fence read)",
        "exists 1, hexists 1, hget 1, hset 1, mget 1, mset 1, time 1, zadd 1, zcard 1, zscore 1",
    ),
    (
        "repeat join (enter.lua)",
        "exists 1, hget 1, mget 1, set 1, time 1, zadd 1, zcard 1, zrank 1, zscore 1",
    ),
    (
        "repeat join, entry time known (enter.lua)",
        "exists 1, mget 1, set 1, time 1, zadd 1, zcard 1, zrank 1, zscore 1",
    ),
    (
        "poll (status.lua)",
        "mget 1, set 1, time 1, zcard 1, zrank 1, zscore 1",
    ),
    (
        "poll, entry time read (status.lua)",
        "hget 1, mget 1, set 1, time 1, zcard 1, zrank 1, zscore 1",
    ),
    ("touch (touch.lua, 1 buyer)", "time 1, zadd 1, zmscore 1"),
    (
        "stream re-read (statuses.lua, 4 buyers)",
        "mget 1, time 1, zcard 1, zmscore 1, zrank 4",
    ),
    (
        "leave (leave.lua)",
        "hdel 1, publish 1, time 1, xadd 1, zrem 2, zscore 1",
    ),
    (
        "admit (admit.lua, 16 a pass)",
        "del 1, hget 3, hmget 4, hset 3, incr 1, mget 1, publish 1, time 1, xadd 1, xrevrange 1, zadd 1, zcard 2, zcount 1, zdiff 1, zrange 2, zrangebyscore 1, zrangestore 1, zrem 1, zremrangebyrank 1, zscore 1",
    ),
    (
        "poll, holder (status.lua)",
        "hget 1, mget 1, set 1, time 1, zcard 1, zscore 1",
    ),
    (
        "poll, holder, entry time read (status.lua)",
        "hget 2, mget 1, set 1, time 1, zcard 1, zscore 1",
    ),
    ("claim (claim.lua)", "hget 1, hset 1, time 1"),
    (
        "consume (consume.lua)",
        "exists 1, hdel 1, hget 1, publish 1, time 1, xadd 1, zrem 1",
    ),
    ("release (release.lua)", "hget 1, hset 1, time 1, xadd 1"),
    (
        "session start (session_start.lua)",
        "hdel 1, hget 2, hset 2, time 1, zadd 2",
    ),
    (
        "session touch (session_touch.lua, 1 session)",
        "hget 1, time 1, zadd 2, zscore 1",
    ),
    (
        "session end (session_end.lua, one named)",
        "hdel 2, hget 3, hmget 1, time 1, xadd 1, zadd 1, zrem 1, zscore 1",
    ),
    (
        "fairness append (fair_append.lua, 64 leaves to an empty log)",
        "hget 1, hset 1, rpush 8",
    ),
    ("fairness proof (fair_nodes.lua, leaf 5 of 64)", "lindex 6"),
    ("fairness head (fair_head.lua)", "hget 1, hset 1"),
];

/// The baseline: one join as the plainest server makes it (`ZSCORE`,
/// `INCR`, `ZADD`, `ZRANK`, `ZCARD` in one Lua call).
const PLAIN_JOIN: &str = include_str!("../../loadtest/plain-join/src/join.lua");

fn user(name: &str) -> UserId {
    UserId::parse(name).unwrap()
}

/// The buyer's budget and repeat-join grace the HTTP layer passes
/// (`src/http/limit.rs`: 2 a second, 10 at once, 2 s), no address limits
/// (the load tests turn them off).
fn join_limits() -> JoinLimits {
    JoinLimits {
        buyer: Some(buyer_budget()),
        address: None,
    }
}

fn buyer_budget() -> BuyerBudget {
    BuyerBudget {
        rate: Rate {
            period_ms: 500,
            burst: 10,
        },
        grace_ms: 2_000,
    }
}

/// Joins hold the line: one fast track, then everyone waits.
fn line_policy() -> Policy {
    Policy {
        batch: 1,
        interval_ms: 3_600_000,
        token_ttl_ms: 300_000,
        max_active: None,
        abandon_after_ms: None,
    }
}

/// The admission pass as a server runs it by default (50 a pass, absent
/// buyers swept), its budget full at every pass. Its tokens live an hour,
/// and buyers are swept once absent an hour (a server's default: 120 s):
/// a run under callgrind takes many minutes (a line of 1,000,000 fills
/// in three), and within it no token expires (that has a row of its own,
/// `EXPIRING`) and no buyer is dropped; what a pass walks and writes is
/// the same.
fn admit_policy() -> Policy {
    Policy {
        batch: 50,
        interval_ms: 1,
        token_ttl_ms: 3_600_000,
        max_active: None,
        abandon_after_ms: Some(3_600_000),
    }
}

/// Buyers an admission pass admits in the cost measurement (the default
/// batch).
const ADMIT_PASS: usize = 50;

/// Buyers holding places before the measured line forms: past the small
/// encodings of Redis's sets (a ZSET listpack of at most 128 members, a
/// HASH listpack of at most 512 fields, where each look-up walks it).
const HOLDERS: usize = 600;

/// A protected site's sessions in the measurement.
const SESSION_LIMITS: SessionLimits = SessionLimits {
    idle_ms: 60_000,
    max_ms: 600_000,
};

/// Calls in flight at once when not paced.
const IN_FLIGHT: usize = 8;

/// Calls `call(i)` for i in 0..n, answers in order: with `pace` zero,
/// [`IN_FLIGHT`] at a time, so Redis runs them back to back (as when it
/// is what limits a server); else one at a time, `pace` apart (Redis idles
/// in between: each call then finds a cold core, dearer for every script
/// alike).
async fn paced<T, F: Future<Output = T>>(
    n: usize,
    pace: Duration,
    call: impl FnMut(usize) -> F,
) -> Vec<T> {
    paced_by(n, pace, IN_FLIGHT, call).await
}

/// [`paced`] with `in_flight` calls at once when not paced: 1 for a
/// baseline sent as a script under measurement is (one at a time, Redis
/// idle for each round trip in between).
async fn paced_by<T, F: Future<Output = T>>(
    n: usize,
    pace: Duration,
    in_flight: usize,
    mut call: impl FnMut(usize) -> F,
) -> Vec<T> {
    if pace.is_zero() {
        return futures::stream::iter(0..n)
            .map(call)
            .buffered(in_flight)
            .collect()
            .await;
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(call(i).await);
        tokio::time::sleep(pace).await;
    }
    out
}

/// One queue on a redis-server of the measurement's own, with a store that
/// sends one `enter.lua` per join, one that groups joins (`enter_many.lua`,
/// the default) and two that send each join as a group of its own
/// (`enter.lua` with the task's fence): pipelined, each sent behind
/// others in flight (writing the fence), and one at a time, as a server
/// whose joins do not overlap sends them (reading it).
struct Bench {
    single: RedisStore,
    grouped: RedisStore,
    grouped_one: RedisStore,
    grouped_idle: RedisStore,
    queue: QueueName,
    plain: redis::Script,
    plain_conn: redis::aio::MultiplexedConnection,
    /// The plain join's line and counter, new for each of its phases.
    plain_keys: [String; 2],
    /// A plain line as long as the measured one (fill_plain), for the
    /// plain join at the same length.
    long_keys: [String; 2],
    /// Names handed out so far (every new buyer is new).
    next: usize,
    pace: Duration,
}

/// A store that sends each join as a group of its own, up to `depth` of
/// them in flight.
async fn groups_of_one(url: &str, prefix: &str, depth: usize) -> RedisStore {
    RedisStore::connect(url, prefix)
        .await
        .unwrap()
        .with_join_batch(Some(JoinBatch {
            window: Duration::ZERO,
            max: 1,
            depth,
        }))
}

impl Bench {
    async fn open(url: &str, prefix: &str, pace: Duration) -> Self {
        let single = RedisStore::connect(url, prefix)
            .await
            .unwrap()
            .with_join_batch(None);
        let grouped = RedisStore::connect(url, prefix).await.unwrap();
        let grouped_one = groups_of_one(url, prefix, IN_FLIGHT).await;
        let grouped_idle = groups_of_one(url, prefix, 1).await;
        let plain_conn = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        Self {
            single,
            grouped,
            grouped_one,
            grouped_idle,
            queue: QueueName::parse("cost").unwrap(),
            plain: redis::Script::new(PLAIN_JOIN),
            plain_conn,
            plain_keys: [
                format!("{prefix}:{{plain}}:line"),
                format!("{prefix}:{{plain}}:seq"),
            ],
            long_keys: [
                format!("{prefix}:{{plainlong}}:line"),
                format!("{prefix}:{{plainlong}}:seq"),
            ],
            next: 0,
            pace,
        }
    }

    /// Passes that admit nobody until the absence walk has walked the
    /// whole line (its place, '~seen' in the entered HASH, stops moving):
    /// each buyer is walked once in their life (absent_since_entry,
    /// admit.lua), costed by the absence-walk row per buyer walked; left
    /// to the measured passes it would charge them the walk of the line
    /// ahead of them (a fifth to a third of their count), which the later
    /// passes of a sale do not pay again.
    async fn walk_caught_up(&self, q: &QueueName, policy: &Policy, prefix: &str) {
        let entered = format!("{prefix}:{{{q}}}:entered");
        let mut conn = self.plain_conn.clone();
        let mut last: Option<String> = None;
        for _ in 0..1_000 {
            self.single.admit(q, policy, &[]).await.unwrap();
            let now: Option<String> = conn.hget(&entered, "~seen").await.unwrap();
            if now.is_some() && now == last {
                return;
            }
            last = now;
        }
        panic!("the absence walk of {q} did not catch up in 1,000 passes");
    }

    fn fresh(&mut self, n: usize) -> Vec<UserId> {
        let users = (self.next..self.next + n)
            .map(|i| user(&format!("b{i:08}")))
            .collect();
        self.next += n;
        users
    }

    async fn join(&self, store: &RedisStore, who: &UserId) -> Snapshot {
        self.join_on(store, &self.queue, who).await
    }

    /// [`Bench::join`] on another queue.
    async fn join_on(&self, store: &RedisStore, queue: &QueueName, who: &UserId) -> Snapshot {
        store
            .enter_limited(
                queue,
                who,
                &line_policy(),
                &EntryToken::generate(),
                &join_limits(),
            )
            .await
            .unwrap()
            .expect("not limited")
            .snapshot
    }

    /// The long plain line: `length` buyers, numbered as the plain join
    /// numbers them.
    async fn fill_plain(&mut self, length: usize) {
        let mut conn = self.plain_conn.clone();
        for from in (0..length).step_by(1_000) {
            let mut zadd = redis::cmd("ZADD");
            zadd.arg(&self.long_keys[0]);
            for i in from..(from + 1_000).min(length) {
                zadd.arg(i + 1).arg(format!("l{i:08}"));
            }
            let _: () = zadd.query_async(&mut conn).await.unwrap();
        }
        let _: () = redis::cmd("SET")
            .arg(&self.long_keys[1])
            .arg(length)
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    /// `n` plain joins, new buyers each: on a line of their own (gone after
    /// them, as the baseline has always been measured), then on the long
    /// line (their places taken back after, so it keeps its length).
    async fn plain(&mut self, meter: &mut Meter, n: usize) -> Plain {
        self.plain_by(meter, n, IN_FLIGHT).await
    }

    /// [`Bench::plain`] with `in_flight` calls at once (see [`paced_by`]).
    async fn plain_by(&mut self, meter: &mut Meter, n: usize, in_flight: usize) -> Plain {
        let fresh = self.plain_on(meter, n, false, in_flight).await;
        let long = self.plain_on(meter, n, true, in_flight).await;
        Plain { fresh, long }
    }

    async fn plain_on(
        &mut self,
        meter: &mut Meter,
        n: usize,
        long: bool,
        in_flight: usize,
    ) -> Cost {
        let names: Vec<String> = self.fresh(n).iter().map(|u| u.to_string()).collect();
        let keys = if long {
            &self.long_keys
        } else {
            &self.plain_keys
        };
        let (script, pace) = (&self.plain, self.pace);
        let mut conn = self.plain_conn.clone();
        let (cost, _) = meter
            .measure(paced_by(n, pace, in_flight, |i| {
                let mut conn = conn.clone();
                let name = names[i].clone();
                async move {
                    let _: redis::Value = script
                        .key(&keys[0])
                        .key(&keys[1])
                        .arg(name)
                        .invoke_async(&mut conn)
                        .await
                        .unwrap();
                }
            }))
            .await;
        let _: () = if long {
            redis::cmd("ZREM")
                .arg(&keys[0])
                .arg(&names[..])
                .query_async(&mut conn)
                .await
                .unwrap()
        } else {
            redis::cmd("DEL")
                .arg(&keys[..])
                .query_async(&mut conn)
                .await
                .unwrap()
        };
        cost
    }
}

/// The plain join's cost measured right before a script's: on a line of
/// its own of at most the phase's calls (the baseline as first measured),
/// and on a line as long as the measured one.
struct Plain {
    fresh: Cost,
    long: Cost,
}

/// One script's measurement: its cost (rounds added up), per round the
/// µs per unit (call or buyer served) and the plain join's µs per call
/// measured right before it.
#[derive(Default)]
struct Row {
    name: &'static str,
    /// Units served per call ("call" rows: 1).
    per_call: f64,
    /// What a unit is, when not a call: "buyer", "leaf".
    per_what: &'static str,
    cost: Cost,
    /// Per round: the unit's cost, the plain join's on its own line and
    /// on the long one.
    rounds: Vec<(f64, f64, f64)>,
}

impl Row {
    fn record(&mut self, plain: &Plain, cost: Cost) {
        // Thousands of instructions under callgrind, else µs.
        let unit = |c: &Cost| {
            let total = if c.instructions > 0 {
                c.instructions as f64 / 1000.0
            } else {
                c.usec as f64
            };
            total / c.calls.max(1) as f64
        };
        self.rounds.push((
            unit(&cost) / self.per_call,
            unit(&plain.fresh),
            unit(&plain.long),
        ));
        self.cost.add(&cost);
    }

    fn median(values: impl Iterator<Item = f64>) -> f64 {
        let mut v: Vec<f64> = values.collect();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return f64::NAN;
        }
        v[v.len() / 2]
    }

    /// µs per unit, the plain join's µs per call on its own line and
    /// their ratio, the same on the long line (medians over the rounds;
    /// each ratio of its round's pair).
    fn summary(&self) -> [f64; 5] {
        let m = |f: fn(&(f64, f64, f64)) -> f64| Self::median(self.rounds.iter().map(f));
        [
            m(|r| r.0),
            m(|r| r.1),
            m(|r| r.0 / r.1),
            m(|r| r.2),
            m(|r| r.0 / r.2),
        ]
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Redis µs per call of every buyer-facing script, next to the plain
/// join, at each line length of `REDIS_COST_LINES` ("1000 100000"):
/// `REDIS_COST_URL` a redis-server of one's own (its counters are reset),
/// `REDIS_COST_CALLS` calls per script and round (100), `REDIS_COST_ROUNDS`
/// rounds (3; medians reported), `REDIS_COST_PACE_US` between calls
/// (0: [`IN_FLIGHT`] calls at a time, Redis busy; else a call at a time,
/// Redis idle in between), `REDIS_COST_TSV` a file for the rows.
#[tokio::test]
#[ignore = "a measurement: loadtest/redis-cost.sh"]
async fn redis_cost() {
    let url = std::env::var("REDIS_COST_URL").expect("REDIS_COST_URL: a redis-server of one's own");
    let lines: Vec<usize> = std::env::var("REDIS_COST_LINES")
        .unwrap_or_else(|_| "1000 100000".into())
        .split_whitespace()
        .map(|l| l.parse().unwrap())
        .collect();
    let calls: usize = env_or("REDIS_COST_CALLS", 100);
    let rounds: usize = env_or("REDIS_COST_ROUNDS", 3);
    let pace = Duration::from_micros(env_or("REDIS_COST_PACE_US", 0));
    let mut table = String::from(
        "mode\tlength\tscript\tunit\tcalls\tus_per_unit\tplain_us_per_call\tratio\tcommands_per_call\tcommands\tplain_at_length_us_per_call\tratio_at_length\n",
    );
    let mode = if std::env::var_os("REDIS_COST_CALLGRIND").is_some() {
        "instructions (thousands)".to_owned()
    } else if pace.is_zero() {
        "busy".to_owned()
    } else {
        format!("paced {} us", pace.as_micros())
    };
    for &length in &lines {
        let rows = measure_line(&url, length, calls, rounds, pace).await;
        for row in rows {
            let [us, plain, ratio, plain_long, ratio_long] = row.summary();
            let each: Vec<String> = row.rounds.iter().map(|r| format!("{:.2}", r.0)).collect();
            eprintln!("{length} {}: per round {}", row.name, each.join(" "));
            let unit = if row.per_call == 1.0 {
                "call".to_owned()
            } else {
                format!("{} ({} a call)", row.per_what, row.per_call)
            };
            table.push_str(&format!(
                "{mode}\t{length}\t{}\t{unit}\t{}\t{us:.2}\t{plain:.2}\t{ratio:.2}\t{:.2}\t{}\t{plain_long:.2}\t{ratio_long:.2}\n",
                row.name,
                row.cost.calls,
                row.cost.commands_per_call(),
                row.cost.breakdown()
            ));
        }
    }
    print!("{table}");
    if let Ok(path) = std::env::var("REDIS_COST_TSV") {
        std::fs::write(path, &table).unwrap();
    }
}

/// Every script's rows at one line length.
async fn measure_line(
    url: &str,
    length: usize,
    calls: usize,
    rounds: usize,
    pace: Duration,
) -> Vec<Row> {
    let prefix = format!("rc{length}-{:08x}", rand::random::<u32>());
    let mut b = Bench::open(url, &prefix, pace).await;
    let mut meter = Meter::connect(url).await;
    warm_up(url, &prefix).await;
    b.fill_plain(length).await;
    let started = Instant::now();

    // A sale in progress: HOLDERS buyers admitted before the line forms
    // hold places, so the active set, the token HASH and the sessions' are
    // past Redis's small encodings (HOLDERS), as in any sale of more than
    // a few hundred holders; empty ones made the first rounds' admissions,
    // claims and sessions pay for walking them.
    let holders = b.fresh(HOLDERS);
    for who in &holders {
        b.join(&b.grouped, who).await;
    }
    let hold = Policy {
        batch: 1_000,
        ..admit_policy()
    };
    let tokens: Vec<EntryToken> = (0..HOLDERS).map(|_| EntryToken::generate()).collect();
    let held = b.single.admit(&b.queue, &hold, &tokens).await.unwrap();
    // The first holder took the fast track as they joined.
    assert_eq!(held.admitted.len(), HOLDERS - 1, "the holders admitted");
    // And, as on a protected site, each holder's token is a live session
    // (the sessions' set, too, past the small encoding).
    for a in &held.admitted {
        let started = b
            .single
            .start_session(
                &b.queue,
                &a.user,
                a.seq,
                &SessionId::generate(),
                SESSION_LIMITS,
            )
            .await
            .unwrap();
        assert!(
            matches!(started, SessionStart::Started { .. }),
            "{started:?}"
        );
    }

    // The line: the first min(length, 1,000) joined one a millisecond (each
    // entry its own time mark: the measured buyers are these), the rest in
    // groups as fast as they go.
    let slow_n = length.min(1_000);
    assert!(
        rounds * calls <= slow_n,
        "calls x rounds: at most 1,000 and the line's length"
    );
    let slow = b.fresh(slow_n);
    let mut entries = Vec::with_capacity(slow_n);
    // What the HTTP layer keeps of each join's answer for the buyer's polls.
    let mut known = Vec::with_capacity(slow_n);
    for who in &slow {
        let s = b.join(&b.grouped, who).await;
        entries.push(s.entry.unwrap());
        known.push(KnownEntry {
            entry: s.entry.unwrap(),
            entered_at_ms: s.entered_at_ms.unwrap(),
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let slow_done = Instant::now();
    let bulk = b.fresh(length - slow_n);
    {
        let b = &b;
        futures::stream::iter(bulk.iter())
            .map(|who| b.join(&b.grouped, who))
            .buffer_unordered(2_048)
            .for_each(|_| async {})
            .await;
    }
    // The buyers the rounds do not measure are present (their streams
    // open: the push loop touches them), so presence, too, is past the
    // small encoding; the measured ones are touched first by their rounds.
    for chunk in slow[rounds * calls..].chunks(500) {
        b.single.touch(&b.queue, chunk).await.unwrap();
    }
    // Repeat joins are counted against the budget past their grace.
    let grace = Duration::from_millis(buyer_budget().grace_ms + 100);
    if slow_done.elapsed() < grace {
        tokio::time::sleep(grace - slow_done.elapsed()).await;
    }
    eprintln!(
        "line of {length}: filled in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let mut rows: Vec<Row> = [
        ("join (enter.lua)", 1.0),
        ("join, group of one (enter.lua, fenced)", 1.0),
        ("repeat join (enter.lua)", 1.0),
        ("poll (status.lua)", 1.0),
        ("touch (touch.lua, 1 buyer)", 1.0),
        ("stream re-read (statuses.lua)", 100.0),
        ("leave (leave.lua)", 1.0),
        ("presence (touch.lua, 100 buyers a call)", 100.0),
        ("poll, entry time read (status.lua)", 1.0),
        ("admit (admit.lua)", ADMIT_PASS as f64),
        ("claim (claim.lua)", 1.0),
        ("consume (consume.lua)", 1.0),
        ("release (release.lua)", 1.0),
        ("session start (session_start.lua)", 1.0),
        ("session touch (session_touch.lua, 1 session)", 1.0),
        ("session end (session_end.lua, one named)", 1.0),
        ("fairness append (fair_append.lua)", APPEND_LEAVES as f64),
        ("fairness proof (fair_nodes.lua)", 1.0),
        ("fairness head (fair_head.lua)", 1.0),
        ("absence walk (admit.lua, present buyers)", WALK_LINE as f64),
        ("poll, holder (status.lua)", 1.0),
        ("poll, holder, entry time read (status.lua)", 1.0),
        ("join, group of one, idle (enter.lua, fence read)", 1.0),
        (
            "token expiry (admit.lua, tokens expired unused)",
            EXPIRING as f64,
        ),
        ("repeat join, entry time known (enter.lua)", 1.0),
    ]
    .into_iter()
    .map(|(name, per_call)| Row {
        name,
        per_call,
        per_what: if name.starts_with("fairness append") {
            "leaf"
        } else if name.starts_with("absence walk") {
            "buyer walked"
        } else {
            "buyer"
        },
        ..Row::default()
    })
    .collect();
    let (q, pace) = (b.queue.clone(), b.pace);
    let budget = Some(buyer_budget().rate);
    // The entry times the slow buyers' joins answered, by buyer (the
    // holder polls send them, as the HTTP layer does).
    let known_of: std::collections::HashMap<&UserId, KnownEntry> =
        slow.iter().zip(known.iter().copied()).collect();

    for round in 0..rounds {
        // This round's buyers: waiting, each their own time mark.
        let mine = &slow[round * calls..(round + 1) * calls];
        let mine_entries = &entries[round * calls..(round + 1) * calls];

        let p = b.plain(&mut meter, calls).await;
        let new = b.fresh(calls);
        let (c, _) = meter
            .measure(paced(calls, pace, |i| b.join(&b.single, &new[i])))
            .await;
        rows[0].record(&p, c);

        let p = b.plain(&mut meter, calls).await;
        let new = b.fresh(calls);
        let (c, _) = meter
            .measure(paced(calls, pace, |i| b.join(&b.grouped_one, &new[i])))
            .await;
        rows[1].record(&p, c);

        // Its grouping task sends one call at a time (the next after the
        // answer): so is its baseline.
        let p = b.plain_by(&mut meter, calls, 1).await;
        let new = b.fresh(calls);
        let (c, _) = meter
            .measure(paced(calls, pace, |i| b.join(&b.grouped_idle, &new[i])))
            .await;
        rows[22].record(&p, c);

        let p = b.plain(&mut meter, calls).await;
        let (c, _) = meter
            .measure(paced(calls, pace, |i| b.join(&b.single, &mine[i])))
            .await;
        rows[2].record(&p, c);

        // A poll as the HTTP layer makes it: its presence is written by
        // the push loop, with many others (the presence row), and the
        // entry time is the one the join answered (src/http/entry_times.rs).
        let mine_known = &known[round * calls..(round + 1) * calls];
        let p = b.plain(&mut meter, calls).await;
        let (c, _) = meter
            .measure(paced(calls, pace, |i| {
                b.single
                    .status_known(&q, &mine[i], budget, Some(mine_known[i]))
            }))
            .await;
        rows[3].record(&p, c);

        // A poll the instance holds no entry time for (its first on this
        // instance, if it never joined here): the entry time read.
        let p = b.plain(&mut meter, calls).await;
        let (c, _) = meter
            .measure(paced(calls, pace, |i| {
                b.single.status_known(&q, &mine[i], budget, None)
            }))
            .await;
        rows[8].record(&p, c);

        // A repeat join as the HTTP layer makes it: with the entry time
        // it answered before.
        let p = b.plain(&mut meter, calls).await;
        let (c, _) = meter
            .measure(paced(calls, pace, |i| {
                join_known(&b.single, &q, &mine[i], mine_known[i])
            }))
            .await;
        rows[24].record(&p, c);

        let p = b.plain(&mut meter, calls).await;
        let (c, _) = meter
            .measure(paced(calls, pace, |i| {
                b.single.touch(&q, std::slice::from_ref(&mine[i]))
            }))
            .await;
        rows[4].record(&p, c);

        let p = b.plain(&mut meter, calls).await;
        let (c, _) = meter
            .measure(paced(calls / 10, pace, |_| b.single.statuses(&q, mine)))
            .await;
        rows[5].record(&p, c);

        let p = b.plain(&mut meter, calls).await;
        let (c, _) = meter
            .measure(paced(calls / 10, pace, |_| b.single.touch(&q, mine)))
            .await;
        rows[7].record(&p, c);

        let p = b.plain(&mut meter, calls).await;
        let (c, _) = meter
            .measure(paced(calls, pace, |i| {
                b.single.leave(&q, &mine[i], mine_entries[i])
            }))
            .await;
        rows[6].record(&p, c);
    }

    // Admission takes the head of the line: twice `calls` buyers a round,
    // whose tokens are then claimed, half consumed and half released. A
    // pass admits one for each token it is given, ADMIT_PASS; its budget
    // (a thousand a millisecond) never the limit, so passes run back to
    // back like every other script here, or paced like them.
    let admit = Policy {
        batch: 1_000,
        ..admit_policy()
    };
    for _ in 0..rounds {
        b.walk_caught_up(&q, &admit, &prefix).await;
        let p = b.plain(&mut meter, calls).await;
        let passes = 2 * calls / ADMIT_PASS;
        let (c, passes) = meter
            .measure(paced(passes, pace, |_| {
                let tokens: Vec<EntryToken> =
                    (0..ADMIT_PASS).map(|_| EntryToken::generate()).collect();
                let (b, q, admit) = (&b, &q, &admit);
                async move { b.single.admit(q, admit, &tokens).await.unwrap() }
            }))
            .await;
        let admitted: Vec<_> = passes.into_iter().flat_map(|p| p.admitted).collect();
        assert_eq!(admitted.len(), 2 * calls, "every pass admits a full batch");
        rows[9].record(&p, c);

        // A holder's poll (the page polling once the buyer is let in): with
        // the entry time the HTTP layer kept from the buyer's answers while
        // they waited, then as to an instance that kept none (the token
        // carries no time: it is read from the marks kept for holders).
        for (row, send) in [(20, true), (21, false)] {
            let p = b.plain(&mut meter, calls).await;
            let (c, answers) = meter
                .measure(paced(calls, pace, |i| {
                    let known = send.then(|| known_of[&admitted[i].user]);
                    b.single.status_known(&q, &admitted[i].user, budget, known)
                }))
                .await;
            rows[row].record(&p, c);
            for (i, answer) in answers.into_iter().enumerate() {
                let s = answer.unwrap().expect("within the budget");
                assert!(matches!(s.standing, Standing::Ready { .. }), "{s:?}");
                let at = known_of[&admitted[i].user].entered_at_ms;
                assert_eq!(s.entered_at_ms, Some(at), "a holder's entry time");
            }
        }

        let p = b.plain(&mut meter, calls).await;
        let (c, claims) = meter
            .measure(paced(admitted.len(), pace, |i| {
                b.single
                    .claim(&q, &admitted[i].user, &admitted[i].token, 30_000)
            }))
            .await;
        rows[10].record(&p, c);
        let claims: Vec<String> = claims
            .into_iter()
            .map(|c| match c.unwrap() {
                ClaimOutcome::Claimed { claim_id } => claim_id,
                other => panic!("claim: {other:?}"),
            })
            .collect();

        let p = b.plain(&mut meter, calls).await;
        let (c, _) = meter
            .measure(paced(calls, pace, |i| {
                b.single.consume(&q, &admitted[i].user, &claims[i])
            }))
            .await;
        rows[11].record(&p, c);

        let p = b.plain(&mut meter, calls).await;
        let (c, _) = meter
            .measure(paced(calls, pace, |i| {
                b.single
                    .release(&q, &admitted[calls + i].user, &claims[calls + i])
            }))
            .await;
        rows[12].record(&p, c);

        // Sessions (a protected site's): the released half hold their
        // tokens again; each starts a session, reports activity once, and
        // is ended by an operator.
        let limits = SESSION_LIMITS;
        let ids: Vec<SessionId> = (0..calls).map(|_| SessionId::generate()).collect();
        let p = b.plain(&mut meter, calls).await;
        let (c, started) = meter
            .measure(paced(calls, pace, |i| {
                let a = &admitted[calls + i];
                b.single.start_session(&q, &a.user, a.seq, &ids[i], limits)
            }))
            .await;
        for s in started {
            assert!(matches!(s.unwrap(), SessionStart::Started { .. }));
        }
        rows[13].record(&p, c);

        let p = b.plain(&mut meter, calls).await;
        let (c, _) = meter
            .measure(paced(calls, pace, |i| {
                b.single
                    .touch_sessions(&q, std::slice::from_ref(&ids[i]), limits.idle_ms)
            }))
            .await;
        rows[14].record(&p, c);

        let p = b.plain(&mut meter, calls).await;
        let (c, ended) = meter
            .measure(paced(calls, pace, |i| b.single.end_session(&q, &ids[i])))
            .await;
        assert!(ended.into_iter().all(|e| e.unwrap()), "every session ended");
        rows[15].record(&p, c);
    }

    // The public admission log, on a queue of its own: appends of
    // APPEND_LEAVES leaves (a second's audit entries of a busy queue),
    // then inclusion proofs' nodes and signed heads.
    let fq = QueueName::parse("costlog").unwrap();
    let mut log = LocalLog::default();
    for _ in 0..rounds {
        let appends: Vec<LogAppend> = (0..calls / 10)
            .map(|_| log.append(APPEND_LEAVES as u64))
            .collect();
        let p = b.plain(&mut meter, calls).await;
        let (c, done) = meter
            .measure(paced(appends.len(), pace, |i| {
                b.single.log_append(&fq, &appends[i])
            }))
            .await;
        assert!(done.into_iter().all(|d| d.unwrap()), "every append applied");
        rows[16].record(&p, c);

        let size = log.size;
        let proofs: Vec<Vec<Node>> = (0..calls)
            .map(|_| {
                let index = rand::random_range(0..size);
                inclusion_ranges(index, size)
                    .into_iter()
                    .flat_map(|(start, end)| range_nodes(start, end))
                    .collect()
            })
            .collect();
        let p = b.plain(&mut meter, calls).await;
        let (c, read) = meter
            .measure(paced(calls, pace, |i| b.single.log_nodes(&fq, &proofs[i])))
            .await;
        for (hashes, nodes) in read.into_iter().zip(&proofs) {
            assert_eq!(hashes.unwrap().len(), nodes.len());
        }
        rows[17].record(&p, c);

        let head = "h".repeat(300);
        let p = b.plain(&mut meter, calls).await;
        let (c, _) = meter
            .measure(paced(calls, pace, |i| {
                b.single.log_put_head(&fq, size + i as u64, &head)
            }))
            .await;
        rows[18].record(&p, c);
    }

    // The absence walk where every buyer is present and entered before the
    // abandon window (a sale whose waits are longer than it: each buyer is
    // walked once, the pass that walks them admitting others): passes that
    // admit nobody, each over a line of WALK_LINE present buyers of its
    // own, all of them walked. Per buyer served in such a sale, an
    // admission costs the admit row plus this one.
    let walk = Policy {
        abandon_after_ms: Some(WALK_WINDOW_MS),
        ..admit_policy()
    };
    let passes = (calls / 100).max(1);
    let lines: Vec<Vec<QueueName>> = (0..rounds)
        .map(|r| {
            (0..passes)
                .map(|i| QueueName::parse(&format!("walk{r}x{i}")).unwrap())
                .collect()
        })
        .collect();
    let mut present = Vec::new();
    for line in lines.iter().flatten() {
        // One more than the line: the first to join takes the fast track.
        let users = b.fresh(WALK_LINE + 1);
        let b = &b;
        futures::stream::iter(users.iter())
            .map(|who| async move {
                b.grouped
                    .enter(line, who, &line_policy(), &EntryToken::generate())
                    .await
                    .unwrap()
            })
            .buffer_unordered(256)
            .for_each(|_| async {})
            .await;
        present.push(users);
    }
    tokio::time::sleep(Duration::from_millis(WALK_WINDOW_MS + 100)).await;
    for (round, queues) in lines.iter().enumerate() {
        // Seen just now: within the window, so none of them is stale.
        for (i, line) in queues.iter().enumerate() {
            for chunk in present[round * passes + i].chunks(500) {
                b.single.touch(line, chunk).await.unwrap();
            }
        }
        let p = b.plain(&mut meter, calls).await;
        let (c, done) = meter
            .measure(paced(passes, pace, |i| {
                b.single.admit(&queues[i], &walk, &[])
            }))
            .await;
        for pass in done {
            let pass = pass.unwrap();
            assert!(pass.abandoned.is_empty(), "nobody is absent: {pass:?}");
            assert_eq!(pass.waiting, WALK_LINE as u64, "{pass:?}");
        }
        rows[19].record(&p, c);
    }

    // Tokens that expire unused (a buyer let in who never orders): the
    // next pass drops them, their records and index fields, and their
    // places among the holders (expire_active, common.lua). Each round,
    // EXPIRING holders of a queue of their own, admitted in one pass with
    // tokens of EXPIRING_TTL_MS; once those expired, a pass that admits
    // nobody, measured per token it drops. A token consumed or released
    // is removed by that call instead (their rows).
    let expiring = Policy {
        batch: 1_000,
        token_ttl_ms: EXPIRING_TTL_MS,
        ..admit_policy()
    };
    for round in 0..rounds {
        let eq = QueueName::parse(&format!("expiry{round}")).unwrap();
        // One more than the holders: the first to join takes the fast
        // track (its token the line policy's, which outlives the round).
        let users = b.fresh(EXPIRING + 1);
        for who in &users {
            b.join_on(&b.grouped, &eq, who).await;
        }
        let tokens: Vec<EntryToken> = (0..EXPIRING).map(|_| EntryToken::generate()).collect();
        let pass = b.single.admit(&eq, &expiring, &tokens).await.unwrap();
        assert_eq!(pass.admitted.len(), EXPIRING, "{pass:?}");
        tokio::time::sleep(Duration::from_millis(EXPIRING_TTL_MS + 100)).await;
        let p = b.plain(&mut meter, calls).await;
        let (c, _) = meter
            .measure(async { b.single.admit(&eq, &expiring, &[]).await.unwrap() })
            .await;
        let left = b.single.stats(&eq).await.unwrap();
        assert_eq!(left.active, 1, "the expired tokens dropped: {left:?}");
        rows[23].record(&p, c);
    }
    rows
}

/// Present buyers on each line an absence-walk pass walks.
const WALK_LINE: usize = 1_000;

/// Tokens that expire unused before the pass the expiry row measures
/// drops them, and how long they live.
const EXPIRING: usize = 500;
const EXPIRING_TTL_MS: u64 = 1_000;

/// The abandon window of the absence-walk measurement: its buyers joined
/// before it and were seen within it (wide enough for a pass of a
/// redis-server under callgrind).
const WALK_WINDOW_MS: u64 = 3_000;

/// Leaves per fairness-log append in the measurement.
const APPEND_LEAVES: usize = 50;

/// The measurement's copy of a log's tree (every stored node), so its
/// appends carry the nodes they complete as the fairness task computes
/// them.
#[derive(Default)]
struct LocalLog {
    size: u64,
    levels: Vec<Vec<Hash>>,
    cursor: u64,
}

impl LocalLog {
    /// The next append: `n` leaves.
    fn append(&mut self, n: u64) -> LogAppend {
        let leaves: Vec<String> = (0..n)
            .map(|i| {
                Leaf {
                    kind: LeafKind::Admitted,
                    seq: self.size + i,
                    fp: format!("{:032x}", rand::random::<u128>()),
                    pass: Some(self.size / 50),
                    at: 1_764_633_600_000 + self.size + i,
                    audit: format!("{}-0", 1_764_633_600_000 + self.size + i),
                }
                .encode()
            })
            .collect();
        let hashes: Vec<Hash> = leaves.iter().map(|l| leaf_hash(l.as_bytes())).collect();
        let edge: Vec<Hash> = root_nodes(self.size)
            .into_iter()
            .map(|n| self.levels[usize::from(n.level)][n.index as usize])
            .collect();
        let nodes = append_nodes(self.size, &edge, &hashes);
        for (level, new) in nodes.iter().enumerate() {
            if self.levels.len() <= level {
                self.levels.resize(level + 1, Vec::new());
            }
            self.levels[level].extend_from_slice(new);
        }
        let from_size = self.size;
        self.size += n;
        self.cursor += n;
        LogAppend {
            from_size,
            cursor: AuditId {
                ms: 1_764_633_600_000 + self.cursor,
                seq: 0,
            },
            leaves,
            nodes,
        }
    }
}

/// Loads every script the measurement calls (a first call finds the
/// script cache empty: an `EVALSHA` refused, then a load), on a queue of
/// its own.
async fn warm_up(url: &str, prefix: &str) {
    let store = RedisStore::connect(url, prefix)
        .await
        .unwrap()
        .with_join_batch(None);
    let q = QueueName::parse("warm").unwrap();
    let policy = Policy {
        batch: 2,
        ..line_policy()
    };
    let (a, w) = (user("warm-a"), user("warm-w"));
    let limits = join_limits();
    for who in [&a, &w, &w] {
        store
            .enter_limited(&q, who, &policy, &EntryToken::generate(), &limits)
            .await
            .unwrap()
            .unwrap();
    }
    let budget = Some(buyer_budget().rate);
    store
        .status_limited(&q, &w, true, budget)
        .await
        .unwrap()
        .unwrap();
    store.touch(&q, std::slice::from_ref(&w)).await.unwrap();
    store.statuses(&q, std::slice::from_ref(&w)).await.unwrap();
    let entry = store.status(&q, &w, false).await.unwrap().entry.unwrap();
    store.leave(&q, &w, entry).await.unwrap();
    store
        .admit(&q, &admit_policy(), &[EntryToken::generate()])
        .await
        .unwrap();
    let token = match store.status(&q, &a, false).await.unwrap().standing {
        waitroom::queue::Standing::Ready { token, .. } => token,
        other => panic!("the fast track: {other:?}"),
    };
    for _ in 0..2 {
        let ClaimOutcome::Claimed { claim_id } =
            store.claim(&q, &a, token.as_str(), 1_000).await.unwrap()
        else {
            panic!("claim");
        };
        store.release(&q, &a, &claim_id).await.unwrap();
        store.consume(&q, &a, &claim_id).await.unwrap();
    }
    // A session on a second buyer's token (the line is empty again, so
    // they take the fast track), and a fairness log: every
    // script in the script cache before anything is measured (a script's
    // first call loads it, which no row should pay).
    let s = user("warm-s");
    store
        .enter_limited(&q, &s, &policy, &EntryToken::generate(), &limits)
        .await
        .unwrap()
        .unwrap();
    let seq = store.status(&q, &s, false).await.unwrap().entry.unwrap();
    let id = SessionId::generate();
    let started = store
        .start_session(&q, &s, seq, &id, SESSION_LIMITS)
        .await
        .unwrap();
    assert!(
        matches!(started, SessionStart::Started { .. }),
        "{started:?}"
    );
    store
        .touch_sessions(&q, std::slice::from_ref(&id), SESSION_LIMITS.idle_ms)
        .await
        .unwrap();
    assert!(store.end_session(&q, &id).await.unwrap(), "ended");
    let append = LocalLog::default().append(2);
    assert!(store.log_append(&q, &append).await.unwrap(), "appended");
    let proof: Vec<Node> = inclusion_ranges(0, 2)
        .into_iter()
        .flat_map(|(start, end)| range_nodes(start, end))
        .collect();
    store.log_nodes(&q, &proof).await.unwrap();
    assert!(store.log_put_head(&q, 2, "a-head").await.unwrap());
}

/// How many times each counted case runs (the counts must be the same
/// every call).
const RUNS: usize = 3;

/// Runs `call(0)` (which loads the script), then `call(1..=RUNS)`, each
/// in a millisecond of its own, and returns the commands per measured
/// call by name. Fails if they differ from call to call.
async fn commands_per_call<F: Future<Output = ()>>(
    meter: &mut Meter,
    case: &str,
    mut call: impl FnMut(usize) -> F,
) -> BTreeMap<String, u64> {
    let gap = Duration::from_millis(3);
    call(0).await;
    tokio::time::sleep(gap).await;
    meter.reset().await;
    for i in 1..=RUNS {
        call(i).await;
        tokio::time::sleep(gap).await;
    }
    let cost = meter.read().await;
    assert_eq!(cost.calls, RUNS as u64, "{case}: script calls");
    cost.commands
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| {
            assert!(
                n % RUNS as u64 == 0,
                "{case}: {name} ran {n} times in {RUNS} calls: not the same every call"
            );
            (name, n / RUNS as u64)
        })
        .collect()
}

/// Joins `n` new buyers through `store`, no pause between them.
async fn join_many(store: &RedisStore, q: &QueueName, names: &[UserId]) -> Vec<Snapshot> {
    let mut out = Vec::new();
    for who in names {
        let s = store
            .enter_limited(
                q,
                who,
                &line_policy(),
                &EntryToken::generate(),
                &join_limits(),
            )
            .await
            .unwrap()
            .unwrap()
            .snapshot;
        out.push(s);
    }
    out
}

/// A join again of `who`, in line with the entry `known` names, with the
/// time an earlier answer gave it (as the HTTP layer joins again).
async fn join_known(
    store: &RedisStore,
    q: &QueueName,
    who: &UserId,
    known: KnownEntry,
) -> Snapshot {
    store
        .enter_known(
            q,
            who,
            &line_policy(),
            &EntryToken::generate(),
            &join_limits(),
            Some(known),
        )
        .await
        .unwrap()
        .unwrap()
        .snapshot
}

/// The entry id the next join of `q` takes.
async fn next_entry(store: &RedisStore, q: &QueueName, probe: &UserId) -> u64 {
    let s = join_many(store, q, std::slice::from_ref(probe)).await;
    s[0].entry.unwrap() + 1
}

/// The span of entry ids one field of entry-time marks covers
/// (`MARK_SPAN` in `lua/common.lua`).
const MARK_SPAN: u64 = 16;

/// Entry times are kept as marks per span of [`MARK_SPAN`] entry ids, and
/// the first entry of a span writes more than the others (its span's first
/// mark): joins `q` on until the next `room` entries share a span whose
/// mark is written.
async fn inside_a_span(store: &RedisStore, q: &QueueName, tag: &str, room: u64) {
    let mut i = 0;
    loop {
        let next = next_entry(store, q, &user(&format!("{tag}-align{i}"))).await;
        i += 1;
        let offset = next % MARK_SPAN;
        if offset >= 1 && offset + room < MARK_SPAN {
            return;
        }
    }
}

#[tokio::test]
async fn every_script_runs_the_commands_counted() {
    let redis = RedisProcess::start(false);
    let url = redis.url();
    let mut meter = Meter::connect(&url).await;
    let single = RedisStore::connect(&url, "count")
        .await
        .unwrap()
        .with_join_batch(None);
    let grouped_one = groups_of_one(&url, "count", 1).await;
    let q = QueueName::parse("line").unwrap();
    let names =
        |tag: &str| -> Vec<UserId> { (0..=RUNS).map(|i| user(&format!("{tag}{i}"))).collect() };
    let mut actual: Vec<(&str, BTreeMap<String, u64>)> = Vec::new();

    // The line: the first join takes the fast track, the rest wait. These
    // wait past their grace (their repeat joins spend the budget).
    join_many(&single, &q, &[user("fast-tracked")]).await;
    let early = names("early");
    let early_joins = join_many(&single, &q, &early).await;
    let early_e: Vec<u64> = early_joins.iter().map(|s| s.entry.unwrap()).collect();
    let early_known: Vec<KnownEntry> = early_joins
        .iter()
        .map(|s| KnownEntry {
            entry: s.entry.unwrap(),
            entered_at_ms: s.entered_at_ms.unwrap(),
        })
        .collect();
    let since = Instant::now();

    inside_a_span(&single, &q, "a", RUNS as u64 + 1).await;
    let new = names("new");
    let c = commands_per_call(&mut meter, "join", |i| {
        let (single, q, who) = (&single, &q, &new[i]);
        async move {
            join_many(single, q, std::slice::from_ref(who)).await;
        }
    })
    .await;
    actual.push(("join (enter.lua)", c));

    inside_a_span(&single, &q, "b", RUNS as u64 + 1).await;
    let new = names("grouped");
    let c = commands_per_call(&mut meter, "join, group of one", |i| {
        let (store, q, who) = (&grouped_one, &q, &new[i]);
        async move {
            join_many(store, q, std::slice::from_ref(who)).await;
        }
    })
    .await;
    actual.push(("join, group of one, idle (enter.lua, fence read)", c));

    let grace = Duration::from_millis(buyer_budget().grace_ms + 100);
    tokio::time::sleep(grace.saturating_sub(since.elapsed())).await;
    let c = commands_per_call(&mut meter, "repeat join", |i| {
        let (single, q, who) = (&single, &q, &early[i]);
        async move {
            let s = join_many(single, q, std::slice::from_ref(who)).await;
            assert!(matches!(
                s[0].standing,
                waitroom::queue::Standing::Waiting { .. }
            ));
        }
    })
    .await;
    actual.push(("repeat join (enter.lua)", c));

    // As the HTTP layer joins again: with the entry time it answered
    // before, not read again.
    let c = commands_per_call(&mut meter, "repeat join, entry time known", |i| {
        let (single, q, who, known) = (&single, &q, &early[i], early_known[i]);
        async move {
            let s = join_known(single, q, who, known).await;
            assert_eq!(
                (s.entry, s.entered_at_ms),
                (Some(known.entry), Some(known.entered_at_ms))
            );
        }
    })
    .await;
    actual.push(("repeat join, entry time known (enter.lua)", c));

    // As the HTTP layer polls: no presence write in the call (the push
    // loop's batched touch marks the buyer seen), and the entry time the
    // join answered sent along (not read again); then as a poll to an
    // instance that holds no entry time for the buyer.
    let budget = Some(buyer_budget().rate);
    let c = commands_per_call(&mut meter, "poll", |i| {
        let (single, q, who, known) = (&single, &q, &early[i], early_known[i]);
        async move {
            let s = single
                .status_known(q, who, budget, Some(known))
                .await
                .unwrap()
                .expect("within the budget");
            assert_eq!(s.entered_at_ms, Some(known.entered_at_ms));
        }
    })
    .await;
    actual.push(("poll (status.lua)", c));
    let c = commands_per_call(&mut meter, "poll, entry time read", |i| {
        let (single, q, who, known) = (&single, &q, &early[i], early_known[i]);
        async move {
            let s = single
                .status_known(q, who, budget, None)
                .await
                .unwrap()
                .expect("within the budget");
            assert_eq!(s.entered_at_ms, Some(known.entered_at_ms));
        }
    })
    .await;
    actual.push(("poll, entry time read (status.lua)", c));

    let c = commands_per_call(&mut meter, "touch", |i| {
        let (single, q, who) = (&single, &q, &early[i]);
        async move {
            single.touch(q, std::slice::from_ref(who)).await.unwrap();
        }
    })
    .await;
    actual.push(("touch (touch.lua, 1 buyer)", c));

    let c = commands_per_call(&mut meter, "stream re-read", |_| {
        let (single, q, who) = (&single, &q, &early);
        async move {
            single.statuses(q, who).await.unwrap();
        }
    })
    .await;
    actual.push(("stream re-read (statuses.lua, 4 buyers)", c));

    let c = commands_per_call(&mut meter, "leave", |i| {
        let (single, q, who, entry) = (&single, &q, &early[i], early_e[i]);
        async move {
            assert!(single.leave(q, who, entry).await.unwrap(), "left");
        }
    })
    .await;
    actual.push(("leave (leave.lua)", c));

    // Admission, on a line of its own that nobody polled (the absent sweep
    // then walks one buyer), a pass of a span of marks from a span's
    // first entry: each pass drops the one span its head passed.
    let aq = QueueName::parse("admit").unwrap();
    let line: Vec<UserId> = (0..300).map(|i| user(&format!("w{i:03}"))).collect();
    let joined = join_many(&single, &aq, &line).await;
    let head = joined[1].entry.unwrap();
    let skip = (MARK_SPAN - head % MARK_SPAN) % MARK_SPAN + MARK_SPAN;
    let one_pass = |batch: u64| {
        let (single, aq) = (&single, &aq);
        async move {
            let policy = Policy {
                batch: batch as u32,
                ..admit_policy()
            };
            let tokens: Vec<EntryToken> = (0..batch).map(|_| EntryToken::generate()).collect();
            let pass = single.admit(aq, &policy, &tokens).await.unwrap();
            assert_eq!(pass.admitted.len() as u64, batch, "{pass:?}");
            pass.admitted
        }
    };
    one_pass(skip).await;
    tokio::time::sleep(Duration::from_millis(3)).await;
    let admitted = std::cell::RefCell::new(Vec::new());
    let c = commands_per_call(&mut meter, "admit", |_| {
        let pass = one_pass(MARK_SPAN);
        let admitted = &admitted;
        async move {
            let got = pass.await;
            admitted.borrow_mut().extend(got);
        }
    })
    .await;
    let admitted = admitted.into_inner();
    actual.push(("admit (admit.lua, 16 a pass)", c));

    // A holder's poll (the page polling once the buyer is let in): the
    // entry time the HTTP layer kept from the buyer's polls while they
    // waited sent along, then as to an instance that kept none (the token
    // carries no time: it is read from the marks kept for holders).
    let times: std::collections::HashMap<&UserId, KnownEntry> = line
        .iter()
        .zip(&joined)
        .map(|(who, s)| {
            let known = KnownEntry {
                entry: s.entry.unwrap(),
                entered_at_ms: s.entered_at_ms.unwrap(),
            };
            (who, known)
        })
        .collect();
    for (row, send) in [
        ("poll, holder (status.lua)", true),
        ("poll, holder, entry time read (status.lua)", false),
    ] {
        let c = commands_per_call(&mut meter, row, |i| {
            let (single, aq, a) = (&single, &aq, &admitted[i]);
            let known = times[&a.user];
            async move {
                let s = single
                    .status_known(aq, &a.user, budget, send.then_some(known))
                    .await
                    .unwrap()
                    .expect("within the budget");
                assert!(matches!(s.standing, Standing::Ready { .. }), "{s:?}");
                assert_eq!(s.entered_at_ms, Some(known.entered_at_ms));
            }
        })
        .await;
        actual.push((row, c));
    }

    let claims = std::cell::RefCell::new(Vec::new());
    let c = commands_per_call(&mut meter, "claim", |i| {
        let (single, aq, a, claims) = (&single, &aq, &admitted[i], &claims);
        async move {
            match single.claim(aq, &a.user, &a.token, 30_000).await.unwrap() {
                ClaimOutcome::Claimed { claim_id } => claims.borrow_mut().push(claim_id),
                other => panic!("claim: {other:?}"),
            }
        }
    })
    .await;
    let claims = claims.into_inner();
    actual.push(("claim (claim.lua)", c));

    let c = commands_per_call(&mut meter, "consume", |i| {
        let (single, aq, a, claim) = (&single, &aq, &admitted[i], &claims[i]);
        async move {
            assert!(
                single.consume(aq, &a.user, claim).await.unwrap(),
                "consumed"
            );
        }
    })
    .await;
    actual.push(("consume (consume.lua)", c));

    let mut claims = Vec::new();
    for a in &admitted[RUNS + 1..2 * (RUNS + 1)] {
        match single.claim(&aq, &a.user, &a.token, 30_000).await.unwrap() {
            ClaimOutcome::Claimed { claim_id } => claims.push(claim_id),
            other => panic!("claim: {other:?}"),
        }
    }
    let c = commands_per_call(&mut meter, "release", |i| {
        let (single, aq, a, claim) = (&single, &aq, &admitted[RUNS + 1 + i], &claims[i]);
        async move {
            assert!(
                single.release(aq, &a.user, claim).await.unwrap(),
                "released"
            );
        }
    })
    .await;
    actual.push(("release (release.lua)", c));

    // Sessions: the admitted buyers no claim touched hold their tokens.
    let limits = SESSION_LIMITS;
    let ids: Vec<SessionId> = (0..=RUNS).map(|_| SessionId::generate()).collect();
    let holders = &admitted[2 * (RUNS + 1)..];
    let c = commands_per_call(&mut meter, "session start", |i| {
        let (single, aq, a, id) = (&single, &aq, &holders[i], &ids[i]);
        async move {
            let started = single
                .start_session(aq, &a.user, a.seq, id, limits)
                .await
                .unwrap();
            assert!(
                matches!(started, SessionStart::Started { .. }),
                "{started:?}"
            );
        }
    })
    .await;
    actual.push(("session start (session_start.lua)", c));

    let c = commands_per_call(&mut meter, "session touch", |i| {
        let (single, aq, id) = (&single, &aq, &ids[i]);
        async move {
            let moved = single
                .touch_sessions(aq, std::slice::from_ref(id), limits.idle_ms)
                .await
                .unwrap();
            assert_eq!(moved, 1, "the deadline moved");
        }
    })
    .await;
    actual.push(("session touch (session_touch.lua, 1 session)", c));

    let c = commands_per_call(&mut meter, "session end", |i| {
        let (single, aq, id) = (&single, &aq, &ids[i]);
        async move {
            assert!(single.end_session(aq, id).await.unwrap(), "ended");
        }
    })
    .await;
    actual.push(("session end (session_end.lua, one named)", c));

    // The public admission log: each call appends 64 leaves to a log of
    // its own (so each writes the same levels), a proof reads leaf 5 of
    // the first log, and heads are stored on it.
    let logs: Vec<QueueName> = (0..=RUNS)
        .map(|i| QueueName::parse(&format!("log{i}")).unwrap())
        .collect();
    let c = commands_per_call(&mut meter, "fairness append", |i| {
        let (single, q) = (&single, &logs[i]);
        async move {
            let append = LocalLog::default().append(64);
            assert!(single.log_append(q, &append).await.unwrap(), "appended");
        }
    })
    .await;
    actual.push((
        "fairness append (fair_append.lua, 64 leaves to an empty log)",
        c,
    ));

    let proof: Vec<Node> = inclusion_ranges(5, 64)
        .into_iter()
        .flat_map(|(start, end)| range_nodes(start, end))
        .collect();
    let c = commands_per_call(&mut meter, "fairness proof", |_| {
        let (single, q, proof) = (&single, &logs[0], &proof);
        async move {
            let hashes = single.log_nodes(q, proof).await.unwrap();
            assert_eq!(hashes.len(), proof.len());
        }
    })
    .await;
    actual.push(("fairness proof (fair_nodes.lua, leaf 5 of 64)", c));

    let c = commands_per_call(&mut meter, "fairness head", |i| {
        let (single, q) = (&single, &logs[0]);
        async move {
            assert!(
                single
                    .log_put_head(q, 64 + i as u64, "a-signed-head")
                    .await
                    .unwrap()
            );
        }
    })
    .await;
    actual.push(("fairness head (fair_head.lua)", c));

    let line = |c: &BTreeMap<String, u64>| -> String {
        c.iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let actual: Vec<(&str, String)> = actual.iter().map(|(case, c)| (*case, line(c))).collect();
    let rows: String = actual
        .iter()
        .map(|(case, c)| format!("    (\"{case}\", \"{c}\"),\n"))
        .collect();
    let expected: Vec<(&str, String)> = EXPECTED
        .iter()
        .map(|(case, c)| (*case, (*c).to_owned()))
        .collect();
    assert!(
        actual == expected,
        "Redis commands per script call changed: each command a script runs is a cost every \
         call pays. If the change is meant, measure it (loadtest/redis-cost.sh) and set \
         EXPECTED in tests/api/redis_commands.rs to what the scripts now run:\n{rows}"
    );
}

/// The absence walk copies the line a page at a time and pages widen to
/// 250 only where the server makes a set that long a skiplist: on a
/// server that keeps a thousand as a listpack (a copy into a listpack
/// costs each row a search of the page, quadratic in its length) it goes
/// on in pages of 16 after its probe of 129. Either way it drops exactly
/// the absent buyers and keeps the present ones.
#[tokio::test]
async fn the_absence_walk_pages_by_what_the_server_keeps_as_a_listpack() {
    if crate::common::skip_redis("a private redis-server") {
        return;
    }
    // 400 waiting: pages of 4, 16 and 129 (the probe), then 251 rows in
    // pages of 250 (two) or of 16 (sixteen). 100 waiting: 4, 16, then the
    // 80 left in pages of 16, no probe (a copy of 17 to 128 rows would be
    // a listpack on any server).
    for (listpack_entries, waiting, copies, probes) in [
        (128, 400, 3 + 2, 1),
        (1_000, 400, 3 + 251_usize.div_ceil(16), 1),
        (128, 100, 2 + 80 / 16, 0),
    ] {
        let redis = RedisProcess::start(false);
        let url = redis.url();
        let mut config = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("zset-max-listpack-entries")
            .arg(listpack_entries)
            .query_async(&mut config)
            .await
            .unwrap();
        let mut meter = Meter::connect(&url).await;
        let store = RedisStore::connect(&url, "walk")
            .await
            .unwrap()
            .with_join_batch(None);
        let q = QueueName::parse("walk").unwrap();
        // The first to join takes the fast track; the line waits behind.
        join_many(&store, &q, &[user("fast")]).await;
        let line: Vec<UserId> = (0..waiting).map(|i| user(&format!("w{i:03}"))).collect();
        join_many(&store, &q, &line).await;
        let window = 1_000;
        tokio::time::sleep(Duration::from_millis(window + 100)).await;
        let absent = |i: usize| i % 50 == 7 || i == waiting - 1;
        let present: Vec<UserId> = (0..waiting)
            .filter(|&i| !absent(i))
            .map(|i| line[i].clone())
            .collect();
        for chunk in present.chunks(500) {
            store.touch(&q, chunk).await.unwrap();
        }
        let policy = Policy {
            abandon_after_ms: Some(window),
            ..admit_policy()
        };
        let (cost, pass) = meter.measure(store.admit(&q, &policy, &[])).await;
        let pass = pass.unwrap();
        let mut dropped: Vec<String> = pass.abandoned.iter().map(|a| a.user.to_string()).collect();
        dropped.sort();
        let expected: Vec<String> = (0..waiting)
            .filter(|&i| absent(i))
            .map(|i| line[i].to_string())
            .collect();
        assert_eq!(
            dropped, expected,
            "zset-max-listpack-entries {listpack_entries}"
        );
        assert_eq!(pass.waiting, present.len() as u64);
        let count = |name: &str| cost.commands.get(name).copied().unwrap_or(0);
        assert_eq!(
            (count("zrangestore"), count("object|encoding")),
            (copies as u64, probes),
            "zset-max-listpack-entries {listpack_entries}, {waiting} waiting: {:?}",
            cost.commands
        );
    }
}
