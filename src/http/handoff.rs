//! The slot through which the events handler hands a stream's session to
//! the transport that carries it.
//!
//! The lean writer (in `crate::server`) puts a [`LeanStream`] in a
//! request's extensions before running it through the router; the events
//! handler, finding one, leaves its session there instead of building a
//! hyper body. It lives here, beside the handler, so the server depends on
//! the API and not the other way round.

use std::sync::{Arc, Mutex};

use crate::push::StreamSession;

/// Put in a lean request's extensions: the events handler leaves the
/// stream's session here for the lean writer.
#[derive(Clone, Default)]
pub struct LeanStream(Arc<Mutex<Option<StreamSession>>>);

impl LeanStream {
    /// Leaves `session` for the lean writer.
    pub fn hand_over(&self, session: StreamSession) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(session);
    }

    /// The session the handler left, if it left one (once).
    pub fn take(&self) -> Option<StreamSession> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}
