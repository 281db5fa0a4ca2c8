//! Which connections a listener takes, before a byte is read from them.
//!
//! **The cap.** At most `max_connections` connections are open at once on a
//! listener (`--max-connections` on the public one, 64 on the operator
//! one); one over it is answered `503 server_busy` and closed.
//!
//! **Per address.** So that one address cannot take every slot (with
//! sockets that connect and never send a byte, say), each listener also
//! counts its connections per client address, IPv6 by its /64
//! (`crate::http::client::ClientKey`): over `--connections-per-address`,
//! a connection is answered `429 address_connections_limited` and closed.
//! What is counted is the socket's peer (nothing else is known before the
//! request is read); a peer that is one of `--trusted-proxies` is not
//! counted at all, as it holds connections for all its clients.
//!
//! **The operator reserve.** On the operator listener, a connection that
//! arrives with every ordinary slot taken is not turned away at once: it
//! *knocks* (at most [`KNOCKS`] at a time), and is served only if its
//! requests carry the admin or the service token, in one of
//! `--admin-reserved-connections` slots kept for them; any other request
//! on it is answered `503 server_busy` and the connection closed. A
//! knocking socket that sends nothing is closed at the first-byte timeout
//! like any other. So sockets that never authenticate, idle or not, can
//! take the ordinary slots but never the reserve, and an operator (or an
//! order service on the token API) still gets in.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::http::client::{ClientKey, TrustedProxies};

/// Connections over the operator listener's cap waiting to show a token at
/// once; more are turned away. Bounds what knocking can hold.
pub const KNOCKS: usize = 64;

/// How one listener takes connections.
pub struct Limits {
    /// Ordinary slots.
    pub max_connections: usize,
    /// Connections one address may hold; `None`: not counted.
    pub per_address: Option<usize>,
    /// Peers not counted per address.
    pub proxies: TrustedProxies,
    /// The operator reserve, on the operator listener.
    pub reserve: Option<ReserveConfig>,
}

/// The operator reserve: its slots, and the tokens that open them.
pub struct ReserveConfig {
    pub slots: usize,
    pub admin_token: String,
    pub service_token: Option<String>,
}

/// A listener's bookkeeping of its open connections.
pub struct Admission {
    open: Arc<Semaphore>,
    addresses: Option<Arc<Addresses>>,
    proxies: TrustedProxies,
    reserve: Option<Arc<Reserve>>,
}

/// What a new connection gets.
pub enum Admitted {
    /// An ordinary slot, held until the connection ends.
    Open(Held),
    /// Over the cap: served only for an operator's token.
    Knocking(Held, Arc<Knock>),
    /// Over its address's share.
    AddressFull,
    /// Over the cap (and, on the operator listener, nowhere to knock).
    Busy,
}

/// What an admitted connection holds: its slot (or knock) and its place in
/// its address's count, both given back when it ends.
pub struct Held {
    _slot: Option<OwnedSemaphorePermit>,
    _address: Option<AddressSlot>,
}

impl Admission {
    pub fn new(limits: Limits) -> Self {
        Self {
            open: Arc::new(Semaphore::new(limits.max_connections)),
            addresses: limits.per_address.map(|cap| {
                Arc::new(Addresses {
                    cap,
                    counts: Mutex::default(),
                })
            }),
            proxies: limits.proxies,
            reserve: limits.reserve.map(|r| {
                Arc::new(Reserve {
                    knocks: Arc::new(Semaphore::new(KNOCKS)),
                    slots: Arc::new(Semaphore::new(r.slots)),
                    admin_token: r.admin_token,
                    service_token: r.service_token,
                })
            }),
        }
    }

    /// Takes (or refuses) a connection from `peer`.
    pub fn admit(&self, peer: SocketAddr) -> Admitted {
        let address = match &self.addresses {
            Some(addresses) if !self.proxies.trusts(peer.ip()) => {
                match addresses.take(ClientKey::of(peer.ip())) {
                    Some(slot) => Some(slot),
                    None => return Admitted::AddressFull,
                }
            }
            _ => None,
        };
        if let Ok(permit) = self.open.clone().try_acquire_owned() {
            return Admitted::Open(Held {
                _slot: Some(permit),
                _address: address,
            });
        }
        let Some(reserve) = &self.reserve else {
            return Admitted::Busy;
        };
        match reserve.knocks.clone().try_acquire_owned() {
            // The knock is held by the connection until a token moves it
            // into the reserve; its address slot for the connection's life.
            Ok(knock) => Admitted::Knocking(
                Held {
                    _slot: None,
                    _address: address,
                },
                Arc::new(Knock {
                    reserve: reserve.clone(),
                    state: Mutex::new(KnockState::Knocking { _knock: knock }),
                }),
            ),
            Err(_) => Admitted::Busy,
        }
    }
}

/// Connections per address on one listener.
struct Addresses {
    cap: usize,
    counts: Mutex<HashMap<ClientKey, usize>>,
}

impl Addresses {
    fn take(self: &Arc<Self>, key: ClientKey) -> Option<AddressSlot> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(key).or_default();
        if *count >= self.cap {
            return None;
        }
        *count += 1;
        Some(AddressSlot {
            addresses: self.clone(),
            key,
        })
    }
}

/// One connection's place in its address's count.
struct AddressSlot {
    addresses: Arc<Addresses>,
    key: ClientKey,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut counts = self
            .addresses
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Forgotten at zero: the map holds only addresses with connections.
        if let Some(count) = counts.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

/// The operator reserve of one listener.
struct Reserve {
    knocks: Arc<Semaphore>,
    slots: Arc<Semaphore>,
    admin_token: String,
    service_token: Option<String>,
}

impl Reserve {
    /// Whether `headers` carry the admin or the service token.
    fn authorised(&self, headers: &HeaderMap) -> bool {
        let admin = crate::http::auth::require_bearer(headers, &self.admin_token).is_ok();
        let service = self
            .service_token
            .as_deref()
            .is_some_and(|token| crate::http::auth::require_bearer(headers, token).is_ok());
        admin | service
    }
}

/// A knocking connection's way into the reserve.
pub struct Knock {
    reserve: Arc<Reserve>,
    state: Mutex<KnockState>,
}

enum KnockState {
    /// No token shown yet: holds a knock.
    Knocking { _knock: OwnedSemaphorePermit },
    /// A token was shown: holds a reserve slot for the connection's life.
    Reserved { _slot: OwnedSemaphorePermit },
    /// Refused: the connection is closing.
    Refused,
}

impl Knock {
    /// Whether a request with `headers` is served on this connection: once
    /// a request carried a token and got a reserve slot, every request
    /// is; until then none is, and the first refusal is final (the
    /// connection closes after its answer).
    pub fn admits(&self, headers: &HeaderMap) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match &*state {
            KnockState::Reserved { .. } => return true,
            KnockState::Refused => return false,
            KnockState::Knocking { .. } => {}
        }
        let slot = self
            .reserve
            .authorised(headers)
            .then(|| self.reserve.slots.clone().try_acquire_owned().ok())
            .flatten();
        // Either way the knock is given back.
        *state = match slot {
            Some(slot) => KnockState::Reserved { _slot: slot },
            None => KnockState::Refused,
        };
        matches!(*state, KnockState::Reserved { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn peer(ip: &str) -> SocketAddr {
        SocketAddr::new(ip.parse().unwrap(), 40000)
    }

    fn limits(max: usize, per_address: Option<usize>) -> Limits {
        Limits {
            max_connections: max,
            per_address,
            proxies: TrustedProxies::default(),
            reserve: None,
        }
    }

    #[test]
    fn addresses_are_counted_by_v4_and_by_v6_64_and_given_back() {
        let admission = Admission::new(limits(100, Some(2)));
        let a = admission.admit(peer("192.0.2.1"));
        let b = admission.admit(peer("192.0.2.1"));
        assert!(matches!(a, Admitted::Open(_)) && matches!(b, Admitted::Open(_)));
        assert!(matches!(
            admission.admit(peer("192.0.2.1")),
            Admitted::AddressFull
        ));
        // IPv4-mapped IPv6 is the same client.
        assert!(matches!(
            admission.admit(peer("::ffff:192.0.2.1")),
            Admitted::AddressFull
        ));
        assert!(matches!(
            admission.admit(peer("192.0.2.2")),
            Admitted::Open(_)
        ));
        drop(a);
        assert!(matches!(
            admission.admit(peer("192.0.2.1")),
            Admitted::Open(_)
        ));

        let one = admission.admit(peer("2001:db8:1:2::1"));
        let two = admission.admit(peer("2001:db8:1:2:ffff::9"));
        assert!(matches!(one, Admitted::Open(_)) && matches!(two, Admitted::Open(_)));
        assert!(matches!(
            admission.admit(peer("2001:db8:1:2::77")),
            Admitted::AddressFull
        ));
        assert!(matches!(
            admission.admit(peer("2001:db8:1:3::1")),
            Admitted::Open(_)
        ));
        drop((one, two, b));
        let counts = admission.addresses.as_ref().unwrap().counts.lock().unwrap();
        assert!(
            !counts.contains_key(&ClientKey::of("2001:db8:1:2::1".parse().unwrap())),
            "an address without connections is forgotten"
        );
    }

    #[test]
    fn trusted_proxies_are_not_counted_and_the_cap_still_holds() {
        let proxies = TrustedProxies::new(
            vec!["10.0.0.0/8".parse().unwrap()],
            crate::http::client::ForwardedHeader::XForwardedFor,
        );
        let admission = Admission::new(Limits {
            proxies,
            ..limits(3, Some(1))
        });
        let held: Vec<_> = (0..3).map(|_| admission.admit(peer("10.1.1.1"))).collect();
        assert!(held.iter().all(|a| matches!(a, Admitted::Open(_))));
        assert!(matches!(admission.admit(peer("10.1.1.1")), Admitted::Busy));
    }

    #[test]
    fn over_the_cap_only_a_token_opens_the_reserve() {
        let admission = Admission::new(Limits {
            reserve: Some(ReserveConfig {
                slots: 1,
                admin_token: "admin-token-0123456789".into(),
                service_token: Some("service-token-0123456789".into()),
            }),
            ..limits(1, None)
        });
        let bearer = |token: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                "authorization",
                HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
            );
            h
        };
        let _ordinary = admission.admit(peer("192.0.2.1"));
        let Admitted::Knocking(_held, anonymous) = admission.admit(peer("192.0.2.2")) else {
            panic!("knocks")
        };
        assert!(!anonymous.admits(&HeaderMap::new()));
        assert!(
            !anonymous.admits(&bearer("admin-token-0123456789")),
            "a refusal is final"
        );
        let Admitted::Knocking(_held, operator) = admission.admit(peer("192.0.2.3")) else {
            panic!("knocks")
        };
        assert!(operator.admits(&bearer("admin-token-0123456789")));
        assert!(operator.admits(&HeaderMap::new()), "the connection is in");
        let Admitted::Knocking(_held, service) = admission.admit(peer("192.0.2.4")) else {
            panic!("knocks")
        };
        assert!(
            !service.admits(&bearer("service-token-0123456789")),
            "the one reserve slot is taken"
        );
        drop(operator);
        let Admitted::Knocking(_held, service) = admission.admit(peer("192.0.2.5")) else {
            panic!("knocks")
        };
        assert!(service.admits(&bearer("service-token-0123456789")));
    }

    #[test]
    fn knocks_are_bounded() {
        let admission = Admission::new(Limits {
            reserve: Some(ReserveConfig {
                slots: 1,
                admin_token: "admin-token-0123456789".into(),
                service_token: None,
            }),
            ..limits(0, None)
        });
        let knocking: Vec<_> = (0..KNOCKS)
            .map(|_| admission.admit(peer("192.0.2.1")))
            .collect();
        assert!(knocking.iter().all(|a| matches!(a, Admitted::Knocking(..))));
        assert!(matches!(admission.admit(peer("192.0.2.1")), Admitted::Busy));
    }
}
