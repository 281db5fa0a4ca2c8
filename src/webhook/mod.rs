//! Outgoing webhooks: each queue's audit log, POSTed to the operators'
//! endpoints (an order service, a CRM, a fraud check) as it happens.
//!
//! Hooks are configured by flag (`--webhook name=…,url=…,secret=…`), the
//! same on every instance, rather than stored through the admin API: a
//! hook's secret then never sits in the store nor comes back out of an
//! admin read, and a hook is rolled out (and rolled back) with the
//! deployment that the receiving service's change ships with.
//!
//! Delivery (`deliver.rs`) is at least once, and once across instances
//! while they live: each hook is a consumer group on each queue's log, so
//! every entry is handed to one instance, acknowledged only after a 2xx,
//! and taken over by another instance if the one holding it dies. Every
//! request carries an `Idempotency-Key` (queue and entry id) that stays the
//! same on every retry, and a signature over its timestamp and body (this
//! module), so a receiver can both drop duplicates and refuse forgeries.

mod deliver;

use std::fmt;
use std::str::FromStr;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

pub use deliver::{DeliveryOptions, run};

use crate::queue::QueueName;
use crate::queue::audit::AuditKind;

/// The header carrying `t=<unix seconds>,v1=<hex HMAC-SHA256>`.
pub const SIGNATURE_HEADER: &str = "waitroom-signature";

/// One configured hook.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSpec {
    /// 1-32 of `a-z 0-9 - _`: names the consumer group and the metrics.
    pub name: String,
    /// Where to POST (`http://` only: see the crate's notes on TLS).
    pub url: String,
    /// The HMAC key (at least 16 bytes), shared with the receiver.
    pub secret: String,
    /// Kinds sent; the others are acknowledged unsent. Empty: every kind.
    pub kinds: Vec<AuditKind>,
    /// Queues followed. Empty: every live queue.
    pub queues: Vec<QueueName>,
    /// Attempts per entry before it is given up (dead-lettered).
    pub attempts: u32,
    /// An entry older than this (from its id) is given up, ms.
    pub max_age_ms: u64,
    /// The first retry's delay, doubled on each further one (up to
    /// [`MAX_BACKOFF_MS`]), with up to half of it added at random, ms.
    pub backoff_ms: u64,
    /// How long one request may take, ms.
    pub timeout_ms: u64,
}

/// The longest wait between two attempts.
pub const MAX_BACKOFF_MS: u64 = 60_000;

impl fmt::Debug for WebhookSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret: configurations end up in logs.
        f.debug_struct("WebhookSpec")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("kinds", &self.kinds)
            .field("queues", &self.queues)
            .field("attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}

impl WebhookSpec {
    /// Whether entries of `kind` are sent.
    pub fn wants(&self, kind: AuditKind) -> bool {
        self.kinds.is_empty() || self.kinds.contains(&kind)
    }

    /// Whether `queue`'s log is followed.
    pub fn follows(&self, queue: &QueueName) -> bool {
        self.queues.is_empty() || self.queues.contains(queue)
    }

    /// The consumer group of this hook in every queue's log.
    pub fn group(&self) -> String {
        format!("webhook:{}", self.name)
    }

    /// `t=<unix>,v1=<hex>`: HMAC-SHA256 with the hook's secret over
    /// `<unix>.<body>`, so a receiver can refuse a forged body and, by the
    /// time, a replayed one.
    pub fn signature(&self, unix: u64, body: &[u8]) -> String {
        format!("t={unix},v1={}", sign(self.secret.as_bytes(), unix, body))
    }
}

/// The hex HMAC-SHA256 of `<unix>.<body>` under `secret`.
pub fn sign(secret: &[u8], unix: u64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(unix.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// A `--webhook` value that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--webhook: {0}")]
pub struct InvalidWebhook(String);

impl FromStr for WebhookSpec {
    type Err = InvalidWebhook;

    /// `name=…,url=http://…,secret=…[,kinds=a+b][,queues=q+r][,attempts=n]
    /// [,max-age-secs=n][,backoff-ms=n][,timeout-ms=n]`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |m: String| InvalidWebhook(m);
        let mut spec = WebhookSpec {
            name: String::new(),
            url: String::new(),
            secret: String::new(),
            kinds: Vec::new(),
            queues: Vec::new(),
            attempts: 10,
            max_age_ms: 24 * 3600 * 1000,
            backoff_ms: 500,
            timeout_ms: 5_000,
        };
        let number = |k: &str, v: &str, lo: u64, hi: u64| {
            v.parse::<u64>()
                .ok()
                .filter(|n| (lo..=hi).contains(n))
                .ok_or_else(|| bad(format!("{k} must be {lo}-{hi}")))
        };
        for part in s.split(',') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("`{part}` is not key=value")))?;
            match k {
                "name" => spec.name = v.to_owned(),
                "url" => spec.url = v.to_owned(),
                "secret" => spec.secret = v.to_owned(),
                "kinds" => {
                    spec.kinds = v
                        .split('+')
                        .map(|k| k.parse().map_err(|e| bad(format!("kinds: {e}"))))
                        .collect::<Result<_, _>>()?
                }
                "queues" => {
                    spec.queues = v
                        .split('+')
                        .map(|q| QueueName::parse(q).map_err(|e| bad(format!("queues: {e}"))))
                        .collect::<Result<_, _>>()?
                }
                "attempts" => spec.attempts = number(k, v, 1, 100)? as u32,
                "max-age-secs" => spec.max_age_ms = number(k, v, 1, 7 * 24 * 3600)? * 1000,
                "backoff-ms" => spec.backoff_ms = number(k, v, 1, MAX_BACKOFF_MS)?,
                "timeout-ms" => spec.timeout_ms = number(k, v, 100, 60_000)?,
                other => return Err(bad(format!("unknown key `{other}`"))),
            }
        }
        let name_ok = (1..=32).contains(&spec.name.len())
            && spec
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !name_ok {
            return Err(bad("name must be 1-32 of a-z 0-9 - _".into()));
        }
        match reqwest::Url::parse(&spec.url) {
            Ok(u) if u.scheme() == "http" && u.host().is_some() => {}
            Ok(_) => {
                return Err(bad(
                    "url must be http:// (this build has no TLS client: point it at a local relay)"
                        .into(),
                ));
            }
            Err(e) => return Err(bad(format!("url: {e}"))),
        }
        if spec.secret.len() < 16 {
            return Err(bad("secret must be at least 16 bytes".into()));
        }
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_parses_with_defaults_and_refuses_mistakes() {
        let s: WebhookSpec =
            "name=crm,url=http://127.0.0.1:9/h,secret=0123456789abcdef,kinds=admitted+consumed"
                .parse()
                .unwrap();
        assert_eq!(s.kinds, [AuditKind::Admitted, AuditKind::Consumed]);
        assert!(s.wants(AuditKind::Consumed) && !s.wants(AuditKind::Left));
        assert!(s.queues.is_empty() && s.follows(&QueueName::parse("x").unwrap()));
        assert_eq!((s.attempts, s.backoff_ms), (10, 500));
        assert!(!format!("{s:?}").contains("0123456789abcdef"));
        for bad in [
            "name=crm,url=http://h/,secret=short",
            "name=Crm,url=http://h/,secret=0123456789abcdef",
            "name=crm,url=https://h/,secret=0123456789abcdef",
            "name=crm,url=nope,secret=0123456789abcdef",
            "name=crm,url=http://h/,secret=0123456789abcdef,kinds=sold_out",
            "name=crm,url=http://h/,secret=0123456789abcdef,attempts=0",
            "name=crm,url=http://h/,secret=0123456789abcdef,colour=red",
            "name=crm,url=http://h/,secret=0123456789abcdef,oops",
        ] {
            assert!(bad.parse::<WebhookSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_signature_covers_time_and_body() {
        let a = sign(b"secret-secret-16", 100, b"{}");
        assert_eq!(a.len(), 64);
        assert_ne!(a, sign(b"secret-secret-16", 101, b"{}"));
        assert_ne!(a, sign(b"secret-secret-16", 100, b"{ }"));
        assert_ne!(a, sign(b"another-secret-1", 100, b"{}"));
    }
}
