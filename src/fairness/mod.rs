//! Fairness anyone can check: signed arrival receipts and the public
//! admission log (`crate::queue::fairness` has the log's rules).
//!
//! A join answers a receipt signed with the published key: the queue, the
//! entry sequence the store gave (arrival order), a fingerprint of the
//! buyer and the store's time of the join. The log records, in the audit
//! log's one order per queue, every admission, fast track, abandonment and
//! leave, each with the entry sequence and fingerprint, in a Merkle tree
//! whose signed heads every instance publishes. A buyer holding a receipt
//! checks with `tools/verify-queue` that nobody who arrived after them was
//! admitted while they waited, and that the log only ever grew.
//!
//! The fingerprint is `HMAC-SHA256(key, queue "\n" user)` cut to 16 bytes,
//! the key derived from the ticket secret and never published: the log
//! says nothing about who a buyer is, and nobody without the key can tell
//! whether a fingerprint is a given user's; the buyer learns theirs from
//! their receipt.

pub mod keys;
pub mod log;

use std::sync::Arc;

use hmac::{Hmac, KeyInit, Mac};
use jsonwebtoken::jwk::JwkSet;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::pass::{Issued, KeyRing, TokenError};
use crate::queue::QueueName;
pub use keys::shared_ring;

/// Domain of the fingerprint key's derivation.
const FINGERPRINT_DOMAIN: &[u8] = b"waitroom-fairness-fingerprint-v1";

/// The JWS `typ` of a receipt.
pub const RECEIPT_TYP: &str = "waitroom-receipt+jws";

/// The JWS `typ` of a signed log head.
pub const HEAD_TYP: &str = "waitroom-log-head+jws";

/// Receipts, fingerprints and heads of one instance (the same on every
/// instance sharing the ticket secret).
pub struct Fairness {
    ring: Arc<KeyRing>,
    fingerprint_key: [u8; 32],
}

/// What a receipt says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The queue.
    pub queue: String,
    /// The entry sequence: the arrival order the store gave the join.
    pub seq: u64,
    /// The buyer's fingerprint, as the log writes it.
    pub fp: String,
    /// When the store placed the buyer, store clock, ms since the epoch.
    pub at: u64,
    /// When signed, seconds since the epoch (the key ring's rotation
    /// checks it).
    pub iat: u64,
}

impl Issued for Receipt {
    fn issued_at(&self) -> u64 {
        self.iat
    }
}

/// What a signed head says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    pub queue: String,
    /// Leaves in the tree.
    pub size: u64,
    /// The tree's root, hex.
    pub root: String,
    /// When it was signed, ms since the epoch.
    pub at: u64,
    /// The same in seconds (the key ring's rotation checks it).
    pub iat: u64,
}

impl Issued for Head {
    fn issued_at(&self) -> u64 {
        self.iat
    }
}

impl Fairness {
    /// Signs with `ring`; fingerprints with a key derived from `secret`
    /// (the ticket secret, shared by every instance).
    pub fn new(ring: Arc<KeyRing>, secret: &[u8]) -> Self {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(FINGERPRINT_DOMAIN);
        Self {
            ring,
            fingerprint_key: mac.finalize().into_bytes().into(),
        }
    }

    /// The published keys at `now` (seconds): the current one and the
    /// previous ones still known.
    pub fn jwks(&self, now: u64) -> JwkSet {
        self.ring.jwks(now)
    }

    /// `user`'s fingerprint in `queue`: 32 hex digits.
    pub fn fingerprint(&self, queue: &str, user: &str) -> String {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.fingerprint_key)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(queue.as_bytes());
        mac.update(b"\n");
        mac.update(user.as_bytes());
        hex::encode(&mac.finalize().into_bytes()[..16])
    }

    /// The signed receipt of `user`'s entry `seq`, placed at `at`.
    pub fn receipt(&self, queue: &QueueName, user: &str, seq: u64, at: u64) -> String {
        let receipt = Receipt {
            queue: queue.to_string(),
            seq,
            fp: self.fingerprint(queue.as_str(), user),
            at,
            iat: crate::clock::now_ms() / 1000,
        };
        self.ring.sign(RECEIPT_TYP, &receipt)
    }

    /// `head` signed.
    pub fn sign_head(&self, head: &Head) -> String {
        self.ring.sign(HEAD_TYP, head)
    }

    /// Checks a receipt's signature and decodes it (`now` in seconds).
    pub fn verify_receipt(&self, receipt: &str, now: u64) -> Result<Receipt, TokenError> {
        self.ring.verify(receipt, RECEIPT_TYP, now)
    }
}
