//! Signed mode: a JWT from the site's own login names the buyer.
//!
//! The token comes in `Authorization: Bearer`, or in a cookie the operator
//! names (EventSource cannot send headers). It is verified with one key
//! and one algorithm, fixed by the configuration: the `alg` a token claims
//! is never trusted to choose the key type. `exp` is required, `nbf` is
//! honoured when present, `iat` may not be in the future, all three with
//! the same small leeway for clock skew; with `--identity-max-lifetime-secs`
//! `iat` is required and `exp - iat` may not exceed it (a token minted to
//! last a year is refused even while it has not expired). `iss` and `aud`
//! are checked when configured, and `sub` is the user id (the `X-User-Id`
//! syntax).

use axum::http::HeaderMap;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::{IdentityError, SignedConfig, SignedKey};
use crate::queue::UserId;

/// The claims waitroom reads; `exp`, `nbf`, `iss` and `aud` are checked by
/// the validation before these are looked at.
#[derive(Deserialize)]
struct Claims {
    sub: Option<serde_json::Value>,
    exp: Option<serde_json::Value>,
    iat: Option<serde_json::Value>,
}

pub(super) struct Verifier {
    key: DecodingKey,
    validation: Validation,
    cookie: Option<String>,
    max_lifetime_secs: Option<u64>,
}

/// Clock skew allowed on `exp`, `nbf` and `iat`: small, as a token past
/// its life must stop working soon after, and one not valid yet must not
/// work long before.
const LEEWAY_SECS: u64 = 30;

impl Verifier {
    pub(super) fn new(config: &SignedConfig) -> Result<Self, String> {
        let (key, algorithm) = match &config.key {
            SignedKey::Secret(secret) => (
                DecodingKey::from_secret(secret).map_err(|e| format!("identity secret: {e}"))?,
                Algorithm::HS256,
            ),
            SignedKey::PublicKeyPem(pem) => {
                if let Ok(key) = DecodingKey::from_ed_pem(pem) {
                    (key, Algorithm::EdDSA)
                } else {
                    let key = DecodingKey::from_rsa_pem(pem).map_err(|e| {
                        format!("identity public key: neither an Ed25519 nor an RSA PEM key: {e}")
                    })?;
                    (key, Algorithm::RS256)
                }
            }
        };
        let mut validation = Validation::new(algorithm);
        validation.leeway = LEEWAY_SECS;
        // Off by default in jsonwebtoken: a token valid from tomorrow
        // would be taken today.
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "sub"]);
        if let Some(iss) = &config.issuer {
            validation.set_issuer(&[iss]);
            validation.required_spec_claims.insert("iss".into());
        }
        match &config.audience {
            Some(aud) => {
                validation.set_audience(&[aud]);
                validation.required_spec_claims.insert("aud".into());
            }
            // Nothing to compare a token's `aud` with.
            None => validation.validate_aud = false,
        }
        Ok(Self {
            key,
            validation,
            cookie: config.cookie.clone(),
            max_lifetime_secs: config.max_lifetime_secs,
        })
    }

    /// What the validation does not check: `iat` not in the future (beyond
    /// the leeway), and the token's whole life within the maximum, if any.
    fn check_times(&self, claims: &Claims) -> Result<(), IdentityError> {
        let says = |m: &str| Err(IdentityError::Invalid(m.to_owned()));
        let iat = match &claims.iat {
            None => None,
            Some(value) => match seconds(value) {
                Some(iat) => Some(iat),
                None => return says("the identity token's iat claim is not a time"),
            },
        };
        let now = jsonwebtoken::get_current_timestamp();
        if iat.is_some_and(|iat| iat > now.saturating_add(LEEWAY_SECS)) {
            return says("the identity token is issued in the future (iat)");
        }
        let Some(max) = self.max_lifetime_secs else {
            return Ok(());
        };
        let Some(iat) = iat else {
            return says("the identity token has no iat claim (needed for its lifetime)");
        };
        // `exp` is required and was checked to be a time by the validation.
        let exp = claims.exp.as_ref().and_then(seconds).unwrap_or(u64::MAX);
        if exp.saturating_sub(iat) > max {
            return says("the identity token lives longer than this site accepts (exp - iat)");
        }
        Ok(())
    }

    /// The raw token: `Authorization: Bearer`, else the configured cookie.
    fn token(&self, headers: &HeaderMap) -> Option<String> {
        let bearer = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, rest) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .filter(|t| !t.is_empty());
        if let Some(token) = bearer {
            return Some(token.to_owned());
        }
        let name = self.cookie.as_deref()?;
        super::cookies(headers, name).find(|v| !v.is_empty())
    }

    pub(super) fn verify_request(&self, headers: &HeaderMap) -> Result<UserId, IdentityError> {
        let token = self.token(headers).ok_or(IdentityError::Missing(
            "sign in first: send your login token (Authorization: Bearer)",
        ))?;
        let data = jsonwebtoken::decode::<Claims>(&token, &self.key, &self.validation)
            .map_err(|e| refusal(e.kind()))?;
        self.check_times(&data.claims)?;
        let sub = match data.claims.sub {
            Some(serde_json::Value::String(s)) => s,
            _ => {
                return Err(IdentityError::Invalid(
                    "the token's sub is not a string".into(),
                ));
            }
        };
        UserId::parse(&sub).map_err(|e| {
            IdentityError::Invalid(format!("the token's sub is not a user id: {}", e.0))
        })
    }
}

/// A NumericDate (seconds since the epoch, fractions allowed) as whole
/// seconds; `None` for anything else.
fn seconds(value: &serde_json::Value) -> Option<u64> {
    value.as_u64().or_else(|| {
        value
            .as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0)
            .map(|f| f as u64)
    })
}

/// What a client is told about a refused token: enough to fix its side,
/// nothing about the key.
fn refusal(kind: &ErrorKind) -> IdentityError {
    let says = |m: &str| IdentityError::Invalid(m.to_owned());
    match kind {
        ErrorKind::ExpiredSignature => IdentityError::Expired,
        ErrorKind::ImmatureSignature => says("the identity token is not valid yet (nbf)"),
        ErrorKind::InvalidClaimFormat(claim) => {
            IdentityError::Invalid(format!("the identity token's {claim} claim is not a time"))
        }
        ErrorKind::InvalidIssuer => says("the identity token is from another issuer"),
        ErrorKind::InvalidAudience => says("the identity token is for another audience"),
        ErrorKind::MissingRequiredClaim(claim) => {
            IdentityError::Invalid(format!("the identity token has no {claim} claim"))
        }
        ErrorKind::InvalidAlgorithm => says("the identity token is signed with another algorithm"),
        ErrorKind::InvalidSignature => says("the identity token's signature does not verify"),
        _ => says("the identity token is malformed"),
    }
}
