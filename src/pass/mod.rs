//! The admission pass: what an admitted buyer carries to the protected
//! site, and what a gateway (nginx `auth_request`, Caddy `forward_auth`,
//! the built-in proxy, or anyone with the JWKS document) checks.
//!
//! A pass is an EdDSA JWT (`typ` [`PASS_TYP`]) naming the visitor (`sub`),
//! the room (the queue, `room`), its issue and expiry times and its session
//! (`jti`). It is a *session*, not a one-shot token: the store counts the
//! live sessions against the room's `maxActive`, activity keeps one alive,
//! and one left idle, or ended by an operator, is *ended*: its id is in
//! every instance's [`EndedSessions`] (refreshed from the store in the
//! background) and its pass is refused from then on, though its signature
//! and `exp` are still good. A gateway verifying offline with the JWKS
//! document sees only `exp`; the check endpoint sees ended sessions too.
//!
//! The hot path ([`PassService::verify`]) is a signature check, or a hit in
//! the cache of passes already verified, a clock read and a lookup in the
//! local ended set: never a store call.
//!
//! - [`keys`]: the key ring (Ed25519, `kid`, rotation, JWKS), reusable for
//!   anything else waitroom signs;
//! - [`returns`]: return-URL validation, so no redirect is ever open;
//! - [`request`]: reading a pass from a request (cookie or bearer).

mod crypto;
pub mod keys;
pub mod request;
pub mod returns;
mod verified;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use jsonwebtoken::jwk::JwkSet;
use serde::{Deserialize, Serialize};

use crate::queue::{QueueName, SessionId, UserId};

pub use keys::{Issued, KeyError, KeyMaterial, KeyRing, TokenError, generate_private_pem};
pub use request::{PassCookie, Presented, pass_from_headers};
pub use returns::{ReturnError, ReturnOrigins, ReturnTo, validate_return};

/// The JWT `typ` of a pass: no other token the ring signs (a receipt, a log
/// head) is ever taken for one.
pub const PASS_TYP: &str = "waitroom-pass+jwt";

/// The longest pass accepted, in bytes: ours are about 400; a longer cookie
/// or header is refused before any parsing.
pub const MAX_PASS_LEN: usize = 2048;

/// What a pass says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassClaims {
    /// The visitor (the queue's buyer id).
    pub sub: UserId,
    /// The room: the queue the visitor was admitted from.
    pub room: QueueName,
    /// Issued at, seconds since the Unix epoch.
    pub iat: u64,
    /// Expires at (the session's longest life), seconds.
    pub exp: u64,
    /// The session's id.
    pub jti: SessionId,
}

/// The claims as they are signed (plain JSON types; checked into
/// [`PassClaims`] after the signature).
#[derive(Serialize, Deserialize)]
struct WireClaims {
    sub: String,
    room: String,
    iat: u64,
    exp: u64,
    jti: String,
}

impl Issued for WireClaims {
    fn issued_at(&self) -> u64 {
        self.iat
    }
}

/// Why a pass was refused. [`PassRejection::code`] is what the check
/// endpoint's `X-Waitroom-Reason` header and the logs say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PassRejection {
    #[error("no pass")]
    Missing,
    #[error("the pass is larger than any pass waitroom issues")]
    Oversized,
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error("the pass has expired")]
    Expired,
    #[error("the pass is issued in the future")]
    NotYetValid,
    #[error("the pass is for another room")]
    OtherRoom,
    #[error("the pass's session has ended")]
    Ended,
}

impl PassRejection {
    /// A short stable code (`expired`, `other_room`, …).
    pub fn code(&self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Oversized => "oversized",
            Self::Token(TokenError::Malformed) => "malformed",
            Self::Token(TokenError::Algorithm) => "algorithm",
            Self::Token(TokenError::UnknownKey) => "unknown_key",
            Self::Token(TokenError::WrongType) => "wrong_type",
            Self::Token(TokenError::Signature) => "signature",
            Self::Token(TokenError::Retired) => "retired_key",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::OtherRoom => "other_room",
            Self::Ended => "ended",
        }
    }
}

/// The ids of sessions ended before their pass expired (idle, or ended by
/// an operator), each kept until its pass's `exp`: the set every check
/// looks in. Filled by the background refresh from the store, never by a
/// store call on a checked request.
#[derive(Default)]
pub struct EndedSessions {
    ids: RwLock<HashMap<SessionId, u64>>,
}

impl EndedSessions {
    /// Marks `id` ended; its pass expires at `exp` (seconds), after which
    /// the entry is no longer needed.
    pub fn insert(&self, id: SessionId, exp: u64) {
        self.ids.write().expect("ended set lock").insert(id, exp);
    }

    /// Whether `id` has ended.
    pub fn contains(&self, id: &SessionId) -> bool {
        self.ids.read().expect("ended set lock").contains_key(id)
    }

    /// Drops the entries whose passes have expired by `now` (seconds).
    pub fn prune(&self, now: u64) {
        self.ids
            .write()
            .expect("ended set lock")
            .retain(|_, exp| *exp > now);
    }

    /// How many are kept.
    pub fn len(&self) -> usize {
        self.ids.read().expect("ended set lock").len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Issues and verifies passes. One per instance, shared (`Arc`).
pub struct PassService {
    ring: Arc<KeyRing>,
    ended: EndedSessions,
    verified: verified::Cache,
    /// Sessions seen active since the background task last took them
    /// (one store call per queue a second, however many requests).
    activity: Mutex<HashMap<QueueName, HashSet<SessionId>>>,
}

impl PassService {
    /// A service signing with `ring`.
    pub fn new(ring: Arc<KeyRing>) -> Self {
        Self {
            ring,
            ended: EndedSessions::default(),
            verified: verified::Cache::default(),
            activity: Mutex::default(),
        }
    }

    /// The key ring (shared with whatever else signs: receipts, log heads).
    pub fn ring(&self) -> &Arc<KeyRing> {
        &self.ring
    }

    /// The local set of ended sessions.
    pub fn ended(&self) -> &EndedSessions {
        &self.ended
    }

    /// Signs a pass.
    pub fn issue(&self, claims: &PassClaims) -> String {
        self.ring.sign(
            PASS_TYP,
            &WireClaims {
                sub: claims.sub.as_str().to_owned(),
                room: claims.room.as_str().to_owned(),
                iat: claims.iat,
                exp: claims.exp,
                jti: claims.jti.as_str().to_owned(),
            },
        )
    }

    /// Verifies a pass at `now` (seconds): its header and signature (or a
    /// cache hit of an earlier verification), `iat` not in the future,
    /// `exp` not past, its session not ended.
    pub fn verify(&self, token: &str, now: u64) -> Result<Arc<PassClaims>, PassRejection> {
        if token.len() > MAX_PASS_LEN {
            return Err(PassRejection::Oversized);
        }
        let claims = match self.verified.get(token) {
            Some(claims) => claims,
            None => {
                let claims = Arc::new(self.verify_signature(token, now)?);
                self.verified.insert(token, &claims);
                claims
            }
        };
        if now >= claims.exp {
            return Err(PassRejection::Expired);
        }
        if claims.iat > now.saturating_add(keys::SKEW_SECS) {
            return Err(PassRejection::NotYetValid);
        }
        if self.ended.contains(&claims.jti) {
            return Err(PassRejection::Ended);
        }
        Ok(claims)
    }

    /// [`PassService::verify`], and the pass must be for `room`.
    pub fn verify_for(
        &self,
        token: &str,
        room: &QueueName,
        now: u64,
    ) -> Result<Arc<PassClaims>, PassRejection> {
        let claims = self.verify(token, now)?;
        if claims.room != *room {
            return Err(PassRejection::OtherRoom);
        }
        Ok(claims)
    }

    fn verify_signature(&self, token: &str, now: u64) -> Result<PassClaims, PassRejection> {
        let wire: WireClaims = self.ring.verify(token, PASS_TYP, now)?;
        let malformed = PassRejection::Token(TokenError::Malformed);
        Ok(PassClaims {
            sub: UserId::parse(&wire.sub).map_err(|_| malformed)?,
            room: QueueName::parse(&wire.room).map_err(|_| malformed)?,
            iat: wire.iat,
            exp: wire.exp,
            jti: SessionId::parse(&wire.jti).map_err(|_| malformed)?,
        })
    }

    /// Notes that the session of `claims` was active (a checked request):
    /// reported to the store in the next batch.
    pub fn note_activity(&self, claims: &PassClaims) {
        let mut activity = self.activity.lock().expect("activity lock");
        match activity.get_mut(&claims.room) {
            Some(ids) => {
                if !ids.contains(&claims.jti) {
                    ids.insert(claims.jti.clone());
                }
            }
            None => {
                activity.insert(claims.room.clone(), HashSet::from([claims.jti.clone()]));
            }
        }
    }

    /// The sessions noted active since the last call, by room.
    pub fn take_activity(&self) -> HashMap<QueueName, HashSet<SessionId>> {
        std::mem::take(&mut *self.activity.lock().expect("activity lock"))
    }

    /// The JWKS document at `now`: every public key a pass may be signed
    /// with.
    pub fn jwks(&self, now: u64) -> JwkSet {
        self.ring.jwks(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(room: &str, iat: u64, exp: u64) -> PassClaims {
        PassClaims {
            sub: UserId::parse("v-1").unwrap(),
            room: QueueName::parse(room).unwrap(),
            iat,
            exp,
            jti: SessionId::generate(),
        }
    }

    fn service() -> PassService {
        PassService::new(Arc::new(KeyRing::generated(3600)))
    }

    #[test]
    fn a_pass_verifies_until_it_expires() {
        let passes = service();
        let c = claims("drop", 1000, 1600);
        let token = passes.issue(&c);
        assert_eq!(passes.verify(&token, 1000), Ok(Arc::new(c.clone())));
        // Twice: the second from the cache, the same answer.
        assert_eq!(passes.verify(&token, 1599), Ok(Arc::new(c.clone())));
        assert_eq!(passes.verify(&token, 1600), Err(PassRejection::Expired));
        let room = QueueName::parse("drop").unwrap();
        assert!(passes.verify_for(&token, &room, 1200).is_ok());
        let other = QueueName::parse("other").unwrap();
        assert_eq!(
            passes.verify_for(&token, &other, 1200),
            Err(PassRejection::OtherRoom)
        );
    }

    #[test]
    fn an_ended_session_is_refused_cached_or_not() {
        let passes = service();
        let c = claims("drop", 1000, 1600);
        let token = passes.issue(&c);
        assert!(passes.verify(&token, 1000).is_ok());
        passes.ended().insert(c.jti.clone(), c.exp);
        assert_eq!(passes.verify(&token, 1001), Err(PassRejection::Ended));
        passes.ended().prune(1599);
        assert_eq!(passes.ended().len(), 1);
        passes.ended().prune(1600);
        assert!(passes.ended().is_empty());
    }

    #[test]
    fn another_rings_pass_and_future_passes_are_refused() {
        let passes = service();
        let stranger = service();
        let token = stranger.issue(&claims("drop", 1000, 1600));
        assert_eq!(
            passes.verify(&token, 1000),
            Err(PassRejection::Token(TokenError::UnknownKey))
        );
        let early = passes.issue(&claims("drop", 2000, 2600));
        assert_eq!(passes.verify(&early, 1000), Err(PassRejection::NotYetValid));
        let huge = "a".repeat(MAX_PASS_LEN + 1);
        assert_eq!(passes.verify(&huge, 1000), Err(PassRejection::Oversized));
    }

    #[test]
    fn a_receipt_signed_by_the_same_ring_is_not_a_pass() {
        let passes = service();
        let c = claims("drop", 1000, 1600);
        let receipt = passes.ring().sign(
            "waitroom-receipt+jwt",
            &WireClaims {
                sub: "v-1".into(),
                room: "drop".into(),
                iat: 1000,
                exp: 1600,
                jti: c.jti.as_str().into(),
            },
        );
        assert_eq!(
            passes.verify(&receipt, 1000),
            Err(PassRejection::Token(TokenError::WrongType))
        );
    }
}
