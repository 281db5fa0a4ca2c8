//! Signed mode in a build without the `signed-identity` feature: no JWT
//! verifier exists (jsonwebtoken is not built), so [`Verifier::new`]
//! refuses and `--identity signed` stops the start (the configuration's
//! check names the flag and the feature before this is reached). The real one
//! is `signed.rs`.

use axum::http::HeaderMap;

use super::{IdentityError, SignedConfig};
use crate::queue::UserId;

/// Uninhabited: there is no verifier in this build.
pub(super) enum Verifier {}

impl Verifier {
    pub(super) fn new(_config: &SignedConfig) -> Result<Self, String> {
        Err(
            "--identity signed needs the `signed-identity` cargo feature, and this build of \
             waitroom was made without it"
                .into(),
        )
    }

    pub(super) fn verify_request(&self, _headers: &HeaderMap) -> Result<UserId, IdentityError> {
        match *self {}
    }
}
