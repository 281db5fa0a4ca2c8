//! The signature backend jsonwebtoken signs and verifies with, in a build
//! without the `signed-identity` feature: Ed25519 only, on the
//! `ed25519-dalek` keys the ring already holds.
//!
//! Everything waitroom signs itself (passes, receipts, log heads) is EdDSA;
//! only the site's login tokens (`--identity signed`: HS256, RS256, EdDSA)
//! need more. jsonwebtoken's own RustCrypto backend brings RSA and the
//! NIST curves with their big-integer crates, a tenth of a minimal
//! release build's compile time, so the minimal build installs this one
//! instead through jsonwebtoken's `CryptoProvider` hook. With the feature
//! on, jsonwebtoken's `rust_crypto` backend is compiled in and chosen by
//! itself, and [`install`] does nothing.
//!
//! Any other algorithm is refused here (`InvalidAlgorithm`), on top of the
//! ring's own refusal of any header that does not say EdDSA.

/// Makes sure jsonwebtoken has a backend before the first token is signed
/// or read (idempotent; called where a key ring is built).
pub fn install() {
    #[cfg(not(feature = "signed-identity"))]
    ed25519_only::install();
}

#[cfg(not(feature = "signed-identity"))]
mod ed25519_only {
    use ed25519_dalek::pkcs8::DecodePrivateKey;
    use ed25519_dalek::{Signature, SigningKey, VerifyingKey};
    use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, JwtVerifier, KeyUtils};
    use jsonwebtoken::errors::{Error, ErrorKind};
    use jsonwebtoken::jwk::{EllipticCurve, ThumbprintHash};
    use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};
    use sha2::Digest;

    static PROVIDER: CryptoProvider = CryptoProvider {
        signer_factory: signer,
        verifier_factory: verifier,
        key_utils: KeyUtils {
            ed_pub_components_from_private_key: ed_public,
            compute_digest: digest,
            ..KeyUtils::new_unimplemented()
        },
    };

    pub fn install() {
        // `Err` means a backend is already there (ours, installed by an
        // earlier ring in this process): nothing to do.
        let _ = PROVIDER.install_default();
    }

    struct Ed25519Signer(SigningKey);

    impl signature::Signer<Vec<u8>> for Ed25519Signer {
        fn try_sign(&self, message: &[u8]) -> Result<Vec<u8>, signature::Error> {
            Ok(self.0.sign(message).to_bytes().to_vec())
        }
    }

    impl JwtSigner for Ed25519Signer {
        fn algorithm(&self) -> Algorithm {
            Algorithm::EdDSA
        }
    }

    struct Ed25519Verifier(VerifyingKey);

    impl signature::Verifier<Vec<u8>> for Ed25519Verifier {
        fn verify(&self, message: &[u8], sig: &Vec<u8>) -> Result<(), signature::Error> {
            // `verify`, as jsonwebtoken's own backend does, so that both
            // builds accept exactly the same tokens.
            self.0.verify(message, &Signature::from_slice(sig)?)
        }
    }

    impl JwtVerifier for Ed25519Verifier {
        fn algorithm(&self) -> Algorithm {
            Algorithm::EdDSA
        }
    }

    fn signer(algorithm: &Algorithm, key: &EncodingKey) -> Result<Box<dyn JwtSigner>, Error> {
        if *algorithm != Algorithm::EdDSA {
            return Err(ErrorKind::InvalidAlgorithm.into());
        }
        let key =
            SigningKey::from_pkcs8_der(key.as_bytes()).map_err(|_| ErrorKind::InvalidEddsaKey)?;
        Ok(Box::new(Ed25519Signer(key)))
    }

    fn verifier(algorithm: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>, Error> {
        if *algorithm != Algorithm::EdDSA {
            return Err(ErrorKind::InvalidAlgorithm.into());
        }
        let bytes: &[u8; 32] = key
            .try_get_as_bytes()?
            .get(..32)
            .and_then(|b| b.try_into().ok())
            .ok_or(ErrorKind::InvalidEddsaKey)?;
        let key = VerifyingKey::from_bytes(bytes).map_err(|_| ErrorKind::InvalidEddsaKey)?;
        Ok(Box::new(Ed25519Verifier(key)))
    }

    fn ed_public(private_der: &[u8], curve: &EllipticCurve) -> Result<Vec<u8>, Error> {
        if *curve != EllipticCurve::Ed25519 {
            return Err(ErrorKind::InvalidAlgorithm.into());
        }
        let key =
            SigningKey::from_pkcs8_der(private_der).map_err(|_| ErrorKind::InvalidEddsaKey)?;
        Ok(key.verifying_key().as_bytes().to_vec())
    }

    fn digest(data: &[u8], hash: ThumbprintHash) -> Result<Vec<u8>, Error> {
        Ok(match hash {
            ThumbprintHash::SHA256 => sha2::Sha256::digest(data).to_vec(),
            ThumbprintHash::SHA384 => sha2::Sha384::digest(data).to_vec(),
            ThumbprintHash::SHA512 => sha2::Sha512::digest(data).to_vec(),
            _ => return Err(ErrorKind::InvalidAlgorithm.into()),
        })
    }
}
