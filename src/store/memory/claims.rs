//! Claims in the memory store: an order's lease on an entry token, and its
//! commit (consume) or rollback (release), under the queue's lock.

use async_trait::async_trait;

use super::{MemoryStore, stock};
use crate::queue::audit::AuditKind;
use crate::queue::{EntryToken, QueueName, UserId};
use crate::store::{ClaimOutcome, ClaimStore, QueueEvent, StoreResult};

#[async_trait]
impl ClaimStore for MemoryStore {
    async fn claim(
        &self,
        queue: &QueueName,
        user: &UserId,
        presented: &str,
        lease_ms: u64,
    ) -> StoreResult<ClaimOutcome> {
        // Made before the lock: most claims are granted.
        let claim_id = EntryToken::generate().as_str().to_owned();
        Ok(self.with_queue(queue, |q, now| {
            let Some((id, token)) = q.token_mut(user) else {
                return ClaimOutcome::Invalid;
            };
            if !token.token.matches(presented) {
                return ClaimOutcome::Invalid;
            }
            if matches!(token.claim, Some((_, until)) if until > now) {
                return ClaimOutcome::InUse;
            }
            let until = now + lease_ms;
            token.claim = Some((claim_id.clone(), until));
            q.extend(id, until);
            ClaimOutcome::Claimed { claim_id }
        }))
    }

    async fn token_holder(
        &self,
        queue: &QueueName,
        presented: &str,
    ) -> StoreResult<Option<UserId>> {
        Ok(self.with_queue(queue, |q, _| q.token_holder(presented)))
    }

    async fn consume(&self, queue: &QueueName, user: &UserId, claim_id: &str) -> StoreResult<bool> {
        let consumed = self.with_queue(queue, |q, now| {
            let Some((id, token)) = q.token_mut(user) else {
                return false;
            };
            let holds = matches!(&token.claim, Some((held, _)) if held == claim_id);
            if holds {
                let entry = q.remove(id).map(|b| b.entry);
                stock::note_consumed(&mut q.stock);
                let max = self.audit_max_len;
                q.audit.append(
                    max,
                    now,
                    AuditKind::Consumed,
                    Some(user.as_str()),
                    entry,
                    None,
                );
            }
            holds
        });
        if consumed {
            self.publish(queue, QueueEvent::Consumed { user: user.clone() });
        }
        Ok(consumed)
    }

    async fn release(&self, queue: &QueueName, user: &UserId, claim_id: &str) -> StoreResult<bool> {
        Ok(self.with_queue(queue, |q, now| match q.token_mut(user) {
            Some((id, token)) if matches!(&token.claim, Some((c, _)) if c == claim_id) => {
                token.claim = None;
                let entry = q.buyers.get(id).map(|b| b.entry);
                let max = self.audit_max_len;
                q.audit.append(
                    max,
                    now,
                    AuditKind::Released,
                    Some(user.as_str()),
                    entry,
                    None,
                );
                true
            }
            _ => false,
        }))
    }

    async fn renew_claim(
        &self,
        queue: &QueueName,
        user: &UserId,
        claim_id: &str,
        lease_ms: u64,
    ) -> StoreResult<bool> {
        Ok(self.with_queue(queue, |q, now| {
            // Expired tokens are already gone (`with_queue`).
            let Some((id, token)) = q.token_mut(user) else {
                return false;
            };
            if !matches!(&token.claim, Some((held, _)) if held == claim_id) {
                return false;
            }
            let until = now + lease_ms;
            token.claim = Some((claim_id.to_owned(), until));
            q.extend(id, until);
            true
        }))
    }
}
