//! Group commit of joins: one script call for many joins of one queue.
//!
//! A queue is one hash slot, so one Redis core: at one script call per
//! join, a hot queue tops out at the calls that core can run, each paying
//! its own round trip, parsing and script set-up. Here each instance keeps
//! one small task per queue that gathers the joins arriving while it waits
//! and sends them as one `enter_many.lua` call; each join is answered from
//! its own part of the reply.
//!
//! When no group of the queue is in flight, the joins waiting are sent at
//! once (waiting would only add latency while Redis has nothing of ours
//! to do); while groups are in flight, the next group gathers joins for
//! up to [`JoinBatch::window`] (or [`JoinBatch::max`] joins) and is then
//! sent behind them, up to [`JoinBatch::depth`] groups in flight (more
//! wait for the oldest to answer, and keep gathering meanwhile). So a
//! queue with a few concurrent joins keeps them pipelined as one call per
//! join would, and a hot queue gets large groups. A group of one join (an
//! idle queue's every join) goes as `enter.lua` with the task's fence:
//! `enter_many.lua`'s group tables cost Redis a fifth more for one join.
//!
//! Strict FIFO: joins go into groups in the order they reached the task,
//! the script handles a group's joins in that order, and the groups are
//! written to the connection in the order they were made (each call is
//! polled once, so queued on the connection, before the next group is
//! made); on one connection Redis runs them in that order. A group sent
//! again behind a later one (a retry after a lost connection, a script
//! cache reloaded) is refused by the script's fence (its number is below
//! that of a later group run) and its joins fail (`503`) rather than take
//! places behind later arrivals. Every call checks the fence; a group of
//! one sent with every earlier call of its task answered and none failed
//! lately (an idle queue's join) only reads it, in the `MGET` it makes
//! anyway: no earlier call can still run after it, and one that could is
//! refused by whichever later call wrote it (`fence_written`). A failed
//! call fails every join of its group alike (`503`); the groups around it
//! keep their answers.

use std::collections::HashMap;
use std::fmt::Write;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::conn::Conn;
use super::reply::{Flags, LineReply, line_reply, new_place};
use super::{CALL_TIMEOUT, QueueKeys, evalsha_for, send_durable};
use crate::queue::{EntryToken, QueueName, UserId};
use crate::store::{KnownEntry, StoreError, StoreResult};

/// How joins are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinBatch {
    /// How long a group waits for more joins after its first one while
    /// other groups of the queue are in flight (zero: only the joins
    /// already waiting are taken). With none in flight a group goes at once.
    pub window: Duration,
    /// The most joins in one call.
    pub max: usize,
    /// The most groups of one queue in flight at once (at least 1).
    pub depth: usize,
}

impl Default for JoinBatch {
    fn default() -> Self {
        Self {
            window: Duration::from_micros(DEFAULT_WINDOW_US),
            max: DEFAULT_MAX,
            depth: DEFAULT_DEPTH,
        }
    }
}

/// Default of `--join-batch-window-us`.
pub const DEFAULT_WINDOW_US: u64 = 500;
/// Default of `--join-batch-max`. Groups only reach it when that many
/// joins wait, i.e. when Redis is the bottleneck; there, a larger group
/// spreads the call's fixed cost wider (with 512-1,024 connections, 64 cost
/// Redis 1.1-1.4x the CPU per join of 256), while a call of 256 new places
/// holds Redis 0.5-1.5 ms.
pub const DEFAULT_MAX: usize = 256;
/// Default of `--join-batch-depth`: one group in flight; deeper pipelines
/// are opt-in (and even then only while the task's calls go through: see
/// `Runner::serve`).
pub const DEFAULT_DEPTH: usize = 1;

/// One join's part of an `enter_many.lua` (or `enter.lua`) call.
pub(super) struct JoinCall {
    pub user: UserId,
    /// The token issued should the join take the fast track.
    pub token: EntryToken,
    /// The client address's bucket, when the address has limits.
    pub address: Option<String>,
    /// The user's entry and its time as the store answered them earlier
    /// ([`crate::store::LineStore::enter_known`]): sent with an `enter.lua`
    /// call (a group of one included); a larger group reads the time.
    pub known: Option<KnownEntry>,
    /// What it shares with the other joins of its group.
    pub shared: JoinShared,
}

impl JoinCall {
    /// `enter.lua`'s keys after the queue's and the user's token
    /// ([`QueueKeys::enter`]): the address's only when it has limits (a
    /// placeholder address for a join without one).
    pub(super) fn enter_keys(&self, keys: &QueueKeys) -> Vec<String> {
        let address = self
            .shared
            .address_limited()
            .then(|| self.address.as_deref().unwrap_or("-"));
        keys.enter(&self.user, address)
    }

    /// `enter.lua`'s `ARGV[3..5]`: the user, the fast-track token and the
    /// packed numbers, then, when the call holds one, its known entry and
    /// time as `|entry,ms|` (in the same argument: a join without one
    /// sends nothing more).
    pub(super) fn push_enter_args(&self, cmd: &mut redis::Cmd) {
        cmd.arg(self.user.as_str()).arg(self.token.as_str());
        let mut packed = self.shared.packed(crate::store::first_entry_id());
        if let Some(k) = self.known {
            let _ = write!(packed, "|{},{}|", k.entry, k.entered_at_ms);
        }
        cmd.arg(packed);
    }
}

/// The arguments of a join besides who joins: the queue's policy and the
/// numbers of the limits. Every join of one group has the same (one call
/// sends them once, and the script parses them once); a join whose differ
/// (settings changed, a test's own limits) starts the next group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct JoinShared {
    pub token_ttl_ms: u64,
    pub batch: u32,
    pub interval_ms: u64,
    /// -1: unlimited.
    pub max_active: i64,
    /// The buyer's budget: period ms (0: none) and burst.
    pub budget_period: u64,
    pub budget_burst: u32,
    pub grace_ms: u64,
    /// The address's join rate: period ms (0: none) and burst.
    pub join_period: u64,
    pub join_burst: u32,
    /// Places per address (0: none).
    pub places: u32,
}

impl JoinShared {
    /// Whether the script reads the address's keys: only then are they sent.
    pub(super) fn address_limited(&self) -> bool {
        self.join_period > 0 || self.places > 0
    }

    /// Appends the one argument `join_config` in `join.lua` reads: the
    /// numbers packed in one string (the budget's first, so a lean head
    /// reads them with one short match), with `first_entry` as the entry
    /// counter's start should it not exist.
    pub(super) fn push_args(&self, first_entry: u64, cmd: &mut redis::Cmd) {
        cmd.arg(self.packed(first_entry));
    }

    /// The numbers [`JoinShared::push_args`] sends, in one string.
    fn packed(&self, first_entry: u64) -> String {
        format!(
            "{} {} {} {} {} {} {} {} {} {} {}",
            self.budget_period,
            self.budget_burst,
            self.grace_ms,
            first_entry,
            self.token_ttl_ms,
            self.batch,
            self.interval_ms,
            self.max_active,
            self.join_period,
            self.join_burst,
            self.places
        )
    }
}

/// A join's answer, from its own part of the group's reply.
type Joined = LineReply;

type Pending = (JoinCall, oneshot::Sender<StoreResult<Joined>>);

/// One group's call and the answering of its joins.
type GroupCall = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a queue's task needs to run a group.
struct Runner {
    conn: Conn,
    script: redis::Script,
    /// `enter.lua`, for a group of one.
    single: redis::Script,
    prefix: String,
    wait_replicas: u32,
    batch: JoinBatch,
}

/// The per-queue grouping tasks of one store. Dropping it closes their
/// channels, and each task ends once its last group is answered.
pub(super) struct Batcher {
    runner: Arc<Runner>,
    queues: Mutex<HashMap<QueueName, mpsc::UnboundedSender<Pending>>>,
}

impl Batcher {
    pub(super) fn new(
        conn: Conn,
        script: redis::Script,
        single: redis::Script,
        prefix: &str,
        wait_replicas: u32,
        batch: JoinBatch,
    ) -> Self {
        Self {
            runner: Arc::new(Runner {
                conn,
                script,
                single,
                prefix: prefix.to_owned(),
                wait_replicas,
                batch: JoinBatch {
                    depth: batch.depth.max(1),
                    ..batch
                },
            }),
            queues: Mutex::new(HashMap::new()),
        }
    }

    /// Runs `call` in the queue's next group and returns its own row.
    pub(super) async fn join(&self, queue: &QueueName, call: JoinCall) -> StoreResult<Joined> {
        let (tx, rx) = oneshot::channel();
        let mut pending = (call, tx);
        // A second try only if the task is gone (it panicked): a new one.
        for _ in 0..2 {
            let sender = self.sender(queue);
            match sender.send(pending) {
                Ok(()) => {
                    // Bounded as a call of its own would be: a join queued
                    // behind a group stuck on a silent Redis gives up, and
                    // is then left out of the next group (`serve`).
                    return match tokio::time::timeout(CALL_TIMEOUT, rx).await {
                        Ok(Ok(result)) => result,
                        Ok(Err(_)) => Err(StoreError::Unavailable("join group dropped".into())),
                        Err(_) => Err(StoreError::Unavailable(format!(
                            "no answer within {CALL_TIMEOUT:?}"
                        ))),
                    };
                }
                Err(mpsc::error::SendError(back)) => {
                    pending = back;
                    self.queues.lock().expect("batcher map").remove(queue);
                }
            }
        }
        Err(StoreError::Unavailable("join group task gone".into()))
    }

    fn sender(&self, queue: &QueueName) -> mpsc::UnboundedSender<Pending> {
        let mut queues = self.queues.lock().expect("batcher map");
        queues
            .entry(queue.clone())
            .or_insert_with(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                let keys = QueueKeys::new(&self.runner.prefix, queue);
                tokio::spawn(self.runner.clone().serve(keys, rx));
                tx
            })
            .clone()
    }
}

/// What a group is made of while it gathers.
struct Gathering {
    joins: Vec<Pending>,
    shared: JoinShared,
}

impl Gathering {
    /// Takes `next` into the group, or gives it back when its shared
    /// arguments differ (it starts the next group, so the order holds).
    fn take(&mut self, next: Pending) -> Option<Pending> {
        if next.0.shared != self.shared {
            return Some(next);
        }
        self.joins.push(next);
        None
    }
}

impl Runner {
    /// How many groups of a queue may be in flight now: `batch.depth` once
    /// the last call succeeded, else one (see `serve`).
    fn depth(&self, warm: &AtomicBool) -> usize {
        if warm.load(Ordering::Relaxed) {
            self.batch.depth
        } else {
            1
        }
    }

    /// One queue's task: gathers groups and sends them, up to
    /// `batch.depth` in flight, each answering its own joins.
    async fn serve(self: Arc<Self>, keys: QueueKeys, mut rx: mpsc::UnboundedReceiver<Pending>) {
        // The task's fence (`enter_many.lua`): its own key, so two
        // instances (or a task made again) never compare numbers.
        let names = Arc::new(GroupKeys::new(&keys, rand::random::<u64>()));
        let keys = Arc::new(keys);
        let mut number: u64 = 0;
        let mut in_flight: FuturesUnordered<GroupCall> = FuturesUnordered::new();
        // Groups are pipelined only once a call has gone through on the
        // connection as it is now (the script in Redis' cache): while it
        // is not, the client reloads the script for each group in flight
        // and may send them again out of order, which the fence would
        // refuse. So the task starts with one group in flight, and goes
        // back to one after any failed call (a lost connection, a
        // failover, a flushed script cache) until a call succeeds.
        let warm = Arc::new(AtomicBool::new(false));
        // When a call of the task last failed (its outcome unknown: it may
        // still run later, overtaken), for `fence_written`.
        let failed = Arc::new(Mutex::new(None::<Instant>));
        // The connection the groups in flight went over: the next group
        // goes over it too (one connection keeps their order), and only
        // with none in flight over the one a call made now would use (on
        // a serving thread, the thread's own: `conn/local.rs`).
        let mut conn = self.conn.pinned();
        // A join that did not fit the last group (other shared arguments):
        // the first of the next, so the order holds.
        let mut carried: Option<Pending> = None;
        let mut open = true;
        loop {
            let first = match carried.take() {
                Some(first) => first,
                None if !open => break,
                None => tokio::select! {
                    biased;
                    Some(()) = in_flight.next(), if !in_flight.is_empty() => continue,
                    next = rx.recv() => match next {
                        Some(first) => first,
                        None => {
                            open = false;
                            continue;
                        }
                    },
                },
            };
            let mut group = Gathering {
                shared: first.0.shared,
                joins: vec![first],
            };
            let deadline = Instant::now() + self.batch.window;
            while group.joins.len() < self.batch.max && carried.is_none() && open {
                if let Ok(next) = rx.try_recv() {
                    carried = group.take(next);
                    continue;
                }
                let free = in_flight.len() < self.depth(&warm);
                if free && (in_flight.is_empty() || Instant::now() >= deadline) {
                    break;
                }
                // More joins, an answer (which may free a place in flight),
                // or the end of the window, whichever comes first.
                tokio::select! {
                    biased;
                    Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
                    next = rx.recv() => match next {
                        Some(next) => carried = group.take(next),
                        None => open = false,
                    },
                    () = tokio::time::sleep_until(deadline), if free => break,
                }
            }
            // Before sending, a place in flight (when the channel closed
            // while every place was taken).
            while in_flight.len() >= self.depth(&warm) {
                in_flight.next().await;
            }
            // Joins whose caller gave up (timed out, or its client went
            // away) are not made: nobody would learn of the place.
            let (calls, replies): (Vec<JoinCall>, Vec<_>) = group
                .joins
                .into_iter()
                .filter(|(_, reply)| !reply.is_closed())
                .unzip();
            if calls.is_empty() {
                continue;
            }
            number += 1;
            if in_flight.is_empty() {
                conn = self.conn.pinned();
            }
            let order = CallOrder {
                number,
                fence: fence_written(!in_flight.is_empty(), *failed.lock().unwrap()),
            };
            let runner = self.clone();
            let conn = conn.clone();
            let (keys, names, shared) = (keys.clone(), names.clone(), group.shared);
            let (warm, failed) = (warm.clone(), failed.clone());
            let mut call: GroupCall = Box::pin(async move {
                let result = runner
                    .run(&conn, &keys, &names, order, shared, &calls)
                    .await;
                warm.store(result.is_ok(), Ordering::Relaxed);
                if result.is_err() {
                    *failed.lock().unwrap() = Some(Instant::now());
                }
                match result {
                    Ok(rows) => {
                        for (reply, row) in replies.into_iter().zip(rows) {
                            let _ = reply.send(Ok(row));
                        }
                    }
                    Err(e) => {
                        for reply in replies {
                            let _ = reply.send(Err(e.clone()));
                        }
                    }
                }
            });
            // Polled once here, so its command is queued on the connection
            // before the next group's is made: the groups reach Redis in
            // the order they were made.
            let sent =
                futures::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx).is_ready())).await;
            if !sent {
                in_flight.push(call);
            }
        }
        // The channel closed: answer the groups in flight, then end.
        while in_flight.next().await.is_some() {}
    }

    /// One `enter_many.lua` call for `calls`, the task's group `number`
    /// (one `enter.lua` call for a group of one, [`Runner::run_one`]):
    /// one row per call, in order. The command is written in one buffer:
    /// the shared arguments once, each join's keys and arguments straight
    /// from its user and address.
    async fn run(
        &self,
        conn: &Conn,
        keys: &QueueKeys,
        names: &GroupKeys,
        order: CallOrder,
        shared: JoinShared,
        calls: &[JoinCall],
    ) -> StoreResult<Vec<Joined>> {
        if let [call] = calls {
            return Ok(vec![
                self.run_one(conn, keys, &names.fence, order, call).await?,
            ]);
        }
        let per_join = if shared.address_limited() { 4 } else { 2 };
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash())
            .arg(names.queue.len() + per_join * calls.len() + 5);
        for key in &names.queue {
            cmd.arg(key.as_str());
        }
        let mut name = Vec::with_capacity(names.budget.len() + 80);
        for call in calls {
            let user = call.user.as_str().as_bytes();
            for prefix in [&keys.token_prefix, &names.budget] {
                name.clear();
                name.extend_from_slice(prefix.as_bytes());
                name.extend_from_slice(user);
                cmd.arg(name.as_slice());
            }
            if per_join == 4 {
                // Placeholder keys, which the script does not touch, for a
                // join without an address.
                let address = call.address.as_deref().unwrap_or("-");
                for suffix in [":joins", ":places"] {
                    name.clear();
                    name.extend_from_slice(names.address.as_bytes());
                    name.extend_from_slice(address.as_bytes());
                    name.extend_from_slice(suffix.as_bytes());
                    cmd.arg(name.as_slice());
                }
            }
        }
        cmd.arg(names.fence.as_str());
        for key in &names.tail {
            cmd.arg(key.as_str());
        }
        cmd.arg(keys.token_prefix.as_str())
            .arg(keys.channel.as_str());
        shared.push_args(crate::store::first_entry_id(), &mut cmd);
        cmd.arg(order.number);
        for call in calls {
            cmd.arg(call.user.as_str()).arg(call.token.as_str());
        }
        let value =
            send_durable(conn, &self.script, &cmd, &keys.channel, self.wait_replicas).await?;
        group_rows(value, calls.len())
    }

    /// A group of one: `enter.lua` as an ungrouped join calls it (so its
    /// lean head answers), with the group's number and the task's fence,
    /// which it only reads when `fence` says so.
    async fn run_one(
        &self,
        conn: &Conn,
        keys: &QueueKeys,
        fence_key: &str,
        order: CallOrder,
        call: &JoinCall,
    ) -> StoreResult<Joined> {
        let mut extra = call.enter_keys(keys);
        extra.push(fence_key.to_owned());
        let mut cmd = evalsha_for(&self.single, keys, &[&call.user], extra);
        call.push_enter_args(&mut cmd);
        cmd.arg(order.number);
        if order.fence == Fence::Read {
            cmd.arg("read");
        }
        let value =
            send_durable(conn, &self.single, &cmd, &keys.channel, self.wait_replicas).await?;
        if matches!(&value, redis::Value::BulkString(s) if s == b"overtaken") {
            return Err(overtaken());
        }
        line_reply("enter.lua", value)
    }
}

/// A call's number in its task's order, and what it does with the
/// task's fence (a group of more than one always writes it).
#[derive(Debug, Clone, Copy)]
struct CallOrder {
    number: u64,
    fence: Fence,
}

/// What a call does with its task's fence (`overtaken`, `join.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fence {
    /// Moves it to the call's number (refused if it holds a later one).
    Write,
    /// Only checks it (refused if it holds a later one).
    Read,
}

/// How long after a failed call its task's calls keep writing the fence:
/// a failed call's command may still reach Redis after later ones (resent
/// by TCP on a connection the client gave up on), for as long as Linux
/// retransmits (`tcp_retries2`: about 15 minutes by default).
const FENCE_AFTER_FAILURE: Duration = Duration::from_secs(20 * 60);

/// Whether a call must write its task's fence. An earlier call runs after
/// it only if it was unanswered as this one was sent (`behind`: still in
/// flight) or failed (its command may arrive late); such a call is refused
/// by any later one that wrote the fence, so only those write it. A call
/// sent with none in flight and no failure within
/// [`FENCE_AFTER_FAILURE`] (an idle queue's every join) only reads it:
/// every earlier call of its task has run, and none can run again.
fn fence_written(behind: bool, failed: Option<Instant>) -> Fence {
    let recently_failed = failed.is_some_and(|at| at.elapsed() < FENCE_AFTER_FAILURE);
    if behind || recently_failed {
        Fence::Write
    } else {
        Fence::Read
    }
}

fn overtaken() -> StoreError {
    StoreError::Unavailable("join group overtaken by a later one; not run".into())
}

/// Reads `enter_many.lua`'s reply for `n` joins: `{now, pass, flags}`
/// (the flags of `row_flags()`: sold out, held),
/// then, in join order, either a run of new places in line as three
/// numbers (the first one's rank and entry id, and how many: each next
/// one is one further back, with the next entry id) or one join's row.
fn group_rows(value: redis::Value, n: usize) -> StoreResult<Vec<Joined>> {
    let bad = |what: &str| StoreError::Protocol(format!("enter_many: {what}"));
    let values = match value {
        redis::Value::Array(values) => values,
        redis::Value::BulkString(s) if s == b"overtaken" => return Err(overtaken()),
        other => return Err(bad(&format!("unexpected reply {other:?}"))),
    };
    let mut values = values.into_iter();
    let int = |v: Option<redis::Value>| match v {
        Some(redis::Value::Int(i)) => Ok(i),
        other => Err(bad(&format!("expected a number, got {other:?}"))),
    };
    let now = int(values.next())?;
    let pass = int(values.next())?.max(0) as u64;
    let flags = Flags::from_bits(int(values.next())?);
    let mut rows = Vec::with_capacity(n);
    while let Some(v) = values.next() {
        rows.push(match v {
            redis::Value::Int(rank) => {
                let seq = int(values.next())?;
                let count = int(values.next())?;
                if count < 1 || rows.len() as i64 + count > n as i64 {
                    return Err(bad(&format!("a run of {count} new places")));
                }
                for i in 0..count {
                    rows.push(new_place(rank + i, seq + i, now, pass, flags));
                }
                continue;
            }
            row @ redis::Value::Array(_) => line_reply("enter_many.lua", row)?,
            other => return Err(bad(&format!("unexpected row {other:?}"))),
        });
    }
    if rows.len() != n {
        return Err(bad(&format!("{} rows for {n} joins", rows.len())));
    }
    Ok(rows)
}

/// A queue's key names a group call needs, made once per queue task
/// rather than once per join.
struct GroupKeys {
    /// `KEYS[1..8]` of every script (common.lua).
    queue: [String; 8],
    /// A user's request budget is this and the user id.
    budget: String,
    /// An address's join rate and places are this, the address, and
    /// `:joins` or `:places`.
    address: String,
    /// The task's fence (`enter_many.lua`): its last group's number.
    fence: String,
    /// The queue-wide keys every join reads last ([`QueueKeys::join_tail`]).
    tail: [String; 4],
}

impl GroupKeys {
    fn new(keys: &QueueKeys, task: u64) -> Self {
        let budget = keys.budget_prefix();
        let address = keys.address_prefix();
        Self {
            queue: keys.script_keys(),
            budget,
            address,
            fence: format!("{}fence:{task:016x}", keys.base),
            tail: keys.join_tail(),
        }
    }
}
