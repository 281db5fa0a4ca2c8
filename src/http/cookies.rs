//! Every cookie the API sets, built in one place: the ticket cookie (per
//! queue) and the visitor cookie (whole site).
//!
//! `Secure` follows `--cookie-secure`: `auto` sets it when a trusted proxy
//! says the client spoke HTTPS (see `client.rs`: only a peer in
//! `--trusted-proxies` is believed), `always` and `never` as they say.
//! A Secure cookie also carries a name prefix the browser enforces:
//! `__Host-waitroom_visitor` (Secure, `Path=/`, no `Domain`: no sibling
//! subdomain or plain-HTTP page can plant or shadow it) and
//! `__Secure-waitroom_ticket` (the ticket's `Path` is its queue's, so
//! `__Host-` is not open to it).
//!
//! Where the prefixed names are in force, the plain ones are not read at
//! all ([`only_prefixed_names`]): any page of the site, a sibling
//! subdomain or plain HTTP included, can set a plain `waitroom_visitor`
//! for the whole domain. Read as a fallback, a planted cookie would make
//! a first-time buyer join as the attacker's visitor, whose own browser
//! then reads the place and its entry token ("cookie tossing"). Such a
//! buyer is a new visitor instead and gets a prefixed cookie of their
//! own. The price: a site that turns on HTTPS starts its visitors and
//! tickets anew.

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, header};
use cookie::{Cookie, SameSite};

use super::AppState;
use super::client::{ClientInfo, client_of};
use crate::identity::{VISITOR_COOKIE, VISITOR_COOKIE_SECURE, VISITOR_MAX_AGE_SECS};
use crate::queue::QueueName;

/// When cookies get `Secure`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CookieSecure {
    /// When a trusted proxy says the client spoke HTTPS.
    #[default]
    Auto,
    /// Always (the site is only served over HTTPS).
    Always,
    /// Never (plain-HTTP development).
    Never,
}
/// The name of the ticket cookie on plain HTTP.
pub const TICKET_COOKIE: &str = "waitroom_ticket";

/// The name of the ticket cookie when it is `Secure`.
pub const TICKET_COOKIE_SECURE: &str = "__Secure-waitroom_ticket";

/// Whether cookies set for `client` get `Secure`.
pub fn secure(mode: CookieSecure, client: &ClientInfo) -> bool {
    match mode {
        CookieSecure::Auto => client.https,
        CookieSecure::Always => true,
        CookieSecure::Never => false,
    }
}

/// The ticket cookie, scoped to its queue so joining a second queue does
/// not overwrite the first, kept as long as the ticket is accepted. Its
/// path is below `base_path` (`--base-path`), where the browser sees the
/// queue's routes.
pub fn ticket(
    base_path: &str,
    queue: &QueueName,
    ticket: String,
    max_age_secs: u64,
    secure: bool,
) -> String {
    let name = if secure {
        TICKET_COOKIE_SECURE
    } else {
        TICKET_COOKIE
    };
    Cookie::build((name, ticket))
        .path(format!("{base_path}/api/queues/{queue}"))
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(secure)
        .max_age(cookie::time::Duration::seconds(max_age_secs as i64))
        .build()
        .to_string()
}

/// The `Set-Cookie` values that clear a queue's ticket cookie, under
/// either name, below `base_path`.
pub fn ticket_removals(base_path: &str, queue: &QueueName, secure: bool) -> Vec<String> {
    let mut out = Vec::with_capacity(2);
    for (name, is_secure) in [(TICKET_COOKIE, false), (TICKET_COOKIE_SECURE, true)] {
        // A prefixed cookie can only be cleared by a Secure one.
        if is_secure && !secure {
            continue;
        }
        let mut c = Cookie::build((name, ""))
            .path(format!("{base_path}/api/queues/{queue}"))
            .http_only(true)
            .same_site(SameSite::Strict)
            .secure(secure)
            .build();
        c.make_removal();
        out.push(c.to_string());
    }
    out
}

/// The visitor cookie carrying `value` (a signed visitor id).
pub fn visitor(value: String, secure: bool) -> String {
    let name = if secure {
        VISITOR_COOKIE_SECURE
    } else {
        VISITOR_COOKIE
    };
    Cookie::build((name, value))
        // The whole site: the orders API reads it as well as the queue.
        .path("/")
        .http_only(true)
        // Lax, not Strict: a shopper following a link to the sale still
        // arrives as themselves.
        .same_site(SameSite::Lax)
        .secure(secure)
        .max_age(cookie::time::Duration::seconds(VISITOR_MAX_AGE_SECS))
        .build()
        .to_string()
}

/// Where cookies are `Secure` (the names are prefixed), takes every
/// plain-named visitor and ticket cookie out of `request` before anything
/// reads it, so each reader (the join, the page, tickets, the order gate)
/// sees the prefixed names only. Other cookies pass untouched. (One of the
/// public router's guards, `super::public_guards`.)
pub fn only_prefixed_names(state: &AppState, request: Request) -> Request {
    if !carries_plain_names(request.headers()) {
        return request;
    }
    let (mut parts, body) = request.into_parts();
    if state.cookie_secure(&client_of(&parts, state)) {
        drop_plain_names(&mut parts.headers);
    }
    Request::from_parts(parts, body)
}

/// The unprefixed names: what a page without HTTPS, or on a sibling
/// subdomain, can set.
const PLAIN_NAMES: [&str; 2] = [VISITOR_COOKIE, TICKET_COOKIE];

/// Whether one `name=value` pair of a `Cookie` header is a plain-named
/// visitor or ticket cookie (names compared as the readers parse them:
/// trimmed, not percent-decoded).
fn is_plain(pair: &str) -> bool {
    let name = pair.split_once('=').map_or(pair, |(name, _)| name).trim();
    PLAIN_NAMES.contains(&name)
}

/// A cheap first look, so requests without such a cookie cost no more.
fn carries_plain_names(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|text| text.split(';').any(is_plain))
}

/// Rewrites the `Cookie` headers without the plain-named pairs, keeping
/// every other pair byte for byte. A value that is not text is kept as
/// is: no reader looks into it either.
fn drop_plain_names(headers: &mut HeaderMap) {
    let kept: Vec<HeaderValue> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| {
            let Ok(text) = value.to_str() else {
                return Some(value.clone());
            };
            let rest: Vec<&str> = text
                .split(';')
                .map(str::trim)
                .filter(|pair| !pair.is_empty() && !is_plain(pair))
                .collect();
            if rest.is_empty() {
                return None;
            }
            HeaderValue::from_str(&rest.join("; ")).ok()
        })
        .collect();
    headers.remove(header::COOKIE);
    for value in kept {
        headers.append(header::COOKIE, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(https: bool) -> ClientInfo {
        ClientInfo {
            addr: "192.0.2.1".parse().unwrap(),
            https,
        }
    }

    #[test]
    fn plain_names_are_dropped_and_nothing_else() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            "a=1; waitroom_visitor=v-x.y;__Host-waitroom_visitor=v-z.w"
                .parse()
                .unwrap(),
        );
        h.append(header::COOKIE, " waitroom_ticket = t ".parse().unwrap());
        h.append(header::COOKIE, "b=2;waitroom_visitorx=3".parse().unwrap());
        assert!(carries_plain_names(&h));
        drop_plain_names(&mut h);
        let left: Vec<&str> = h
            .get_all(header::COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(
            left,
            [
                "a=1; __Host-waitroom_visitor=v-z.w",
                "b=2; waitroom_visitorx=3"
            ]
        );
        assert!(!carries_plain_names(&h));
    }

    #[test]
    fn secure_follows_the_mode() {
        assert!(secure(CookieSecure::Auto, &client(true)));
        assert!(!secure(CookieSecure::Auto, &client(false)));
        assert!(secure(CookieSecure::Always, &client(false)));
        assert!(!secure(CookieSecure::Never, &client(true)));
    }

    #[test]
    fn secure_cookies_carry_their_prefix() {
        let q = QueueName::parse("default").unwrap();
        let plain = ticket("", &q, "t".into(), 60, false);
        assert!(plain.starts_with("waitroom_ticket=t;"), "{plain}");
        assert!(!plain.contains("Secure"));
        let s = ticket("/shop", &q, "t".into(), 60, true);
        assert!(
            s.starts_with("__Secure-waitroom_ticket=t;") && s.contains("Secure"),
            "{s}"
        );
        assert!(s.contains("Path=/shop/api/queues/default") && s.contains("SameSite=Strict"));
        let v = visitor("v".into(), true);
        assert!(v.starts_with("__Host-waitroom_visitor=v;"), "{v}");
        assert!(v.contains("Secure") && v.contains("Path=/") && !v.contains("Domain"));
        assert!(v.contains("HttpOnly") && v.contains("SameSite=Lax"));
        let v = visitor("v".into(), false);
        assert!(
            v.starts_with("waitroom_visitor=v;") && !v.contains("Secure"),
            "{v}"
        );
        assert_eq!(ticket_removals("", &q, false).len(), 1);
        let both = ticket_removals("", &q, true);
        assert_eq!(both.len(), 2);
        assert!(both.iter().all(|c| c.contains("Max-Age=0")), "{both:?}");
    }
}
