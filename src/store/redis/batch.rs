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
use super::{CALL_TIMEOUT, QueueKeys, Row, eval_durable, split_row};
use crate::queue::{QueueName, UserId};
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

/// One join's part of an `enter_many.lua` call.
pub(super) struct JoinCall {
    pub user: UserId,
    /// The user's budget key and the address's joins and places keys.
    pub keys: [String; 3],
    /// The join's 13 arguments (see `join.lua`).
    pub args: Vec<Vec<u8>>,
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
        while let Some(first) = rx.recv().await {
            let mut group = vec![first];
            let deadline = Instant::now() + self.batch.window;
            while group.len() < self.batch.max {
                if let Ok(next) = rx.try_recv() {
                    group.push(next);
                    continue;
                }
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(next)) => group.push(next),
                    _ => break,
                }
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
            match self.run(&keys, &calls).await {
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
    async fn run(&self, keys: &QueueKeys, calls: &[JoinCall]) -> StoreResult<Vec<Joined>> {
        let mut all: Vec<String> = keys.script_keys().into();
        all.extend(calls.iter().map(|c| keys.token_key(&c.user)));
        all.extend(calls.iter().flat_map(|c| c.keys.iter().cloned()));
        all.push(keys.stock());
        all.push(keys.audit());
        let args = calls.iter().flat_map(|c| c.args.iter().map(Vec::as_slice));
        let value = eval_durable(
            &self.conn,
            &self.script,
            keys,
            &all,
            args,
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

/// A copy of `e` for each join of a failed group.
fn same(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
        StoreError::Protocol(m) => StoreError::Protocol(m.clone()),
    }
}
