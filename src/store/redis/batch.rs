//! Group commit of joins: one script call for many joins of one queue.
//!
//! A queue is one hash slot, so one Redis core: at one script call per
//! join, a hot queue tops out at the calls that core can run, each paying
//! its own round trip, parsing and script set-up. Here each instance keeps
//! one small task per queue that gathers the joins arriving while it waits
//! (up to [`JoinBatch::window`] after the first, or [`JoinBatch::max`]
//! joins) and sends them as one `enter_many.lua` call; each join is
//! answered from its own row.
//!
//! Strict FIFO: joins go into the group in the order they reached the task,
//! the script handles them in that order, and the task sends a queue's next
//! group only once the previous one answered, so groups cannot overtake
//! each other even over a reconnection. A failed call fails every join of
//! the group alike (`503`); the script is one atomic step, so it placed
//! either all of them or none.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::conn::Conn;
use super::{CALL_TIMEOUT, QueueKeys, Row, send_durable, split_row};
use crate::queue::{EntryToken, QueueName, UserId};
use crate::store::{StoreError, StoreResult};

/// How joins are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinBatch {
    /// How long a group waits for more joins after its first one (zero:
    /// only the joins already waiting are taken).
    pub window: Duration,
    /// The most joins in one call.
    pub max: usize,
}

impl Default for JoinBatch {
    fn default() -> Self {
        Self {
            window: Duration::from_micros(DEFAULT_WINDOW_US),
            max: DEFAULT_MAX,
        }
    }
}

/// Default of `--join-batch-window-us`.
pub const DEFAULT_WINDOW_US: u64 = 500;
/// Default of `--join-batch-max`.
pub const DEFAULT_MAX: usize = 64;

/// One join's part of an `enter_many.lua` (or `enter.lua`) call.
pub(super) struct JoinCall {
    pub user: UserId,
    /// The token issued should the join take the fast track.
    pub token: EntryToken,
    /// The client address's bucket, when the address has limits.
    pub address: Option<String>,
    /// What it shares with the other joins of its group.
    pub shared: JoinShared,
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
    fn address_limited(&self) -> bool {
        self.join_period > 0 || self.places > 0
    }

    /// Appends the 11 arguments `join_config` in `join.lua` reads, with
    /// `first_entry` as the entry counter's start should it not exist.
    pub(super) fn push_args(&self, first_entry: u64, cmd: &mut redis::Cmd) {
        cmd.arg(self.token_ttl_ms)
            .arg(self.batch)
            .arg(self.interval_ms)
            .arg(self.max_active)
            .arg(first_entry)
            .arg(self.budget_period)
            .arg(self.budget_burst)
            .arg(self.grace_ms)
            .arg(self.join_period)
            .arg(self.join_burst)
            .arg(self.places);
    }
}

/// A join's row and whether the queue is sold out (`split_row`).
type Joined = (Row, bool);

type Pending = (JoinCall, oneshot::Sender<StoreResult<Joined>>);

/// What a queue's task needs to run a group.
#[derive(Clone)]
struct Runner {
    conn: Conn,
    script: redis::Script,
    prefix: String,
    wait_replicas: u32,
    batch: JoinBatch,
}

/// The per-queue grouping tasks of one store. Dropping it closes their
/// channels, and each task ends once its last group is answered.
pub(super) struct Batcher {
    runner: Runner,
    queues: Mutex<HashMap<QueueName, mpsc::UnboundedSender<Pending>>>,
}

impl Batcher {
    pub(super) fn new(
        conn: Conn,
        script: redis::Script,
        prefix: &str,
        wait_replicas: u32,
        batch: JoinBatch,
    ) -> Self {
        Self {
            runner: Runner {
                conn,
                script,
                prefix: prefix.to_owned(),
                wait_replicas,
                batch,
            },
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

impl Runner {
    /// One queue's task: gathers a group, runs it, answers it, and again.
    async fn serve(self, keys: QueueKeys, mut rx: mpsc::UnboundedReceiver<Pending>) {
        let names = GroupKeys::new(&keys);
        // A join that did not fit the last group (other shared arguments):
        // the first of the next, so the order holds.
        let mut carried: Option<Pending> = None;
        loop {
            let first = match carried.take() {
                Some(first) => first,
                None => match rx.recv().await {
                    Some(first) => first,
                    None => break,
                },
            };
            let shared = first.0.shared;
            let mut group = vec![first];
            let deadline = Instant::now() + self.batch.window;
            while group.len() < self.batch.max {
                let next = match rx.try_recv() {
                    Ok(next) => next,
                    Err(_) => match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Ok(Some(next)) => next,
                        _ => break,
                    },
                };
                if next.0.shared != shared {
                    carried = Some(next);
                    break;
                }
                group.push(next);
            }
            // Joins whose caller gave up (timed out, or its client went
            // away) are not made: nobody would learn of the place.
            let (calls, replies): (Vec<JoinCall>, Vec<_>) = group
                .into_iter()
                .filter(|(_, reply)| !reply.is_closed())
                .unzip();
            if calls.is_empty() {
                continue;
            }
            match self.run(&keys, &names, shared, &calls).await {
                Ok(rows) => {
                    for (reply, row) in replies.into_iter().zip(rows) {
                        let _ = reply.send(Ok(row));
                    }
                }
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(same(&e)));
                    }
                }
            }
        }
    }

    /// One `enter_many.lua` call for `calls`: one row per call, in order.
    /// The command is written in one buffer: the shared arguments once,
    /// each join's keys and arguments straight from its user and address.
    async fn run(
        &self,
        keys: &QueueKeys,
        names: &GroupKeys,
        shared: JoinShared,
        calls: &[JoinCall],
    ) -> StoreResult<Vec<Joined>> {
        let per_join = if shared.address_limited() { 4 } else { 2 };
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash())
            .arg(names.queue.len() + per_join * calls.len() + 4);
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
        cmd.arg(names.stock.as_str())
            .arg(names.audit.as_str())
            .arg(names.lottery[0].as_str())
            .arg(names.lottery[1].as_str())
            .arg(keys.token_prefix.as_str())
            .arg(keys.channel.as_str());
        shared.push_args(crate::store::first_entry_id(), &mut cmd);
        for call in calls {
            cmd.arg(call.user.as_str()).arg(call.token.as_str());
        }
        let value = send_durable(
            &self.conn,
            &self.script,
            &cmd,
            &keys.channel,
            self.wait_replicas,
        )
        .await?;
        let rows: Vec<Vec<redis::Value>> =
            redis::from_redis_value(value).map_err(redis::RedisError::from)?;
        let rows = rows
            .into_iter()
            .map(split_row)
            .collect::<StoreResult<Vec<Joined>>>()?;
        if rows.len() != calls.len() {
            return Err(StoreError::Protocol(format!(
                "enter_many answered {} rows for {} joins",
                rows.len(),
                calls.len()
            )));
        }
        Ok(rows)
    }
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
    stock: String,
    audit: String,
    /// The lottery and its pre-queue (a join answers `prequeue` before a draw).
    lottery: [String; 2],
}

impl GroupKeys {
    fn new(keys: &QueueKeys) -> Self {
        let budget = keys.budget_prefix();
        let address = keys.address_prefix();
        Self {
            queue: keys.script_keys(),
            budget,
            address,
            stock: keys.stock(),
            audit: keys.audit(),
            lottery: {
                let [lot, pre, _] = keys.lottery();
                [lot, pre]
            },
        }
    }
}

/// A copy of `e` for each join of a failed group.
fn same(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
        StoreError::Protocol(m) => StoreError::Protocol(m.clone()),
    }
}
