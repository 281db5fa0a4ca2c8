//! The `pass` section: checks and the typed settings of the admission pass
//! (`crate::pass`), its sessions and return URLs.

use super::sessions::SESSION_SECS;
use super::{Config, ConfigError};
use crate::pass::{KeyRing, PassCookie, ReturnOrigins};
use crate::store::SessionLimits;

impl Config {
    pub(super) fn validate_pass(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError(m));
        if !(SESSION_SECS.0..=SESSION_SECS.1).contains(&self.session_idle_secs) {
            return bad(format!(
                "--session-idle-secs must be {}-{}",
                SESSION_SECS.0, SESSION_SECS.1
            ));
        }
        if !(self.session_idle_secs..=SESSION_SECS.1).contains(&self.session_max_secs) {
            return bad(format!(
                "--session-max-secs must be --session-idle-secs ({}) to {}",
                self.session_idle_secs, SESSION_SECS.1
            ));
        }
        let cookie_name_ok = !self.pass_cookie.is_empty()
            && self.pass_cookie.len() <= 64
            && self
                .pass_cookie
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
        if !cookie_name_ok {
            return bad("--pass-cookie must be 1-64 characters of A-Z a-z 0-9 _ -".into());
        }
        if !self.pass_cookie_path.starts_with('/')
            || !self
                .pass_cookie_path
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b';')
        {
            return bad("--pass-cookie-path must be a path starting with /".into());
        }
        if let Some(domain) = &self.pass_cookie_domain {
            let ok = !domain.is_empty()
                && domain
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'));
            if !ok {
                return bad("--pass-cookie-domain must be a host name".into());
            }
        }
        ReturnOrigins::parse(&self.protected_origins)
            .map_err(|e| ConfigError(format!("--protected-origins: {e}")))?;
        if let Some(url) = &self.pass_page_url {
            let parsed =
                url::Url::parse(url).map_err(|e| ConfigError(format!("--pass-page-url: {e}")))?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.query().is_some() {
                return bad("--pass-page-url must be an http(s) URL without a query".into());
            }
        }
        Ok(())
    }

    /// The pass cookie's name, `Domain` and `Path`.
    pub fn pass_cookie_settings(&self) -> PassCookie {
        PassCookie {
            name: self.pass_cookie.clone(),
            domain: self.pass_cookie_domain.clone(),
            path: self.pass_cookie_path.clone(),
        }
    }

    /// How long sessions last by default (a queue may set its own:
    /// `session_policy`).
    pub fn session_limits(&self) -> SessionLimits {
        SessionLimits {
            idle_ms: self.session_idle_secs * 1000,
            max_ms: self.session_max_secs * 1000,
        }
    }

    /// The longest any pass lives, in any queue: a retired key is
    /// accepted that long for the passes it signed.
    fn longest_session_secs(&self) -> u64 {
        self.session_policy().longest_ms() / 1000
    }

    /// `--protected-origins`, parsed (checked by `validate`).
    pub fn protected_origins(&self) -> ReturnOrigins {
        ReturnOrigins::parse(&self.protected_origins).unwrap_or_default()
    }

    /// The pass key ring: `--pass-key` and `--pass-previous-keys`, retired
    /// at `now` (seconds); or, with no key configured, one generated now
    /// (`Ok((ring, true))`: the caller warns).
    pub fn pass_key_ring(&self, now: u64) -> Result<(KeyRing, bool), ConfigError> {
        let Some(current) = &self.pass_key else {
            if !self.pass_previous_keys.is_empty() {
                return Err(ConfigError(
                    "--pass-previous-keys needs --pass-key (the key that signs now)".into(),
                ));
            }
            return Ok((KeyRing::generated(self.longest_session_secs()), true));
        };
        KeyRing::from_files(
            current,
            &self.pass_previous_keys,
            now,
            self.longest_session_secs(),
        )
        .map(|ring| (ring, false))
        .map_err(|e| ConfigError(format!("--pass-key / --pass-previous-keys: {e}")))
    }
}
