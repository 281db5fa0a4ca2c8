//! The Redis side of adaptive admission: one hash per queue,
//! `<prefix>:{<queue>}:adaptive`, hash-tagged like the queue's settings so
//! the decision and the batch it sets are written by one script in one
//! slot. It holds the current windows' commit-time histograms and
//! rollback counts (`adaptive_record.lua`) and the last decision
//! (`adaptive_apply.lua`), which is what keeps the decision to one per
//! window however many instances run the controller.

use std::sync::LazyLock;

use redis::Script;

use async_trait::async_trait;

use super::{RedisStore, bounded};
use crate::queue::QueueName;
use crate::queue::adaptive::{BUCKETS_MS, MAX_EVIDENCE_WINDOWS, WindowSamples};
use crate::store::{
    AdaptiveRead, AdaptiveState, AdaptiveStore, OrderSignal, StoreError, StoreResult,
};

static RECORD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/adaptive_record.lua")));
static READ: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/adaptive_read.lua")));
static APPLY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/adaptive_apply.lua")));

/// How long the hash outlives its last write: long enough for a decision
/// to be shown in the console between two sales, short enough that a
/// queue whose adaptive admission was switched off leaves nothing behind.
pub(crate) fn keep_ms(window_ms: u64) -> u64 {
    (window_ms * 20).max(60_000)
}

/// The raw reply of `adaptive_read.lua`.
type ReadReply = (u64, u64, u64, Vec<u64>, u64, Vec<Option<String>>);

impl RedisStore {
    pub(super) fn adaptive_key(&self, queue: &QueueName) -> String {
        format!("{}:{{{queue}}}:adaptive", self.prefix)
    }
}

/// The last decision's fields, `None` before the first; malformed fields
/// (a hash written by hand) are a protocol error, never a default.
fn decode_state(raw: &[Option<String>]) -> StoreResult<Option<AdaptiveState>> {
    let bad = |f: &str| StoreError::Protocol(format!("adaptive state field {f} is bad"));
    let Some(Some(window)) = raw.first() else {
        return Ok(None);
    };
    let field = |i: usize| raw.get(i).cloned().flatten().unwrap_or_default();
    let num = |i: usize, name: &str| field(i).parse::<u64>().map_err(|_| bad(name));
    Ok(Some(AdaptiveState {
        window: window.parse().map_err(|_| bad("window"))?,
        rate_per_sec: field(1).parse().map_err(|_| bad("rate"))?,
        hold_until: num(2, "holdUntil")?,
        verdict: field(3),
        p95_ms: field(4).parse().ok(),
        commits: num(5, "commits")?,
        failures: num(6, "failures")?,
        at: num(7, "at")?,
        window_ms: num(8, "windowMs")?,
        // A decision stored before evidence could span windows covered
        // its own window only.
        evidence_from: match raw.get(9).cloned().flatten() {
            Some(from) => from.parse().map_err(|_| bad("evidenceFrom"))?,
            None => window.parse::<u64>().map_err(|_| bad("window"))? + 1,
        },
    }))
}

#[async_trait]
impl AdaptiveStore for RedisStore {
    async fn record_order(
        &self,
        queue: &QueueName,
        signal: OrderSignal,
        window_ms: u64,
    ) -> StoreResult<()> {
        let field = match signal {
            OrderSignal::Committed { ms } => crate::queue::adaptive::bucket_of(ms).to_string(),
            OrderSignal::RolledBack => "f".to_owned(),
        };
        let mut conn = self.conn.clone();
        let mut invocation = RECORD.key(self.adaptive_key(queue));
        invocation
            .arg(window_ms.max(1))
            .arg(field)
            .arg(keep_ms(window_ms));
        let _: i64 = bounded(invocation.invoke_async(&mut conn)).await?;
        Ok(())
    }

    async fn adaptive_read(&self, queue: &QueueName, window_ms: u64) -> StoreResult<AdaptiveRead> {
        let mut conn = self.conn.clone();
        let mut invocation = READ.key(self.adaptive_key(queue));
        invocation
            .arg(window_ms.max(1))
            .arg(BUCKETS_MS.len() + 1)
            .arg(MAX_EVIDENCE_WINDOWS);
        let (now_ms, window, evidence_from, buckets, failures, state): ReadReply =
            bounded(invocation.invoke_async(&mut conn)).await?;
        Ok(AdaptiveRead {
            now_ms,
            window,
            evidence_from,
            samples: WindowSamples { buckets, failures },
            state: decode_state(&state)?,
        })
    }

    async fn adaptive_apply(
        &self,
        queue: &QueueName,
        d: &AdaptiveState,
        batch: Option<u32>,
        settings_version: u64,
        window_ms: u64,
    ) -> StoreResult<bool> {
        let mut conn = self.conn.clone();
        let mut invocation = APPLY.key(self.adaptive_key(queue));
        invocation
            .key(self.keys(queue).settings())
            .arg(d.window)
            .arg(d.rate_per_sec.to_string())
            .arg(d.hold_until)
            .arg(&d.verdict)
            .arg(d.p95_ms.map_or(String::new(), |p| p.to_string()))
            .arg(d.commits)
            .arg(d.failures)
            .arg(batch.map_or(String::new(), |b| b.to_string()))
            .arg(settings_version)
            .arg(keep_ms(window_ms))
            .arg(d.window_ms.max(1))
            .arg(d.evidence_from);
        let stored: i64 = bounded(invocation.invoke_async(&mut conn)).await?;
        Ok(stored == 1)
    }
}
