//! Checking a configuration before anything starts: what clap cannot
//! (names, ranges, secrets, flags that only make sense together), one
//! section at a time, each naming the flag it refuses. The loader
//! (`load.rs`) adds where the value came from and exits 2.

use super::{Config, ConfigError, IdentityMode, features};
use crate::store::redis::Topology;

/// The longest `--identity-max-lifetime-secs`: a year.
const MAX_IDENTITY_LIFETIME_SECS: u64 = 365 * 86_400;

/// The longest ticket life accepted: a leaked ticket stays usable no
/// longer than this, even while its place lasts.
const MAX_TICKET_TTL_SECS: u64 = 30 * 24 * 3600;

/// The most replicas a write may wait for: more is a typo, not a topology.
const MAX_WAIT_REPLICAS: u32 = 16;

/// `Err` with `m`, the refusal of one flag.
fn bad(m: &str) -> Result<(), ConfigError> {
    Err(ConfigError(m.to_owned()))
}

impl Config {
    /// Checks what clap cannot: names, ranges and secrets.
    pub fn validate(&self) -> Result<(), ConfigError> {
        features::check(self).map_err(ConfigError)?;
        self.queue_names()?;
        self.validate_pass()?;
        self.check_front()?;
        self.check_sessions()?;
        self.check_admission()?;
        self.check_store()?;
        self.check_webhooks()?;
        self.check_secrets()?;
        self.check_connections()?;
        self.check_requests()?;
        self.seed_settings()?;
        Ok(())
    }

    /// The admission policy every queue starts with.
    fn check_admission(&self) -> Result<(), ConfigError> {
        if self.admission_interval_ms == 0 {
            return bad("--admission-interval-ms must be at least 1");
        }
        if self.admission_batch == 0 {
            return bad("--admission-batch must be at least 1");
        }
        if self.token_ttl_secs == 0 {
            return bad("--token-ttl-secs must be at least 1");
        }
        if self.claim_lease_secs == 0 {
            return bad("--claim-lease-secs must be at least 1");
        }
        if let Some(url) = &self.shop_url {
            crate::queue::check_shop_url(url)
                .map_err(|m| ConfigError(format!("--shop-url: {m}")))?;
        }
        if let Some(a) = self.adaptive_settings() {
            a.validate(self.admission_interval_ms)
                .map_err(|m| ConfigError(format!("--adaptive: {m}")))?;
        }
        Ok(())
    }

    /// Redis: the topology, the replicas a write waits for, how joins are
    /// grouped, the key prefix.
    fn check_store(&self) -> Result<(), ConfigError> {
        if self.redis_url.is_none() && (self.redis_cluster || self.redis_wait_replicas > 0) {
            return bad("--redis-cluster and --redis-wait-replicas need --redis-url");
        }
        if self.redis_wait_replicas > MAX_WAIT_REPLICAS {
            return bad("--redis-wait-replicas must be 0-16");
        }
        if self.join_batch_window_us > 2000 {
            return bad("--join-batch-window-us must be 0-2000");
        }
        if !(1..=1000).contains(&self.join_batch_max) {
            return bad("--join-batch-max must be 1-1000");
        }
        if !(1..=64).contains(&self.join_batch_depth) {
            return bad("--join-batch-depth must be 1-64");
        }
        if let Some(url) = &self.redis_url {
            let topology = Topology::from_flags(url, self.redis_cluster).map_err(ConfigError)?;
            if matches!(topology, Topology::Single(_)) && url.contains(',') {
                return bad("--redis-url names several nodes: add --redis-cluster");
            }
        }
        if self.key_prefix.is_empty() || self.key_prefix.contains(['{', '}', ' ']) {
            return bad("--key-prefix must be non-empty, without braces or spaces");
        }
        Ok(())
    }

    /// The `[[webhooks]]` and their delivery.
    fn check_webhooks(&self) -> Result<(), ConfigError> {
        if !(1_000..=3_600_000).contains(&self.webhook_claim_ms) {
            return bad("--webhook-claim-ms must be 1000-3600000");
        }
        if self.fairness_log && self.audit_max_len == 0 {
            return bad("--fairness-log needs the audit log: --audit-max-len must not be 0");
        }
        if !self.webhooks.is_empty() && self.audit_max_len == 0 {
            return bad("[[webhooks]] need the audit log: --audit-max-len must not be 0");
        }
        for (i, hook) in self.webhooks.iter().enumerate() {
            if self.webhooks[..i].iter().any(|h| h.name == hook.name) {
                return Err(ConfigError(format!(
                    "webhooks: two hooks are named `{}`: names must be distinct",
                    hook.name
                )));
            }
        }
        Ok(())
    }

    /// The ticket secret and the two API tokens.
    fn check_secrets(&self) -> Result<(), ConfigError> {
        if let Some(s) = &self.ticket_secret
            && s.len() < 16
        {
            return bad("--ticket-secret must be at least 16 bytes");
        }
        if !(1..=MAX_TICKET_TTL_SECS).contains(&self.ticket_ttl_secs) {
            return bad("--ticket-ttl-secs must be 1-2592000 (30 days)");
        }
        if let Some(t) = &self.admin_token
            && t.len() < 16
        {
            return bad("--admin-token must be at least 16 characters");
        }
        if let Some(t) = &self.service_token
            && t.len() < 16
        {
            return bad("--service-token must be at least 16 characters");
        }
        if let (Some(service), Some(admin)) = (&self.service_token, &self.admin_token)
            && service == admin
        {
            return bad("--service-token must differ from --admin-token (separate scopes)");
        }
        Ok(())
    }

    /// The listeners, their connection caps and timeouts.
    fn check_connections(&self) -> Result<(), ConfigError> {
        if !(1..=65_535).contains(&self.listen_backlog) {
            return bad("--listen-backlog must be 1-65535");
        }
        if !(1..=15).contains(&self.keep_alive_secs) {
            return bad("--keep-alive-secs must be 1-15");
        }
        // Port 0 on both is fine: each gets a port of its own.
        if self
            .admin_addr
            .is_some_and(|a| a == self.addr && a.port() != 0)
        {
            return bad("--admin-addr must differ from --addr");
        }
        if let Some(gate) = self.gate_addr.filter(|a| a.port() != 0)
            && (gate == self.addr || Some(gate) == self.admin_addr)
        {
            return bad("--gate-addr must differ from --addr and --admin-addr");
        }
        if self.max_streams == Some(0) {
            return bad("--max-streams must be at least 1");
        }
        if self.max_connections == Some(0) {
            return bad("--max-connections must be at least 1");
        }
        if let (Some(streams), Some(connections)) = (self.max_streams, self.max_connections)
            && streams > connections
        {
            return bad("--max-connections must be at least --max-streams");
        }
        if let (Some(per_address), Some(connections)) =
            (self.connections_per_address, self.max_connections)
            && per_address > connections
        {
            return bad("--connections-per-address must be at most --max-connections (0: off)");
        }
        if !(1..=60).contains(&self.first_byte_timeout_secs) {
            return bad("--first-byte-timeout-secs must be 1-60");
        }
        if self.admin_reserved_connections > 1024 {
            return bad("--admin-reserved-connections must be 0-1024");
        }
        if !(1..=3600).contains(&self.idle_timeout_secs) {
            return bad("--idle-timeout-secs must be 1-3600");
        }
        if let Some(secs) = self.body_timeout_secs
            && (secs == 0 || secs >= self.claim_lease_secs)
        {
            return bad(
                "--body-timeout-secs must be at least 1 and shorter than --claim-lease-secs",
            );
        }
        Ok(())
    }

    /// Who a request is from and what it may ask: the operator host names,
    /// buyer identity, the base path, allowed origins, trusted proxies and
    /// the join challenge.
    fn check_requests(&self) -> Result<(), ConfigError> {
        self.admin_host_names()?;
        self.check_identity()?;
        self.check_base_path()?;
        for origin in &self.allowed_origins {
            if crate::http::origin::parse_origin(origin.trim()).is_none() {
                return Err(ConfigError(format!(
                    "--allowed-origins: {origin:?} is not an origin like https://shop.example"
                )));
            }
        }
        self.proxy_nets()?;
        self.check_join_challenge()
    }

    /// `--base-path`: empty, or `/` and segments of `A-Z a-z 0-9 - _ . ~`
    /// without a trailing `/` (so it can be put in a cookie `Path` and in
    /// front of a route as it is).
    fn check_base_path(&self) -> Result<(), ConfigError> {
        let p = &self.base_path;
        if p.is_empty() {
            return Ok(());
        }
        let ok = p.starts_with('/')
            && !p.ends_with('/')
            && p[1..].split('/').all(|seg| {
                !seg.is_empty()
                    && seg != "."
                    && seg != ".."
                    && seg
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.~".contains(&b))
            });
        if ok {
            Ok(())
        } else {
            Err(ConfigError(format!(
                "--base-path {p:?}: empty, or like /shop (segments of A-Z a-z 0-9 - _ . ~, no trailing /)"
            )))
        }
    }

    /// The challenge flags' ranges (checked in every mode, so a typo is
    /// found before the day `auto` switches on).
    fn check_join_challenge(&self) -> Result<(), ConfigError> {
        use crate::challenge::{MAX_DIFFICULTY, MIN_DIFFICULTY};
        if !(MIN_DIFFICULTY..=MAX_DIFFICULTY).contains(&self.join_challenge_difficulty) {
            return bad("--join-challenge-difficulty must be 1000-1000000");
        }
        if !(1..=3600).contains(&self.join_challenge_ttl_secs) {
            return bad("--join-challenge-ttl-secs must be 1-3600");
        }
        if self.join_challenge_threshold == 0 {
            return bad("--join-challenge-threshold must be at least 1");
        }
        if !(1..=86_400).contains(&self.join_challenge_hold_secs) {
            return bad("--join-challenge-hold-secs must be 1-86400");
        }
        Ok(())
    }

    /// Signed mode needs exactly one key; the signed-mode flags anywhere
    /// else are a mistake worth stopping for (a deployment that believes
    /// it checks logins but does not).
    fn check_identity(&self) -> Result<(), ConfigError> {
        let signed_flags = self.identity_secret.is_some()
            || self.identity_public_key.is_some()
            || self.identity_issuer.is_some()
            || self.identity_audience.is_some()
            || self.identity_cookie.is_some()
            || self.identity_max_lifetime_secs.is_some();
        if self.identity != IdentityMode::Signed {
            if signed_flags {
                return bad("the --identity-* flags need --identity signed");
            }
            return Ok(());
        }
        match (&self.identity_secret, &self.identity_public_key) {
            (Some(_), Some(_)) => {
                bad("--identity signed takes --identity-secret or --identity-public-key, not both")
            }
            (None, None) => bad(
                "--identity signed needs --identity-secret (HS256) or --identity-public-key (RS256/EdDSA)",
            ),
            (Some(s), None) if s.len() < 32 => bad("--identity-secret must be at least 32 bytes"),
            _ if self
                .identity_max_lifetime_secs
                .is_some_and(|secs| !(1..=MAX_IDENTITY_LIFETIME_SECS).contains(&secs)) =>
            {
                bad("--identity-max-lifetime-secs must be 1-31536000 (a year)")
            }
            _ => Ok(()),
        }
    }
}
