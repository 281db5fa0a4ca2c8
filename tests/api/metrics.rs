//! Metrics move by exactly what happened. The recorder is process-wide, so
//! these checks scrape a binary of their own rather than the test process,
//! where other tests' apps share one recorder.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{BinApp, eventually};

/// Every sample of a Prometheus text page, keyed by name and labels as
/// printed (`waitroom_enters_total{queue="default",new="true"}`).
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The value of the sample named `name` whose labels include every one of
/// `labels` (0 when absent: a counter that never moved is not printed).
fn value(all: &HashMap<String, f64>, name: &str, labels: &[(&str, &str)]) -> f64 {
    all.iter()
        .filter(|(key, _)| {
            let (n, rest) = key.split_once('{').unwrap_or((key.as_str(), ""));
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, v)| *v)
        .sum()
}

async fn scrape(app: &BinApp, client: &reqwest::Client) -> HashMap<String, f64> {
    let text = client
        .get(app.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    samples(&text)
}

#[tokio::test]
async fn counters_move_by_exactly_what_the_test_did() {
    let app = BinApp::spawn(&[
        "--admission-interval-ms",
        "200",
        "--admission-batch",
        "2",
        "--admin-token",
        "metrics-admin-token-0123456789",
    ])
    .await;
    let client = reqwest::Client::new();
    let before = scrape(&app, &client).await;

    // Five new buyers (two take the fast track, three wait), two repeats.
    let mut tickets = Vec::new();
    for i in 0..5 {
        tickets.push(app.enter(&client, &format!("m{i}")).await);
    }
    app.enter(&client, "m3").await;
    app.enter(&client, "m4").await;

    // Everyone is let in: the three who waited by admission passes.
    let position = |ticket: String| {
        let client = client.clone();
        let url = app.url("/api/queues/default/position");
        async move {
            let r = client
                .get(url)
                .header("x-queue-ticket", ticket)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let tokens: Vec<String> = eventually(Duration::from_secs(15), "all five READY", || {
        let reads: Vec<_> = tickets.iter().cloned().map(position).collect();
        async move {
            let mut tokens = Vec::new();
            for read in reads {
                let (code, body) = read.await;
                if code != 200 || body["status"] != "READY" {
                    return None;
                }
                tokens.push(body["entryToken"].as_str().unwrap().to_owned());
            }
            Some(tokens)
        }
    })
    .await;

    // One order placed, one refused for stock: quantity beyond all of it.
    let order = |user: &str, token: &str, quantity: i64| {
        client
            .post(app.url("/api/orders"))
            .header("x-user-id", user)
            .header("x-entry-token", token)
            .json(&json!({ "productId": "demo-sneaker", "quantity": quantity }))
            .send()
    };
    assert_eq!(order("m0", &tokens[0], 1).await.unwrap().status(), 201);
    assert_eq!(
        order("m1", &tokens[1], 1_000_000_000)
            .await
            .unwrap()
            .status(),
        409
    );

    // Polls as fast as possible: count the refusals the client saw.
    let mut refused = 0.0;
    for _ in 0..30 {
        let r = client
            .get(app.url("/api/queues/default/position"))
            .header("x-queue-ticket", &tickets[4])
            .send()
            .await
            .unwrap();
        if r.status() == 429 {
            refused += 1.0;
        }
    }
    assert!(refused > 0.0, "30 polls at once are limited");

    let after = scrape(&app, &client).await;
    let delta = |name: &str, labels: &[(&str, &str)]| {
        value(&after, name, labels) - value(&before, name, labels)
    };
    let default = ("queue", "default");
    assert_eq!(
        delta("waitroom_enters_total", &[default, ("new", "true")]),
        5.0
    );
    assert_eq!(
        delta("waitroom_enters_total", &[default, ("new", "false")]),
        2.0
    );
    // Every admission, on either path: the two of the fast track as well.
    assert_eq!(delta("waitroom_admitted_total", &[default]), 5.0);
    assert_eq!(
        delta("waitroom_admitted_total", &[default, ("path", "pass")]),
        3.0
    );
    assert_eq!(
        delta(
            "waitroom_admitted_total",
            &[default, ("path", "fast_track")]
        ),
        2.0
    );
    assert_eq!(
        delta("waitroom_orders_total", &[("result", "created")]),
        1.0
    );
    assert_eq!(
        delta("waitroom_orders_total", &[("result", "out_of_stock")]),
        1.0
    );
    assert_eq!(delta("waitroom_rate_limited_total", &[]), refused);
    assert_eq!(value(&after, "waitroom_waiting", &[default]), 0.0);
}

/// Claims settled through the token API (order services not written in
/// Rust) are counted like the Rust extractor's: one consume, one release.
#[tokio::test]
async fn token_api_settles_are_counted() {
    const SERVICE: &str = "metrics-service-token-0123456789";
    let app = BinApp::spawn(&[
        "--admission-interval-ms",
        "600000",
        "--admission-batch",
        "2",
        "--service-token",
        SERVICE,
    ])
    .await;
    let client = reqwest::Client::new();
    let before = scrape(&app, &client).await;
    let mut claims = Vec::new();
    for user in ["t0", "t1"] {
        let r = client
            .post(app.url("/api/queues/default/entries"))
            .header("x-user-id", user)
            .send()
            .await
            .unwrap();
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["status"], "READY", "the fast track: {body}");
        let token = body["entryToken"].as_str().unwrap();
        let claim: Value = client
            .post(app.admin_url("/api/tokens/claim"))
            .bearer_auth(SERVICE)
            .json(&json!({"userId": user, "token": token}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        claims.push((user, claim["claimId"].as_str().unwrap().to_owned()));
    }
    for ((user, claim), how) in claims.iter().zip(["consume", "release"]) {
        let r = client
            .post(app.admin_url(&format!("/api/tokens/{how}")))
            .bearer_auth(SERVICE)
            .json(&json!({"userId": user, "queue": "default", "claimId": claim}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 204, "{how}");
    }
    let after = scrape(&app, &client).await;
    let delta = |name: &str| {
        let labels = [("queue", "default")];
        value(&after, name, &labels) - value(&before, name, &labels)
    };
    assert_eq!(delta("waitroom_tokens_consumed_total"), 1.0);
    assert_eq!(delta("waitroom_tokens_released_total"), 1.0);
}
