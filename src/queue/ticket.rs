//! Queue tickets: an HMAC-SHA256-signed, opaque string binding a queue, a
//! user, one entry (the arrival sequence the store gave that place in line)
//! and an expiry, proving who owns a place in line.
//!
//! Browsers carry it as an `HttpOnly` cookie (EventSource cannot send
//! headers); other clients send it as `X-Queue-Ticket`. Any instance that
//! knows the secret accepts any other instance's tickets. The signature and
//! the expiry are checked here, without the store; whether the entry is
//! still the user's current one is the caller's second check, so a ticket
//! ends with its place (left, dropped, token used or expired) and a new
//! place always gets a new ticket.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::{QueueName, UserId};

type HmacSha256 = Hmac<Sha256>;

/// Why a presented ticket was refused. Deliberately vague towards clients.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    /// Not of the ticket's shape, or its signature does not verify.
    #[error("the queue ticket is malformed or forged")]
    Invalid,
    /// Valid, but for another queue than the one asked about.
    #[error("the queue ticket belongs to another queue")]
    ForeignQueue,
    /// Valid, but past its expiry: join again for a fresh one.
    #[error("the queue ticket has expired; join again for a fresh one")]
    Expired,
}

/// A verified ticket: what it was issued for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// The queue the ticket was issued for.
    pub queue: QueueName,
    /// The user the ticket was issued to.
    pub user: UserId,
    /// The entry (arrival sequence) the ticket stands for.
    pub entry: u64,
    /// When the ticket stops being accepted, ms since the epoch.
    pub expires_at_ms: u64,
}

/// Signs and verifies tickets with one secret.
#[derive(Clone)]
pub struct TicketSigner {
    key: Vec<u8>,
}

impl TicketSigner {
    /// A signer using `secret` (at least 16 bytes; checked by the config).
    pub fn new(secret: impl Into<Vec<u8>>) -> Self {
        Self { key: secret.into() }
    }

    /// A signer with 32 random bytes, for a single in-memory process.
    pub fn random() -> Self {
        let mut key = vec![0u8; 32];
        rand::fill(&mut key[..]);
        Self { key }
    }

    fn mac(&self, payload: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes any key length");
        // v2: the payload gained the entry and the expiry; a v1 ticket
        // (queue and user only) can never verify as a v2 one.
        mac.update(b"waitroom-ticket-v2\n");
        mac.update(payload);
        mac
    }

    /// Issues the ticket for `user`'s `entry` in `queue`, accepted until
    /// `expires_at_ms` (ms since the epoch).
    pub fn sign(&self, queue: &QueueName, user: &UserId, entry: u64, expires_at_ms: u64) -> String {
        let payload = format!("{queue}\n{user}\n{entry}\n{expires_at_ms}");
        let tag = self.mac(payload.as_bytes()).finalize().into_bytes();
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload),
            URL_SAFE_NO_PAD.encode(tag)
        )
    }

    /// Verifies `raw`, that it was issued for `queue` and that it has not
    /// expired at `now_ms`.
    pub fn verify(&self, raw: &str, queue: &QueueName, now_ms: u64) -> Result<Ticket, TicketError> {
        let ticket = self.verify_any(raw)?;
        if &ticket.queue != queue {
            return Err(TicketError::ForeignQueue);
        }
        if now_ms >= ticket.expires_at_ms {
            return Err(TicketError::Expired);
        }
        Ok(ticket)
    }

    /// Verifies `raw`'s signature and shape, whatever queue it names and
    /// however old it is.
    pub fn verify_any(&self, raw: &str) -> Result<Ticket, TicketError> {
        // Tickets are ~150 bytes; refuse anything far larger before decoding.
        if raw.len() > 512 {
            return Err(TicketError::Invalid);
        }
        let (payload_b64, tag_b64) = raw.split_once('.').ok_or(TicketError::Invalid)?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload_b64)
            .map_err(|_| TicketError::Invalid)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag_b64)
            .map_err(|_| TicketError::Invalid)?;
        // Constant-time comparison of the tag; nothing of the payload is
        // trusted (or even parsed) before it verifies.
        self.mac(&payload)
            .verify_slice(&tag)
            .map_err(|_| TicketError::Invalid)?;
        let text = std::str::from_utf8(&payload).map_err(|_| TicketError::Invalid)?;
        let mut fields = text.split('\n');
        let (Some(queue), Some(user), Some(entry), Some(expires), None) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return Err(TicketError::Invalid);
        };
        Ok(Ticket {
            queue: QueueName::parse(queue).map_err(|_| TicketError::Invalid)?,
            user: UserId::parse(user).map_err(|_| TicketError::Invalid)?,
            entry: entry.parse().map_err(|_| TicketError::Invalid)?,
            expires_at_ms: expires.parse().map_err(|_| TicketError::Invalid)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    fn q(s: &str) -> QueueName {
        QueueName::parse(s).unwrap()
    }
    fn u(s: &str) -> UserId {
        UserId::parse(s).unwrap()
    }

    #[test]
    fn round_trip() {
        let s = TicketSigner::new(b"0123456789abcdef0123".to_vec());
        let t = s.sign(&q("default"), &u("alice"), 42, NOW + 1000);
        let v = s.verify(&t, &q("default"), NOW).unwrap();
        assert_eq!(v.user, u("alice"));
        assert_eq!((v.entry, v.expires_at_ms), (42, NOW + 1000));
    }

    #[test]
    fn each_entry_and_expiry_gets_its_own_ticket() {
        let s = TicketSigner::random();
        let a = s.sign(&q("default"), &u("alice"), 1, NOW + 1000);
        let b = s.sign(&q("default"), &u("alice"), 2, NOW + 1000);
        let c = s.sign(&q("default"), &u("alice"), 1, NOW + 2000);
        assert!(a != b && a != c && b != c);
    }

    #[test]
    fn expired_is_refused_from_its_expiry_on() {
        let s = TicketSigner::random();
        let t = s.sign(&q("default"), &u("alice"), 7, NOW);
        assert!(s.verify(&t, &q("default"), NOW - 1).is_ok());
        assert_eq!(s.verify(&t, &q("default"), NOW), Err(TicketError::Expired));
    }

    #[test]
    fn other_secret_or_tampering_is_refused() {
        let s = TicketSigner::new(b"0123456789abcdef0123".to_vec());
        let other = TicketSigner::random();
        let t = s.sign(&q("default"), &u("alice"), 3, NOW + 1000);
        assert_eq!(
            other.verify(&t, &q("default"), NOW),
            Err(TicketError::Invalid)
        );
        let (_, tag) = t.split_once('.').unwrap();
        for forged in [
            "default\nmallory\n3\n1800000001000",
            "default\nalice\n4\n1800000001000",
            "default\nalice\n3\n9999999999999",
        ] {
            let forged_payload = URL_SAFE_NO_PAD.encode(forged);
            assert_eq!(
                s.verify(&format!("{forged_payload}.{tag}"), &q("default"), NOW),
                Err(TicketError::Invalid)
            );
        }
        assert_eq!(
            s.verify("forged.AAAA", &q("default"), NOW),
            Err(TicketError::Invalid)
        );
        assert_eq!(s.verify("", &q("default"), NOW), Err(TicketError::Invalid));
    }

    #[test]
    fn a_signed_payload_of_the_wrong_shape_is_refused() {
        let s = TicketSigner::random();
        for payload in [
            "default\nalice",
            "default\nalice\nx\n1",
            "default\nalice\n1\n2\n3",
        ] {
            let tag = s.mac(payload.as_bytes()).finalize().into_bytes();
            let raw = format!(
                "{}.{}",
                URL_SAFE_NO_PAD.encode(payload),
                URL_SAFE_NO_PAD.encode(tag)
            );
            assert_eq!(s.verify_any(&raw), Err(TicketError::Invalid), "{payload:?}");
        }
    }

    #[test]
    fn foreign_queue_is_refused() {
        let s = TicketSigner::random();
        let t = s.sign(&q("shoes"), &u("alice"), 1, NOW + 1000);
        assert_eq!(
            s.verify(&t, &q("default"), NOW),
            Err(TicketError::ForeignQueue)
        );
    }

    /// A ticket signed by `s` whose entry is written with leading zeros
    /// until the whole ticket is `len` characters (sign never pads; this
    /// is a validly signed ticket of an unusual size).
    fn padded_ticket(s: &TicketSigner, len: usize) -> Option<String> {
        (0..600).find_map(|zeros| {
            let payload = format!("default\nalice\n{}7\n{}", "0".repeat(zeros), NOW + 1000);
            let tag = s.mac(payload.as_bytes()).finalize().into_bytes();
            let raw = format!(
                "{}.{}",
                URL_SAFE_NO_PAD.encode(payload),
                URL_SAFE_NO_PAD.encode(tag)
            );
            (raw.len() == len).then_some(raw)
        })
    }

    #[test]
    fn tickets_over_512_bytes_are_refused_before_decoding() {
        let s = TicketSigner::random();
        let at_limit = padded_ticket(&s, 512).unwrap();
        let t = s.verify(&at_limit, &q("default"), NOW).unwrap();
        assert_eq!((t.user, t.entry), (u("alice"), 7));
        let over = padded_ticket(&s, 514).unwrap();
        assert_eq!(
            s.verify(&over, &q("default"), NOW),
            Err(TicketError::Invalid)
        );
    }
}
