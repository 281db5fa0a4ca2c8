//! Session times per room and per queue (`src/config/sessions.rs`): a
//! room's `session_idle_secs` / `session_max_secs` hold for its queue's
//! passes behind the built-in proxy, over the global ones; a bad value or
//! two sources that disagree stop the start (exit 2) naming the key and
//! where it was set.

use std::process::Command;
use std::time::Duration;

use crate::common::{TestApp, config_with_file};
use crate::front::{Shop, admitted, browse};

#[tokio::test]
async fn a_rooms_own_session_times_end_an_idle_visitor_and_cap_the_pass() {
    let shop = Shop::start();
    let origin = shop.origin();
    // The global times are the defaults (idle 300 s, at most 3600 s): only
    // the room's own make Ann's session idle out in 2 s.
    let file = format!(
        "[[rooms]]\nqueue = \"default\"\norigin = \"{origin}\"\nsession_idle_secs = 2\nsession_max_secs = 30\n"
    );
    let app = TestApp::memory_with(config_with_file(
        &file,
        &[
            "--max-active",
            "1",
            "--admission-interval-ms",
            "200",
            "--admission-batch",
            "1",
        ],
    ))
    .await;
    let pass = admitted(&app, "/product/1?who=ann", "ann").await;
    let token = pass.trim_start_matches("waitroom_pass=");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = app.state.passes().verify(token, now).unwrap();
    assert!(
        (29..=30).contains(&(claims.exp - claims.iat)),
        "the room's session_max_secs is the pass's life: {claims:?}"
    );
    // Ann holds the only slot: Bob waits.
    let html = browse(&app, "/product/2?who=bob", "bob")
        .await
        .text()
        .await
        .unwrap();
    assert!(
        html.contains(r#"<meta name="waitroom-queue" content="default">"#),
        "{html}"
    );
    // Ann stops: after the room's 2 s her slot is Bob's (with the global
    // 300 s Bob would wait on).
    let started = std::time::Instant::now();
    let bob_pass = admitted(&app, "/product/2?who=bob", "bob").await;
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    let answer = app
        .client
        .get(app.url("/product/2?who=bob"))
        .header("accept", "text/html")
        .header("cookie", &bob_pass)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert!(answer.text().await.unwrap().contains(r#"data-id="2""#));
    app.stop().await;
}

#[test]
fn bad_session_times_exit_2_naming_the_key_and_where_it_was_set() {
    let dir = std::env::temp_dir().join(format!(
        "waitroom-session-times-{:016x}",
        rand::random::<u64>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let room = |extra: &str| {
        format!("[[rooms]]\nqueue = \"default\"\norigin = \"http://127.0.0.1:3000\"\n{extra}")
    };
    let cases = [
        // Two rooms of one queue, two idle times: which one is it?
        (
            format!(
                "{}\n{}",
                room("path_prefix = \"/a\"\nsession_idle_secs = 60\n"),
                room("path_prefix = \"/b\"\nsession_idle_secs = 90\n")
            ),
            vec!["rooms[1].session_idle_secs", "rooms[1] (source: file:"],
        ),
        // Idle longer than the (global) longest session.
        (
            room("session_idle_secs = 7200\n"),
            vec![
                "rooms[0].session_idle_secs",
                "pass.session_max_secs (source: default)",
            ],
        ),
        (
            room("session_max_secs = 0\n"),
            vec!["rooms[0].session_max_secs: must be 1-86400"],
        ),
        (
            "[queues.default]\nsession_max_secs = 100000\n".to_owned(),
            vec![
                "queues.default: session_max_secs",
                "queues.default (source: file:",
            ],
        ),
        // The queue's table and its room disagree.
        (
            format!(
                "[queues.default]\nsession_idle_secs = 30\n\n{}",
                room("session_idle_secs = 31\n")
            ),
            vec!["rooms[0].session_idle_secs: 31 differs"],
        ),
    ];
    for (i, (text, named)) in cases.iter().enumerate() {
        let path = dir.join(format!("{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
            .arg("check")
            .arg("-c")
            .arg(&path)
            .env_clear()
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {stderr}");
        for name in named {
            assert!(stderr.contains(name), "{text}: no {name:?} in {stderr}");
        }
    }
    // Set once, agreeing, in range: it loads.
    let path = dir.join("ok.toml");
    std::fs::write(
        &path,
        format!(
            "[queues.default]\nsession_idle_secs = 30\n\n{}",
            room("session_idle_secs = 30\nsession_max_secs = 600\n")
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .arg("check")
        .arg("-c")
        .arg(&path)
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
