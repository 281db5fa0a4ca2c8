//! The webhook HTTP client: HTTP/1.1 over TLS for `https://` hooks (and
//! over plain TCP for the `http://` ones the hook rules allow).
//!
//! Why a hyper client of its own rather than reqwest's TLS: reqwest's
//! rustls feature either builds aws-lc (a C toolchain with cmake on some
//! hosts, and minutes of CI) or, without a provider, panics in every
//! `reqwest::Client` built before someone installs one process-wide. This
//! client names its `ring` provider itself and touches nothing global.
//!
//! Trust (`crate::tls`): the Mozilla root list compiled in plus, per hook,
//! the certificates of its `ca=` file, for receivers behind a private CA.

use std::path::Path;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

use super::WebhookSpec;

/// Whether this build speaks TLS to hooks (the `https-webhooks` feature).
pub(crate) const HTTPS: bool = true;

/// Why an `https://` hook cannot run; only read without TLS.
pub(crate) const NO_HTTPS: &str = "";

/// A trusted certificate of a hook's `ca=` file, DER.
pub type Certificate = crate::tls::Certificate;

/// One hook's client (its roots are its own).
pub(crate) type HookClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Reads a `ca=` file (see [`crate::tls::read_ca`]).
pub(crate) fn read_ca(path: &Path) -> Result<Vec<Certificate>, String> {
    crate::tls::read_ca(path)
}

/// The client for `hook`: the built-in roots plus the hook's CA, HTTP/1.1,
/// no redirects followed (a redirect is a failed attempt), connections
/// kept for reuse a little while.
pub(crate) fn client(hook: &WebhookSpec) -> HookClient {
    // The CA was checked when the hook was read (`read_ca`).
    let extra = hook.ca.iter().flat_map(|ca| ca.certs.iter().cloned());
    let tls = crate::tls::client_config(extra);
    let mut tcp = super::connect::tcp();
    tcp.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(tcp);
    super::connect::pooled(connector)
}

#[cfg(test)]
mod tests {
    use super::super::connect::describe;
    use super::*;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A TLS server on loopback answering every request `204`, with a
    /// certificate for 127.0.0.1 from a CA of its own; its CA's PEM.
    async fn server() -> (String, String) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}/h", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut buf = [0u8; 4096];
                    let _ = tls.read(&mut buf).await;
                    let _ = tls
                        .write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
                        .await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        (url, ca_pem)
    }

    fn post(url: &str) -> hyper::Request<Full<Bytes>> {
        hyper::Request::post(url)
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    }

    #[tokio::test]
    async fn a_private_receiver_is_trusted_only_with_its_ca() {
        let (url, ca_pem) = server().await;
        let file = std::env::temp_dir().join(format!("waitroom-ca-ok-{}.pem", std::process::id()));
        std::fs::write(&file, &ca_pem).unwrap();
        let base = format!("name = \"t\"\nurl = \"{url}\"\nsecret = \"0123456789abcdef\"\n");
        let plain = WebhookSpec::from_toml(&base).unwrap();
        let with_ca =
            WebhookSpec::from_toml(&format!("{base}ca = {:?}", file.display().to_string()))
                .unwrap();
        std::fs::remove_file(&file).unwrap();

        let e = client(&plain).request(post(&url)).await.unwrap_err();
        let why = describe(&e);
        assert!(why.contains("certificate"), "{why}");
        let ok = client(&with_ca).request(post(&url)).await.unwrap();
        assert_eq!(ok.status(), 204);
        // The CA is trusted, but the certificate names 127.0.0.1 only.
        let other_name = url.replace("127.0.0.1", "localhost");
        let e = client(&with_ca)
            .request(post(&other_name))
            .await
            .unwrap_err();
        let why = describe(&e);
        assert!(why.contains("certificate"), "{why}");
    }

    #[test]
    fn a_ca_file_must_hold_usable_certificates() {
        let dir = std::env::temp_dir().join(format!("waitroom-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.pem");
        assert!(read_ca(&missing).unwrap_err().contains("cannot read"));
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        assert!(read_ca(&empty).unwrap_err().contains("no PEM certificate"));
        let junk = dir.join("junk.pem");
        std::fs::write(
            &junk,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        assert!(read_ca(&junk).unwrap_err().contains("not usable"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
