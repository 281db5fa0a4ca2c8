//! Entry tokens: 32 bytes from the operating system's CSPRNG, URL-safe base64.
//!
//! A token is the buyer's pass to the order API, so it must be unguessable
//! and compared in constant time.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use subtle::ConstantTimeEq;

/// A freshly generated or stored entry token.
#[derive(Clone, PartialEq, Eq)]
pub struct EntryToken(String);

impl EntryToken {
    /// 32 random bytes, URL-safe base64 without padding (43 characters).
    pub fn generate() -> Self {
        let mut bytes = [0u8; 32];
        rand::fill(&mut bytes);
        Self(URL_SAFE_NO_PAD.encode(bytes))
    }

    /// Wraps a token read back from a store.
    pub fn from_stored(raw: String) -> Self {
        Self(raw)
    }

    /// The token text, for the buyer and the store. Never log it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Constant-time comparison with a presented token, so a timing side
    /// channel cannot reveal how much of a guess was right.
    pub fn matches(&self, presented: &str) -> bool {
        self.0.as_bytes().ct_eq(presented.as_bytes()).into()
    }
}

impl std::fmt::Debug for EntryToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EntryToken(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_43_url_safe_chars_and_distinct() {
        let a = EntryToken::generate();
        let b = EntryToken::generate();
        assert_eq!(a.as_str().len(), 43);
        assert!(
            a.as_str()
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        );
        assert_ne!(a, b);
        assert_eq!(URL_SAFE_NO_PAD.decode(a.as_str()).unwrap().len(), 32);
    }

    #[test]
    fn matches_only_the_same_text() {
        let a = EntryToken::generate();
        assert!(a.matches(a.as_str()));
        assert!(!a.matches(&a.as_str()[..42]));
        assert!(!a.matches(EntryToken::generate().as_str()));
        assert!(!format!("{a:?}").contains(a.as_str()));
    }

    #[test]
    fn debug_names_the_type_only() {
        let a = EntryToken::from_stored("secret-token-text".into());
        assert_eq!(a.as_str(), "secret-token-text");
        let shown = format!("{:?}", Some(a));
        assert!(shown.contains("EntryToken"), "{shown}");
        assert!(!shown.contains("secret"), "{shown}");
    }
}
