//! The proxy's side of the seam with `crate::pass`: a pass read from the
//! request (cookie or bearer, `pass::pass_from_headers`) and verified by
//! the instance's `pass::PassService` (signature, `kid`, expiry, room,
//! ended sessions), its session's activity noted for the batched report.
//!
//! Checking costs a signature check (or a hit in the service's cache of
//! verified passes) and a clock read: never a store call. Passes are not
//! issued here: an admitted visitor is sent through the pass endpoint
//! (`GET {prefix}/api/queues/{queue}/pass`), which starts the session, so
//! `maxActive`, idleness and an operator's end hold behind the proxy as
//! behind a gateway.

use std::sync::Arc;

use axum::http::HeaderMap;

use super::Passes;
use crate::pass::{PassService, Presented, pass_from_headers};
use crate::queue::QueueName;

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
        match self.service.verify_for(token, queue, now) {
            Ok(claims) => {
                self.service.note_activity(&claims);
                true
            }
            Err(_) => false,
        }
    }
}
