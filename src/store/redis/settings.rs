//! The Redis side of live queue settings: a hash per queue
//! (`<prefix>:{<queue>}:settings`, hash-tagged like every other key of the
//! queue, so `admit.lua` reads it in the pass's own slot) and one registry
//! set of queue names (`<prefix>:queues`).
//!
//! The registry is one key, so in a cluster it lives in one slot: fine for
//! the admin path and each instance's reload every second, and no per-join
//! script ever reads it.

use std::collections::HashMap;

use async_trait::async_trait;
use redis::Script;

use super::{RedisStore, bounded};
use crate::queue::{QueueName, QueueSettings, StoredSettings};
use crate::store::{SettingsStore, StoreError, StoreResult};

/// The write script, loaded once per store.
pub(super) fn put_settings_script() -> Script {
    Script::new(include_str!("lua/put_settings.lua"))
}

impl RedisStore {
    fn registry(&self) -> String {
        format!("{}:queues", self.prefix)
    }
}

/// Reads a settings hash back; anything malformed is a protocol error (a
/// hash written by hand), never a default.
fn decode(raw: &HashMap<String, String>) -> StoreResult<StoredSettings> {
    let num = |field: &str| -> StoreResult<i64> {
        raw.get(field)
            .and_then(|v| v.parse::<i64>().ok())
            .ok_or_else(|| {
                StoreError::Protocol(format!("settings field {field} is missing or bad"))
            })
    };
    let positive = |field: &str| -> StoreResult<u64> {
        u64::try_from(num(field)?)
            .map_err(|_| StoreError::Protocol(format!("settings field {field} is negative")))
    };
    let texts = match raw.get("texts") {
        Some(t) => serde_json::from_str(t)
            .map_err(|e| StoreError::Protocol(format!("settings texts: {e}")))?,
        None => Default::default(),
    };
    let adaptive = match raw.get("adaptive").filter(|a| !a.is_empty()) {
        Some(a) => Some(
            serde_json::from_str(a)
                .map_err(|e| StoreError::Protocol(format!("settings adaptive: {e}")))?,
        ),
        None => None,
    };
    let max_active = num("maxActive")?;
    let abandon = positive("abandonAfterMs")?;
    Ok(StoredSettings {
        settings: QueueSettings {
            batch: u32::try_from(positive("batch")?)
                .map_err(|_| StoreError::Protocol("settings batch out of range".into()))?,
            interval_ms: positive("intervalMs")?,
            token_ttl_ms: positive("tokenTtlMs")?,
            max_active: u64::try_from(max_active).ok(),
            abandon_after_ms: (abandon > 0).then_some(abandon),
            claim_lease_ms: positive("claimLeaseMs")?,
            texts,
            shop_url: raw.get("shopUrl").filter(|u| !u.is_empty()).cloned(),
            adaptive,
        },
        version: positive("version")?,
        updated_at: positive("updatedAt")?,
    })
}

#[async_trait]
impl SettingsStore for RedisStore {
    async fn list_queues(&self) -> StoreResult<Vec<QueueName>> {
        let mut conn = self.conn.clone();
        let raw: Vec<String> = bounded(
            redis::cmd("SMEMBERS")
                .arg(self.registry())
                .query_async(&mut conn),
        )
        .await?;
        let mut names: Vec<QueueName> = raw
            .iter()
            .filter_map(|n| QueueName::parse(n).ok())
            .collect();
        names.sort();
        Ok(names)
    }

    async fn queue_settings(&self, queue: &QueueName) -> StoreResult<Option<StoredSettings>> {
        let mut conn = self.conn.clone();
        let raw: HashMap<String, String> = bounded(
            redis::cmd("HGETALL")
                .arg(self.keys(queue).settings())
                .query_async(&mut conn),
        )
        .await?;
        if raw.is_empty() {
            return Ok(None);
        }
        decode(&raw).map(Some)
    }

    async fn put_queue_settings(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
        only_if_new: bool,
    ) -> StoreResult<(StoredSettings, bool)> {
        let texts = serde_json::to_string(&settings.texts)
            .map_err(|e| StoreError::Protocol(e.to_string()))?;
        // Empty: off (a field is cleared by writing it empty, so a write
        // without adaptive settings switches them off).
        let adaptive = match &settings.adaptive {
            Some(a) => serde_json::to_string(a).map_err(|e| StoreError::Protocol(e.to_string()))?,
            None => String::new(),
        };
        let mut invocation = self.put_settings.key(self.keys(queue).settings());
        invocation
            .arg(if only_if_new { "1" } else { "0" })
            .arg("batch")
            .arg(settings.batch)
            .arg("intervalMs")
            .arg(settings.interval_ms)
            .arg("tokenTtlMs")
            .arg(settings.token_ttl_ms)
            .arg("maxActive")
            .arg(settings.max_active.map_or(-1, |m| m as i64))
            .arg("abandonAfterMs")
            .arg(settings.abandon_after_ms.unwrap_or(0))
            .arg("claimLeaseMs")
            .arg(settings.claim_lease_ms)
            .arg("texts")
            .arg(texts)
            .arg("adaptive")
            .arg(adaptive)
            // Empty: none (cleared by writing it empty, like adaptive).
            .arg("shopUrl")
            .arg(settings.shop_url.as_deref().unwrap_or(""));
        let mut conn = self.conn.clone();
        let written: i64 = bounded(invocation.invoke_async(&mut conn)).await?;
        // Listed after the write: a queue is never listed without settings
        // (a failure in between is repaired by the next write).
        let _: i64 = bounded(
            redis::cmd("SADD")
                .arg(self.registry())
                .arg(queue.as_str())
                .query_async(&mut conn),
        )
        .await?;
        let stored = self
            .queue_settings(queue)
            .await?
            .ok_or_else(|| StoreError::Protocol("settings vanished after a write".into()))?;
        Ok((stored, written == 1))
    }

    async fn delete_queue(&self, queue: &QueueName) -> StoreResult<bool> {
        let mut conn = self.conn.clone();
        // Unlisted first: no instance picks the queue up again meanwhile.
        let _: i64 = bounded(
            redis::cmd("SREM")
                .arg(self.registry())
                .arg(queue.as_str())
                .query_async(&mut conn),
        )
        .await?;
        let keys = self.keys(queue);
        let had: i64 = bounded(
            redis::cmd("DEL")
                .arg(keys.settings())
                .query_async(&mut conn),
        )
        .await?;
        let mut doomed = Vec::new();
        // The line, presence, budget and hold go. The entry and pass
        // counters stay (no entry id or event id is handed out twice), and
        // so do the holders (tokens already issued live out their TTL).
        const KEPT: [&str; 3] = [":seq", ":pass", ":active"];
        doomed.extend(
            keys.script_keys()
                .into_iter()
                .filter(|k| !KEPT.iter().any(|kept| k.ends_with(kept))),
        );
        // Adaptive admission's samples and last decision: a queue opened
        // again starts from its own batch.
        doomed.push(self.adaptive_key(queue));
        // The last entry-time mark goes with the marks (`entered`).
        doomed.push(keys.last_mark());
        doomed.extend(keys.lottery());
        doomed.extend(keys.lottery_stage());
        let _: i64 = bounded(redis::cmd("DEL").arg(&doomed).query_async(&mut conn)).await?;
        Ok(had == 1)
    }
}
