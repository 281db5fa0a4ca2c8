//! What the rest of the crate reads from a [`Config`]: typed values
//! derived from the flags (durations, the admission policy, networks,
//! host names, the signed-identity key), each parsed and checked in one
//! place so `validate` and the composition root agree on them.

use std::time::Duration;

use super::{Config, ConfigError, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS, IdentityMode};
use crate::queue::{Policy, QueueName};

impl Config {
    /// The configured queues, validated and without duplicates.
    pub fn queue_names(&self) -> Result<Vec<QueueName>, ConfigError> {
        let mut names: Vec<QueueName> = Vec::new();
        for raw in &self.queues {
            let name = QueueName::parse(raw.trim())
                .map_err(|e| ConfigError(format!("--queues: {raw:?}: {e}")))?;
            if !names.contains(&name) {
                names.push(name);
            }
        }
        if names.is_empty() {
            return Err(ConfigError("--queues names no queue".into()));
        }
        Ok(names)
    }

    /// The admission policy every queue follows.
    pub fn policy(&self) -> Policy {
        Policy {
            batch: self.admission_batch,
            interval_ms: self.admission_interval_ms,
            token_ttl_ms: self.token_ttl_secs * 1000,
            max_active: self.max_active,
            abandon_after_ms: (self.abandon_after_secs > 0)
                .then_some(self.abandon_after_secs * 1000),
        }
    }

    /// The adaptive admission settings `--adaptive` seeds new queues with
    /// (`None` without it).
    pub fn adaptive_settings(&self) -> Option<crate::queue::AdaptiveSettings> {
        self.adaptive.then(|| crate::queue::AdaptiveSettings {
            enabled: true,
            floor_per_sec: self.adaptive_floor,
            ceiling_per_sec: self.adaptive_ceiling,
            target_p95_ms: self.adaptive_target_p95_ms,
            window_ms: self.adaptive_window_ms,
            ..crate::queue::AdaptiveSettings::recommended()
        })
    }

    /// How long a request body may take to arrive: `--body-timeout-secs`,
    /// or 10 s capped at half the claim lease, so a body that trickles in
    /// can never outlast the claim an order would take on it.
    pub fn body_timeout(&self) -> Duration {
        match self.body_timeout_secs {
            Some(secs) => Duration::from_secs(secs),
            None => Duration::from_secs(10).min(Duration::from_secs(self.claim_lease_secs) / 2),
        }
    }

    /// How long an idle keep-alive connection stays open.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(self.idle_timeout_secs)
    }

    /// How long a new connection may wait before its first byte.
    pub fn first_byte_timeout(&self) -> Duration {
        Duration::from_secs(self.first_byte_timeout_secs)
    }

    /// Most connections one address may hold on the public listener, given
    /// the instance's connection cap (`--max-connections` or its
    /// default); `None`: not capped (`--connections-per-address 0`).
    pub fn connections_per_address(&self, max_connections: usize) -> Option<usize> {
        match self.connections_per_address {
            Some(0) => None,
            Some(n) => Some(n),
            // Half: one address never holds the whole instance, and a
            // crowd behind one NAT address still gets a large share.
            None => Some((max_connections / 2).clamp(1, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS)),
        }
    }

    /// `--admin-hosts`, each lower-case and without a trailing dot.
    /// Refuses anything that is not a DNS name (a port, a scheme, a path,
    /// an empty label).
    pub fn admin_host_names(&self) -> Result<Vec<String>, ConfigError> {
        let mut names = Vec::new();
        for raw in &self.admin_hosts {
            let name = raw.trim().to_ascii_lowercase();
            let name = name.strip_suffix('.').unwrap_or(&name);
            if name.is_empty() && raw.trim().is_empty() {
                continue;
            }
            let ok = (1..=253).contains(&name.len())
                && name.split('.').all(|label| {
                    (1..=63).contains(&label.len())
                        && !label.starts_with('-')
                        && !label.ends_with('-')
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            if !ok {
                return Err(ConfigError(format!(
                    "--admin-hosts: {raw:?} is not a host name (no port, scheme or path)"
                )));
            }
            names.push(name.to_owned());
        }
        Ok(names)
    }

    /// `--trusted-proxies` as networks; a bare address is its own /32 or
    /// /128. Refuses anything else, and `0.0.0.0/0` or `::/0` (trusting
    /// every peer would let any client choose its address).
    pub fn proxy_nets(&self) -> Result<Vec<ipnet::IpNet>, ConfigError> {
        let mut nets = Vec::new();
        for raw in &self.trusted_proxies {
            let raw = raw.trim();
            if raw.is_empty() {
                continue;
            }
            let net = raw
                .parse::<ipnet::IpNet>()
                .or_else(|_| raw.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| {
                    ConfigError(format!(
                        "--trusted-proxies: {raw:?} is not a CIDR or an address"
                    ))
                })?;
            if net.prefix_len() == 0 {
                return Err(ConfigError(format!(
                    "--trusted-proxies: {raw:?} trusts every peer, so any client could choose its address"
                )));
            }
            nets.push(net.trunc());
        }
        Ok(nets)
    }

    /// The signed-mode settings (the key file read), when `--identity
    /// signed`.
    pub fn signed_identity(&self) -> Result<Option<crate::identity::SignedConfig>, ConfigError> {
        use crate::identity::{SignedConfig, SignedKey};
        if self.identity != IdentityMode::Signed {
            return Ok(None);
        }
        let key = match (&self.identity_secret, &self.identity_public_key) {
            (Some(secret), _) => SignedKey::Secret(secret.as_bytes().to_vec()),
            (None, Some(path)) => SignedKey::PublicKeyPem(std::fs::read(path).map_err(|e| {
                ConfigError(format!("--identity-public-key {}: {e}", path.display()))
            })?),
            (None, None) => return Err(ConfigError("--identity signed needs a key".into())),
        };
        Ok(Some(SignedConfig {
            key,
            issuer: self.identity_issuer.clone(),
            audience: self.identity_audience.clone(),
            cookie: self.identity_cookie.clone(),
            max_lifetime_secs: self.identity_max_lifetime_secs,
        }))
    }

    /// How joins are grouped into script calls; `None`: one call per join.
    pub fn join_batch(&self) -> Option<crate::store::redis::JoinBatch> {
        (self.join_batch_max > 1).then(|| crate::store::redis::JoinBatch {
            window: Duration::from_micros(self.join_batch_window_us),
            max: self.join_batch_max,
            depth: self.join_batch_depth,
        })
    }
}
