//! Where a visitor may be sent back to after the waiting room: a path on
//! this site, or an absolute URL on an allow-listed origin. Nothing else,
//! so the return parameter is never an open redirect.
//!
//! Browsers are generous with what they take for a URL: `//evil.example`
//! and `/\evil.example` are another host, `https:evil.example` is
//! `https://evil.example/` (the WHATWG parser), tabs and newlines inside a
//! URL are dropped, and a fullwidth solidus may be folded to `/` by a
//! server on the way. So the check is strict on the raw text first (ASCII
//! printable only, no backslash, a path starts with exactly one `/`, an
//! absolute URL spells `http://` or `https://`), then on the text once and
//! twice percent-decoded (no `//` or `\` smuggled in as `%2F%2F`, `%5C`,
//! `%252F…`, no control character), and only then is it parsed and its
//! origin compared. What is returned is the parser's normalised form
//! (dot segments resolved), the same URL the browser would ask for.

use url::{Origin, Url};

/// The longest return URL accepted: longer ones are not links a shop
/// sends buyers to, and they would grow every cookie and header carrying
/// them.
pub const MAX_RETURN_LEN: usize = 2048;

/// A validated return target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReturnTo {
    /// A path (with its query and fragment) on the origin that asked.
    Path(String),
    /// An absolute URL on an allow-listed origin.
    Url(Url),
}

impl ReturnTo {
    /// The target as it goes into a `Location` header or a link.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Path(p) => p,
            Self::Url(u) => u.as_str(),
        }
    }
}

/// Why a return URL was refused (the JSON error says which).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReturnError {
    #[error("the return URL is empty or longer than 2048 bytes")]
    Length,
    #[error(
        "the return URL holds characters a URL may not (controls, spaces, non-ASCII, backslash)"
    )]
    Characters,
    #[error("the return URL is neither a path nor an http(s) URL")]
    Shape,
    #[error("the return URL names another site")]
    Origin,
}

/// The origins a return URL may point to (`--pass-return-origins`, the
/// rooms' sites): scheme, host and port each.
#[derive(Debug, Clone, Default)]
pub struct ReturnOrigins(Vec<Origin>);

impl ReturnOrigins {
    /// From `https://shop.example` strings; anything but a bare http(s)
    /// origin (a path, a query, credentials) is refused, naming it.
    pub fn parse<S: AsRef<str>>(origins: &[S]) -> Result<Self, String> {
        origins
            .iter()
            .map(|raw| {
                let raw = raw.as_ref();
                let url = Url::parse(raw).map_err(|e| format!("{raw}: {e}"))?;
                let bare = matches!(url.scheme(), "http" | "https")
                    && url.host().is_some()
                    && url.username().is_empty()
                    && url.password().is_none()
                    && url.path() == "/"
                    && url.query().is_none()
                    && url.fragment().is_none();
                if !bare {
                    return Err(format!(
                        "{raw}: an origin is scheme://host[:port] and nothing more"
                    ));
                }
                Ok(url.origin())
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    /// Whether `origin` is one of the allowed ones.
    pub fn allows(&self, origin: &Origin) -> bool {
        self.0.contains(origin)
    }

    /// Adds an origin (a room's own site).
    pub fn push(&mut self, origin: Origin) {
        if !self.allows(&origin) {
            self.0.push(origin);
        }
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Validates a return URL: a path (`/product/42?size=9`) or an absolute
/// `http(s)://` URL whose origin is allowed.
pub fn validate_return(raw: &str, allowed: &ReturnOrigins) -> Result<ReturnTo, ReturnError> {
    if raw.is_empty() || raw.len() > MAX_RETURN_LEN {
        return Err(ReturnError::Length);
    }
    if !raw.bytes().all(|b| b.is_ascii_graphic()) || raw.contains('\\') {
        return Err(ReturnError::Characters);
    }
    let once = percent_decode(raw);
    let twice = percent_decode(&once);
    for decoded in [&once, &twice] {
        if decoded.chars().any(|c| c.is_control() || c == '\\') {
            return Err(ReturnError::Characters);
        }
    }
    if raw.starts_with('/') {
        for text in [raw, &once, &twice] {
            if text.starts_with("//") {
                return Err(ReturnError::Shape);
            }
        }
        // Resolved against a placeholder origin: dot segments go, and the
        // result must still be on that origin.
        let base = Url::parse("http://return.invalid/").expect("a valid base");
        let url = base.join(raw).map_err(|_| ReturnError::Shape)?;
        if url.origin() != base.origin() {
            return Err(ReturnError::Shape);
        }
        return Ok(ReturnTo::Path(url[url::Position::BeforePath..].to_owned()));
    }
    let lower = raw.get(..8).unwrap_or(raw).to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return Err(ReturnError::Shape);
    }
    let url = Url::parse(raw).map_err(|_| ReturnError::Shape)?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ReturnError::Origin);
    }
    if !allowed.allows(&url.origin()) {
        return Err(ReturnError::Origin);
    }
    Ok(ReturnTo::Url(url))
}

/// One round of percent-decoding, lossy: what a server on the way may
/// make of the text.
fn percent_decode(text: &str) -> String {
    // form_urlencoded would also turn `+` into a space: not wanted here.
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (
                bytes.get(i + 1).and_then(|b| (*b as char).to_digit(16)),
                bytes.get(i + 2).and_then(|b| (*b as char).to_digit(16)),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shop() -> ReturnOrigins {
        ReturnOrigins::parse(&["https://shop.example", "http://127.0.0.1:8081"]).unwrap()
    }

    fn ok(raw: &str) -> String {
        validate_return(raw, &shop())
            .unwrap_or_else(|e| panic!("{raw}: {e}"))
            .as_str()
            .to_owned()
    }

    #[test]
    fn takes_paths_and_allowed_urls() {
        assert_eq!(ok("/product/42?size=9"), "/product/42?size=9");
        assert_eq!(ok("/"), "/");
        assert_eq!(ok("/a/b#frag"), "/a/b#frag");
        assert_eq!(ok("/shop/../product/1"), "/product/1");
        assert_eq!(ok("/caf%C3%A9"), "/caf%C3%A9");
        assert_eq!(
            ok("https://shop.example/product/42?size=9"),
            "https://shop.example/product/42?size=9"
        );
        assert_eq!(ok("HTTPS://SHOP.example/x"), "https://shop.example/x");
        assert_eq!(ok("http://127.0.0.1:8081/p"), "http://127.0.0.1:8081/p");
    }

    #[test]
    fn refuses_other_hosts_in_every_spelling() {
        let refused = [
            "//evil.example",
            "//evil.example/path",
            "///evil.example",
            "/\\evil.example",
            "\\\\evil.example",
            "https:evil.example",
            "https:/evil.example",
            "http:\\\\evil.example",
            "https://evil.example/",
            "https://shop.example.evil.example/",
            "https://shop.example@evil.example/",
            "https://user:pw@shop.example/",
            "http://shop.example/",
            "https://shop.example:444/",
            "javascript:alert(1)",
            "data:text/html,x",
            "evil.example",
            "/%2F%2Fevil.example",
            "/%2f/evil.example",
            "/%5Cevil.example",
            "/%252F%252Fevil.example",
            "/%255Cevil.example",
            "/\t/evil.example",
            "/\n/evil.example",
            "/%09/evil.example",
            "/%0d%0aSet-Cookie:x=1",
            "/ /evil.example",
            "/\u{FF0F}evil.example",
            "/\u{2215}evil.example",
            "https://shop.example\u{3002}evil/",
            "/\u{0000}",
            "",
        ];
        for raw in refused {
            assert!(
                validate_return(raw, &shop()).is_err(),
                "{raw:?} was taken as {:?}",
                validate_return(raw, &shop())
            );
        }
        assert!(validate_return(&format!("/{}", "a".repeat(MAX_RETURN_LEN)), &shop()).is_err());
    }

    #[test]
    fn origins_are_bare() {
        assert!(ReturnOrigins::parse(&["https://shop.example/path"]).is_err());
        assert!(ReturnOrigins::parse(&["ftp://shop.example"]).is_err());
        assert!(ReturnOrigins::parse(&["https://u@shop.example"]).is_err());
        assert!(ReturnOrigins::parse(&["shop.example"]).is_err());
        assert!(ReturnOrigins::parse(&["https://shop.example/"]).is_ok());
    }
}
