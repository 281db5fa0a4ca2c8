//! Where the fairness log's signatures come from: the admission pass's
//! key ring (`crate::pass::KeyRing`: Ed25519, `kid`, rotation, JWKS),
//! never a key system of its own. Receipts and heads are compact JWS
//! signed by the ring under their own `typ`, so none is ever taken for a
//! pass, and any JOSE library (or `tools/verify-queue`) checks them with
//! the published keys.
//!
//! The ring is its own, not the pass's: [`shared_ring`] derives its key
//! from the ticket secret, which every instance shares already
//! (`--ticket-secret`, or the one shared through Redis), so every
//! instance signs with the same key across restarts with nothing more to
//! configure. The pass's ring suits passes, not receipts: without
//! `--pass-key` its key is each process's own, and a retired pass key is
//! published only until its passes expire (an hour), where a receipt must
//! verify for as long as anyone asks about the sale (a year).

use ed25519_dalek::SigningKey;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::pass::KeyRing;

/// Domain of the key derivation, so the key is no other use's HMAC.
const KEY_DOMAIN: &[u8] = b"waitroom-fairness-signing-key-v1";

/// A receipt or head never expires: the longest life a ring is told of
/// (how long a retired key stays published) is a year.
pub const SIGNED_LIFE_SECS: u64 = 365 * 86_400;

/// A ring signing with the key derived from `secret` (the ticket secret).
pub fn shared_ring(secret: &[u8]) -> KeyRing {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
    mac.update(KEY_DOMAIN);
    let seed: [u8; 32] = mac.finalize().into_bytes().into();
    KeyRing::new(&SigningKey::from_bytes(&seed), &[], 0, SIGNED_LIFE_SECS)
        .unwrap_or_else(|e| unreachable!("a derived Ed25519 key encodes: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_instance_with_the_secret_has_the_key_and_no_other_does() {
        let one = shared_ring(b"secret one");
        assert_eq!(shared_ring(b"secret one").kid(), one.kid());
        assert_ne!(shared_ring(b"secret two").kid(), one.kid());
    }
}
