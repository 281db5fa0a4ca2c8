//! `--page-dir`: a queue's branding over `GET /api/queues/{queue}/page`,
//! files of the directory over the embedded page, nothing outside it, and
//! a bad branding refused at start-up.

use std::path::{Path, PathBuf};

use waitroom::store::memory::MemoryStore;
use waitroom::{App, StartError};

use crate::common::{TestApp, config};

/// A throwaway page directory, removed on drop.
struct PageDir(PathBuf);

impl PageDir {
    fn new() -> Self {
        let dir =
            std::env::temp_dir().join(format!("waitroom-page-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(dir.join("queues")).unwrap();
        Self(dir)
    }

    fn write(&self, name: &str, text: &str) -> &Self {
        let path = self.0.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        self
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for PageDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn get(app: &TestApp, path: &str) -> (u16, String, Option<String>) {
    let r = app.client.get(app.url(path)).send().await.unwrap();
    let status = r.status().as_u16();
    let csp = r
        .headers()
        .get("content-security-policy")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, r.text().await.unwrap(), csp)
}

#[tokio::test]
async fn a_branded_queue_is_served_its_branding_and_files_override_the_page() {
    let dir = PageDir::new();
    dir.write("img/logo.svg", "<svg xmlns='http://www.w3.org/2000/svg'/>")
        .write("styles.css", "/* operator */ body { margin: 0 }")
        .write(
            "queues/drop.json",
            r##"{"name":"Acme","logo":"img/logo.svg","colors":{"accent":"#e4002b"},
                "texts":{"ko":{"waiting.heading":"잠시만요"}}}"##,
        );
    let page_dir = dir.path().to_str().unwrap();
    let app = TestApp::memory(&["--queues", "default,drop", "--page-dir", page_dir]).await;

    let (status, body, _) = get(&app, "/api/queues/drop/page").await;
    assert_eq!(status, 200);
    let brand: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(brand["name"], "Acme");
    assert_eq!(brand["colors"]["accent"], "#e4002b");
    assert_eq!(brand["texts"]["ko"]["waiting.heading"], "잠시만요");
    let (status, body, _) = get(&app, "/api/queues/default/page").await;
    assert_eq!((status, body.as_str()), (200, "{}"));
    let (status, body, _) = get(&app, "/api/queues/nope/page").await;
    assert_eq!(status, 404);
    assert!(body.contains("unknown_queue"), "{body}");

    // The directory's file wins, under the same policy; the rest is embedded.
    let (status, body, csp) = get(&app, "/styles.css").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "/* operator */ body { margin: 0 }")
    );
    assert!(csp.unwrap().contains("style-src 'self'"));
    let (status, body, _) = get(&app, "/app.js").await;
    assert_eq!(status, 200);
    assert!(body.contains("startLanguage"), "the embedded page");
    assert_eq!(get(&app, "/img/logo.svg").await.0, 200);
    for path in [
        "/queues/drop.json",
        "/img/../queues/drop.json",
        "/img/..%2f..%2fetc%2fpasswd",
        "/..%2f..%2fetc%2fpasswd",
        "/img%5c..%5cqueues%5cdrop.json",
    ] {
        assert_eq!(get(&app, path).await.0, 404, "{path}");
    }
    app.stop().await;
}

#[tokio::test]
async fn a_bad_branding_stops_the_start() {
    for (file, json, why) in [
        (
            "queues/default.json",
            r#"{"colors":{"accent":"red"}}"#,
            "colors.accent",
        ),
        ("queues/default.json", r#"{"logo":"../etc/passwd"}"#, "logo"),
        ("queues/default.json", r#"{"logo":"nope.svg"}"#, "logo"),
        ("queues/default.json", "{not json", "default.json"),
        ("queues/other.json", "{}", "no queue"),
    ] {
        let dir = PageDir::new();
        dir.write(file, json);
        let config = config(&["--page-dir", dir.path().to_str().unwrap()]);
        let result = App::with_store(
            config,
            std::sync::Arc::new(MemoryStore::new()),
            None,
            tokio_util::sync::CancellationToken::new(),
        )
        .await;
        match result {
            Err(StartError::Page(e)) => assert!(e.to_string().contains(why), "{json}: {e}"),
            Err(e) => panic!("{json}: another error: {e}"),
            Ok(_) => panic!("{json}: started"),
        }
    }
}
