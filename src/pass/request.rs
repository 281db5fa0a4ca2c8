//! Reading a pass from a request: the pass cookie on the protected site's
//! domain (browsers), else `Authorization: Bearer` (API clients, apps).
//!
//! The cookie comes first: a site behind the gateway may use its own
//! bearer tokens for its own login, and those are not passes.

use axum::http::HeaderMap;

use super::MAX_PASS_LEN;

/// Where the pass cookie lives: its name, and the `Domain` and `Path` it is
/// set with (`Secure`, `HttpOnly` and `SameSite=Lax` are always set, the
/// first per `--cookie-secure`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassCookie {
    /// The cookie's name (`waitroom_pass`).
    pub name: String,
    /// `Domain=`: unset, the host that set it only; set to the protected
    /// site's parent domain when waitroom runs on a sibling host.
    pub domain: Option<String>,
    /// `Path=`.
    pub path: String,
}

impl Default for PassCookie {
    fn default() -> Self {
        Self {
            name: DEFAULT_PASS_COOKIE.to_owned(),
            domain: None,
            path: "/".to_owned(),
        }
    }
}

/// The pass cookie's name unless configured.
pub const DEFAULT_PASS_COOKIE: &str = "waitroom_pass";

/// What a request presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presented<'a> {
    /// Neither the cookie nor a bearer.
    Nothing,
    /// A pass candidate (not verified yet).
    Token(&'a str),
    /// A candidate larger than any pass: refused unread.
    Oversized,
}

/// The pass a request presents: the first non-empty cookie named
/// `cookie_name`, else an `Authorization: Bearer` token.
pub fn pass_from_headers<'a>(headers: &'a HeaderMap, cookie_name: &str) -> Presented<'a> {
    let from_cookie = headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|text| text.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, value)| *name == cookie_name && !value.is_empty())
        .map(|(_, value)| value.trim_matches('"'));
    let token = from_cookie.or_else(|| {
        headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, rest) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .filter(|t| !t.is_empty())
    });
    match token {
        None => Presented::Nothing,
        Some(t) if t.len() > MAX_PASS_LEN => Presented::Oversized,
        Some(t) => Presented::Token(t),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn cookie_first_then_bearer() {
        let h = headers(&[
            ("cookie", "a=1; waitroom_pass=abc.def.ghi; b=2"),
            ("authorization", "Bearer site-login"),
        ]);
        assert_eq!(
            pass_from_headers(&h, "waitroom_pass"),
            Presented::Token("abc.def.ghi")
        );
        let h = headers(&[("authorization", "bearer  x.y.z ")]);
        assert_eq!(
            pass_from_headers(&h, "waitroom_pass"),
            Presented::Token("x.y.z")
        );
        let h = headers(&[
            ("cookie", "waitroom_pass=; other=1"),
            ("cookie", "waitroom_pass=p.q.r"),
        ]);
        assert_eq!(
            pass_from_headers(&h, "waitroom_pass"),
            Presented::Token("p.q.r")
        );
        let h = headers(&[
            ("cookie", "xwaitroom_pass=1"),
            ("authorization", "Basic abc"),
        ]);
        assert_eq!(pass_from_headers(&h, "waitroom_pass"), Presented::Nothing);
    }

    #[test]
    fn oversized_is_refused_unread() {
        let big = format!("waitroom_pass={}", "a".repeat(MAX_PASS_LEN + 1));
        let h = headers(&[("cookie", &big)]);
        assert_eq!(pass_from_headers(&h, "waitroom_pass"), Presented::Oversized);
    }
}
