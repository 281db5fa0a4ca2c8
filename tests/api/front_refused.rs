//! A browser whose server-side join through the built-in proxy is refused
//! (`src/front/refused.rs`) gets a page in the waiting page's look saying
//! what happened, with the join's status and `Retry-After` and no script;
//! a join that needs a challenge gets the waiting page, whose scripts
//! solve it; programs keep the JSON error shape. The shop sees none of it,
//! nor the health checks under the reserved prefix.

use serde_json::Value;

use super::front::{Shop, browse, front_of, hold};
use crate::common::{TestApp, config};

/// The `content` of the `<meta http-equiv="refresh">` in `html`.
fn refresh_of(html: &str) -> Option<u64> {
    let at = html.find(r#"<meta http-equiv="refresh" content=""#)?;
    let rest = &html[at + r#"<meta http-equiv="refresh" content=""#.len()..];
    rest[..rest.find('"')?].parse().ok()
}

#[tokio::test]
async fn a_browser_over_its_networks_join_limit_gets_a_page_saying_so_and_when_to_come_back() {
    let shop = Shop::start();
    let app = front_of(&shop, &["--joins-per-address-per-minute", "1"]).await;
    hold(&app, "default").await;
    let first = browse(&app, "/product/1", "ann").await;
    assert_eq!(first.status(), 200, "the first new place from 127.0.0.1");

    let refused = browse(&app, "/product/1?size=9", "bob").await;
    assert_eq!(refused.status(), 429);
    assert!(
        refused.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html"),
        "{:?}",
        refused.headers()
    );
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    let html = refused.text().await.unwrap();
    assert!(
        html.contains(r#"<meta name="waitroom-refused" content="address_rate_limited">"#),
        "{html}"
    );
    assert!(html.contains("joining from your network"), "{html}");
    let refresh = refresh_of(&html).expect("the page comes back by itself");
    assert!(
        (retry_after..=retry_after + retry_after.div_ceil(4) + 1).contains(&refresh),
        "refresh {refresh} for Retry-After {retry_after}"
    );
    // The waiting page's look, no script, back to the URL asked.
    assert!(html.contains(r#"href="/_waitroom/styles.css""#), "{html}");
    assert_eq!(app.get_status("/_waitroom/styles.css").await, 200);
    assert!(html.contains(r#"class="card""#), "{html}");
    assert!(!html.contains("<script"), "{html}");
    assert!(html.contains(r#"href="/product/1?size=9""#), "{html}");
    assert!(!html.contains("\"error\""), "no JSON for a browser: {html}");

    // A program asking for the same page: the JSON shape, no join tried.
    let program = app
        .client
        .get(app.url("/product/1?size=9"))
        .header("accept", "application/json")
        .header("x-user-id", "bob")
        .send()
        .await
        .unwrap();
    assert_eq!(program.status(), 503);
    let body: Value = program.json().await.unwrap();
    assert_eq!(body["error"], "pass_required");
    // The join route itself keeps its JSON refusal.
    let api = app
        .client
        .post(app.url("/_waitroom/api/queues/default/entries"))
        .header("accept", "application/json")
        .header("x-user-id", "bob")
        .send()
        .await
        .unwrap();
    assert_eq!(api.status(), 429);
    assert!(api.headers().contains_key("retry-after"));
    let body: Value = api.json().await.unwrap();
    assert_eq!(body["error"], "address_rate_limited");
    assert!(shop.requests().is_empty(), "{:?}", shop.requests());
    app.stop().await;
}

#[tokio::test]
async fn a_browser_without_an_identity_is_told_so_and_not_sent_round_in_circles() {
    let shop = Shop::start();
    let app = front_of(&shop, &[]).await;
    hold(&app, "default").await;
    // `--identity header` (the tests' mode): the auth gateway sets
    // X-User-Id; without it the join is refused, and waiting would not help.
    let answer = app
        .client
        .get(app.url("/product/1"))
        .header("accept", "text/html")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 400);
    assert!(answer.headers().get("retry-after").is_none());
    let html = answer.text().await.unwrap();
    assert!(html.contains("could not tell who you are"), "{html}");
    assert!(html.contains(r#"content="missing_user_id""#), "{html}");
    assert_eq!(refresh_of(&html), None, "no refresh loop: {html}");
    assert!(shop.requests().is_empty(), "{:?}", shop.requests());
    app.stop().await;
}

#[tokio::test]
async fn a_join_that_needs_a_challenge_gets_the_waiting_page_whose_scripts_solve_it() {
    let shop = Shop::start();
    let app = front_of(&shop, &["--join-challenge", "always"]).await;
    let answer = browse(&app, "/product/1", "ann").await;
    assert_eq!(answer.status(), 200);
    let html = answer.text().await.unwrap();
    assert!(
        html.contains(r#"<meta name="waitroom-front" content="/product/1">"#),
        "the waiting page: {html}"
    );
    assert!(html.contains(r#"src="app.js""#), "with its scripts: {html}");
    assert!(html.contains(r#"data-status="NEEDS_SCRIPT""#), "{html}");
    assert!(html.contains("needs JavaScript"), "{html}");
    assert!(shop.requests().is_empty(), "{:?}", shop.requests());
    app.stop().await;
}

#[tokio::test]
async fn with_the_store_dead_a_newcomer_gets_a_page_that_comes_back_and_a_program_json() {
    if crate::common::skip_redis("the store dying under the proxy") {
        return;
    }
    let shop = Shop::start();
    let mut redis = crate::common::RedisProcess::start(false);
    let store = std::sync::Arc::new(
        waitroom::store::redis::RedisStore::connect(&redis.url(), "front-refused")
            .await
            .unwrap(),
    );
    let origin = shop.origin();
    let app = TestApp::spawn_with(config(&["--origin", &origin]), store).await;
    assert_eq!(app.get_status("/_waitroom/readyz").await, 200);
    redis.kill();
    // The load balancer's check stays green (live passes still work here);
    // readiness says the store is away. Neither reaches the shop.
    assert_eq!(app.get_status("/_waitroom/healthz").await, 200);
    assert_eq!(app.get_status("/_waitroom/readyz").await, 503);
    let answer = browse(&app, "/product/2", "late").await;
    assert_eq!(answer.status(), 503, "nobody new gets in: fail closed");
    assert!(
        answer.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let retry_after: u64 = answer.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let html = answer.text().await.unwrap();
    assert!(html.contains("briefly unavailable"), "{html}");
    assert!(html.contains("you keep it"), "{html}");
    let refresh = refresh_of(&html).expect("comes back by itself");
    assert!(refresh >= retry_after, "{refresh} < {retry_after}");
    let program = app
        .client
        .get(app.url("/product/2"))
        .header("x-requested-with", "XMLHttpRequest")
        .header("x-user-id", "late")
        .send()
        .await
        .unwrap();
    assert_eq!(program.status(), 503);
    let body: Value = program.json().await.unwrap();
    assert_eq!(body["error"], "pass_required");
    assert!(shop.requests().is_empty(), "{:?}", shop.requests());
    app.stop().await;
}
