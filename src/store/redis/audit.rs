//! The Redis side of the audit log: reading a queue's Stream
//! (`<prefix>:{<queue>}:audit`, written by the scripts themselves, see
//! `lua/common.lua`) a page at a time, and the consumer groups through
//! which webhooks take its entries, one group per hook.
//!
//! A group is what makes delivery once across instances: `XREADGROUP`
//! hands each new entry to one consumer (instance), and an entry stays in
//! the group's pending list until that instance acknowledges it
//! (`XACK`) after a 2xx. An instance that dies leaves its entries pending;
//! another takes them over with `XAUTOCLAIM` once they have been idle
//! longer than the claim timeout, and a live instance that is still
//! retrying keeps its entries by re-claiming them (`XCLAIM … JUSTID`),
//! which resets their idle time. Each call is one key, so a cluster routes
//! it to the queue's slot.

use async_trait::async_trait;
use redis::{RedisError, Value};

use super::{RedisStore, bounded};
use crate::queue::QueueName;
use crate::queue::audit::{
    AUDIT_SCAN_FACTOR, AuditEntry, AuditId, AuditKind, AuditPage, AuditQuery, TakenEntry,
};
use crate::store::{AuditStore, StoreError, StoreResult};

impl RedisStore {
    /// Entries idle past `idle_ms` in other consumers' hands (a dead
    /// instance's), then new ones; at most about `count` of each.
    async fn audit_group_read_once(
        &self,
        queue: &QueueName,
        group: &str,
        consumer: &str,
        idle_ms: u64,
        count: usize,
    ) -> Result<Vec<TakenEntry>, GroupRead> {
        let key = self.keys(queue).audit();
        let mut conn = self.conn.clone();
        let claimed: Value = no_group(
            bounded_raw(
                redis::cmd("XAUTOCLAIM")
                    .arg(&key)
                    .arg(group)
                    .arg(consumer)
                    .arg(idle_ms)
                    .arg("0-0")
                    .arg("COUNT")
                    .arg(count)
                    .query_async(&mut conn),
            )
            .await,
        )?;
        // [next cursor, entries, ids deleted meanwhile (7.0)]
        let mut entries = match claimed {
            Value::Array(mut parts) if parts.len() >= 2 => parse_entries(parts.swap_remove(1))?,
            other => {
                return Err(GroupRead::Store(StoreError::Protocol(format!(
                    "XAUTOCLAIM answered {other:?}"
                ))));
            }
        };
        let fresh: Value = no_group(
            bounded_raw(
                redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg(group)
                    .arg(consumer)
                    .arg("COUNT")
                    .arg(count)
                    .arg("STREAMS")
                    .arg(&key)
                    .arg(">")
                    .query_async(&mut conn),
            )
            .await,
        )?;
        entries.extend(parse_read_reply(fresh)?);
        Ok(entries)
    }
}

/// A group read's failure: the group does not exist (yet), or the store.
enum GroupRead {
    NoGroup,
    Store(StoreError),
}

impl From<StoreError> for GroupRead {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// [`bounded`], keeping Redis's own error apart from the timeout.
async fn bounded_raw<T>(
    call: impl Future<Output = Result<T, RedisError>>,
) -> StoreResult<Result<T, RedisError>> {
    // Redis's errors, a lost connection included, are classified by the
    // caller (`StoreError::from`), once it has looked for NOGROUP.
    match tokio::time::timeout(super::CALL_TIMEOUT, call).await {
        Ok(result) => Ok(result),
        Err(_) => Err(StoreError::Unavailable(format!(
            "no answer within {:?}",
            super::CALL_TIMEOUT
        ))),
    }
}

/// Tells a missing group from other failures.
fn no_group<T>(reply: StoreResult<Result<T, RedisError>>) -> Result<T, GroupRead> {
    match reply? {
        Ok(v) => Ok(v),
        Err(e) if e.code() == Some("NOGROUP") || e.to_string().contains("NOGROUP") => {
            Err(GroupRead::NoGroup)
        }
        Err(e) => Err(GroupRead::Store(e.into())),
    }
}

fn protocol(what: impl std::fmt::Debug) -> StoreError {
    StoreError::Protocol(format!("unreadable audit entry: {what:?}"))
}

fn text(v: &Value) -> Option<&str> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// `XREADGROUP`'s answer: nil when nothing is new, else one stream's
/// `[key, entries]` (as an array, or a map under RESP3).
fn parse_read_reply(v: Value) -> StoreResult<Vec<TakenEntry>> {
    match v {
        Value::Nil => Ok(Vec::new()),
        Value::Array(streams) => {
            let mut out = Vec::new();
            for stream in streams {
                match stream {
                    Value::Array(mut kv) if kv.len() == 2 => {
                        out.extend(parse_entries(kv.swap_remove(1))?)
                    }
                    other => return Err(protocol(other)),
                }
            }
            Ok(out)
        }
        Value::Map(streams) => {
            let mut out = Vec::new();
            for (_, entries) in streams {
                out.extend(parse_entries(entries)?);
            }
            Ok(out)
        }
        other => Err(protocol(other)),
    }
}

/// A list of stream entries `[[id, [field, value, …]], …]`, each as the
/// log's entries it holds (one, or an admission pass's buyers), oldest
/// first. An entry deleted meanwhile (`[id, nil]`, from trimming) is
/// skipped: there is nothing left to deliver.
pub(super) fn parse_entries(v: Value) -> StoreResult<Vec<TakenEntry>> {
    let Value::Array(items) = v else {
        return match v {
            Value::Nil => Ok(Vec::new()),
            other => Err(protocol(other)),
        };
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Value::Array(parts) = item else {
            return Err(protocol(item));
        };
        let [id, fields] = <[Value; 2]>::try_from(parts).map_err(protocol)?;
        let id: AuditId = text(&id)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| protocol(&id))?;
        let pairs: Vec<(String, String)> = match fields {
            Value::Nil => continue,
            Value::Array(flat) => flat
                .chunks(2)
                .filter_map(|kv| Some((text(&kv[0])?.to_owned(), text(kv.get(1)?)?.to_owned())))
                .collect(),
            Value::Map(map) => map
                .iter()
                .filter_map(|(k, v)| Some((text(k)?.to_owned(), text(v)?.to_owned())))
                .collect(),
            other => return Err(protocol(other)),
        };
        let field = |name: &str| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v);
        let number = |name: &str| field(name).and_then(|v| v.parse::<u64>().ok());
        let kind: AuditKind = field("kind")
            .and_then(|k| k.parse().ok())
            .ok_or_else(|| protocol(&pairs))?;
        let at = number("at").unwrap_or(id.ms);
        let pass = number("pass");
        let Some(buyers) = field("buyers") else {
            out.push(TakenEntry {
                entry: AuditEntry {
                    id,
                    kind,
                    user: field("user").cloned(),
                    entry: number("entry"),
                    at,
                    pass,
                },
                record: id,
            });
            continue;
        };
        // One pass's buyers in one record (`audit_each`, lua/common.lua):
        // "<entry id> <user> ...", the i-th of n with the record's id less
        // n - 1 - i.
        let words: Vec<&str> = buyers.split(' ').collect();
        if words.len() < 2 || !words.len().is_multiple_of(2) {
            return Err(protocol(&pairs));
        }
        let n = (words.len() / 2) as u64;
        let first = id.seq.checked_sub(n - 1).ok_or_else(|| protocol(&pairs))?;
        for (i, pair) in words.chunks(2).enumerate() {
            let entry = pair[0].parse::<u64>().map_err(|_| protocol(&pairs))?;
            out.push(TakenEntry {
                entry: AuditEntry {
                    id: AuditId {
                        ms: id.ms,
                        seq: first + i as u64,
                    },
                    kind,
                    user: Some(pair[1].to_owned()),
                    entry: Some(entry),
                    at,
                    pass,
                },
                record: id,
            });
        }
    }
    Ok(out)
}

#[async_trait]
impl AuditStore for RedisStore {
    async fn audit_page(&self, queue: &QueueName, query: AuditQuery) -> StoreResult<AuditPage> {
        let key = self.keys(queue).audit();
        let limit = query.limit.max(1);
        let mut conn = self.conn.clone();
        let mut entries = Vec::new();
        // The last entry read: a page may end inside a record (a pass's
        // buyers), and the next one starts inside it.
        let mut cursor = query.after;
        let mut scanned = 0;
        loop {
            // Exclusive start (`(id`), so a page never repeats its cursor;
            // a record whose first entries are at or before it comes again
            // and those are skipped.
            let start = cursor.map_or_else(|| "-".to_owned(), |id| format!("({id}"));
            let want = limit - entries.len();
            let raw: Value = bounded(
                redis::cmd("XRANGE")
                    .arg(&key)
                    .arg(start)
                    .arg("+")
                    .arg("COUNT")
                    .arg(want)
                    .query_async(&mut conn),
            )
            .await?;
            let batch = parse_entries(raw)?;
            let mut records = 0;
            let mut last_record = None;
            for taken in &batch {
                if last_record != Some(taken.record) {
                    records += 1;
                    last_record = Some(taken.record);
                }
            }
            let end_of_log = records < want;
            let after = cursor;
            let mut batch = batch
                .into_iter()
                .map(|t| t.entry)
                .filter(|e| after.is_none_or(|c| e.id > c))
                .peekable();
            while let Some(entry) = batch.next() {
                scanned += 1;
                cursor = Some(entry.id);
                if query.kind.is_none_or(|k| entry.kind == k) {
                    entries.push(entry);
                }
                if entries.len() >= limit || scanned >= limit * AUDIT_SCAN_FACTOR {
                    let done = end_of_log && batch.peek().is_none();
                    return Ok(AuditPage {
                        entries,
                        next: if done { None } else { cursor },
                    });
                }
            }
            if end_of_log {
                return Ok(AuditPage {
                    entries,
                    next: None,
                });
            }
        }
    }

    async fn audit_take(
        &self,
        queue: &QueueName,
        group: &str,
        start: AuditId,
        consumer: &str,
        idle_ms: u64,
        count: usize,
    ) -> StoreResult<Vec<TakenEntry>> {
        match self
            .audit_group_read_once(queue, group, consumer, idle_ms, count)
            .await
        {
            Err(GroupRead::NoGroup) => {
                // First use of this hook on this queue, or the store lost
                // its data: the group starts at the hook's start id, so it
                // delivers what happened since the hook was set up, however
                // late an instance first looks.
                let mut conn = self.conn.clone();
                let created: Result<Value, RedisError> = bounded_raw(
                    redis::cmd("XGROUP")
                        .arg("CREATE")
                        .arg(self.keys(queue).audit())
                        .arg(group)
                        .arg(start.to_string())
                        .arg("MKSTREAM")
                        .query_async(&mut conn),
                )
                .await?;
                if let Err(e) = created
                    && !e.to_string().contains("BUSYGROUP")
                {
                    return Err(e.into());
                }
                match self
                    .audit_group_read_once(queue, group, consumer, idle_ms, count)
                    .await
                {
                    Ok(entries) => Ok(entries),
                    Err(GroupRead::NoGroup) => Err(StoreError::Protocol(
                        "the audit group vanished after it was created".into(),
                    )),
                    Err(GroupRead::Store(e)) => Err(e),
                }
            }
            Err(GroupRead::Store(e)) => Err(e),
            Ok(entries) => Ok(entries),
        }
    }

    async fn audit_hold(
        &self,
        queue: &QueueName,
        group: &str,
        consumer: &str,
        ids: &[AuditId],
    ) -> StoreResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("XCLAIM");
        cmd.arg(self.keys(queue).audit())
            .arg(group)
            .arg(consumer)
            .arg(0);
        for id in ids {
            cmd.arg(id.to_string());
        }
        cmd.arg("JUSTID");
        let mut conn = self.conn.clone();
        let _: Value = bounded(cmd.query_async(&mut conn)).await?;
        Ok(())
    }

    async fn audit_ack(&self, queue: &QueueName, group: &str, ids: &[AuditId]) -> StoreResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("XACK");
        cmd.arg(self.keys(queue).audit()).arg(group);
        for id in ids {
            cmd.arg(id.to_string());
        }
        let mut conn = self.conn.clone();
        let _: i64 = bounded(cmd.query_async(&mut conn)).await?;
        Ok(())
    }
}
