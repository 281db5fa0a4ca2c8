//! Sessions in Redis: `session_start.lua` (the token spent, the slot
//! passed to the session), `session_touch.lua` (a batch of activity),
//! `session_end.lua` (idle ones swept, or one an operator names), and the
//! ended log read with `XRANGE`. All keys carry the queue's hash tag.

use std::collections::HashMap;

use async_trait::async_trait;

use super::{RedisStore, bounded};
use crate::queue::{QueueName, SessionId, UserId};
use crate::store::{
    ENDED_PAGE, ENDED_SLOT_HOLD_MS, EndedPage, EndedSession, SessionLimits, SessionStart,
    SessionStore, StoreError, StoreResult,
};

/// How long ended entries are kept: the longest session allowed (a day),
/// so no pass outlives its entry in the log.
const ENDED_KEEP_MS: u64 = 86_400_000;

fn protocol(what: &str) -> StoreError {
    StoreError::Protocol(format!("session script returned {what}"))
}

fn session_id(raw: &str) -> StoreResult<SessionId> {
    SessionId::parse(raw).map_err(|_| protocol("a bad session id"))
}

#[async_trait]
impl SessionStore for RedisStore {
    async fn start_session(
        &self,
        queue: &QueueName,
        user: &UserId,
        entry: u64,
        id: &SessionId,
        limits: SessionLimits,
    ) -> StoreResult<SessionStart> {
        let [sessions, info, users, _] = self.keys(queue).sessions();
        let reply: Vec<String> = self
            .run_for(
                &self.scripts.session_start,
                queue,
                &[user],
                vec![sessions, info, users],
                |inv| {
                    inv.arg(user.as_str())
                        .arg(entry)
                        .arg(id.as_str())
                        .arg(limits.idle_ms)
                        .arg(limits.max_ms)
                        .arg(ENDED_SLOT_HOLD_MS);
                },
            )
            .await?;
        let exp = |raw: Option<&String>| -> StoreResult<u64> {
            raw.and_then(|e| e.parse().ok())
                .ok_or_else(|| protocol("no expiry"))
        };
        match reply.first().map(String::as_str) {
            Some("started") => Ok(SessionStart::Started {
                id: session_id(reply.get(1).map_or("", String::as_str))?,
                exp_ms: exp(reply.get(2))?,
            }),
            Some("live") => Ok(SessionStart::Live {
                id: session_id(reply.get(1).map_or("", String::as_str))?,
                exp_ms: exp(reply.get(2))?,
            }),
            Some("not_admitted") => Ok(SessionStart::NotAdmitted),
            other => Err(protocol(&format!("{other:?}"))),
        }
    }

    async fn touch_sessions(
        &self,
        queue: &QueueName,
        ids: &[SessionId],
        idle_ms: u64,
    ) -> StoreResult<usize> {
        if ids.is_empty() {
            return Ok(0);
        }
        let [sessions, info, _, _] = self.keys(queue).sessions();
        let moved: i64 = self
            .run_for(
                &self.scripts.session_touch,
                queue,
                &[],
                vec![sessions, info],
                |inv| {
                    inv.arg(idle_ms).arg(ENDED_SLOT_HOLD_MS);
                    for id in ids {
                        inv.arg(id.as_str());
                    }
                },
            )
            .await?;
        Ok(moved.max(0) as usize)
    }

    async fn sweep_sessions(&self, queue: &QueueName) -> StoreResult<usize> {
        self.end_sessions(queue, "").await
    }

    async fn end_session(&self, queue: &QueueName, id: &SessionId) -> StoreResult<bool> {
        Ok(self.end_sessions(queue, id.as_str()).await? == 1)
    }

    async fn live_sessions(&self, queue: &QueueName) -> StoreResult<u64> {
        let [sessions, ..] = self.keys(queue).sessions();
        let now = crate::clock::now_ms();
        let mut conn = self.conn.clone();
        let n: u64 = bounded(
            redis::cmd("ZCOUNT")
                .arg(sessions)
                .arg(format!("({now}"))
                .arg("+inf")
                .query_async(&mut conn),
        )
        .await?;
        Ok(n)
    }

    async fn ended_sessions(
        &self,
        queue: &QueueName,
        cursor: Option<&str>,
    ) -> StoreResult<EndedPage> {
        let [.., ended] = self.keys(queue).sessions();
        let start = cursor.map_or_else(|| "-".to_owned(), |c| format!("({c}"));
        let mut conn = self.conn.clone();
        let entries: Vec<(String, HashMap<String, String>)> = bounded(
            redis::cmd("XRANGE")
                .arg(ended)
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(ENDED_PAGE)
                .query_async(&mut conn),
        )
        .await?;
        let mut page = EndedPage {
            ended: Vec::with_capacity(entries.len()),
            cursor: cursor.unwrap_or("0-0").to_owned(),
        };
        for (stream_id, fields) in entries {
            let field = |name: &str| fields.get(name).map(String::as_str);
            let id = session_id(field("id").unwrap_or(""))?;
            let exp_ms = field("exp")
                .and_then(|e| e.parse().ok())
                .ok_or_else(|| protocol("an ended entry without expiry"))?;
            page.ended.push(EndedSession { id, exp_ms });
            page.cursor = stream_id;
        }
        Ok(page)
    }
}

impl RedisStore {
    /// `session_end.lua`: the idle sessions (`only` empty) or one.
    async fn end_sessions(&self, queue: &QueueName, only: &str) -> StoreResult<usize> {
        let ended: i64 = self
            .run_for(
                &self.scripts.session_end,
                queue,
                &[],
                self.keys(queue).sessions().to_vec(),
                |inv| {
                    inv.arg(only).arg(ENDED_KEEP_MS).arg(ENDED_SLOT_HOLD_MS);
                },
            )
            .await?;
        Ok(ended.max(0) as usize)
    }
}
