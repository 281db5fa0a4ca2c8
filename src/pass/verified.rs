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
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::{Arc, Mutex};

use super::PassClaims;

const SHARDS: usize = 16;
/// Entries per shard: 16 × 4096 passes, about 40 MB at worst (a pass of
/// ~400 bytes and its claims).
const SHARD_CAPACITY: usize = 4096;

/// A shard: the token's keyed hash to the token itself (compared on every
/// hit, so two tokens of one hash never share claims) and its claims.
type Shard = HashMap<u64, (Box<str>, Arc<PassClaims>), BuildHasherDefault<Prehashed>>;

pub(super) struct Cache {
    hasher: RandomState,
    shards: [Mutex<Shard>; SHARDS],
}

impl Default for Cache {
    fn default() -> Self {
        Self {
            hasher: RandomState::new(),
            shards: std::array::from_fn(|_| Mutex::new(Shard::default())),
        }
    }
}

impl Cache {
    /// The token hashed once (a pass is a few hundred bytes: hashing it is
    /// most of a hit's cost), its shard chosen and its map keyed by that.
    fn locate(&self, token: &str) -> (u64, &Mutex<Shard>) {
        let hash = self.hasher.hash_one(token);
        (hash, &self.shards[hash as usize % SHARDS])
    }

    pub(super) fn get(&self, token: &str) -> Option<Arc<PassClaims>> {
        let (hash, shard) = self.locate(token);
        let shard = shard.lock().expect("pass cache lock");
        match shard.get(&hash) {
            Some((cached, claims)) if **cached == *token => Some(Arc::clone(claims)),
            _ => None,
        }
    }

    pub(super) fn insert(&self, token: &str, claims: &Arc<PassClaims>) {
        let (hash, shard) = self.locate(token);
        let mut shard = shard.lock().expect("pass cache lock");
        if shard.len() >= SHARD_CAPACITY {
            shard.clear();
        }
        shard.insert(hash, (token.into(), Arc::clone(claims)));
    }
}

/// The hasher of a map whose keys are already keyed hashes (`RandomState`,
/// so an attacker cannot aim tokens at one bucket): passes them through.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed here; anything else still spreads.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::{QueueName, SessionId, UserId};

    fn claims() -> Arc<PassClaims> {
        Arc::new(PassClaims {
            sub: UserId::parse("v").unwrap(),
            room: QueueName::parse("q").unwrap(),
            iat: 0,
            exp: 1,
            jti: SessionId::generate(),
        })
    }

    #[test]
    fn stays_bounded() {
        let cache = Cache::default();
        let claims = claims();
        for i in 0..(SHARDS * SHARD_CAPACITY * 2) {
            cache.insert(&format!("t{i}"), &claims);
        }
        let total: usize = cache.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert!(total <= SHARDS * SHARD_CAPACITY);
        cache.insert("last", &claims);
        assert_eq!(cache.get("last"), Some(claims));
        assert_eq!(cache.get("never"), None);
    }

    /// Keyed by the token's hash, but a hit needs the very token: another
    /// one under the same hash (a collision) misses and is verified.
    #[test]
    fn a_hit_needs_the_very_token() {
        let cache = Cache::default();
        let claims = claims();
        let (hash, shard) = cache.locate("forged");
        shard
            .lock()
            .unwrap()
            .insert(hash, ("genuine".into(), claims.clone()));
        assert_eq!(cache.get("forged"), None);
        cache.insert("genuine", &claims);
        assert_eq!(cache.get("genuine"), Some(claims));
    }
}
