//! The cargo features: the optional parts of waitroom, each with the
//! crates it pulls in, all on by default (see CONTRIBUTING.md, "Cargo
//! features"). A build without one still parses every flag, so a
//! configuration that needs a missing part is refused at start with a
//! message naming the flag and the feature ([`check`]), rather than a
//! clap error about an unknown value or a part that silently does nothing.

use super::{Config, IdentityMode, OrdersMode};

/// An optional part of waitroom.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// `demo-orders`: the demo order service (`--orders on`), sqlx with
    /// SQLite and PostgreSQL.
    DemoOrders,
    /// `signed-identity`: `--identity signed`, JWTs (jsonwebtoken).
    SignedIdentity,
    /// `https-webhooks`: `https://` webhooks and `https://` origins of the
    /// built-in proxy (rustls, hyper-rustls, webpki-roots).
    HttpsWebhooks,
    /// `redis-cluster`: the store on a Redis Cluster (`--redis-cluster`),
    /// redis-rs's async cluster client.
    RedisCluster,
}

impl Feature {
    /// Every feature, in `Cargo.toml`'s order.
    pub const ALL: [Self; 4] = [
        Self::DemoOrders,
        Self::SignedIdentity,
        Self::HttpsWebhooks,
        Self::RedisCluster,
    ];

    /// The feature's name in `Cargo.toml`.
    pub fn name(self) -> &'static str {
        match self {
            Self::DemoOrders => "demo-orders",
            Self::SignedIdentity => "signed-identity",
            Self::HttpsWebhooks => "https-webhooks",
            Self::RedisCluster => "redis-cluster",
        }
    }

    /// Whether this build has it.
    pub fn enabled(self) -> bool {
        match self {
            Self::DemoOrders => cfg!(feature = "demo-orders"),
            Self::SignedIdentity => cfg!(feature = "signed-identity"),
            Self::HttpsWebhooks => cfg!(feature = "https-webhooks"),
            Self::RedisCluster => cfg!(feature = "redis-cluster"),
        }
    }

    /// The message for `flag` used without this feature.
    pub fn missing(self, flag: &str) -> String {
        format!(
            "{flag} needs the `{name}` cargo feature, and this build of waitroom was made \
             without it (rebuild with the default features, or `--features {name}`)",
            name = self.name()
        )
    }
}

/// The names of the features this build has, for the start-up log.
pub fn enabled() -> Vec<&'static str> {
    Feature::ALL
        .into_iter()
        .filter(|f| f.enabled())
        .map(Feature::name)
        .collect()
}

/// Refuses a configuration that needs a part this build left out, naming
/// the flag and the feature.
pub fn check(config: &Config) -> Result<(), String> {
    let need = |feature: Feature, flag: &str| {
        if feature.enabled() {
            Ok(())
        } else {
            Err(feature.missing(flag))
        }
    };
    if config.orders == OrdersMode::On {
        need(Feature::DemoOrders, "--orders on")?;
    }
    if config.stock_from_orders {
        need(Feature::DemoOrders, "--stock-from-orders")?;
    }
    if config.identity == IdentityMode::Signed {
        need(Feature::SignedIdentity, "--identity signed")?;
    }
    if config.redis_cluster {
        need(Feature::RedisCluster, "--redis-cluster")?;
    }
    for hook in &config.webhooks {
        // Parsing refuses these already; a spec built in code comes here.
        if hook
            .url
            .get(..8)
            .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
        {
            let flag = format!("webhook `{}` (an https:// url)", hook.name);
            need(Feature::HttpsWebhooks, &flag)?;
        }
    }
    // The built-in proxy's TLS to its origins is the same crates'.
    let https_origin = config
        .origin
        .as_deref()
        .and_then(|o| crate::front::Origin::parse(o).ok())
        .is_some_and(|o| o.tls);
    if https_origin {
        need(Feature::HttpsWebhooks, "--origin (an https:// origin)")?;
    }
    for (i, room) in config.rooms.iter().enumerate() {
        if room.origin.tls {
            let flag = format!("rooms[{i}].origin (an https:// origin)");
            need(Feature::HttpsWebhooks, &flag)?;
        }
    }
    if config.origin_ca.is_some() {
        need(Feature::HttpsWebhooks, "--origin-ca")?;
    }
    Ok(())
}

impl OrdersMode {
    /// `--orders` unset: `on` (the demo) when the build has the demo order
    /// service, `off` otherwise.
    pub const DEFAULT: Self = if cfg!(feature = "demo-orders") {
        Self::On
    } else {
        Self::Off
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg_attr(
        all(feature = "demo-orders", feature = "signed-identity"),
        allow(dead_code)
    )]
    fn parse(args: &[&str]) -> Config {
        Config::from_args(args.iter().copied()).expect("arguments parse")
    }

    #[test]
    fn the_defaults_need_no_missing_feature() {
        check(&Config::default()).unwrap();
        assert_eq!(
            Config::default().orders == OrdersMode::On,
            Feature::DemoOrders.enabled()
        );
    }

    #[cfg(not(feature = "demo-orders"))]
    #[test]
    fn without_demo_orders_the_orders_flags_are_refused_naming_the_feature() {
        for args in [
            &["--orders", "on"][..],
            &["--orders", "off", "--stock-from-orders"],
        ] {
            let e = check(&parse(args)).unwrap_err();
            assert!(
                e.contains(args[args.len() - 1]) || e.contains("--orders on"),
                "{e}"
            );
            assert!(e.contains("`demo-orders`"), "{e}");
        }
        let e = parse(&["--orders", "on"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--orders on") && e.contains("`demo-orders`"),
            "{e}"
        );
    }

    #[cfg(not(feature = "signed-identity"))]
    #[test]
    fn without_signed_identity_signed_mode_is_refused_naming_the_feature() {
        let secret = "s".repeat(32);
        let config = parse(&["--identity", "signed", "--identity-secret", &secret]);
        let e = check(&config).unwrap_err();
        assert!(
            e.contains("--identity signed") && e.contains("`signed-identity`"),
            "{e}"
        );
        let e = config.validate().unwrap_err().to_string();
        assert!(e.contains("`signed-identity`"), "{e}");
    }

    #[cfg(not(feature = "https-webhooks"))]
    #[test]
    fn without_https_webhooks_an_https_hook_is_refused_naming_the_feature() {
        let dir = std::env::temp_dir().join(format!("waitroom-features-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("hooks.toml");
        std::fs::write(
            &file,
            "[[webhooks]]\nname = \"crm\"\nurl = \"https://h.example/\"\nsecret = \"0123456789abcdef\"\n",
        )
        .unwrap();
        let e = match super::super::load(["-c", file.to_str().unwrap()], false) {
            Ok(_) => panic!("an https hook loaded without the feature"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("crm") && e.contains("`https-webhooks`"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(not(feature = "https-webhooks"))]
    #[test]
    fn without_https_webhooks_an_https_origin_is_refused_naming_the_feature() {
        for args in [
            &["--origin", "https://shop.example"][..],
            &[
                "--origin",
                "http://127.0.0.1:3000",
                "--origin-ca",
                "/ca.pem",
            ],
        ] {
            let e = parse(args).validate().unwrap_err().to_string();
            assert!(
                e.contains(args[args.len() - 2]) && e.contains("`https-webhooks`"),
                "{e}"
            );
        }
        let dir = std::env::temp_dir().join(format!("waitroom-features-o-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("rooms.toml");
        std::fs::write(
            &file,
            "[[rooms]]\nqueue = \"default\"\norigin = \"https://shop.example\"\n",
        )
        .unwrap();
        let e = match super::super::load(["-c", file.to_str().unwrap()], false) {
            Ok(_) => panic!("an https origin loaded without the feature"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("rooms[0].origin") && e.contains("`https-webhooks`"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(not(feature = "redis-cluster"))]
    #[test]
    fn without_redis_cluster_a_cluster_is_refused_naming_the_feature() {
        let config = parse(&[
            "--redis-url",
            "redis://127.0.0.1:7000,redis://127.0.0.1:7001",
            "--redis-cluster",
        ]);
        let e = check(&config).unwrap_err();
        assert!(
            e.contains("--redis-cluster") && e.contains("`redis-cluster`"),
            "{e}"
        );
        let e = config.validate().unwrap_err().to_string();
        assert!(e.contains("`redis-cluster`"), "{e}");
        // A single Redis and Sentinel need no feature.
        check(&parse(&["--redis-url", "redis://127.0.0.1:6379"])).unwrap();
        check(&parse(&[
            "--redis-url",
            "redis+sentinel://127.0.0.1:26379/m",
        ]))
        .unwrap();
    }

    #[cfg(feature = "redis-cluster")]
    #[test]
    fn with_redis_cluster_a_cluster_passes_the_check() {
        check(
            &Config::from_args([
                "--redis-url",
                "redis://127.0.0.1:7000,redis://127.0.0.1:7001",
                "--redis-cluster",
            ])
            .unwrap(),
        )
        .unwrap();
    }

    #[test]
    fn every_feature_of_the_build_is_listed() {
        let on = enabled();
        for f in Feature::ALL {
            assert_eq!(on.contains(&f.name()), f.enabled(), "{}", f.name());
        }
    }
}
