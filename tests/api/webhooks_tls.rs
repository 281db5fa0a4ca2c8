//! Webhooks over HTTPS, against a local TLS receiver whose certificate is
//! issued by a CA made up for the test (`rcgen`): with the hook's `ca=`
//! naming that CA, entries arrive signed; without it, the certificate is
//! not trusted, nothing reaches the receiver, and the entries stay pending
//! (retried, never acknowledged) until an instance that trusts it takes
//! them over; a `ca=` that cannot be read stops the server at start-up.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use waitroom::store::SharedStore;
use waitroom::store::redis::RedisStore;

use super::webhooks::{
    BOUND, Receiver, SECRET, actions, cfg, every_entry_delivered, hook, log_keys, receive, verifies,
};
use crate::common::{TestApp, eventually, redis_url, unique_prefix};

/// A receiver on `https://127.0.0.1:<port>/hook` and the PEM file of the
/// CA that issued its certificate.
struct TlsReceiver {
    url: String,
    ca_file: PathBuf,
    receiver: Receiver,
}

impl Drop for TlsReceiver {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.ca_file);
    }
}

async fn start_tls_receiver() -> TlsReceiver {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "waitroom test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let ca_file = std::env::temp_dir().join(format!(
        "waitroom-test-ca-{:016x}.pem",
        rand::random::<u64>()
    ));
    std::fs::write(&ca_file, ca_cert.pem()).unwrap();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let receiver = Receiver::default();
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                // A client that does not trust us hangs up here.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                    .await;
            });
        }
    });
    TlsReceiver {
        url,
        ca_file,
        receiver,
    }
}

/// The hook's `retried` count on `app`'s metrics (the recorder is the
/// process's: the hook names below are used by no other test).
async fn retried(app: &TestApp, hook: &str) -> f64 {
    let text = app
        .client
        .get(app.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| {
            l.starts_with("waitroom_webhook_deliveries_total{")
                && l.contains(&format!("hook=\"{hook}\""))
                && l.contains("outcome=\"retried\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn an_https_hook_trusting_its_ca_delivers_signed_entries() {
    let r = start_tls_receiver().await;
    let ca = format!("ca = {:?}", r.ca_file.display().to_string());
    let app = TestApp::memory_with(cfg(&[hook("tls-ok", &r.url, &ca)], 60_000)).await;
    actions(&app, "t", 3).await;
    let keys = every_entry_delivered(&app, &r.receiver, 4).await;
    let got = r.receiver.got();
    assert!(got.len() >= 4, "{got:?}");
    for g in &got {
        assert!(keys.contains(&g.key), "{}", g.key);
        assert!(verifies(&g.signature, &g.body, SECRET), "{g:?}");
        assert!(!verifies(&g.signature, &g.body, "another-secret-0123456"));
    }
    app.stop().await;
}

/// Without `ca=` the receiver's certificate is not trusted: every attempt
/// fails before a byte of the entry is sent, and is retried; nothing is
/// acknowledged, so an instance that does trust the CA, taking over after
/// the first stops, delivers every entry.
#[tokio::test]
async fn an_untrusted_certificate_is_retried_never_acknowledged() {
    crate::needs_redis!();
    let r = start_tls_receiver().await;
    let prefix = unique_prefix("hooks-tls");
    let store: SharedStore = Arc::new(RedisStore::connect(&redis_url(), &prefix).await.unwrap());
    let mut untrusting = cfg(&[hook("tls-untrusted", &r.url, "attempts = 100")], 1_000);
    untrusting.key_prefix = prefix.clone();
    let first = TestApp::spawn_with(untrusting, store.clone()).await;
    actions(&first, "u", 3).await;
    let keys = log_keys(&first).await;
    assert_eq!(keys.len(), 4);
    eventually(BOUND, "attempts failed and were retried", || async {
        (retried(&first, "tls-untrusted").await >= 8.0).then_some(())
    })
    .await;
    first.stop().await;
    assert!(
        r.receiver.got().is_empty(),
        "nothing crosses an untrusted connection: {:?}",
        r.receiver.got()
    );
    let ca = format!("attempts = 100\nca = {:?}", r.ca_file.display().to_string());
    let mut trusting = cfg(&[hook("tls-untrusted", &r.url, &ca)], 1_000);
    trusting.key_prefix = prefix;
    let second = TestApp::spawn_with(trusting, store).await;
    let delivered = every_entry_delivered(&second, &r.receiver, 4).await;
    assert_eq!(delivered, keys);
    let distinct: HashSet<String> = r.receiver.got().into_iter().map(|g| g.key).collect();
    assert_eq!(distinct, keys);
    second.stop().await;
}

/// The binary, given a hook whose `ca` is missing or not a certificate,
/// exits at once (code 2) with a message naming the hook, the file and
/// the line of its table.
#[tokio::test]
async fn a_bad_ca_file_stops_the_server_at_start_up() {
    let junk = std::env::temp_dir().join(format!(
        "waitroom-junk-ca-{:016x}.pem",
        rand::random::<u64>()
    ));
    std::fs::write(&junk, "this is no certificate\n").unwrap();
    for (path, why) in [
        (PathBuf::from("/nonexistent/waitroom/ca.pem"), "cannot read"),
        (junk.clone(), "no PEM certificate"),
    ] {
        let file =
            std::env::temp_dir().join(format!("waitroom-hook-{:016x}.toml", rand::random::<u64>()));
        let table = format!(
            "# hooks\n[[webhooks]]\nname = \"billing\"\nurl = \"https://127.0.0.1:9/h\"\nsecret = \"{SECRET}\"\nca = {:?}\n",
            path.display().to_string()
        );
        std::fs::write(&file, table).unwrap();
        let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_waitroom"))
            .args(["--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .arg("--config")
            .arg(&file)
            .env("NO_COLOR", "1")
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(20), run)
            .await
            .expect("the server must refuse to start, not run")
            .unwrap();
        let _ = std::fs::remove_file(&file);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("hook `billing`")
                && stderr.contains(&format!("{}:2", file.display()))
                && stderr.contains(&path.display().to_string())
                && stderr.contains(why),
            "{stderr}"
        );
        assert!(
            !stderr.contains(SECRET),
            "the secret stays out of logs: {stderr}"
        );
    }
    let _ = std::fs::remove_file(&junk);
}
