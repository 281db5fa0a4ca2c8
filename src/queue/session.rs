//! A protected site's session: its id (the pass's `jti`), the same
//! grammar everywhere it travels (a JWT claim, a Redis member, an admin
//! URL), checked once at the edge.

use std::borrow::Borrow;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::InvalidName;

/// A session id: 22 characters of base64url (128 random bits) when minted
/// here; any 16-64 characters of `[A-Za-z0-9_-]` are accepted back.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct SessionId(String);

impl SessionId {
    /// A fresh random id.
    pub fn generate() -> Self {
        use base64::Engine as _;
        let mut bytes = [0u8; 16];
        rand::fill(&mut bytes);
        Self(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
    }

    /// Checks `raw` against the session-id grammar.
    pub fn parse(raw: &str) -> Result<Self, InvalidName> {
        let ok = (16..=64).contains(&raw.len())
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
        if ok {
            Ok(Self(raw.to_owned()))
        } else {
            Err(InvalidName(
                "a session id is 16-64 characters of A-Z, a-z, 0-9, _ and -",
            ))
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SessionId {
    type Error = InvalidName;

    fn try_from(raw: String) -> Result<Self, InvalidName> {
        Self::parse(&raw)
    }
}

impl From<SessionId> for String {
    fn from(id: SessionId) -> Self {
        id.0
    }
}

impl Borrow<str> for SessionId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_parse_and_differ() {
        let a = SessionId::generate();
        let b = SessionId::generate();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 22);
        assert_eq!(SessionId::parse(a.as_str()).unwrap(), a);
        assert!(SessionId::parse("short").is_err());
        assert!(SessionId::parse("abcdefghijklmnop/").is_err());
        assert!(SessionId::parse(&"a".repeat(65)).is_err());
    }
}
