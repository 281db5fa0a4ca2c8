//! Visitor cookies: a random visitor id with its HMAC-SHA256, minted on a
//! first join, for shoppers nobody has signed in.
//!
//! The id is 128 random bits, so it cannot be guessed; the MAC makes it
//! unforgeable, so a client cannot pick someone else's id. A cookie whose
//! MAC does not verify is treated as absent: its bearer gets a new visitor,
//! never the place of the id it claims. The key is derived from the ticket
//! secret, so every instance sharing that secret accepts every visitor.

use axum::http::HeaderMap;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::queue::UserId;

type HmacSha256 = Hmac<Sha256>;

/// The name of the visitor cookie on plain HTTP.
pub const VISITOR_COOKIE: &str = "waitroom_visitor";

/// The name of the visitor cookie when it is `Secure`: `__Host-` makes the
/// browser refuse it unless it is `Secure`, `Path=/` and has no `Domain`,
/// so no sibling subdomain or plain-HTTP page can plant one.
pub const VISITOR_COOKIE_SECURE: &str = "__Host-waitroom_visitor";

/// How long a browser keeps its visitor cookie: longer than any ticket
/// (at most 30 days), so a returning visitor finds their place.
pub const VISITOR_MAX_AGE_SECS: i64 = MAX_AGE_SECS;

/// How long a browser keeps its visitor cookie: longer than any ticket
/// (at most 30 days), so a returning visitor finds their place.
const MAX_AGE_SECS: i64 = 30 * 24 * 3600;

/// Prefix of minted ids: tells a visitor from a gateway's user in logs and
/// order rows.
const ID_PREFIX: &str = "v-";

/// The key visitor cookies are signed with.
pub(super) struct VisitorKey {
    key: Vec<u8>,
}

impl VisitorKey {
    /// A key of its own, derived from `secret`, so a visitor cookie's MAC
    /// can never be replayed as a ticket's or the other way round.
    pub(super) fn derive(secret: &[u8]) -> Self {
        let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
        mac.update(b"waitroom visitor cookie key v1");
        Self {
            key: mac.finalize().into_bytes().to_vec(),
        }
    }

    fn mac(&self, id: &str) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(b"waitroom-visitor-v1\n");
        mac.update(id.as_bytes());
        mac
    }

    /// The cookie value of visitor `id`: `<id>.<mac>`.
    fn sign(&self, id: &str) -> String {
        let tag = URL_SAFE_NO_PAD.encode(self.mac(id).finalize().into_bytes());
        format!("{id}.{tag}")
    }

    /// The visitor a cookie value names, if its MAC verifies (in constant
    /// time).
    fn verify(&self, value: &str) -> Option<UserId> {
        let (id, tag) = value.rsplit_once('.')?;
        if !id.starts_with(ID_PREFIX) {
            return None;
        }
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        self.mac(id).verify_slice(&tag).ok()?;
        UserId::parse(id).ok()
    }

    /// The visitor of the first valid visitor cookie in `headers`.
    pub(super) fn verify_request(&self, headers: &HeaderMap) -> Option<UserId> {
        // Both names, the Secure one first. Over HTTPS the plain name
        // never gets here: the HTTP edge drops it (it can be planted by
        // any page of the site; see `crate::http::cookies`).
        super::cookies(headers, VISITOR_COOKIE_SECURE)
            .chain(super::cookies(headers, VISITOR_COOKIE))
            .find_map(|v| self.verify(&v))
    }

    /// A new visitor and its signed cookie value (the HTTP edge builds the
    /// cookie around it).
    pub(super) fn mint(&self) -> (UserId, String) {
        let mut bytes = [0u8; 16];
        rand::fill(&mut bytes);
        let id = format!("{ID_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes));
        let user = UserId::parse(&id).expect("a minted id is a valid user id");
        (user, self.sign(&id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(cookie: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("cookie", cookie.parse().unwrap());
        h
    }

    #[test]
    fn a_minted_cookie_verifies_and_an_altered_one_does_not() {
        let key = VisitorKey::derive(b"0123456789abcdef0123456789abcdef");
        let (user, value) = key.mint();
        let pair = format!("{VISITOR_COOKIE}={value}");
        assert_eq!(key.verify_request(&headers(&pair)), Some(user.clone()));
        let secure = format!("{VISITOR_COOKIE_SECURE}={value}");
        assert_eq!(key.verify_request(&headers(&secure)), Some(user.clone()));
        let elsewhere = format!("other_cookie={value}");
        assert_eq!(key.verify_request(&headers(&elsewhere)), None);

        // Another id with the same MAC, a changed MAC, no MAC, another key.
        let value = pair.split_once('=').unwrap().1;
        let (id, tag) = value.rsplit_once('.').unwrap();
        let other_id = format!("{id}x");
        let forged = [
            format!("{VISITOR_COOKIE}={other_id}.{tag}"),
            format!(
                "{VISITOR_COOKIE}={id}.{}{}",
                if tag.starts_with('A') { 'B' } else { 'A' },
                &tag[1..]
            ),
            format!("{VISITOR_COOKIE}={id}"),
            format!("{VISITOR_COOKIE}=v-attacker"),
        ];
        for cookie in forged {
            assert_eq!(key.verify_request(&headers(&cookie)), None, "{cookie}");
        }
        let other = VisitorKey::derive(b"another secret of sixteen bytes+");
        assert_eq!(other.verify_request(&headers(&pair)), None);
    }
}
