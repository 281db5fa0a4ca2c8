//! The TLS client settings waitroom uses wherever it connects out over
//! `https://`: to webhook receivers (`webhook`) and to a room's origin
//! (`front`). Built only with the `https-webhooks` cargo feature (rustls
//! with `ring`).
//!
//! One place, so both trust the same roots the same way: the Mozilla list
//! compiled in (`webpki-roots`), so a fresh Debian or distroless image
//! needs no `ca-certificates` and every instance trusts the same roots
//! whatever its host, plus the operator's own CA file for a peer behind a
//! private CA. The `ring` provider is named here rather than installed
//! process-wide, so nothing global is touched.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// A certificate an operator's CA file adds to the trusted roots, DER.
pub type Certificate = CertificateDer<'static>;

/// Reads a CA file: every PEM certificate in it, each checked to be a
/// usable trust anchor, so a wrong file stops the start rather than every
/// connection made later.
pub fn read_ca(path: &Path) -> Result<Vec<Certificate>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM: {e}"))?;
    if certs.is_empty() {
        return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into());
    }
    let mut store = RootCertStore::empty();
    for (i, cert) in certs.iter().enumerate() {
        store
            .add(cert.clone())
            .map_err(|e| format!("certificate {} is not usable: {e}", i + 1))?;
    }
    Ok(certs)
}

/// A client configuration trusting the built-in roots plus `extra` (read
/// and checked by [`read_ca`]), TLS 1.2 and 1.3, no client certificate.
pub fn client_config(extra: impl IntoIterator<Item = Certificate>) -> rustls::ClientConfig {
    let mut roots = RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    roots.add_parsable_certificates(extra);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}
