//! Outgoing webhooks: each queue's audit log, POSTed to the operators'
//! endpoints (an order service, a CRM, a fraud check) as it happens.
//!
//! Hooks are configured in the configuration file (`[[webhooks]]` tables,
//! [`WebhookTable`]), the same on every instance, rather than stored through the admin API: a
//! hook's secret then never sits in the store nor comes back out of an
//! admin read, and a hook is rolled out (and rolled back) with the
//! deployment that the receiving service's change ships with.
//!
//! Delivery (`deliver.rs`) is at least once, and once across instances
//! while they live: each hook is a consumer group on each queue's log, so
//! every entry is handed to one instance, acknowledged only after a 2xx,
//! and taken over by another instance if the one holding it dies. Every
//! request carries an idempotency key (queue and entry id) that stays the
//! same on every retry, in its body as `idempotencyKey` and as the
//! `Idempotency-Key` header, and a signature over its timestamp and body
//! (this module), so a receiver can both refuse forgeries and drop
//! duplicates. It must drop them by the body's key: the header is not
//! signed, so a captured delivery replayed under another header key would
//! otherwise be taken twice.
//!
//! Transport (`tls.rs`): `https://` with the built-in roots plus a hook's
//! own `ca`; `http://` only to a loopback receiver (a local relay) unless
//! the hook says `insecure_http = true`, because the bodies name buyers and
//! a signature proves who sent them, not that nobody else read them.

mod deliver;
// Without `https-webhooks`, a plain-TCP client of the same shape: no TLS
// crates are built, and an `https://` hook or `ca=` is refused when the
// flag is parsed.
mod connect;
#[cfg(feature = "https-webhooks")]
mod tls;
#[cfg(not(feature = "https-webhooks"))]
#[path = "plain.rs"]
mod tls;

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

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
    /// Where to POST: `https://`, or `http://` to a loopback host (any
    /// host with [`WebhookSpec::insecure_http`]).
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
    /// Certificates trusted for this hook besides the built-in roots
    /// (`ca = "<PEM file>"`), read when the file is loaded.
    pub ca: Option<ExtraCa>,
    /// `insecure_http = true`: `http://` to a host that is not loopback.
    pub insecure_http: bool,
}

/// A hook's `ca` file and the certificates read from it at start-up.
#[derive(Clone, PartialEq, Eq)]
pub struct ExtraCa {
    /// The file, as given (for messages).
    pub path: PathBuf,
    /// Its certificates, DER, each a usable trust anchor.
    pub certs: Vec<tls::Certificate>,
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
            .field("ca", &self.ca.as_ref().map(|c| &c.path))
            .field("insecure_http", &self.insecure_http)
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

/// A `[[webhooks]]` table that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidWebhook(String);

/// One `[[webhooks]]` table of the configuration file, as written.
///
/// ```toml
/// [[webhooks]]
/// name = "crm"
/// url = "https://crm.internal:8443/hooks"
/// secret = "…"
/// kinds = ["admitted", "consumed"]   # default: every kind
/// queues = ["spring-drop"]           # default: every queue
/// attempts = 10
/// max_age_secs = 86400
/// backoff_ms = 500
/// timeout_ms = 5000
/// ca = "/etc/waitroom/internal-ca.pem"
/// insecure_http = false
/// ```
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookTable {
    pub name: String,
    pub url: String,
    pub secret: String,
    #[serde(default)]
    pub kinds: Vec<String>,
    #[serde(default)]
    pub queues: Vec<String>,
    pub attempts: Option<u64>,
    pub max_age_secs: Option<u64>,
    pub backoff_ms: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub ca: Option<PathBuf>,
    #[serde(default)]
    pub insecure_http: bool,
}

/// The keys of a `[[webhooks]]` table and what each does (for the
/// generated documentation and `waitroom init`).
pub const TABLE_KEYS: &[(&str, &str)] = &[
    (
        "name",
        "1-32 of `a-z 0-9 - _`: names the consumer group and the metrics (required)",
    ),
    (
        "url",
        "where to POST: `https://`, or `http://` to a loopback host (required)",
    ),
    (
        "secret",
        "the HMAC key shared with the receiver, at least 16 bytes (required)",
    ),
    (
        "kinds",
        "the audit kinds sent (`[\"admitted\", \"consumed\"]`); default: every kind",
    ),
    ("queues", "the queues followed; default: every live queue"),
    (
        "attempts",
        "attempts per entry before it is given up, 1-100 (default 10)",
    ),
    (
        "max_age_secs",
        "an entry older than this is given up, 1-604800 (default 86400)",
    ),
    (
        "backoff_ms",
        "the first retry's delay, doubled on each further one, 1-60000 (default 500)",
    ),
    (
        "timeout_ms",
        "how long one request may take, 100-60000 (default 5000)",
    ),
    (
        "ca",
        "a PEM file of certificates trusted besides the built-in roots (https only)",
    ),
    (
        "insecure_http",
        "`true`: `http://` to a host that is not loopback (default false)",
    ),
];

impl WebhookSpec {
    /// One `[[webhooks]]` table's text (its keys, without the header),
    /// checked as the configuration file's are.
    pub fn from_toml(table: &str) -> Result<Self, InvalidWebhook> {
        let table: WebhookTable =
            toml::from_str(table).map_err(|e| InvalidWebhook(e.message().to_owned()))?;
        table.into_spec()
    }
}

impl WebhookTable {
    /// Checks the table and reads its `ca` file: a hook that cannot be used
    /// stops the start, naming the hook (never its secret).
    pub fn into_spec(self) -> Result<WebhookSpec, InvalidWebhook> {
        let bad = |m: String| InvalidWebhook(m);
        let number = |k: &str, v: Option<u64>, default: u64, lo: u64, hi: u64| {
            let v = v.unwrap_or(default);
            if (lo..=hi).contains(&v) {
                Ok(v)
            } else {
                Err(format!("{k} must be {lo}-{hi}"))
            }
        };
        let name_ok = (1..=32).contains(&self.name.len())
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !name_ok {
            return Err(bad("name must be 1-32 of a-z 0-9 - _".into()));
        }
        // From here on, messages name the hook: there may be several.
        let bad = |m: String| InvalidWebhook(format!("hook `{}`: {m}", self.name));
        let kinds = self
            .kinds
            .iter()
            .map(|k| k.parse().map_err(|e| bad(format!("kinds: {e}"))))
            .collect::<Result<Vec<AuditKind>, _>>()?;
        let queues = self
            .queues
            .iter()
            .map(|q| QueueName::parse(q).map_err(|e| bad(format!("queues: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let attempts = number("attempts", self.attempts, 10, 1, 100).map_err(&bad)?;
        let max_age_secs =
            number("max_age_secs", self.max_age_secs, 86_400, 1, 7 * 24 * 3600).map_err(&bad)?;
        let backoff_ms =
            number("backoff_ms", self.backoff_ms, 500, 1, MAX_BACKOFF_MS).map_err(&bad)?;
        let timeout_ms = number("timeout_ms", self.timeout_ms, 5_000, 100, 60_000).map_err(&bad)?;
        self.check_url().map_err(&bad)?;
        if self.secret.len() < 16 {
            return Err(bad("secret must be at least 16 bytes".into()));
        }
        let ca = match self.ca {
            Some(path) if path.as_os_str().is_empty() => {
                return Err(bad("ca needs a PEM file's path".into()));
            }
            Some(path) => {
                let certs =
                    tls::read_ca(&path).map_err(|e| bad(format!("ca {}: {e}", path.display())))?;
                Some(ExtraCa { path, certs })
            }
            None => None,
        };
        Ok(WebhookSpec {
            name: self.name,
            url: self.url,
            secret: self.secret,
            kinds,
            queues,
            attempts: attempts as u32,
            max_age_ms: max_age_secs * 1000,
            backoff_ms,
            timeout_ms,
            ca,
            insecure_http: self.insecure_http,
        })
    }

    /// The url: https (in a build with TLS), or http to this machine or
    /// with `insecure_http`; `ca` only with https.
    fn check_url(&self) -> Result<(), String> {
        let url = url::Url::parse(&self.url).map_err(|e| format!("url: {e}"))?;
        let Some(host) = url.host_str() else {
            return Err("url has no host".into());
        };
        match url.scheme() {
            "https" if self.insecure_http => Err("insecure_http = true is for http:// urls".into()),
            "https" if !tls::HTTPS => Err(tls::NO_HTTPS.into()),
            "https" => Ok(()),
            "http" if self.ca.is_some() => Err("ca needs an https:// url".into()),
            "http" if self.insecure_http || is_loopback(host) => Ok(()),
            "http" => Err(format!(
                "url is http:// to `{host}`: entries (buyers' ids) would cross the network \
                 in clear; use https://, or add insecure_http = true"
            )),
            other => Err(format!("url must be https:// (not {other}://)")),
        }
    }
}

/// `localhost`, 127.0.0.0/8 or `::1`: a receiver on this machine (a
/// relay or sidecar), where plain HTTP crosses no network.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: &str = "secret = \"0123456789abcdef\"\n";

    fn spec(lines: &str) -> Result<WebhookSpec, String> {
        WebhookSpec::from_toml(&format!("{S}{lines}")).map_err(|e| e.to_string())
    }

    #[test]
    fn a_table_parses_with_defaults_and_refuses_mistakes() {
        let s = spec(
            "name = \"crm\"\nurl = \"http://127.0.0.1:9/h\"\nkinds = [\"admitted\", \"consumed\"]",
        )
        .unwrap();
        assert_eq!(s.kinds, [AuditKind::Admitted, AuditKind::Consumed]);
        assert!(s.wants(AuditKind::Consumed) && !s.wants(AuditKind::Left));
        assert!(s.queues.is_empty() && s.follows(&QueueName::parse("x").unwrap()));
        assert_eq!((s.attempts, s.backoff_ms), (10, 500));
        assert!(!format!("{s:?}").contains("0123456789abcdef"));
        assert!(
            WebhookSpec::from_toml("name = \"crm\"\nurl = \"https://h/\"\nsecret = \"short\"")
                .is_err()
        );
        for bad in [
            "name = \"Crm\"\nurl = \"http://h/\"",
            "name = \"crm\"\nurl = \"http://10.0.0.5/h\"",
            "name = \"crm\"\nurl = \"http://orders.internal/h\"",
            "name = \"crm\"\nurl = \"ftp://h/\"",
            "name = \"crm\"\nurl = \"https://h/\"\ninsecure_http = true",
            "name = \"crm\"\nurl = \"http://10.0.0.5/h\"\ninsecure_http = \"yes\"",
            "name = \"crm\"\nurl = \"http://127.0.0.1/h\"\nca = \"/etc/hostname\"",
            "name = \"crm\"\nurl = \"https://h/\"\nca = \"\"",
            "name = \"crm\"\nurl = \"nope\"",
            "name = \"crm\"\nurl = \"http://h/\"\nkinds = [\"sold_out\"]",
            "name = \"crm\"\nurl = \"http://127.0.0.1/h\"\nattempts = 0",
            "name = \"crm\"\nurl = \"http://127.0.0.1/h\"\ncolour = \"red\"",
            "url = \"http://127.0.0.1/h\"",
        ] {
            assert!(spec(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn plain_http_only_to_loopback_unless_the_hook_allows_it() {
        let ok = |url: &str, extra: &str| {
            spec(&format!("name = \"orders\"\nurl = \"{url}\"\n{extra}")).map(|h| h.insecure_http)
        };
        for url in [
            #[cfg(feature = "https-webhooks")]
            "https://orders.example/h",
            "http://127.0.0.1:8080/h",
            "http://127.9.9.9/h",
            "http://localhost/h",
            "http://[::1]:81/h",
        ] {
            assert_eq!(ok(url, ""), Ok(false), "{url}");
        }
        assert_eq!(ok("http://10.0.0.5/h", "insecure_http = true"), Ok(true));
        let refused = ok("http://10.0.0.5/h", "").unwrap_err();
        assert!(
            refused.contains("hook `orders`") && refused.contains("insecure_http = true"),
            "{refused}"
        );
    }

    #[cfg(not(feature = "https-webhooks"))]
    #[test]
    fn without_tls_an_https_hook_is_refused_naming_the_feature() {
        for lines in [
            "name = \"billing\"\nurl = \"https://h/\"",
            "name = \"billing\"\nurl = \"https://h/\"\nca = \"/etc/hostname\"",
        ] {
            let e = spec(lines).unwrap_err();
            assert!(
                e.contains("hook `billing`") && e.contains("`https-webhooks`"),
                "{e}"
            );
        }
    }

    #[cfg(feature = "https-webhooks")]
    #[test]
    fn a_ca_file_is_read_when_loaded_and_its_errors_name_the_hook() {
        let e = spec("name = \"billing\"\nurl = \"https://h/\"\nca = \"/nonexistent/ca.pem\"")
            .unwrap_err();
        assert!(
            e.contains("hook `billing`") && e.contains("/nonexistent/ca.pem"),
            "{e}"
        );
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
