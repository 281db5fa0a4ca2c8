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
//! `__Host-` is not open to it). Both names are read, the prefixed one
//! first, so a site that turns on HTTPS keeps its visitors and tickets.

use cookie::{Cookie, SameSite};

use super::client::ClientInfo;
use crate::config::CookieSecure;
use crate::identity::{VISITOR_COOKIE, VISITOR_COOKIE_SECURE, VISITOR_MAX_AGE_SECS};
use crate::queue::QueueName;

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
