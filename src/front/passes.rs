//! The proxy's side of the seam with `crate::pass`: a pass read from the
//! request (cookie or bearer, `pass::pass_from_headers`) and verified by
//! `pass::PassService` (signature, `kid`, expiry, room, ended sessions),
//! and a pass issued to a visitor the queue has admitted.
//!
//! Checking costs a signature check (or a hit in the service's cache of
//! verified passes) and a clock read: never a store call.

use std::sync::Arc;

use axum::http::HeaderMap;

use super::Passes;
use crate::pass::{PassClaims, PassService, Presented, pass_from_headers};
use crate::queue::{QueueName, SessionId, UserId};

/// A pass's life from its issue: the session's longest.
pub const PASS_LIFE_SECS: u64 = 30 * 60;

/// [`Passes`] over the pass service, with the pass cookie named `cookie`.
pub struct PassGate {
    service: Arc<PassService>,
    cookie: String,
}

impl PassGate {
    pub fn new(service: Arc<PassService>, cookie: String) -> Self {
        Self { service, cookie }
    }
}

impl Passes for PassGate {
    fn admits(&self, headers: &HeaderMap, queue: &QueueName) -> bool {
        let Presented::Token(token) = pass_from_headers(headers, &self.cookie) else {
            return false;
        };
        let now = crate::clock::now_ms() / 1000;
        self.service.verify_for(token, queue, now).is_ok()
    }

    fn issue(&self, user: &UserId, queue: &QueueName, secure: bool) -> String {
        let iat = crate::clock::now_ms() / 1000;
        let token = self.service.issue(&PassClaims {
            sub: user.clone(),
            room: queue.clone(),
            iat,
            exp: iat + PASS_LIFE_SECS,
            jti: SessionId::generate(),
        });
        cookie::Cookie::build((self.cookie.clone(), token))
            .path("/")
            .http_only(true)
            .secure(secure)
            .same_site(cookie::SameSite::Lax)
            .max_age(cookie::time::Duration::seconds(PASS_LIFE_SECS as i64))
            .build()
            .to_string()
    }
}
