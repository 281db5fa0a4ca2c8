//! The key ring: the Ed25519 key this instance signs with and the public
//! keys it still accepts, each named by a `kid`.
//!
//! One algorithm only, EdDSA (Ed25519): a token's header may name no other
//! (`HS256` with the public key as the "secret", `none`, RS256 are all
//! refused before any key is looked at), so a public key published in the
//! JWKS document can never be turned into a signing secret. The ring is
//! not specific to admission passes: anything waitroom signs for others to
//! verify (arrival receipts, audit-log heads) signs through [`KeyRing::sign`]
//! and is checked with [`KeyRing::verify`], under its own `typ`.
//!
//! Rotation: the new key becomes the current one; the old one is kept as a
//! *previous* key, retired at a moment (by default when this ring was
//! built). A previous key verifies only tokens it issued before it was
//! retired (`iat` ≤ retirement + skew), and only until every token it could
//! have signed has expired (retirement + the longest token life); after
//! that it is no longer known (`unknown_kid`) nor published.

use std::collections::HashMap;
use std::path::Path;

use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey};
use ed25519_dalek::{SigningKey, VerifyingKey};
use jsonwebtoken::jwk::{
    AlgorithmParameters, CommonParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm,
    OctetKeyPairParameters, OctetKeyPairType, PublicKeyUse, ThumbprintHash,
};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Clock skew allowed between instances on `iat` (a token issued "in the
/// future" by this much is still taken) and on a previous key's
/// retirement.
pub const SKEW_SECS: u64 = 30;

/// The longest `kid` accepted in a token header: anything longer is not
/// one of ours and is refused before a map lookup.
const MAX_KID_LEN: usize = 64;

/// What a token claims about its own time; every token the ring verifies
/// carries `iat`, which a previous key's retirement is checked against.
pub trait Issued {
    /// `iat`, seconds since the Unix epoch.
    fn issued_at(&self) -> u64;
}

/// Why a key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("{0}")]
    Invalid(String),
}

/// Why a token was refused by the ring (signature and header only: the
/// claims' meaning is the caller's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not three base64url parts, a header or payload that is not JSON, or
    /// claims of the wrong shape.
    #[error("the token is malformed")]
    Malformed,
    /// The header names an algorithm other than EdDSA (`none`, HS256, …).
    #[error("the token's algorithm is not EdDSA")]
    Algorithm,
    /// No `kid`, or one this ring does not (or no longer) know.
    #[error("the token's key is not known")]
    UnknownKey,
    /// The header's `typ` is not the one asked for (a receipt offered as a
    /// pass).
    #[error("the token is of another type")]
    WrongType,
    /// The signature does not match.
    #[error("the token's signature does not match")]
    Signature,
    /// Signed by a previous key after it was retired.
    #[error("the token was signed by a retired key after its retirement")]
    Retired,
}

/// A key this ring accepts: its decoding key, its public bytes (for the
/// JWKS document) and, for a previous key, when it was retired.
struct Accepted {
    decoding: DecodingKey,
    public: [u8; 32],
    retired_at: Option<u64>,
}

/// The signing key and the accepted public keys. Build it once at start
/// and share it (`Arc`): signing and verifying take `&self`.
pub struct KeyRing {
    kid: String,
    encoding: EncodingKey,
    accepted: HashMap<String, Accepted>,
    /// The longest life of a token signed by this ring (a previous key is
    /// known until its retirement plus this).
    max_token_life_secs: u64,
}

/// A key as read from a file: a private key can sign; a public one only
/// verify (a previous key).
pub enum KeyMaterial {
    Private(Box<SigningKey>),
    Public(VerifyingKey),
}

impl KeyMaterial {
    /// Reads a PEM file: PKCS#8 `PRIVATE KEY` (`openssl genpkey -algorithm
    /// ed25519`) or SPKI `PUBLIC KEY` (`openssl pkey -pubout`).
    pub fn from_pem_file(path: &Path) -> Result<Self, KeyError> {
        let file_error = |reason: String| KeyError::File {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
        Self::from_pem(&text).map_err(|e| file_error(e.to_string()))
    }

    /// Reads PEM text (see [`KeyMaterial::from_pem_file`]).
    pub fn from_pem(text: &str) -> Result<Self, KeyError> {
        if let Ok(key) = SigningKey::from_pkcs8_pem(text) {
            return Ok(Self::Private(Box::new(key)));
        }
        VerifyingKey::from_public_key_pem(text)
            .map(Self::Public)
            .map_err(|_| {
                KeyError::Invalid(
                    "not an Ed25519 key in PEM (PKCS#8 PRIVATE KEY or SPKI PUBLIC KEY)".into(),
                )
            })
    }

    fn verifying_key(&self) -> VerifyingKey {
        match self {
            Self::Private(key) => key.verifying_key(),
            Self::Public(key) => *key,
        }
    }
}

/// A fresh Ed25519 private key as PKCS#8 PEM (what `waitroom init` writes
/// and the tests use).
pub fn generate_private_pem() -> String {
    let key = generate_signing_key();
    key.to_pkcs8_pem(Default::default())
        .expect("an Ed25519 key encodes as PKCS#8")
        .to_string()
}

fn generate_signing_key() -> SigningKey {
    let mut seed = [0u8; 32];
    rand::fill(&mut seed);
    SigningKey::from_bytes(&seed)
}

/// The `kid` of a public key: the first 16 characters of its RFC 7638
/// thumbprint, so every instance given the same key file names it alike.
pub fn key_id(public: &VerifyingKey) -> String {
    super::crypto::install();
    let jwk = public_jwk(None, &public.to_bytes());
    let thumbprint = jwk
        .thumbprint(ThumbprintHash::SHA256)
        .expect("an OKP key has a thumbprint");
    thumbprint.chars().take(16).collect()
}

fn public_jwk(kid: Option<String>, public: &[u8; 32]) -> Jwk {
    use base64::Engine as _;
    Jwk {
        common: CommonParameters {
            public_key_use: Some(PublicKeyUse::Signature),
            key_algorithm: Some(KeyAlgorithm::EdDSA),
            key_id: kid,
            ..Default::default()
        },
        algorithm: AlgorithmParameters::OctetKeyPair(OctetKeyPairParameters {
            key_type: OctetKeyPairType::OctetKeyPair,
            curve: EllipticCurve::Ed25519,
            x: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(public),
        }),
    }
}

impl KeyRing {
    /// A ring signing with `current`, accepting `previous` keys retired at
    /// `retired_at` (seconds; usually now, when the configuration naming
    /// them is loaded). `max_token_life_secs` is the longest life of a
    /// token it signs.
    pub fn new(
        current: &SigningKey,
        previous: &[KeyMaterial],
        retired_at: u64,
        max_token_life_secs: u64,
    ) -> Result<Self, KeyError> {
        super::crypto::install();
        let der = current
            .to_pkcs8_der()
            .map_err(|e| KeyError::Invalid(format!("the signing key: {e}")))?;
        let encoding = EncodingKey::from_ed_der(der.as_bytes());
        let current_public = current.verifying_key();
        let kid = key_id(&current_public);
        let mut accepted = HashMap::new();
        accepted.insert(kid.clone(), Accepted::new(&current_public, None));
        for key in previous {
            let public = key.verifying_key();
            let id = key_id(&public);
            // The current key listed again among the previous ones stays
            // current (never retired).
            accepted
                .entry(id)
                .or_insert_with(|| Accepted::new(&public, Some(retired_at)));
        }
        Ok(Self {
            kid,
            encoding,
            accepted,
            max_token_life_secs,
        })
    }

    /// A ring from configured PEM files: `current` must hold a private
    /// key; each of `previous` a private or public one.
    pub fn from_files(
        current: &Path,
        previous: &[impl AsRef<Path>],
        retired_at: u64,
        max_token_life_secs: u64,
    ) -> Result<Self, KeyError> {
        let KeyMaterial::Private(signing) = KeyMaterial::from_pem_file(current)? else {
            return Err(KeyError::File {
                path: current.display().to_string(),
                reason: "a public key cannot sign: give the PRIVATE KEY".into(),
            });
        };
        let previous = previous
            .iter()
            .map(|p| KeyMaterial::from_pem_file(p.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(&signing, &previous, retired_at, max_token_life_secs)
    }

    /// A ring with a key generated now: good for one instance only (no
    /// other instance, nor this one after a restart, knows it). The caller
    /// warns.
    pub fn generated(max_token_life_secs: u64) -> Self {
        Self::new(&generate_signing_key(), &[], 0, max_token_life_secs)
            .expect("a generated key encodes")
    }

    /// The current key's id (the `kid` of everything signed now).
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// Signs `claims` with the current key: header `alg` EdDSA, this
    /// ring's `kid` and the given `typ` (`"waitroom-pass+jwt"`, …).
    pub fn sign<T: Serialize>(&self, typ: &str, claims: &T) -> String {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        header.typ = Some(typ.to_owned());
        jsonwebtoken::encode(&header, claims, &self.encoding)
            .expect("claims serialize and an Ed25519 key signs")
    }

    /// Checks a token's header (EdDSA, a known `kid`, `typ`) and signature
    /// and decodes its claims. Times are the caller's to check (it has the
    /// clock), but for a previous key's retirement: `now` (seconds) says
    /// whether the key is still known, and the token's `iat` whether it was
    /// signed before the retirement.
    pub fn verify<T: DeserializeOwned + Issued>(
        &self,
        token: &str,
        typ: &str,
        now: u64,
    ) -> Result<T, TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
        if header.alg != Algorithm::EdDSA {
            return Err(TokenError::Algorithm);
        }
        let kid = header
            .kid
            .filter(|k| k.len() <= MAX_KID_LEN)
            .ok_or(TokenError::UnknownKey)?;
        let key = self
            .accepted
            .get(&kid)
            .filter(|k| self.known_at(k, now))
            .ok_or(TokenError::UnknownKey)?;
        if header.typ.as_deref() != Some(typ) {
            return Err(TokenError::WrongType);
        }
        let mut validation = Validation::new(Algorithm::EdDSA);
        // The caller checks times against its own `now` (tests move it);
        // nothing else is a spec claim here.
        validation.validate_exp = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        let data =
            jsonwebtoken::decode::<T>(token, &key.decoding, &validation).map_err(|e| {
                match e.kind() {
                    jsonwebtoken::errors::ErrorKind::InvalidSignature => TokenError::Signature,
                    jsonwebtoken::errors::ErrorKind::InvalidAlgorithm => TokenError::Algorithm,
                    _ => TokenError::Malformed,
                }
            })?;
        if let Some(retired_at) = key.retired_at
            && data.claims.issued_at() > retired_at.saturating_add(SKEW_SECS)
        {
            return Err(TokenError::Retired);
        }
        Ok(data.claims)
    }

    /// Whether a key is still known at `now`: the current key always; a
    /// previous one until every token it signed before its retirement has
    /// expired.
    fn known_at(&self, key: &Accepted, now: u64) -> bool {
        key.retired_at.is_none_or(|retired| {
            now < retired
                .saturating_add(SKEW_SECS)
                .saturating_add(self.max_token_life_secs)
        })
    }

    /// The JWKS document (`/.well-known/jwks.json`): every key known at
    /// `now`, the current one first.
    pub fn jwks(&self, now: u64) -> JwkSet {
        let mut keys = vec![public_jwk(
            Some(self.kid.clone()),
            &self.accepted[&self.kid].public,
        )];
        let mut previous: Vec<_> = self
            .accepted
            .iter()
            .filter(|(kid, key)| **kid != self.kid && self.known_at(key, now))
            .collect();
        previous.sort_by(|a, b| a.0.cmp(b.0));
        keys.extend(
            previous
                .into_iter()
                .map(|(kid, key)| public_jwk(Some(kid.clone()), &key.public)),
        );
        JwkSet { keys }
    }
}

impl Accepted {
    fn new(public: &VerifyingKey, retired_at: Option<u64>) -> Self {
        let bytes = public.to_bytes();
        Self {
            decoding: DecodingKey::from_ed_der(&bytes),
            public: bytes,
            retired_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Receipt {
        iat: u64,
        n: u32,
    }

    impl Issued for Receipt {
        fn issued_at(&self) -> u64 {
            self.iat
        }
    }

    fn signing(pem: &str) -> SigningKey {
        match KeyMaterial::from_pem(pem).unwrap() {
            KeyMaterial::Private(k) => *k,
            KeyMaterial::Public(_) => panic!("a private key"),
        }
    }

    #[test]
    fn signs_and_verifies_other_token_types() {
        let ring = KeyRing::generated(600);
        let token = ring.sign("receipt+jwt", &Receipt { iat: 100, n: 7 });
        let back: Receipt = ring.verify(&token, "receipt+jwt", 100).unwrap();
        assert_eq!(back, Receipt { iat: 100, n: 7 });
        assert_eq!(
            ring.verify::<Receipt>(&token, "waitroom-pass+jwt", 100),
            Err(TokenError::WrongType)
        );
    }

    #[test]
    fn the_kid_follows_the_key_not_the_instance() {
        let pem = generate_private_pem();
        let a = KeyRing::new(&signing(&pem), &[], 0, 60).unwrap();
        let b = KeyRing::new(&signing(&pem), &[], 0, 60).unwrap();
        assert_eq!(a.kid(), b.kid());
        assert_eq!(a.kid().len(), 16);
        let token = a.sign("t", &Receipt { iat: 1, n: 1 });
        assert!(b.verify::<Receipt>(&token, "t", 1).is_ok());
        let other = KeyRing::generated(60);
        assert_ne!(other.kid(), a.kid());
        assert_eq!(
            other.verify::<Receipt>(&token, "t", 1),
            Err(TokenError::UnknownKey)
        );
    }

    #[test]
    fn a_previous_key_verifies_until_its_tokens_expired_and_not_after_retirement() {
        let old_pem = generate_private_pem();
        let old = KeyRing::new(&signing(&old_pem), &[], 0, 100).unwrap();
        let issued = old.sign("t", &Receipt { iat: 1000, n: 1 });
        let new = KeyRing::new(
            &generate_signing_key(),
            &[KeyMaterial::from_pem(&old_pem).unwrap()],
            1000,
            100,
        )
        .unwrap();
        assert!(new.verify::<Receipt>(&issued, "t", 1050).is_ok());
        assert_eq!(new.jwks(1050).keys.len(), 2);
        // Past retirement + skew + the longest life: gone.
        assert_eq!(
            new.verify::<Receipt>(&issued, "t", 1000 + SKEW_SECS + 100),
            Err(TokenError::UnknownKey)
        );
        assert_eq!(new.jwks(1000 + SKEW_SECS + 100).keys.len(), 1);
        // A token the old key signs after its retirement (a stolen key).
        let late = old.sign("t", &Receipt { iat: 1100, n: 1 });
        assert_eq!(
            new.verify::<Receipt>(&late, "t", 1100),
            Err(TokenError::Retired)
        );
    }

    #[test]
    fn a_public_previous_key_is_enough_to_verify() {
        let old_pem = generate_private_pem();
        let old_key = signing(&old_pem);
        let public_pem = {
            use ed25519_dalek::pkcs8::EncodePublicKey;
            old_key
                .verifying_key()
                .to_public_key_pem(Default::default())
                .unwrap()
        };
        let old = KeyRing::new(&old_key, &[], 0, 100).unwrap();
        let new = KeyRing::new(
            &generate_signing_key(),
            &[KeyMaterial::from_pem(&public_pem).unwrap()],
            10,
            100,
        )
        .unwrap();
        let token = old.sign("t", &Receipt { iat: 5, n: 2 });
        assert!(new.verify::<Receipt>(&token, "t", 20).is_ok());
    }

    #[test]
    fn refuses_other_algorithms_and_bad_signatures() {
        use base64::Engine as _;
        let b64 = |s: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let ring = KeyRing::generated(60);
        let token = ring.sign("t", &Receipt { iat: 1, n: 1 });
        let (head, rest) = token.split_once('.').unwrap();
        let (_, sig) = rest.split_once('.').unwrap();
        // Claims changed under the same signature.
        let forged = format!("{head}.{}.{sig}", b64(br#"{"iat":1,"n":2}"#));
        assert_eq!(
            ring.verify::<Receipt>(&forged, "t", 1),
            Err(TokenError::Signature)
        );
        // `alg: none`, no signature.
        let none = format!(
            "{}.{}.",
            b64(format!(r#"{{"alg":"none","typ":"t","kid":"{}"}}"#, ring.kid()).as_bytes()),
            b64(br#"{"iat":1,"n":1}"#)
        );
        assert!(ring.verify::<Receipt>(&none, "t", 1).is_err());
        // HS256 keyed with the public key's bytes (the JWKS `x`), made by
        // hand: a build without `signed-identity` has no HMAC signer.
        let public = ring.accepted[ring.kid()].public;
        let signing_input = format!(
            "{}.{}",
            b64(format!(r#"{{"alg":"HS256","typ":"t","kid":"{}"}}"#, ring.kid()).as_bytes()),
            b64(br#"{"iat":1,"n":1}"#)
        );
        let mac = {
            use hmac::{KeyInit as _, Mac as _};
            let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&public).unwrap();
            mac.update(signing_input.as_bytes());
            mac.finalize().into_bytes()
        };
        let hs = format!("{signing_input}.{}", b64(&mac));
        assert_eq!(
            ring.verify::<Receipt>(&hs, "t", 1),
            Err(TokenError::Algorithm)
        );
        assert_eq!(
            ring.verify::<Receipt>("not.a.token", "t", 1),
            Err(TokenError::Malformed)
        );
    }

    #[test]
    fn reads_pem_files_and_refuses_a_public_current_key() {
        let dir = std::env::temp_dir().join(format!("waitroom-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let private = dir.join("pass.pem");
        std::fs::write(&private, generate_private_pem()).unwrap();
        let ring = KeyRing::from_files(&private, &[] as &[&Path], 0, 60).unwrap();
        assert_eq!(ring.jwks(0).keys.len(), 1);
        let garbage = dir.join("garbage.pem");
        std::fs::write(
            &garbage,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let e = KeyRing::from_files(&garbage, &[] as &[&Path], 0, 60)
            .err()
            .unwrap();
        assert!(e.to_string().contains("garbage.pem"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
