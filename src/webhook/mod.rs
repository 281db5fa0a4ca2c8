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
//! request carries an idempotency key (queue and entry id) that stays the
//! same on every retry, in its body as `idempotencyKey` and as the
//! `Idempotency-Key` header, and a signature over its timestamp and body
//! (this module), so a receiver can both refuse forgeries and drop
//! duplicates. It must drop them by the body's key: the header is not
//! signed, so a captured delivery replayed under another header key would
//! otherwise be taken twice.
//!
//! Transport (`tls.rs`): `https://` with the built-in roots plus a hook's
//! own `ca=`; `http://` only to a loopback receiver (a local relay) unless
//! the hook says `insecure-http=true`, because the bodies name buyers and
//! a signature proves who sent them, not that nobody else read them.

mod deliver;
// Without `https-webhooks`, a plain-TCP client of the same shape: no TLS
// crates are built, and an `https://` hook or `ca=` is refused when the
// flag is parsed.
#[cfg(feature = "https-webhooks")]
mod tls;
#[cfg(not(feature = "https-webhooks"))]
#[path = "plain.rs"]
mod tls;

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
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
    /// (`ca=<PEM file>`), read when the flag is parsed.
    pub ca: Option<ExtraCa>,
    /// `insecure-http=true`: `http://` to a host that is not loopback.
    pub insecure_http: bool,
}

/// A hook's `ca=` file and the certificates read from it at start-up.
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

/// A `--webhook` value that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--webhook: {0}")]
pub struct InvalidWebhook(String);

impl FromStr for WebhookSpec {
    type Err = InvalidWebhook;

    /// `name=…,url=https://…,secret=…[,kinds=a+b][,queues=q+r][,attempts=n]
    /// [,max-age-secs=n][,backoff-ms=n][,timeout-ms=n][,ca=<PEM file>]
    /// [,insecure-http=true]`. Reads the `ca=` file: a flag that cannot
    /// be used stops the start, naming its hook.
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
            ca: None,
            insecure_http: false,
        };
        let mut ca_path: Option<PathBuf> = None;
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
                "ca" if v.is_empty() => return Err(bad("ca= needs a PEM file's path".into())),
                "ca" => ca_path = Some(PathBuf::from(v)),
                "insecure-http" => {
                    spec.insecure_http = match v {
                        "true" => true,
                        "false" => false,
                        _ => return Err(bad("insecure-http must be true or false".into())),
                    }
                }
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
        // From here on, messages name the hook: there may be several.
        let bad = |m: String| InvalidWebhook(format!("hook `{}`: {m}", spec.name));
        let url = url::Url::parse(&spec.url).map_err(|e| bad(format!("url: {e}")))?;
        let Some(host) = url.host_str() else {
            return Err(bad("url has no host".into()));
        };
        match url.scheme() {
            "https" if spec.insecure_http => {
                return Err(bad("insecure-http=true is for http:// urls".into()));
            }
            "https" if !tls::HTTPS => return Err(bad(tls::NO_HTTPS.into())),
            "https" => {}
            "http" if ca_path.is_some() => return Err(bad("ca= needs an https:// url".into())),
            "http" if spec.insecure_http || is_loopback(host) => {}
            "http" => {
                return Err(bad(format!(
                    "url is http:// to `{host}`: entries (buyers' ids) would cross the network \
                     in clear; use https://, or add insecure-http=true"
                )));
            }
            other => return Err(bad(format!("url must be https:// (not {other}://)"))),
        }
        if spec.secret.len() < 16 {
            return Err(bad("secret must be at least 16 bytes".into()));
        }
        if let Some(path) = ca_path {
            let certs =
                tls::read_ca(&path).map_err(|e| bad(format!("ca={}: {e}", path.display())))?;
            spec.ca = Some(ExtraCa { path, certs });
        }
        Ok(spec)
    }
}

/// The `--webhook` parser: [`WebhookSpec::from_str`], whose message alone
/// is shown. Clap's own would quote the whole value, secret included, into
/// the logs of whatever started the server.
#[derive(Clone, Copy, Debug)]
pub struct SpecParser;

impl clap::builder::TypedValueParser for SpecParser {
    type Value = WebhookSpec;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<WebhookSpec, clap::Error> {
        let refuse = |m: String| {
            clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("{m}\n"))
                .with_cmd(cmd)
        };
        value
            .to_str()
            .ok_or_else(|| refuse("--webhook: not UTF-8".into()))?
            .parse()
            .map_err(|e: InvalidWebhook| refuse(e.to_string()))
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
            "name=crm,url=https://h/,secret=short",
            "name=Crm,url=http://h/,secret=0123456789abcdef",
            "name=crm,url=http://10.0.0.5/h,secret=0123456789abcdef",
            "name=crm,url=http://orders.internal/h,secret=0123456789abcdef",
            "name=crm,url=ftp://h/,secret=0123456789abcdef",
            "name=crm,url=https://h/,secret=0123456789abcdef,insecure-http=true",
            "name=crm,url=http://10.0.0.5/h,secret=0123456789abcdef,insecure-http=yes",
            "name=crm,url=http://127.0.0.1/h,secret=0123456789abcdef,ca=/etc/hostname",
            "name=crm,url=https://h/,secret=0123456789abcdef,ca=",
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
    fn plain_http_only_to_loopback_unless_the_hook_allows_it() {
        let ok = |s: &str| {
            s.parse::<WebhookSpec>()
                .map_err(|e| e.to_string())
                .map(|h| h.insecure_http)
        };
        for url in [
            #[cfg(feature = "https-webhooks")]
            "https://orders.example/h",
            "http://127.0.0.1:8080/h",
            "http://127.9.9.9/h",
            "http://localhost/h",
            "http://[::1]:81/h",
        ] {
            assert_eq!(
                ok(&format!("name=a,url={url},secret=0123456789abcdef")),
                Ok(false),
                "{url}"
            );
        }
        assert_eq!(
            ok("name=a,url=http://10.0.0.5/h,secret=0123456789abcdef,insecure-http=true"),
            Ok(true)
        );
        let refused = ok("name=orders,url=http://10.0.0.5/h,secret=0123456789abcdef").unwrap_err();
        assert!(
            refused.contains("hook `orders`") && refused.contains("insecure-http=true"),
            "{refused}"
        );
    }

    #[cfg(not(feature = "https-webhooks"))]
    #[test]
    fn without_tls_an_https_hook_is_refused_naming_the_feature() {
        for spec in [
            "name=billing,url=https://h/,secret=0123456789abcdef",
            "name=billing,url=https://h/,secret=0123456789abcdef,ca=/etc/hostname",
        ] {
            let e = spec.parse::<WebhookSpec>().unwrap_err().to_string();
            assert!(
                e.contains("hook `billing`") && e.contains("`https-webhooks`"),
                "{e}"
            );
        }
    }

    #[cfg(feature = "https-webhooks")]
    #[test]
    fn a_ca_file_is_read_when_parsed_and_its_errors_name_the_hook() {
        let e = "name=billing,url=https://h/,secret=0123456789abcdef,ca=/nonexistent/ca.pem"
            .parse::<WebhookSpec>()
            .unwrap_err()
            .to_string();
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
