//! The passes this instance has already verified: a signature check costs
//! tens of microseconds, a lookup well under one, and a visitor's browser
//! shows the same pass on every request of a session.
//!
//! Keyed by the whole token (never by its signature alone: the same
//! signature under another header or payload must miss). What is cached
//! is the claims only; expiry and ended sessions are checked on every use.
//! Bounded: a shard that is full is emptied, so a flood of fresh valid
//! passes costs signature checks again, never memory.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

use super::PassClaims;

const SHARDS: usize = 16;
/// Entries per shard: 16 × 4096 passes, about 40 MB at worst (a pass of
/// ~400 bytes and its claims).
const SHARD_CAPACITY: usize = 4096;

pub(super) struct Cache {
    hasher: RandomState,
    shards: [Mutex<HashMap<Box<str>, PassClaims>>; SHARDS],
}

impl Default for Cache {
    fn default() -> Self {
        Self {
            hasher: RandomState::new(),
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
        }
    }
}

impl Cache {
    fn shard(&self, token: &str) -> &Mutex<HashMap<Box<str>, PassClaims>> {
        let hash = self.hasher.hash_one(token) as usize;
        &self.shards[hash % SHARDS]
    }

    pub(super) fn get(&self, token: &str) -> Option<PassClaims> {
        self.shard(token)
            .lock()
            .expect("pass cache lock")
            .get(token)
            .cloned()
    }

    pub(super) fn insert(&self, token: &str, claims: &PassClaims) {
        let mut shard = self.shard(token).lock().expect("pass cache lock");
        if shard.len() >= SHARD_CAPACITY {
            shard.clear();
        }
        shard.insert(token.into(), claims.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::{QueueName, SessionId, UserId};

    #[test]
    fn stays_bounded() {
        let cache = Cache::default();
        let claims = PassClaims {
            sub: UserId::parse("v").unwrap(),
            room: QueueName::parse("q").unwrap(),
            iat: 0,
            exp: 1,
            jti: SessionId::generate(),
        };
        for i in 0..(SHARDS * SHARD_CAPACITY * 2) {
            cache.insert(&format!("t{i}"), &claims);
        }
        let total: usize = cache.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert!(total <= SHARDS * SHARD_CAPACITY);
        cache.insert("last", &claims);
        assert_eq!(cache.get("last"), Some(claims));
        assert_eq!(cache.get("never"), None);
    }
}
