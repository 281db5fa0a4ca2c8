//! Validated names: a queue (`[a-z0-9_-]{1,64}`) and a buyer (`[A-Za-z0-9_.:-]{1,64}`).
//!
//! Both end up inside Redis keys, cookie paths and log lines, so they are
//! checked once at the edge and carried as types afterwards.

use std::borrow::Borrow;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidName(pub &'static str);

/// A queue name: 1–64 characters of `[a-z0-9_-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueName(String);

impl QueueName {
    /// Checks `raw` against the queue-name grammar.
    pub fn parse(raw: &str) -> Result<Self, InvalidName> {
        let ok = (1..=64).contains(&raw.len())
            && raw
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if ok {
            Ok(Self(raw.to_owned()))
        } else {
            Err(InvalidName(
                "a queue name is 1-64 characters of a-z, 0-9, _ and -",
            ))
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A buyer's id: 1–64 characters of `[A-Za-z0-9_.:-]`.
///
/// It crosses the store as a plain string (events, Lua results) and is
/// checked again when read back, so a malformed id never becomes one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct UserId(String);

impl UserId {
    /// Checks `raw` against the user-id grammar.
    pub fn parse(raw: &str) -> Result<Self, InvalidName> {
        let ok = (1..=64).contains(&raw.len())
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
        if ok {
            Ok(Self(raw.to_owned()))
        } else {
            Err(InvalidName(
                "X-User-Id must be 1-64 characters of A-Z, a-z, 0-9, _ . : and -",
            ))
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for UserId {
    type Error = InvalidName;

    fn try_from(raw: String) -> Result<Self, InvalidName> {
        Self::parse(&raw)
    }
}

impl From<UserId> for String {
    fn from(user: UserId) -> Self {
        user.0
    }
}

/// Lookups by `&str` find a `UserId` key: both hash and compare as the text.
impl Borrow<str> for UserId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names() {
        assert!(QueueName::parse("default").is_ok());
        assert!(QueueName::parse("drop_2024-xmas").is_ok());
        assert!(QueueName::parse("").is_err());
        assert!(QueueName::parse("Default").is_err());
        assert!(QueueName::parse("a{b}").is_err());
        assert!(QueueName::parse(&"a".repeat(65)).is_err());
        assert!(QueueName::parse(&"a".repeat(64)).is_ok());
    }

    #[test]
    fn user_ids() {
        assert!(UserId::parse("alice").is_ok());
        assert!(UserId::parse("tenant:42.user_7-x").is_ok());
        assert!(UserId::parse("bad user!").is_err());
        assert!(UserId::parse("").is_err());
        assert!(UserId::parse(&"x".repeat(65)).is_err());
        assert!(UserId::parse("ünï").is_err());
    }

    #[test]
    fn user_ids_cross_json_as_checked_strings() {
        let alice = UserId::parse("alice").unwrap();
        assert_eq!(serde_json::to_string(&alice).unwrap(), r#""alice""#);
        assert_eq!(serde_json::from_str::<UserId>(r#""alice""#).unwrap(), alice);
        assert!(serde_json::from_str::<UserId>(r#""bad user!""#).is_err());
        assert!(serde_json::from_str::<UserId>(r#""""#).is_err());
    }
}
