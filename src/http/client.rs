//! Who is at the other end of a request: the client's address (what the
//! per-address limits count) and whether it came over HTTPS (what the
//! cookies' `Secure` follows).
//!
//! The address is the socket's peer, unless that peer is one of the
//! `--trusted-proxies`: then the forwarding header named by
//! `--client-address-header` (`X-Forwarded-For` or RFC 7239 `Forwarded`,
//! only the one) is read from the right, skipping hops that are trusted
//! proxies themselves, and the first untrusted hop is the client. Nothing
//! is trusted by default, and a header from an untrusted peer is ignored,
//! so a client can never name its own address. Only one header is read
//! because a proxy that sets one usually passes the other through from the
//! client untouched: believing both would let the client choose.
//!
//! A hop that cannot be read (garbage, `unknown`, an obfuscated name) or a
//! chain longer than [`MAX_HOPS`] ends the walk at the last hop known to
//! be a trusted proxy: a proxy that forwards garbage shares one bucket
//! rather than letting its clients pick one each.
//!
//! Addresses are counted as [`ClientKey`]s: IPv4-mapped IPv6 is IPv4, and
//! IPv6 is grouped by its /64 (one subscriber usually holds a whole /64,
//! so counting single IPv6 addresses would give each scalper 2^64 buckets).

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use ipnet::IpNet;

use super::AppState;
use crate::error::ApiError;

/// Which forwarding header trusted proxies set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For`, with `X-Forwarded-Proto`.
    #[default]
    #[value(name = "x-forwarded-for")]
    XForwardedFor,
    /// RFC 7239 `Forwarded`.
    Forwarded,
}

/// The most forwarding hops read, from the right; a longer chain ends at
/// the last trusted hop (a client padding the header gains nothing).
pub const MAX_HOPS: usize = 20;

/// The bucket an address is counted in: IPv4 as is, IPv6 by its /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientKey(IpAddr);

impl ClientKey {
    /// The bucket of `addr`.
    pub fn of(addr: IpAddr) -> Self {
        match canonical(addr) {
            IpAddr::V4(v4) => Self(IpAddr::V4(v4)),
            IpAddr::V6(v6) => {
                let bits = u128::from(v6) & !((1u128 << 64) - 1);
                Self(IpAddr::V6(Ipv6Addr::from(bits)))
            }
        }
    }

    /// The bucket's address (an IPv6 /64's first address).
    pub fn ip(&self) -> IpAddr {
        self.0
    }
}

impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`, what a dual-stack socket reports
/// for an IPv4 client) as the IPv4 address it is.
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// The proxies whose forwarding headers are believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
    header: ForwardedHeader,
}

impl TrustedProxies {
    /// `nets` (CIDRs, a bare address is its /32 or /128), reading `header`.
    pub fn new(nets: Vec<IpNet>, header: ForwardedHeader) -> Self {
        Self { nets, header }
    }

    /// Whether `addr` is one of the trusted proxies.
    pub fn trusts(&self, addr: IpAddr) -> bool {
        let addr = canonical(addr);
        self.nets.iter().any(|n| n.contains(&addr))
    }

    /// The client of a request from `peer` with `headers`.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> ClientInfo {
        let peer = canonical(peer);
        if !self.trusts(peer) {
            return ClientInfo {
                addr: peer,
                https: false,
            };
        }
        let hops = match self.header {
            ForwardedHeader::XForwardedFor => xff_hops(headers),
            ForwardedHeader::Forwarded => forwarded_hops(headers),
        };
        // Walk from the right: every hop a trusted proxy vouches for.
        let mut addr = peer;
        // A proxy that sets only `X-Forwarded-Proto` still speaks for the
        // connection it took.
        let mut proto: Option<String> = match self.header {
            ForwardedHeader::XForwardedFor if hops.is_empty() => list(headers, "x-forwarded-proto")
                .first()
                .map(|p| (*p).to_owned()),
            _ => None,
        };
        for hop in hops.iter().rev().take(MAX_HOPS) {
            let Some(ip) = hop.addr else { break };
            addr = ip;
            proto = hop.proto.clone();
            if !self.trusts(ip) {
                break;
            }
        }
        ClientInfo {
            addr,
            https: proto.is_some_and(|p| p.trim().eq_ignore_ascii_case("https")),
        }
    }
}

/// One hop of a forwarding header: its address if readable, and the
/// protocol the proxy that added it was spoken to with, if said.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hop {
    addr: Option<IpAddr>,
    proto: Option<String>,
}

/// The values of every `name` header, split at commas.
fn list<'a>(headers: &'a HeaderMap, name: &'a str) -> Vec<&'a str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect()
}

/// `X-Forwarded-For` hops, each with the `X-Forwarded-Proto` value at the
/// same position when both lists have the same length (each proxy appends
/// one of each), else the first `X-Forwarded-Proto` value (the edge's).
fn xff_hops(headers: &HeaderMap) -> Vec<Hop> {
    let fors = list(headers, "x-forwarded-for");
    let protos = list(headers, "x-forwarded-proto");
    fors.iter()
        .enumerate()
        .map(|(i, f)| Hop {
            addr: parse_node(f),
            proto: if protos.len() == fors.len() {
                protos.get(i)
            } else {
                protos.first()
            }
            .map(|p| (*p).to_owned()),
        })
        .collect()
}

/// RFC 7239 `Forwarded` hops: one per element, its `for=` and `proto=`.
fn forwarded_hops(headers: &HeaderMap) -> Vec<Hop> {
    list(headers, "forwarded")
        .into_iter()
        .map(|element| {
            let mut hop = Hop {
                addr: None,
                proto: None,
            };
            for pair in element.split(';') {
                let Some((name, value)) = pair.split_once('=') else {
                    continue;
                };
                let value = value.trim();
                let value = value
                    .strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .unwrap_or(value);
                match name.trim().to_ascii_lowercase().as_str() {
                    "for" => hop.addr = parse_node(value),
                    "proto" => hop.proto = Some(value.to_owned()),
                    _ => {}
                }
            }
            hop
        })
        .collect()
}

/// An address as forwarding headers write it: `1.2.3.4`, `1.2.3.4:80`,
/// `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:80`. `None` for
/// anything else (`unknown`, `_hidden`, garbage).
fn parse_node(text: &str) -> Option<IpAddr> {
    let text = text.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    if let Ok(sock) = text.parse::<SocketAddr>() {
        return Some(canonical(sock.ip()));
    }
    let inner = text.strip_prefix('[')?.strip_suffix(']')?;
    inner
        .parse::<Ipv6Addr>()
        .ok()
        .map(|v6| canonical(IpAddr::V6(v6)))
}

/// The client of a request, as [`TrustedProxies::client`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientInfo {
    /// The client's address.
    pub addr: IpAddr,
    /// True when a trusted proxy says the client spoke HTTPS to it.
    pub https: bool,
}

impl ClientInfo {
    /// The bucket the address is counted in.
    pub fn key(&self) -> ClientKey {
        ClientKey::of(self.addr)
    }
}

/// Extracts the request's [`ClientInfo`]. The transport puts the peer in
/// the request (`ConnectInfo`) on both stream paths; a request without one
/// (a router driven in-process) counts as from `0.0.0.0`, one shared bucket,
/// never as an unlimited client.
pub struct Client(pub ClientInfo);

impl FromRequestParts<AppState> for Client {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        Ok(Client(client_of(parts, state)))
    }
}

/// The client of `parts`, see [`Client`].
pub fn client_of(parts: &Parts, state: &AppState) -> ClientInfo {
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::from([0, 0, 0, 0]), |c| c.0.ip());
    state.trusted_proxies().client(peer, &parts.headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                axum::http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn proxies(nets: &[&str], header: ForwardedHeader) -> TrustedProxies {
        TrustedProxies::new(nets.iter().map(|n| n.parse().unwrap()).collect(), header)
    }

    const XFF: ForwardedHeader = ForwardedHeader::XForwardedFor;
    const FWD: ForwardedHeader = ForwardedHeader::Forwarded;

    #[test]
    fn headers_of_an_untrusted_peer_are_ignored() {
        let none = TrustedProxies::default();
        let h = headers(&[
            ("x-forwarded-for", "9.9.9.9"),
            ("x-forwarded-proto", "https"),
            ("forwarded", "for=9.9.9.9;proto=https"),
        ]);
        let c = none.client(ip("10.0.0.5"), &h);
        assert_eq!(c.addr, ip("10.0.0.5"));
        assert!(!c.https, "a client cannot claim https for itself");
        let other = proxies(&["10.1.0.0/16"], XFF);
        assert_eq!(other.client(ip("10.0.0.5"), &h).addr, ip("10.0.0.5"));
    }

    #[test]
    fn the_rightmost_untrusted_hop_is_the_client() {
        let p = proxies(&["10.0.0.0/8"], XFF);
        // The client put 6.6.6.6 first; the edge appended the real peer.
        let h = headers(&[
            ("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.0.0.2"),
            ("x-forwarded-proto", "http, https, http"),
        ]);
        let c = p.client(ip("10.0.0.1"), &h);
        assert_eq!(c.addr, ip("203.0.113.7"));
        assert!(c.https, "the proto the edge was spoken to with");
        // Split over two header lines, the same list.
        let h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "203.0.113.7"),
        ]);
        assert_eq!(p.client(ip("10.0.0.1"), &h).addr, ip("203.0.113.7"));
        // Every hop trusted: the leftmost one.
        let h = headers(&[("x-forwarded-for", "10.0.0.9, 10.0.0.8")]);
        assert_eq!(p.client(ip("10.0.0.1"), &h).addr, ip("10.0.0.9"));
        // No header: the proxy itself.
        assert_eq!(
            p.client(ip("10.0.0.1"), &HeaderMap::new()).addr,
            ip("10.0.0.1")
        );
    }

    #[test]
    fn https_is_read_properly() {
        let p = proxies(&["10.0.0.0/8"], XFF);
        for (proto, https) in [
            ("https", true),
            ("HTTPS", true),
            (" https ", true),
            ("https, https", true),
            ("http", false),
            ("httpsx", false),
            ("", false),
        ] {
            let h = headers(&[
                ("x-forwarded-for", "203.0.113.7"),
                ("x-forwarded-proto", proto),
            ]);
            assert_eq!(p.client(ip("10.0.0.1"), &h).https, https, "{proto:?}");
        }
        let f = proxies(&["10.0.0.0/8"], FWD);
        let h = headers(&[("forwarded", "for=203.0.113.7;proto=https")]);
        assert!(f.client(ip("10.0.0.1"), &h).https);
        // In Forwarded mode X-Forwarded-Proto says nothing.
        let h = headers(&[
            ("forwarded", "for=203.0.113.7"),
            ("x-forwarded-proto", "https"),
        ]);
        assert!(!f.client(ip("10.0.0.1"), &h).https);
    }

    #[test]
    fn forwarded_elements_are_parsed() {
        let p = proxies(&["10.0.0.0/8", "2001:db8:ffff::/48"], FWD);
        let cases = [
            ("for=192.0.2.60;proto=http;by=203.0.113.43", "192.0.2.60"),
            ("For=\"[2001:db8:cafe::17]:4711\"", "2001:db8:cafe::17"),
            ("for=\"192.0.2.43:8080\", for=10.0.0.3", "192.0.2.43"),
            (
                "for=6.6.6.6, for=198.51.100.17;proto=https",
                "198.51.100.17",
            ),
            (
                "for=\"[2001:db8:ffff::1]\", for=10.0.0.3",
                "2001:db8:ffff::1",
            ),
        ];
        for (value, want) in cases {
            let h = headers(&[("forwarded", value)]);
            assert_eq!(p.client(ip("10.0.0.1"), &h).addr, ip(want), "{value}");
        }
        // In Forwarded mode X-Forwarded-For is not read.
        let h = headers(&[("x-forwarded-for", "6.6.6.6")]);
        assert_eq!(p.client(ip("10.0.0.1"), &h).addr, ip("10.0.0.1"));
    }

    #[test]
    fn unreadable_hops_stop_at_the_last_trusted_one() {
        let p = proxies(&["10.0.0.0/8"], XFF);
        for garbage in [
            "unknown",
            "_hidden",
            "not an ip",
            "1.2.3",
            "[::1",
            "::1]:80",
            "999.1.1.1",
        ] {
            let h = headers(&[("x-forwarded-for", &format!("{garbage}, 10.0.0.4"))]);
            assert_eq!(
                p.client(ip("10.0.0.1"), &h).addr,
                ip("10.0.0.4"),
                "{garbage}"
            );
            let h = headers(&[("x-forwarded-for", garbage)]);
            assert_eq!(
                p.client(ip("10.0.0.1"), &h).addr,
                ip("10.0.0.1"),
                "{garbage}"
            );
        }
        let f = proxies(&["10.0.0.0/8"], FWD);
        let h = headers(&[("forwarded", "for=unknown")]);
        assert_eq!(f.client(ip("10.0.0.1"), &h).addr, ip("10.0.0.1"));
        let h = headers(&[("forwarded", "garbage;;;===,")]);
        assert_eq!(f.client(ip("10.0.0.1"), &h).addr, ip("10.0.0.1"));
        // Ports and brackets are fine.
        let h = headers(&[("x-forwarded-for", "[2001:db8::5]:443, 1.2.3.4:5")]);
        assert_eq!(p.client(ip("10.0.0.1"), &h).addr, ip("1.2.3.4"));
        let h = headers(&[("x-forwarded-for", "[2001:db8::5]")]);
        assert_eq!(p.client(ip("10.0.0.1"), &h).addr, ip("2001:db8::5"));
    }

    #[test]
    fn too_many_trusted_hops_end_the_walk() {
        let p = proxies(&["10.0.0.0/8"], XFF);
        let mut chain = vec!["6.6.6.6".to_owned()];
        chain.extend((0..MAX_HOPS + 5).map(|i| format!("10.0.{}.1", i)));
        let h = headers(&[("x-forwarded-for", &chain.join(", "))]);
        let c = p.client(ip("10.0.0.1"), &h);
        assert!(
            p.trusts(c.addr),
            "stops within the trusted chain: {}",
            c.addr
        );
        assert_ne!(c.addr, ip("6.6.6.6"));
    }

    #[test]
    fn keys_group_ipv6_by_64_and_unmap_ipv4() {
        assert_eq!(
            ClientKey::of(ip("2001:db8:1:2:aaaa::1")),
            ClientKey::of(ip("2001:db8:1:2:ffff:ffff:ffff:ffff"))
        );
        assert_ne!(
            ClientKey::of(ip("2001:db8:1:2::1")),
            ClientKey::of(ip("2001:db8:1:3::1"))
        );
        assert_eq!(
            ClientKey::of(ip("2001:db8:1:2::9")).to_string(),
            "2001:db8:1:2::/64"
        );
        assert_eq!(
            ClientKey::of(ip("::ffff:192.0.2.1")),
            ClientKey::of(ip("192.0.2.1"))
        );
        assert_eq!(ClientKey::of(ip("192.0.2.1")).to_string(), "192.0.2.1");
        assert_ne!(
            ClientKey::of(ip("192.0.2.1")),
            ClientKey::of(ip("192.0.2.2"))
        );
        // A mapped peer is matched against IPv4 CIDRs.
        let p = proxies(&["10.0.0.0/8"], XFF);
        let h = headers(&[("x-forwarded-for", "203.0.113.7")]);
        assert_eq!(p.client(ip("::ffff:10.0.0.1"), &h).addr, ip("203.0.113.7"));
    }
}
