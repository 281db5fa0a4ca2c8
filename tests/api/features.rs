//! A build without an optional part (a cargo feature) refuses the flags
//! that need it: exit code 2, before any port is taken, with a message
//! naming the flag and the feature. Only a build without the feature has
//! anything to check (`cargo test --no-default-features --test api
//! features::`); the default build checks that its features are all there.

use std::process::Command;

use crate::common::clean_env;

/// Runs the binary with `args` (and a free `--addr`): exit code, stderr.
#[cfg_attr(
    all(
        feature = "demo-orders",
        feature = "signed-identity",
        feature = "https-webhooks",
        feature = "redis-cluster"
    ),
    allow(dead_code)
)]
fn run(args: &[&str]) -> (Option<i32>, String) {
    let port = crate::common::free_port().to_string();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_waitroom"));
    clean_env(&mut cmd);
    let out = cmd
        .args([
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--orders-db",
            ":memory:",
        ])
        .args(args)
        .output()
        .expect("run waitroom");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_default_build_has_every_feature() {
    let all = cfg!(feature = "demo-orders")
        && cfg!(feature = "signed-identity")
        && cfg!(feature = "https-webhooks")
        && cfg!(feature = "redis-cluster");
    assert_eq!(
        waitroom::config::features::enabled().len() == 4,
        all,
        "{:?}",
        waitroom::config::features::enabled()
    );
}

#[cfg(not(feature = "demo-orders"))]
#[test]
fn without_demo_orders_orders_on_exits_2_naming_the_flag_and_feature() {
    let (code, stderr) = run(&["--orders", "on"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--orders on") && stderr.contains("`demo-orders`"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[cfg(not(feature = "signed-identity"))]
#[test]
fn without_signed_identity_signed_mode_exits_2_naming_the_flag_and_feature() {
    let secret = "s".repeat(32);
    let (code, stderr) = run(&["--identity", "signed", "--identity-secret", &secret]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--identity signed") && stderr.contains("`signed-identity`"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[cfg(not(feature = "https-webhooks"))]
#[test]
fn without_https_webhooks_an_https_hook_exits_2_naming_the_hook_and_feature() {
    // Webhooks are configured in the file (`[[webhooks]]`).
    let dir = std::env::temp_dir().join(format!("waitroom-feat-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("waitroom.toml");
    std::fs::write(
        &file,
        "[[webhooks]]\nname = \"crm\"\nurl = \"https://crm.example/hook\"\nsecret = \"0123456789abcdef\"\n",
    )
    .unwrap();
    let (code, stderr) = run(&["-c", file.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("crm") && stderr.contains("`https-webhooks`"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("0123456789abcdef"),
        "the secret stays out: {stderr}"
    );
}

#[cfg(not(feature = "redis-cluster"))]
#[test]
fn without_redis_cluster_a_cluster_exits_2_naming_the_flag_and_feature() {
    let (code, stderr) = run(&[
        "--redis-url",
        "redis://127.0.0.1:1,redis://127.0.0.1:2",
        "--redis-cluster",
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--redis-cluster") && stderr.contains("`redis-cluster`"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
