//! The configuration file: `waitroom init`, `waitroom check`, `-c FILE`
//! layered as defaults < file < environment < flags, per-queue overrides
//! seeding their queue, and bad values refused with exit code 2 and one
//! line naming the key and its source. The binary runs as a subprocess
//! wherever the environment or the exit code is what is tested.

use std::path::PathBuf;
use std::process::Output;
use std::sync::Arc;

use serde_json::Value;
use waitroom::store::SharedStore;
use waitroom::store::memory::MemoryStore;

use crate::common::{TestApp, config_with_file};

const ADMIN: &str = "admin-token-for-config-tests-01";

/// A temporary file holding `text`, removed when dropped.
struct TempToml(PathBuf);

impl TempToml {
    fn new(text: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "waitroom-config-{:016x}.toml",
            rand::random::<u64>()
        ));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempToml {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs the binary with `args` and only the environment `env` of ours
/// (every `WAITROOM_*` of the caller's removed).
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_waitroom"));
    for (key, _) in std::env::vars() {
        if key.starts_with("WAITROOM_") || key == "REDIS_URL" {
            cmd.env_remove(key);
        }
    }
    cmd.args(args)
        .envs(env.iter().copied())
        .env("NO_COLOR", "1")
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn each_layer_overrides_the_one_below() {
    let file = TempToml::new(
        "[admission]\nbatch = 7\ninterval_ms = 2000\ntoken_ttl_secs = 60\n\n[store]\nkey_prefix = \"from-file\"\n",
    );
    let out = run(
        &["check", "-c", &file.path(), "--token-ttl-secs", "90"],
        &[
            ("WAITROOM_ADMISSION_INTERVAL_MS", "3000"),
            ("WAITROOM_TOKEN_TTL_SECS", "70"),
        ],
    );
    let report = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    let at = |line: usize| format!("(source: file:{}:{line})", file.path());
    for expected in [
        "admission.claim_lease_secs = 30  (source: default)".to_owned(),
        format!("admission.batch = 7  {}", at(2)),
        format!("store.key_prefix = \"from-file\"  {}", at(7)),
        "admission.interval_ms = 3000  (source: env WAITROOM_ADMISSION_INTERVAL_MS)".to_owned(),
        "admission.token_ttl_secs = 90  (source: flag --token-ttl-secs)".to_owned(),
    ] {
        assert!(report.contains(&expected), "{expected}\n{report}");
    }
    // The file is found through the environment too.
    let out = run(&["check"], &[("WAITROOM_CONFIG", &file.path())]);
    assert!(stdout(&out).contains(&format!("admission.batch = 7  {}", at(2))));
}

/// Arguments, environment, and what stderr must say.
type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);

#[test]
fn bad_values_exit_2_naming_the_key_and_its_source() {
    let file = TempToml::new("# a sale\n[admission]\nbatch = 0\n");
    let unknown = TempToml::new("[server]\naddr = \"127.0.0.1:0\"\nlisten_backlogg = 5\n");
    let typo = TempToml::new("[admision]\nbatch = 5\n");
    let (file_path, unknown_path, typo_path) = (file.path(), unknown.path(), typo.path());
    let from_file = format!("admission.batch (source: file:{file_path}:3)");
    let unknown_key = format!(
        "server.listen_backlogg: unknown key (source: file:{}:3)",
        unknown.path()
    );
    let unknown_section = format!(
        "admision: unknown section or key (source: file:{}:1)",
        typo.path()
    );
    let cases: Vec<Case> = vec![
        (vec!["-c", &file_path], vec![], &from_file),
        (vec!["check", "-c", &file_path], vec![], &from_file),
        (
            vec![],
            vec![("WAITROOM_ADMISSION_BATCH", "0")],
            "admission.batch (source: env WAITROOM_ADMISSION_BATCH)",
        ),
        (
            vec![],
            vec![("WAITROOM_ADMISSION_BATCH", "lots")],
            "admission.batch (source: env WAITROOM_ADMISSION_BATCH)",
        ),
        (
            vec!["--admission-batch", "0"],
            vec![],
            "admission.batch (source: flag --admission-batch)",
        ),
        (
            vec!["--claim-lease-secs", "5", "--body-timeout-secs", "9"],
            vec![],
            "server.body_timeout_secs (source: flag --body-timeout-secs); admission.claim_lease_secs (source: flag --claim-lease-secs)",
        ),
        (vec!["-c", &unknown_path], vec![], &unknown_key),
        (vec!["-c", &typo_path], vec![], &unknown_section),
    ];
    for (args, env, expected) in cases {
        let out = run(&args, &env);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {err}");
        assert!(
            err.contains(expected),
            "{args:?} {env:?}: {expected}\n{err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{err}"
        );
    }
}

#[test]
fn init_prints_a_file_that_check_accepts_with_its_secrets_masked() {
    let out = run(&["init"], &[]);
    assert!(out.status.success());
    let template = stdout(&out);
    let again = stdout(&run(&["init"], &[]));
    assert_ne!(template, again, "fresh secrets on every run");
    let token = template
        .lines()
        .find_map(|l| l.strip_prefix("admin_token = "))
        .expect("an admin token")
        .trim_matches('"')
        .to_owned();
    assert!(token.len() >= 32);
    for section in [
        "[server]",
        "[store]",
        "[admission]",
        "[admission.adaptive]",
        "[identity]",
        "[audit]",
    ] {
        assert!(template.contains(&format!("\n{section}\n")), "{section}");
    }
    let file = TempToml::new(&template);
    let out = run(&["check", "-c", &file.path()], &[]);
    let report = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!report.contains(&token), "secrets masked: {report}");
    assert!(report.contains("auth.admin_token = \"********\"  (source: file:"));
    assert!(report.contains("server.addr = \"127.0.0.1:8080\"  (source: default)"));
}

#[test]
fn plain_flags_still_work_and_help_lists_the_file() {
    let out = run(&["--help"], &[]);
    assert!(out.status.success());
    assert!(
        stdout(&out).contains("--config <CONFIG_FILE>"),
        "{}",
        stdout(&out)
    );
    let out = run(&["check", "--admission-batch", "4", "--queues", "a,b"], &[]);
    assert!(stdout(&out).contains("admission.queues = [\"a\", \"b\"]  (source: flag --queues)"));
    let out = run(&["--no-such-flag"], &[]);
    assert_eq!(out.status.code(), Some(2));
}

/// `[queues.<name>]` seeds its queue with its overrides (the others with
/// `[admission]`), and like the flags only when the store does not know
/// the queue: a queue the store holds keeps the store's settings.
#[tokio::test]
async fn queue_tables_seed_their_queue_only_when_the_store_lacks_it() {
    let file = "[admission]\nqueues = [\"default\", \"shoes\"]\nbatch = 9\n\n[queues.shoes]\nbatch = 3\ntoken_ttl_secs = 60\ntexts = { title = \"Shoe drop\" }\n";
    let store: SharedStore = Arc::new(MemoryStore::new());
    let config = config_with_file(file, &["--admin-token", ADMIN]);
    let first = TestApp::spawn_with(config.clone(), store.clone()).await;
    let get = |app: &TestApp, queue: &str| {
        let url = app.admin_url(&format!("/api/admin/queues/{queue}"));
        let client = app.client.clone();
        async move {
            let r = client.get(url).bearer_auth(ADMIN).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.unwrap()
        }
    };
    let shoes = get(&first, "shoes").await;
    assert_eq!(
        (shoes["batch"].as_u64(), shoes["tokenTtlMs"].as_u64()),
        (Some(3), Some(60_000))
    );
    assert_eq!(shoes["texts"]["title"], "Shoe drop");
    assert_eq!(get(&first, "default").await["batch"], 9);
    // An operator changes the queue live; a restart with the same file
    // keeps the store's settings.
    let r = first
        .client
        .put(first.admin_url("/api/admin/queues/shoes"))
        .bearer_auth(ADMIN)
        .header("content-type", "application/json")
        .body(r#"{"batch": 5}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    first.stop().await;
    let second = TestApp::spawn_with(config, store).await;
    assert_eq!(get(&second, "shoes").await["batch"], 5, "the store wins");
    second.stop().await;
}
