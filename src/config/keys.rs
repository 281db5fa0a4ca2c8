//! The one table from a configuration file's keys to the flags they set.
//!
//! Every flag of [`Config`](super::Config) has exactly one key here (a unit
//! test holds the two lists together), so the file, `waitroom check`,
//! `waitroom init` and `docs/configuration.md` all come from the same
//! place. A section is named after the module it configures (`owner`);
//! its keys are the flag's name less the section's prefix. The two
//! structured sections, `[queues.<name>]`, `[[webhooks]]` and `[[rooms]]`, have no flag
//! and are read with serde (see `file.rs`).

/// A section of the file, and the module whose settings it holds.
pub struct Section {
    pub name: &'static str,
    pub owner: &'static str,
    pub about: &'static str,
}

/// One key of the file and the flag (clap argument id) it sets.
pub struct Key {
    /// Dotted path: `admission.batch`, `admission.adaptive.floor`.
    pub file: &'static str,
    /// The clap argument id (the `Config` field name).
    pub arg: &'static str,
}

pub const SECTIONS: &[Section] = &[
    Section {
        name: "server",
        owner: "crate::server",
        about: "Listeners, connection caps and timeouts.",
    },
    Section {
        name: "store",
        owner: "crate::store",
        about: "Where the queues live: Redis (single, Sentinel or Cluster) or, unset, in memory.",
    },
    Section {
        name: "store.group_commit",
        owner: "crate::store::redis",
        about: "Group commit of joins (Redis only).",
    },
    Section {
        name: "admission",
        owner: "crate::admission",
        about: "The queues, and the admission settings they are seeded with.",
    },
    Section {
        name: "admission.adaptive",
        owner: "crate::admission::adaptive",
        about: "Admission that follows the order service (seeds the queues' `adaptive` settings).",
    },
    Section {
        name: "tickets",
        owner: "crate::queue::ticket",
        about: "Queue tickets: the signing secret and how long one is accepted.",
    },
    Section {
        name: "identity",
        owner: "crate::identity",
        about: "Who a request is for.",
    },
    Section {
        name: "proxy",
        owner: "crate::http::client",
        about: "What stands in front: trusted proxies, cookies, allowed origins.",
    },
    Section {
        name: "pass",
        owner: "crate::pass",
        about: "The admission pass of a protected site: its key, cookie, sessions and return URLs.",
    },
    Section {
        name: "front",
        owner: "crate::front",
        about: "The built-in reverse proxy: the site waitroom stands in front of (`[[rooms]]` for several).",
    },
    Section {
        name: "limits",
        owner: "crate::http::limit",
        about: "Budgets per client address (IPv6: per /64).",
    },
    Section {
        name: "challenge",
        owner: "crate::challenge",
        about: "Proof of work at the door.",
    },
    Section {
        name: "auth",
        owner: "crate::http::auth",
        about: "Bearer tokens of the admin API and the token API.",
    },
    Section {
        name: "orders",
        owner: "crate::orders",
        about: "The demo order service, or where the real one is.",
    },
    Section {
        name: "lottery",
        owner: "crate::lottery",
        about: "Scheduled openings with a lottery.",
    },
    Section {
        name: "audit",
        owner: "crate::queue::audit",
        about: "Each queue's audit log, and the webhook delivery that follows it.",
    },
    Section {
        name: "page",
        owner: "crate::brand",
        about: "The waiting-room page.",
    },
];

macro_rules! keys {
    ($($file:literal => $arg:ident),* $(,)?) => {
        &[$(Key { file: $file, arg: stringify!($arg) }),*]
    };
}

pub const KEYS: &[Key] = keys![
    "server.addr" => addr,
    "server.admin_addr" => admin_addr,
    "server.gate_addr" => gate_addr,
    "server.listen_backlog" => listen_backlog,
    "server.base_path" => base_path,
    "server.idle_timeout_secs" => idle_timeout_secs,
    "server.first_byte_timeout_secs" => first_byte_timeout_secs,
    "server.body_timeout_secs" => body_timeout_secs,
    "server.keep_alive_secs" => keep_alive_secs,
    "server.drain_secs" => drain_secs,
    "server.max_streams" => max_streams,
    "server.max_connections" => max_connections,
    "server.connections_per_address" => connections_per_address,
    "server.admin_reserved_connections" => admin_reserved_connections,
    "server.admin_hosts" => admin_hosts,
    "store.redis_url" => redis_url,
    "store.redis_cluster" => redis_cluster,
    "store.redis_wait_replicas" => redis_wait_replicas,
    "store.key_prefix" => key_prefix,
    "store.group_commit.window_us" => join_batch_window_us,
    "store.group_commit.max" => join_batch_max,
    "store.group_commit.depth" => join_batch_depth,
    "admission.queues" => queues,
    "admission.interval_ms" => admission_interval_ms,
    "admission.batch" => admission_batch,
    "admission.token_ttl_secs" => token_ttl_secs,
    "admission.max_active" => max_active,
    "admission.abandon_after_secs" => abandon_after_secs,
    "admission.claim_lease_secs" => claim_lease_secs,
    "admission.adaptive.enabled" => adaptive,
    "admission.adaptive.floor" => adaptive_floor,
    "admission.adaptive.ceiling" => adaptive_ceiling,
    "admission.adaptive.target_p95_ms" => adaptive_target_p95_ms,
    "admission.adaptive.window_ms" => adaptive_window_ms,
    "tickets.secret" => ticket_secret,
    "tickets.ttl_secs" => ticket_ttl_secs,
    "tickets.in_query" => ticket_in_query,
    "identity.mode" => identity,
    "identity.secret" => identity_secret,
    "identity.public_key" => identity_public_key,
    "identity.issuer" => identity_issuer,
    "identity.audience" => identity_audience,
    "identity.cookie" => identity_cookie,
    "identity.max_lifetime_secs" => identity_max_lifetime_secs,
    "proxy.trusted" => trusted_proxies,
    "proxy.client_address_header" => client_address_header,
    "proxy.cookie_secure" => cookie_secure,
    "proxy.allowed_origins" => allowed_origins,
    "pass.key" => pass_key,
    "pass.previous_keys" => pass_previous_keys,
    "pass.cookie" => pass_cookie,
    "pass.cookie_domain" => pass_cookie_domain,
    "pass.cookie_path" => pass_cookie_path,
    "pass.session_idle_secs" => session_idle_secs,
    "pass.session_max_secs" => session_max_secs,
    "pass.protected_origins" => protected_origins,
    "pass.page_url" => pass_page_url,
    "front.origin" => origin,
    "front.preserve_host" => origin_preserve_host,
    "front.timeout_secs" => origin_timeout_secs,
    "front.connect_timeout_ms" => origin_connect_timeout_ms,
    "front.origin_ca" => origin_ca,
    "limits.joins_per_address_per_minute" => joins_per_address_per_minute,
    "limits.places_per_address" => places_per_address,
    "limits.visitors_per_address_per_minute" => visitors_per_address_per_minute,
    "limits.streams_per_address" => streams_per_address,
    "challenge.mode" => join_challenge,
    "challenge.difficulty" => join_challenge_difficulty,
    "challenge.ttl_secs" => join_challenge_ttl_secs,
    "challenge.threshold" => join_challenge_threshold,
    "challenge.hold_secs" => join_challenge_hold_secs,
    "auth.admin_token" => admin_token,
    "auth.service_token" => service_token,
    "orders.mode" => orders,
    "orders.db" => orders_db,
    "orders.shop_url" => shop_url,
    "orders.stock_from_orders" => stock_from_orders,
    "lottery.draw_chunk" => lottery_draw_chunk,
    "audit.max_len" => audit_max_len,
    "audit.webhook_claim_ms" => webhook_claim_ms,
    "audit.fairness_log" => fairness_log,
    "page.dir" => page_dir,
];

/// The argument id of the option naming the file itself (no file key).
pub const CONFIG_ARG: &str = "config_file";

/// The key that sets `arg`.
pub fn by_arg(arg: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.arg == arg)
}

/// The key at `path`.
pub fn by_file(path: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.file == path)
}

/// The section a key belongs to (the longest section name it starts with).
pub fn section_of(path: &str) -> &'static Section {
    SECTIONS
        .iter()
        .filter(|s| {
            path.strip_prefix(s.name)
                .is_some_and(|rest| rest.starts_with('.') && !rest[1..].contains('.'))
        })
        .max_by_key(|s| s.name.len())
        .expect("every key is in a section")
}

/// Whether `path` names a section (a table the file may hold).
pub fn is_section(path: &str) -> bool {
    SECTIONS.iter().any(|s| s.name == path)
}

/// Values never printed: shown as `"********"` by `waitroom check`.
pub fn is_secret(arg: &str) -> bool {
    matches!(
        arg,
        "ticket_secret" | "admin_token" | "service_token" | "identity_secret"
    )
}

/// `raw` (clap's raw values of `arg`) written as a TOML value: a list for
/// a comma-separated flag, a bare number or boolean, else a string.
pub fn toml_literal(arg: &clap::Arg, raw: &[String]) -> String {
    fn scalar(v: &str) -> String {
        let number = !v.is_empty()
            && v.trim_start_matches('-')
                .chars()
                .all(|c| c.is_ascii_digit() || c == '.')
            && v.trim_start_matches('-')
                .starts_with(|c: char| c.is_ascii_digit())
            && v.matches('.').count() <= 1;
        if number || v == "true" || v == "false" {
            v.to_owned()
        } else {
            format!("{v:?}")
        }
    }
    if arg.get_value_delimiter().is_some() {
        let items: Vec<String> = raw
            .iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(scalar)
            .collect();
        format!("[{}]", items.join(", "))
    } else {
        raw.first().map_or_else(String::new, |v| scalar(v))
    }
}

/// An argument's whole help text (its doc comment), as plain text.
pub fn help_text(arg: &clap::Arg) -> String {
    let mut text = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    // clap drops the period of a one-paragraph help.
    if !text.is_empty() && !text.ends_with('.') {
        text.push('.');
    }
    text
}

/// The argument with id `id` of `cmd`.
pub fn arg<'a>(cmd: &'a clap::Command, id: &str) -> &'a clap::Arg {
    cmd.get_arguments()
        .find(|a| a.get_id() == id)
        .expect("every key names a flag")
}

/// The default of `arg`, as raw values (empty: none).
pub fn default_raw(arg: &clap::Arg) -> Vec<String> {
    arg.get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect()
}

/// The key's name inside its section (`batch` for `admission.batch`).
pub fn short_name(key: &Key) -> &'static str {
    let section = section_of(key.file).name;
    &key.file[section.len() + 1..]
}
