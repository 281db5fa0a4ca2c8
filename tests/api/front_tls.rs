//! An `https://` origin behind the built-in proxy (`src/front/tls.rs`):
//! a local TLS shop whose certificate is issued by a CA made up for the
//! test (`rcgen`). Trusted through `--origin-ca`, admitted requests and
//! WebSocket-style upgrades reach it over TLS; without the CA its
//! certificate is refused, nothing reaches it and the visitor gets `502`;
//! a CA file that cannot be read stops the start (exit 2).

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::HeaderMap;
use axum::response::{Html, Response};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{TestApp, config};
use crate::front::admitted;

/// What the TLS shop saw: each request's path, `Host` and
/// `X-Forwarded-Proto`.
type Seen = Arc<Mutex<Vec<(String, String, String)>>>;

/// A shop on `https://127.0.0.1:<port>` and the PEM file of the CA that
/// issued its certificate.
struct TlsShop {
    origin: String,
    ca_file: PathBuf,
    seen: Seen,
}

impl Drop for TlsShop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.ca_file);
    }
}

fn note(seen: &Seen, path: String, headers: &HeaderMap) {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    seen.lock()
        .unwrap()
        .push((path, header("host"), header("x-forwarded-proto")));
}

async fn product(
    State(seen): State<Seen>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Html<String> {
    note(&seen, format!("/product/{id}"), &headers);
    Html(format!(
        "<!doctype html><title>product</title><p data-id=\"{id}\">over TLS</p>"
    ))
}

/// Switches to an echo of raw bytes.
async fn echo(State(seen): State<Seen>, mut request: Request) -> Response {
    note(&seen, "/ws".into(), request.headers());
    let upgraded = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let Ok(upgraded) = upgraded.await else {
            return;
        };
        let mut io = TokioIo::new(upgraded);
        let mut buf = [0u8; 1024];
        while let Ok(n) = io.read(&mut buf).await {
            if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    Response::builder()
        .status(101)
        .header("upgrade", "echo")
        .header("connection", "upgrade")
        .body(Body::empty())
        .unwrap()
}

async fn start_tls_shop() -> TlsShop {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "waitroom test origin CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let ca_file = std::env::temp_dir().join(format!(
        "waitroom-origin-ca-{:016x}.pem",
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
    let seen = Seen::default();
    let app = axum::Router::new()
        .route("/product/{id}", axum::routing::get(product))
        .route("/ws", axum::routing::get(echo))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("https://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                // A proxy that does not trust us hangs up here.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                    .with_upgrades()
                    .await;
            });
        }
    });
    TlsShop {
        origin,
        ca_file,
        seen,
    }
}

#[tokio::test]
async fn an_https_origin_trusted_through_its_ca_gets_the_admitted_visitors() {
    let shop = start_tls_shop().await;
    let ca = shop.ca_file.display().to_string();
    let app = TestApp::memory_with(config(&["--origin", &shop.origin, "--origin-ca", &ca])).await;
    let pass = admitted(&app, "/product/7", "ann").await;
    assert!(
        shop.seen.lock().unwrap().is_empty(),
        "nothing before the pass"
    );
    let page = app
        .client
        .get(app.url("/product/7"))
        .header("accept", "text/html")
        .header("cookie", &pass)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains(r#"data-id="7""#));
    // Pooled: a second request reuses what the first opened.
    let again = app
        .client
        .get(app.url("/product/8"))
        .header("cookie", &pass)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
    {
        let seen = shop.seen.lock().unwrap();
        let authority = shop.origin.trim_start_matches("https://");
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(
            seen[0],
            (
                "/product/7".to_owned(),
                authority.to_owned(),
                "http".to_owned()
            )
        );
    }

    // An upgrade with the pass: its own TLS connection, bytes both ways.
    let mut socket = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    let handshake = format!(
        "GET /ws HTTP/1.1\r\nHost: shop\r\nUpgrade: echo\r\nConnection: Upgrade\r\nCookie: {pass}\r\n\r\n"
    );
    socket.write_all(handshake.as_bytes()).await.unwrap();
    let mut got = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut got))
        .await
        .expect("the 101")
        .unwrap();
    let head = String::from_utf8_lossy(&got[..n]).into_owned();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    socket.write_all(b"ping over tls").await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut got))
        .await
        .expect("the echo")
        .unwrap();
    assert_eq!(&got[..n], b"ping over tls");
    app.stop().await;
}

#[tokio::test]
async fn an_https_origin_whose_certificate_is_not_trusted_gets_nothing() {
    let shop = start_tls_shop().await;
    // The built-in roots only: the shop's private CA is not among them.
    let app = TestApp::memory_with(config(&["--origin", &shop.origin])).await;
    let pass = admitted(&app, "/product/7", "ann").await;
    let refused = app
        .client
        .get(app.url("/product/7"))
        .header("accept", "application/json")
        .header("cookie", &pass)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 502);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"], "origin_unreachable");
    let upgrade = {
        let mut socket = tokio::net::TcpStream::connect(app.addr).await.unwrap();
        let handshake = format!(
            "GET /ws HTTP/1.1\r\nHost: shop\r\nUpgrade: echo\r\nConnection: Upgrade\r\nCookie: {pass}\r\n\r\n"
        );
        socket.write_all(handshake.as_bytes()).await.unwrap();
        let mut got = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut got))
            .await
            .expect("an answer")
            .unwrap();
        String::from_utf8_lossy(&got[..n]).into_owned()
    };
    assert!(upgrade.starts_with("HTTP/1.1 502"), "{upgrade}");
    assert!(
        shop.seen.lock().unwrap().is_empty(),
        "no request crossed an untrusted TLS: {:?}",
        shop.seen.lock().unwrap()
    );
    app.stop().await;
}

#[test]
fn an_origin_ca_that_cannot_be_used_exits_2_naming_the_key() {
    let junk = std::env::temp_dir().join(format!(
        "waitroom-origin-junk-{:016x}.pem",
        rand::random::<u64>()
    ));
    std::fs::write(&junk, "not a certificate\n").unwrap();
    for (file, why) in [
        ("/nonexistent/ca.pem".to_owned(), "cannot read"),
        (junk.display().to_string(), "no PEM certificate"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
            .args([
                "check",
                "--origin",
                "https://127.0.0.1:9",
                "--origin-ca",
                &file,
            ])
            .env_clear()
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("front.origin_ca (source: flag --origin-ca)") && stderr.contains(why),
            "{stderr}"
        );
    }
    let _ = std::fs::remove_file(&junk);
}
