//! Queue tickets: an HMAC-SHA256-signed, opaque string binding a queue and a
//! user, proving who owns a place in line.
//!
//! Browsers carry it as an `HttpOnly` cookie (EventSource cannot send
//! headers); other clients send it as `X-Queue-Ticket`. Any instance that
//! knows the secret accepts any other instance's tickets.

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
}

/// A verified ticket: the queue and the user it was issued for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// The queue the ticket was issued for.
    pub queue: QueueName,
    /// The user the ticket was issued to.
    pub user: UserId,
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
        mac.update(b"waitroom-ticket-v1\n");
        mac.update(payload);
        mac
    }

    /// Issues the ticket for `user` in `queue`.
    pub fn sign(&self, queue: &QueueName, user: &UserId) -> String {
        let payload = format!("{queue}\n{user}");
        let tag = self.mac(payload.as_bytes()).finalize().into_bytes();
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload),
            URL_SAFE_NO_PAD.encode(tag)
        )
    }

    /// Verifies `raw` and that it was issued for `queue`.
    pub fn verify(&self, raw: &str, queue: &QueueName) -> Result<Ticket, TicketError> {
        let ticket = self.verify_any(raw)?;
        if &ticket.queue != queue {
            return Err(TicketError::ForeignQueue);
        }
        Ok(ticket)
    }

    /// Verifies `raw` whatever queue it names.
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
        self.mac(&payload)
            .verify_slice(&tag)
            .map_err(|_| TicketError::Invalid)?;
        let text = std::str::from_utf8(&payload).map_err(|_| TicketError::Invalid)?;
        let (queue, user) = text.split_once('\n').ok_or(TicketError::Invalid)?;
        Ok(Ticket {
            queue: QueueName::parse(queue).map_err(|_| TicketError::Invalid)?,
            user: UserId::parse(user).map_err(|_| TicketError::Invalid)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> QueueName {
        QueueName::parse(s).unwrap()
    }
    fn u(s: &str) -> UserId {
        UserId::parse(s).unwrap()
    }

    #[test]
    fn round_trip() {
        let s = TicketSigner::new(b"0123456789abcdef0123".to_vec());
        let t = s.sign(&q("default"), &u("alice"));
        let v = s.verify(&t, &q("default")).unwrap();
        assert_eq!(v.user, u("alice"));
    }

    #[test]
    fn other_secret_or_tampering_is_refused() {
        let s = TicketSigner::new(b"0123456789abcdef0123".to_vec());
        let other = TicketSigner::random();
        let t = s.sign(&q("default"), &u("alice"));
        assert_eq!(other.verify(&t, &q("default")), Err(TicketError::Invalid));
        let forged_payload = URL_SAFE_NO_PAD.encode("default\nmallory");
        let (_, tag) = t.split_once('.').unwrap();
        assert_eq!(
            s.verify(&format!("{forged_payload}.{tag}"), &q("default")),
            Err(TicketError::Invalid)
        );
        assert_eq!(
            s.verify("forged.AAAA", &q("default")),
            Err(TicketError::Invalid)
        );
        assert_eq!(s.verify("", &q("default")), Err(TicketError::Invalid));
    }

    #[test]
    fn foreign_queue_is_refused() {
        let s = TicketSigner::random();
        let t = s.sign(&q("shoes"), &u("alice"));
        assert_eq!(s.verify(&t, &q("default")), Err(TicketError::ForeignQueue));
    }
}
