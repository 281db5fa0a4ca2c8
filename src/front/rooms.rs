//! Rooms: which part of which site a queue protects, and where its
//! admitted visitors are sent.
//!
//! `--origin URL` is one room over the whole site, on the first queue of
//! `--queues`. The configuration file's `[[rooms]]` tables describe
//! several: each matched by `match_host` (the request's `Host`, exact or
//! `*.example.com`, any when unset) and `path_prefix` (whole segments,
//! `/` when unset), each on its own queue (its admission settings are the
//! queue's, `[queues.<name>]`) and its own origin. The most specific room
//! wins: a named host before a wildcard before none, then the longest
//! prefix. A request no room matches is answered `404` and never
//! forwarded.

use serde::Deserialize;

use super::path::is_below;
use crate::queue::QueueName;

/// An origin: where a room's admitted requests go. Plain HTTP to an
/// address waitroom reaches directly (the origin on the same host or
/// network), or HTTPS (`tls.rs`: an origin elsewhere, or one that only
/// speaks TLS); TLS to the browser stays the front proxy's either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// `host:port` as connected to (the host also names the certificate
    /// expected of an `https://` origin) and, without `preserve_host`,
    /// sent as `Host`.
    pub authority: String,
    /// `https://`: reached over TLS.
    pub tls: bool,
}

impl Origin {
    /// Parses `http://host[:port]` or `https://host[:port]` (a trailing
    /// `/` allowed, nothing else after the authority). Whether this build
    /// speaks TLS is `config::features`' to say, naming the feature.
    pub fn parse(text: &str) -> Result<Self, String> {
        let url = url::Url::parse(text).map_err(|e| format!("`{text}` is not a URL: {e}"))?;
        let tls = match url.scheme() {
            "http" => false,
            "https" => true,
            _ => return Err(format!("`{text}`: an origin is http:// or https://")),
        };
        let Some(host) = url.host_str() else {
            return Err(format!("`{text}` names no host"));
        };
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!("`{text}`: no user information in an origin"));
        }
        if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
            return Err(format!(
                "`{text}`: an origin is scheme, host and port only (no path, query or fragment)"
            ));
        }
        let port = url
            .port_or_known_default()
            .unwrap_or(if tls { 443 } else { 80 });
        Ok(Self {
            authority: format!("{host}:{port}"),
            tls,
        })
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> &'static str {
        if self.tls { "https" } else { "http" }
    }
}

/// One `[[rooms]]` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoomTable {
    /// A name for logs and errors (the queue's when unset).
    pub name: Option<String>,
    pub match_host: Option<String>,
    pub path_prefix: Option<String>,
    pub queue: String,
    pub origin: String,
    #[serde(default)]
    pub preserve_host: bool,
    /// The room's session idle time, seconds (unset: the queue's, else
    /// `pass.session_idle_secs`).
    pub session_idle_secs: Option<u64>,
    /// The room's longest session, seconds (unset: the queue's, else
    /// `pass.session_max_secs`).
    pub session_max_secs: Option<u64>,
}

/// The keys a `[[rooms]]` table takes, with what each does (for the
/// generated documentation).
pub const ROOM_KEYS: &[(&str, &str)] = &[
    (
        "name",
        "a name for logs and errors (the queue's when unset)",
    ),
    (
        "match_host",
        "the request's `Host` (port ignored), `*.shop.example` for subdomains; unset: any",
    ),
    (
        "path_prefix",
        "whole segments: `/drop` is `/drop` and `/drop/…`, not `/dropped`; unset: `/`",
    ),
    (
        "queue",
        "the room's queue, one of `admission.queues` (required)",
    ),
    (
        "origin",
        "where admitted requests go: `http://host[:port]`, or `https://` with the `https-webhooks` feature (required)",
    ),
    (
        "preserve_host",
        "send the visitor's `Host` rather than the origin's (default false)",
    ),
    (
        "session_idle_secs",
        "the room's session idle time (its queue's sessions); unset: `[queues.<name>]`'s, else `pass.session_idle_secs`",
    ),
    (
        "session_max_secs",
        "the room's longest session (its queue's sessions); unset: `[queues.<name>]`'s, else `pass.session_max_secs`",
    ),
];

/// Session times set apart from the global ones, seconds; unset: the
/// next source's. A pass is a queue's, so they hold for the room's queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionTimes {
    pub idle_secs: Option<u64>,
    pub max_secs: Option<u64>,
}

impl RoomTable {
    /// The checked room; the error names the key at fault.
    pub fn into_spec(self) -> Result<RoomSpec, String> {
        let queue = QueueName::parse(&self.queue).map_err(|e| format!("queue: {e}"))?;
        let origin = Origin::parse(&self.origin).map_err(|e| format!("origin: {e}"))?;
        let host = match self.match_host {
            None => HostMatch::Any,
            Some(h) => HostMatch::parse(&h).map_err(|e| format!("match_host: {e}"))?,
        };
        let prefix = self.path_prefix.unwrap_or_else(|| "/".to_owned());
        if !prefix.starts_with('/') {
            return Err(format!("path_prefix: `{prefix}` must start with `/`"));
        }
        if super::path::normalize(&prefix).as_deref() != Ok(prefix.as_str())
            && super::path::normalize(&prefix).as_deref() != Ok(&format!("{prefix}/"))
        {
            return Err(format!(
                "path_prefix: `{prefix}` is not a plain path (no `.`, `..`, `//` or encoded separator)"
            ));
        }
        Ok(RoomSpec {
            name: self.name.unwrap_or_else(|| queue.to_string()),
            host,
            path_prefix: prefix,
            queue,
            origin,
            preserve_host: self.preserve_host,
            sessions: SessionTimes {
                idle_secs: self.session_idle_secs,
                max_secs: self.session_max_secs,
            },
        })
    }
}

/// Which `Host` a room answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    Any,
    /// `*.example.com`: a subdomain of this (stored without the `*`).
    Suffix(String),
    Exact(String),
}

impl HostMatch {
    fn parse(text: &str) -> Result<Self, String> {
        let lower = text.trim().to_ascii_lowercase();
        let bare = lower.strip_prefix("*.").unwrap_or(&lower);
        if bare.is_empty()
            || !bare
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        {
            return Err(format!(
                "`{text}` is not a host name (`shop.example`, `*.example`)"
            ));
        }
        Ok(if lower.starts_with("*.") {
            Self::Suffix(format!(".{bare}"))
        } else {
            Self::Exact(lower)
        })
    }

    fn matches(&self, host: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Suffix(suffix) => host.ends_with(suffix.as_str()),
            Self::Exact(exact) => host == exact,
        }
    }

    fn rank(&self) -> u8 {
        match self {
            Self::Exact(_) => 2,
            Self::Suffix(_) => 1,
            Self::Any => 0,
        }
    }
}

/// A checked room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomSpec {
    pub name: String,
    pub host: HostMatch,
    pub path_prefix: String,
    pub queue: QueueName,
    pub origin: Origin,
    pub preserve_host: bool,
    pub sessions: SessionTimes,
}

impl RoomSpec {
    /// The one room of `--origin`: every host, every path.
    pub fn whole_site(queue: QueueName, origin: Origin, preserve_host: bool) -> Self {
        Self {
            name: queue.to_string(),
            host: HostMatch::Any,
            path_prefix: "/".to_owned(),
            queue,
            origin,
            preserve_host,
            sessions: SessionTimes::default(),
        }
    }
}

/// The rooms, most specific first.
#[derive(Debug, Clone)]
pub struct Rooms {
    rooms: Vec<RoomSpec>,
}

impl Rooms {
    pub fn new(mut rooms: Vec<RoomSpec>) -> Self {
        rooms.sort_by(|a, b| {
            (b.host.rank(), b.path_prefix.trim_end_matches('/').len())
                .cmp(&(a.host.rank(), a.path_prefix.trim_end_matches('/').len()))
        });
        Self { rooms }
    }

    /// The room of a request for `path` (normalized) on `host` (the
    /// `Host` header, any port dropped, lower-cased).
    pub fn find(&self, host: &str, path: &str) -> Option<&RoomSpec> {
        self.rooms
            .iter()
            .find(|room| room.host.matches(host) && is_below(path, &room.path_prefix))
    }

    pub fn iter(&self) -> impl Iterator<Item = &RoomSpec> {
        self.rooms.iter()
    }
}

/// `Host` without its port, lower-cased (`[v6]:port` keeps its brackets).
pub fn host_name(host: &str) -> String {
    let host = host.trim();
    let bare = if let Some(end) = host.find(']') {
        &host[..=end]
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    bare.to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(host: Option<&str>, prefix: Option<&str>, queue: &str) -> RoomSpec {
        RoomTable {
            name: None,
            match_host: host.map(str::to_owned),
            path_prefix: prefix.map(str::to_owned),
            queue: queue.to_owned(),
            origin: "http://127.0.0.1:3000".to_owned(),
            preserve_host: false,
            session_idle_secs: None,
            session_max_secs: None,
        }
        .into_spec()
        .unwrap()
    }

    #[test]
    fn the_most_specific_room_wins() {
        let rooms = Rooms::new(vec![
            room(None, None, "site"),
            room(Some("*.shop.example"), Some("/drop"), "drops"),
            room(Some("eu.shop.example"), Some("/drop/tickets"), "tickets"),
        ]);
        let q = |host, path| rooms.find(host, path).map(|r| r.queue.to_string());
        assert_eq!(
            q("eu.shop.example", "/drop/tickets/1").as_deref(),
            Some("tickets")
        );
        assert_eq!(
            q("eu.shop.example", "/drop/shoes").as_deref(),
            Some("drops")
        );
        assert_eq!(q("us.shop.example", "/drop").as_deref(), Some("drops"));
        assert_eq!(q("shop.example", "/drop").as_deref(), Some("site"));
        assert_eq!(q("us.shop.example", "/dropped").as_deref(), Some("site"));
    }

    #[test]
    fn bad_tables_name_their_key() {
        let bad = |t: RoomTable| t.into_spec().unwrap_err();
        let base = || RoomTable {
            name: None,
            match_host: None,
            path_prefix: None,
            queue: "q".into(),
            origin: "http://127.0.0.1:3000".into(),
            preserve_host: false,
            session_idle_secs: None,
            session_max_secs: None,
        };
        assert!(
            bad(RoomTable {
                origin: "ftp://x".into(),
                ..base()
            })
            .starts_with("origin:")
        );
        assert!(
            bad(RoomTable {
                origin: "https://x/a".into(),
                ..base()
            })
            .starts_with("origin:")
        );
        assert!(
            bad(RoomTable {
                origin: "http://x/a".into(),
                ..base()
            })
            .starts_with("origin:")
        );
        assert!(
            bad(RoomTable {
                queue: "no spaces".into(),
                ..base()
            })
            .starts_with("queue:")
        );
        assert!(
            bad(RoomTable {
                path_prefix: Some("x".into()),
                ..base()
            })
            .starts_with("path_prefix:")
        );
        assert!(
            bad(RoomTable {
                path_prefix: Some("/a/../b".into()),
                ..base()
            })
            .starts_with("path_prefix:")
        );
        assert!(
            bad(RoomTable {
                match_host: Some("a b".into()),
                ..base()
            })
            .starts_with("match_host:")
        );
    }

    #[test]
    fn origins_are_http_or_https_with_their_default_ports() {
        let http = Origin::parse("http://127.0.0.1").unwrap();
        assert_eq!((http.authority.as_str(), http.tls), ("127.0.0.1:80", false));
        let https = Origin::parse("https://shop.example/").unwrap();
        assert_eq!(
            (https.authority.as_str(), https.tls, https.scheme()),
            ("shop.example:443", true, "https")
        );
        let port = Origin::parse("https://[::1]:8443").unwrap();
        assert_eq!(port.authority, "[::1]:8443");
    }

    #[test]
    fn hosts_lose_their_port() {
        assert_eq!(host_name("Shop.Example:8080"), "shop.example");
        assert_eq!(host_name("[::1]:80"), "[::1]");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
    }
}
