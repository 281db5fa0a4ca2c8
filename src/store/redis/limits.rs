//! Named rate buckets in Redis (`spend.lua` over `gcra.lua`), each under
//! a hash tag of its own: a bucket belongs to no queue.

use async_trait::async_trait;

use super::{RedisStore, bounded};
use crate::store::{LimitKind, LimitStore, Limited, Rate, StoreResult};

/// The arguments of a rate: period and burst, `0 0` for none.
pub(super) fn rate_args(rate: Option<Rate>) -> (u64, u32) {
    rate.map_or((0, 0), |r| (r.period_ms.max(1), r.burst.max(1)))
}

#[async_trait]
impl LimitStore for RedisStore {
    async fn spend(&self, bucket: &str, rate: Rate) -> StoreResult<Result<(), Limited>> {
        // A bucket of its own hash tag: it belongs to no queue.
        let key = format!("{}:{{limit:{bucket}}}", self.prefix);
        let (period, burst) = rate_args(Some(rate));
        let mut invocation = self.scripts.spend.prepare_invoke();
        invocation.key(key).arg(period).arg(burst);
        let mut conn = self.conn.clone();
        let wait: i64 = bounded(invocation.invoke_async(&mut conn)).await?;
        Ok(if wait > 0 {
            Err(Limited {
                kind: LimitKind::Bucket,
                retry_after_ms: wait as u64,
            })
        } else {
            Ok(())
        })
    }
}
