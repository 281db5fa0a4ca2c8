//! The operator listener answers only for its own names.
//!
//! A page on any site, open in an operator's browser, can have its DNS
//! name re-pointed at the operator listener's address (DNS rebinding):
//! the browser then treats the listener as that page's own origin and
//! lets it read `/metrics` (no token needed) and whatever else answers.
//! The one thing such a request cannot hide is its `Host`, which names
//! the attacker's domain. So every request on the operator listener must
//! name `localhost`, an IP literal (which no DNS answer can rebind), or a
//! name listed in `--admin-hosts`, in `Host` and in an absolute-form
//! target alike; anything else is `421 misdirected_request`, before
//! routing and before any token is looked at. A request without `Host`
//! (HTTP/1.0 tools) passes: browsers always send one.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::http::uri::Authority;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;

/// The names the operator listener answers for besides `localhost` and IP
/// literals: `--admin-hosts`, lower-case, without a trailing dot.
#[derive(Debug, Clone, Default)]
pub struct OperatorHosts(Arc<Vec<String>>);

impl OperatorHosts {
    pub fn new(names: Vec<String>) -> Self {
        Self(Arc::new(names))
    }

    /// Whether `authority` (`name[:port]`, `a.b.c.d[:port]`,
    /// `[v6][:port]`) is one this listener answers for.
    fn allows(&self, authority: &str) -> bool {
        let Ok(authority) = authority.parse::<Authority>() else {
            return false;
        };
        // `user@host` is not a `Host` a browser sends.
        if authority.as_str().contains('@') {
            return false;
        }
        let host = authority.host();
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if bare.parse::<IpAddr>().is_ok() {
            return true;
        }
        let name = host.to_ascii_lowercase();
        let name = name.strip_suffix('.').unwrap_or(&name);
        name == "localhost" || self.0.iter().any(|allowed| allowed == name)
    }

    /// Whether `request` names this listener.
    fn admits(&self, request: &Request) -> bool {
        let mut hosts = request.headers().get_all(header::HOST).iter();
        let first = hosts.next();
        if hosts.next().is_some() {
            return false; // two `Host` headers: which one the client meant is unknowable
        }
        let by_header = first.is_none_or(|v| v.to_str().is_ok_and(|h| self.allows(h)));
        let by_target = request
            .uri()
            .authority()
            .is_none_or(|a| self.allows(a.as_str()));
        by_header && by_target
    }
}

/// Middleware of the operator router: `421 misdirected_request` for a
/// request that does not name this listener (see the module doc).
pub async fn refuse_foreign_hosts(
    State(hosts): State<OperatorHosts>,
    request: Request,
    next: Next,
) -> Response {
    if hosts.admits(&request) {
        next.run(request).await
    } else {
        ApiError::MisdirectedHost.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(host: Option<&str>, target: &str) -> Request {
        let mut r = Request::builder().uri(target);
        if let Some(h) = host {
            r = r.header("host", h);
        }
        r.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn loopback_names_ip_literals_and_listed_names_only() {
        let hosts = OperatorHosts::new(vec!["ops.internal".into()]);
        for ok in [
            "localhost",
            "LOCALHOST:9090",
            "localhost.:9090",
            "127.0.0.1:9090",
            "10.0.0.7",
            "[::1]:9090",
            "[2001:db8::1]",
            "ops.internal",
            "Ops.Internal.:9090",
        ] {
            assert!(hosts.admits(&request(Some(ok), "/metrics")), "{ok}");
        }
        for refused in [
            "attacker.example",
            "attacker.example:9090",
            "localhost.attacker.example",
            "ops.internal.attacker.example",
            "127.0.0.1.nip.io",
            "user@localhost",
            "",
            "local host",
        ] {
            assert!(
                !hosts.admits(&request(Some(refused), "/metrics")),
                "{refused:?}"
            );
        }
        assert!(
            hosts.admits(&request(None, "/metrics")),
            "HTTP/1.0, no Host"
        );
        assert!(
            !hosts.admits(&request(
                Some("localhost"),
                "http://attacker.example/metrics"
            )),
            "the absolute-form target counts too"
        );
        let mut two = request(Some("localhost"), "/metrics");
        two.headers_mut()
            .append("host", "attacker.example".parse().unwrap());
        assert!(!hosts.admits(&two));
    }
}
