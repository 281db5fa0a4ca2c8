//! Signed mode's settings: plain data, in every build (the configuration
//! reads them whatever the features); the verifier itself (`signed.rs`,
//! jsonwebtoken) only with the `signed-identity` feature.

/// The key JWTs are verified with.
#[derive(Debug, Clone)]
pub enum SignedKey {
    /// HS256 with a shared secret.
    Secret(Vec<u8>),
    /// RS256 or EdDSA (Ed25519) with a public key, PEM (SPKI, or PKCS#1
    /// for RSA); which one is read from the key itself.
    PublicKeyPem(Vec<u8>),
}

/// How signed mode verifies tokens.
#[derive(Debug, Clone)]
pub struct SignedConfig {
    /// The verification key.
    pub key: SignedKey,
    /// `iss` a token must carry, when set.
    pub issuer: Option<String>,
    /// `aud` a token must carry (one of), when set.
    pub audience: Option<String>,
    /// A cookie to read the token from when no `Authorization` header
    /// carries one.
    pub cookie: Option<String>,
    /// The longest `exp - iat` accepted, when set (and `iat` required).
    pub max_lifetime_secs: Option<u64>,
}
