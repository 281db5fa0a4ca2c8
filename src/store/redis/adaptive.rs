//! The Redis side of adaptive admission: one hash per queue,
//! `<prefix>:{<queue>}:adaptive`, hash-tagged like the queue's settings so
//! the decision and the batch it sets are written by one script in one
//! slot. It holds the current windows' commit-time histograms and
//! rollback counts (`adaptive_record.lua`) and the last decision
//! (`adaptive_apply.lua`), which is what keeps the decision to one per
//! window however many instances run the controller.

use std::sync::LazyLock;

use redis::{FromRedisValue, ParsingError, Script, Value};

use async_trait::async_trait;

use super::decode::Reply;
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

/// `adaptive_read.lua`'s reply, `{now, window, from, {buckets…},
/// failures, {state fields…}}`, read by name (see `decode.rs`); the state's
/// fields are checked by `decode_state`.
impl FromRedisValue for AdaptiveRead {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let mut r = Reply::of("adaptive_read.lua", value)?;
        let now_ms = r.count("now")?;
        let window = r.count("window")?;
        let evidence_from = r.count("evidence_from")?;
        let buckets = r.field("buckets")?;
        let failures = r.count("failures")?;
        let state: Vec<Option<String>> = r.field("state")?;
        r.end()?;
        Ok(Self {
            now_ms,
            window,
            evidence_from,
            samples: WindowSamples { buckets, failures },
            state: decode_state(&state).map_err(|e| state_error(&e))?,
        })
    }
}

/// A bad state field, as the decoder's error.
fn state_error(e: &StoreError) -> ParsingError {
    format!("adaptive_read.lua: {e}").into()
}

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
        bounded(invocation.invoke_async(&mut conn)).await
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

#[cfg(test)]
mod tests {
    use super::super::decode::tests::{decode, reply};
    use super::*;

    fn read_reply(head: &[&str], buckets: &[&str], tail: &str, state: &[&str]) -> Value {
        let Value::Array(mut fields) = reply(head) else {
            unreachable!()
        };
        fields.push(reply(buckets));
        fields.extend(match reply(&[tail]) {
            Value::Array(v) => v,
            _ => unreachable!(),
        });
        fields.push(reply(state));
        Value::Array(fields)
    }

    #[test]
    fn a_read_decodes_by_name() {
        let read: AdaptiveRead =
            decode(read_reply(&["5000", "4", "3"], &["1", "2"], "1", &[])).unwrap();
        assert_eq!((read.now_ms, read.window, read.evidence_from), (5000, 4, 3));
        assert_eq!(read.samples.buckets, vec![1, 2]);
        assert_eq!(read.samples.failures, 1);
        assert_eq!(read.state, None);
        let state = ["3", "12.5", "0", "hold", "", "7", "0", "4900", "1000", "3"];
        let read: AdaptiveRead =
            decode(read_reply(&["5000", "4", "3"], &["1"], "0", &state)).unwrap();
        let state = read.state.expect("a decision");
        assert_eq!(
            (state.window, state.commits, state.evidence_from),
            (3, 7, 3)
        );
        // Short: no state; wrong: a text for the window; a bad state field.
        let Value::Array(mut short) = read_reply(&["5000", "4", "3"], &[], "0", &[]) else {
            unreachable!()
        };
        short.pop();
        let short = decode::<AdaptiveRead>(Value::Array(short)).unwrap_err();
        assert!(
            short.contains("adaptive_read.lua") && short.contains("no state"),
            "{short}"
        );
        let wrong =
            decode::<AdaptiveRead>(read_reply(&["5000", "four", "3"], &[], "0", &[])).unwrap_err();
        assert!(wrong.contains("window"), "{wrong}");
        let bad_state = ["x", "12.5", "0", "hold", "", "7", "0", "4900", "1000"];
        let bad = decode::<AdaptiveRead>(read_reply(&["5000", "4", "3"], &[], "0", &bad_state))
            .unwrap_err();
        assert!(bad.contains("window is bad"), "{bad}");
    }
}
