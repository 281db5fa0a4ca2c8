//! The key that signs arrival receipts and log heads, and its public half
//! as a JWK for `/.well-known/waitroom-keys.json`.
//!
//! Signatures are compact JWS (RFC 7515) with `alg` `EdDSA` (Ed25519, RFC
//! 8037) and the key's `kid` in the header: any JOSE library checks them,
//! and `tools/verify-queue` does with nothing but Ed25519.
//!
//! The key is derived from the ticket secret, which every instance shares
//! already (`--ticket-secret`, or the one shared through Redis), so every
//! instance signs with the same key without a key file of its own; a new
//! ticket secret is a new key with a new `kid`, and `--fairness-old-secret`
//! keeps publishing the previous one so receipts signed before the
//! rotation still check.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ed25519_dalek::{Signer, SigningKey};
use hmac::{Hmac, KeyInit, Mac};
use serde::Serialize;
use sha2::{Digest, Sha256};

/// Domain of the key derivation, so the key is no other use's HMAC.
const KEY_DOMAIN: &[u8] = b"waitroom-fairness-signing-key-v1";

/// One Ed25519 key with its id.
pub struct LogKey {
    key: SigningKey,
    kid: String,
}

/// A public key as JWK (RFC 8037 `OKP`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Jwk {
    pub kty: &'static str,
    pub crv: &'static str,
    pub x: String,
    pub kid: String,
    pub alg: &'static str,
    #[serde(rename = "use")]
    pub usage: &'static str,
}

impl LogKey {
    /// The key derived from `secret` (the ticket secret).
    pub fn derive(secret: &[u8]) -> Self {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(KEY_DOMAIN);
        let seed: [u8; 32] = mac.finalize().into_bytes().into();
        let key = SigningKey::from_bytes(&seed);
        // The kid names the public key: the first 16 hex digits of its hash.
        let kid = hex::encode(&Sha256::digest(key.verifying_key().as_bytes())[..8]);
        Self { key, kid }
    }

    /// The key's id, in every signature's header.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public half as a JWK.
    pub fn jwk(&self) -> Jwk {
        Jwk {
            kty: "OKP",
            crv: "Ed25519",
            x: B64.encode(self.key.verifying_key().as_bytes()),
            kid: self.kid.clone(),
            alg: "EdDSA",
            usage: "sig",
        }
    }

    /// `claims` signed as a compact JWS of type `typ`.
    pub fn sign(&self, typ: &str, claims: &impl Serialize) -> String {
        let header = serde_json::json!({"alg": "EdDSA", "kid": self.kid, "typ": typ});
        // JSON values and plain structs always serialize.
        let header = B64.encode(serde_json::to_vec(&header).unwrap_or_default());
        let payload = B64.encode(serde_json::to_vec(claims).unwrap_or_default());
        let input = format!("{header}.{payload}");
        let signature = B64.encode(self.key.sign(input.as_bytes()).to_bytes());
        format!("{input}.{signature}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signature, Verifier, VerifyingKey};

    #[test]
    fn signatures_verify_with_the_published_key_only() {
        let key = LogKey::derive(b"secret one");
        let jws = key.sign("test", &serde_json::json!({"a": 1}));
        let parts: Vec<&str> = jws.split('.').collect();
        let public: [u8; 32] = B64.decode(&key.jwk().x).unwrap().try_into().unwrap();
        let public = VerifyingKey::from_bytes(&public).unwrap();
        let sig: [u8; 64] = B64.decode(parts[2]).unwrap().try_into().unwrap();
        let input = format!("{}.{}", parts[0], parts[1]);
        assert!(
            public
                .verify(input.as_bytes(), &Signature::from_bytes(&sig))
                .is_ok()
        );
        assert!(
            public
                .verify(b"other", &Signature::from_bytes(&sig))
                .is_err()
        );
        // The same secret is the same key on every instance; another is not.
        assert_eq!(LogKey::derive(b"secret one").kid(), key.kid());
        assert_ne!(LogKey::derive(b"secret two").kid(), key.kid());
    }
}
