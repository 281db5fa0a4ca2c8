//! Sessions in the memory store: a queue's live sessions beside its
//! tokens, under the queue's lock, so starting one spends the token in the
//! same step and admission counts both (`QueueData::active`), with the
//! slots of ended sessions until their hold is over
//! ([`crate::store::ENDED_SLOT_HOLD_MS`]).

use std::collections::{BTreeSet, HashMap, VecDeque};

use async_trait::async_trait;

use super::MemoryStore;
use crate::queue::{QueueName, SessionId, UserId};
use crate::store::{
    ENDED_PAGE, ENDED_SLOT_HOLD_MS, EndedPage, EndedSession, SessionLimits, SessionStart,
    SessionStore, StoreResult,
};

/// One live session.
struct Live {
    user: UserId,
    exp_ms: u64,
    deadline: u64,
}

/// A queue's sessions: the live ones, by deadline and by user, the
/// ended log (entry number, session), kept while their passes last, and
/// when each ended session's slot frees.
#[derive(Default)]
pub(super) struct Sessions {
    live: HashMap<SessionId, Live>,
    by_deadline: BTreeSet<(u64, SessionId)>,
    by_user: HashMap<UserId, SessionId>,
    ended: VecDeque<(u64, EndedSession)>,
    ended_seq: u64,
    held_until: VecDeque<u64>,
}

impl Sessions {
    /// Live sessions.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Slots under `maxActive` the sessions hold: the live ones and those
    /// ended less than the hold ago (see `release_held`).
    pub fn slots(&self) -> usize {
        self.live.len() + self.held_until.len()
    }

    /// Frees the slots of sessions whose hold is over by `now`.
    pub fn release_held(&mut self, now: u64) {
        // Pushed at `now + hold` in order, so the front frees first.
        while self.held_until.front().is_some_and(|&until| until <= now) {
            self.held_until.pop_front();
        }
    }

    /// Ends every session whose deadline has come by `now`; how many.
    pub fn end_idle(&mut self, now: u64) -> usize {
        let mut n = 0;
        while let Some((deadline, id)) = self.by_deadline.first().cloned() {
            if deadline > now {
                break;
            }
            self.end(&id, now);
            n += 1;
        }
        n
    }

    /// Ends `id`: out of the live set, into the ended log, its slot held
    /// for [`ENDED_SLOT_HOLD_MS`]. False if it was not live.
    fn end(&mut self, id: &SessionId, now: u64) -> bool {
        let Some(live) = self.live.remove(id) else {
            return false;
        };
        self.by_deadline.remove(&(live.deadline, id.clone()));
        if self.by_user.get(&live.user) == Some(id) {
            self.by_user.remove(&live.user);
        }
        // Entries whose passes have expired are no longer needed by anyone.
        while self.ended.front().is_some_and(|(_, e)| e.exp_ms <= now) {
            self.ended.pop_front();
        }
        self.held_until.push_back(now + ENDED_SLOT_HOLD_MS);
        self.ended_seq += 1;
        self.ended.push_back((
            self.ended_seq,
            EndedSession {
                id: id.clone(),
                exp_ms: live.exp_ms,
            },
        ));
        true
    }

    fn set_deadline(&mut self, id: &SessionId, deadline: u64) {
        if let Some(live) = self.live.get_mut(id) {
            self.by_deadline.remove(&(live.deadline, id.clone()));
            live.deadline = deadline;
            self.by_deadline.insert((deadline, id.clone()));
        }
    }
}

#[async_trait]
impl SessionStore for MemoryStore {
    async fn start_session(
        &self,
        queue: &QueueName,
        user: &UserId,
        entry: u64,
        id: &SessionId,
        limits: SessionLimits,
    ) -> StoreResult<SessionStart> {
        Ok(self.with_queue(queue, |q, now| {
            if let Some(live_id) = q.sessions.by_user.get(user).cloned()
                && let Some(live) = q.sessions.live.get(&live_id)
            {
                return SessionStart::Live {
                    exp_ms: live.exp_ms,
                    id: live_id,
                };
            }
            let Some((record, _)) = q.token_mut(user) else {
                return SessionStart::NotAdmitted;
            };
            if q.buyers.get(record).map(|b| b.entry) != Some(entry) {
                return SessionStart::NotAdmitted;
            }
            q.remove(record);
            let exp_ms = now + limits.max_ms;
            let deadline = (now + limits.idle_ms).min(exp_ms);
            let s = &mut q.sessions;
            s.live.insert(
                id.clone(),
                Live {
                    user: user.clone(),
                    exp_ms,
                    deadline,
                },
            );
            s.by_deadline.insert((deadline, id.clone()));
            s.by_user.insert(user.clone(), id.clone());
            SessionStart::Started {
                id: id.clone(),
                exp_ms,
            }
        }))
    }

    async fn touch_sessions(
        &self,
        queue: &QueueName,
        ids: &[SessionId],
        idle_ms: u64,
    ) -> StoreResult<usize> {
        Ok(self.with_queue(queue, |q, now| {
            let mut n = 0;
            for id in ids {
                let Some(live) = q.sessions.live.get(id) else {
                    continue;
                };
                let deadline = (now + idle_ms).min(live.exp_ms);
                if deadline > live.deadline {
                    q.sessions.set_deadline(id, deadline);
                    n += 1;
                }
            }
            n
        }))
    }

    async fn sweep_sessions(&self, queue: &QueueName) -> StoreResult<usize> {
        // `with_queue` ends the idle sessions before anything else, as it
        // expires tokens: nothing is left for a sweep.
        Ok(self.with_queue(queue, |q, now| q.sessions.end_idle(now)))
    }

    async fn end_session(&self, queue: &QueueName, id: &SessionId) -> StoreResult<bool> {
        Ok(self.with_queue(queue, |q, now| q.sessions.end(id, now)))
    }

    async fn live_sessions(&self, queue: &QueueName) -> StoreResult<u64> {
        Ok(self.with_queue(queue, |q, _| q.sessions.len() as u64))
    }

    async fn ended_sessions(
        &self,
        queue: &QueueName,
        cursor: Option<&str>,
    ) -> StoreResult<EndedPage> {
        let after: u64 = cursor.and_then(|c| c.parse().ok()).unwrap_or(0);
        Ok(self.with_queue(queue, |q, _| {
            let ended: Vec<(u64, EndedSession)> = q
                .sessions
                .ended
                .iter()
                .filter(|(seq, _)| *seq > after)
                .take(ENDED_PAGE)
                .cloned()
                .collect();
            let cursor = ended.last().map_or(after, |(seq, _)| *seq).to_string();
            EndedPage {
                ended: ended.into_iter().map(|(_, e)| e).collect(),
                cursor,
            }
        }))
    }
}
