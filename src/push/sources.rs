//! Stream slots per client source, so one client cannot hold every stream
//! an instance has room for.
//!
//! A source is a client address bucket (an IPv4 address, an IPv6 /64), as
//! the HTTP edge found it. Two rules, applied when a stream opens:
//! - a source holding `per_source` streams gets no more (the new stream is
//!   shed to polling);
//! - at the instance's cap, a newcomer from a source lighter than the
//!   heaviest one takes a slot from the heaviest: one of that source's
//!   streams is told to go (it ends with a long `retry:`, like a shed
//!   stream) and the newcomer is admitted. A newcomer from the heaviest
//!   source itself (or one as heavy, less one) is shed. So under pressure
//!   the sources even out, and the heaviest is always shed first.

use std::collections::{BTreeSet, HashMap};
use std::future::poll_fn;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

/// Tells one stream to go, once. A flag and the stream task's waker: a
/// `CancellationToken` would do, but costs a tree node and a `Notify` per
/// stream, and every open stream holds one of these.
#[derive(Clone, Default)]
pub struct Eviction(Arc<Mutex<EvictionState>>);

#[derive(Default)]
struct EvictionState {
    evicted: bool,
    waker: Option<Waker>,
}

impl Eviction {
    fn lock(&self) -> MutexGuard<'_, EvictionState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn evict(&self) {
        let waker = {
            let mut state = self.lock();
            state.evicted = true;
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Whether the stream was told to go.
    pub fn is_evicted(&self) -> bool {
        self.lock().evicted
    }

    /// Waits until the stream is told to go. Cancel safe.
    pub async fn wait(&self) {
        poll_fn(|cx| {
            let mut state = self.lock();
            if state.evicted {
                return Poll::Ready(());
            }
            match &mut state.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                slot => *slot = Some(cx.waker().clone()),
            }
            Poll::Pending
        })
        .await
    }
}

/// The streams of one source: their ids and how to tell each to go.
#[derive(Default)]
struct Source {
    streams: HashMap<u64, Eviction>,
}

#[derive(Default)]
struct Table {
    sources: HashMap<IpAddr, Source>,
    /// (streams, source), heaviest last.
    by_weight: BTreeSet<(usize, IpAddr)>,
    total: usize,
    next_id: u64,
}

impl Table {
    fn count(&self, source: &IpAddr) -> usize {
        self.sources.get(source).map_or(0, |s| s.streams.len())
    }

    fn add(&mut self, source: IpAddr, id: u64, token: Eviction) {
        let before = self.count(&source);
        self.by_weight.remove(&(before, source));
        let entry = self.sources.entry(source).or_default();
        entry.streams.insert(id, token);
        self.by_weight.insert((before + 1, source));
        self.total += 1;
    }

    /// Forgets stream `id` of `source`; its eviction, if it was there.
    fn remove(&mut self, source: IpAddr, id: u64) -> Option<Eviction> {
        let entry = self.sources.get_mut(&source)?;
        let before = entry.streams.len();
        let token = entry.streams.remove(&id)?;
        self.by_weight.remove(&(before, source));
        if entry.streams.is_empty() {
            self.sources.remove(&source);
        } else {
            self.by_weight.insert((before - 1, source));
        }
        self.total -= 1;
        Some(token)
    }
}

/// The stream slots of one instance, by source.
#[derive(Default)]
pub struct Sources {
    table: Mutex<Table>,
}

/// A stream's slot: frees itself when dropped. `evicted` is set when the
/// slot was given to a lighter source; the stream must then end.
pub struct StreamSlot {
    sources: Arc<Sources>,
    source: IpAddr,
    id: u64,
    /// Set when this stream is to make room for a lighter source.
    pub evicted: Eviction,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.sources.lock().remove(self.source, self.id);
    }
}

impl Sources {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stream slots taken on this instance.
    pub fn total(&self) -> usize {
        self.lock().total
    }

    /// Streams `source` holds here.
    pub fn count(&self, source: IpAddr) -> usize {
        self.lock().count(&source)
    }

    /// A slot for a stream from `source`, or `None` when it must be shed
    /// (see the module doc). `max_total` is the instance's cap;
    /// `per_source` the cap of one source (`None`: none).
    pub fn admit(
        self: &Arc<Self>,
        source: IpAddr,
        max_total: usize,
        per_source: Option<usize>,
    ) -> Option<StreamSlot> {
        let mut table = self.lock();
        let mine = table.count(&source);
        if per_source.is_some_and(|cap| mine >= cap) {
            return None;
        }
        if table.total >= max_total {
            let &(heaviest_count, heaviest) = table.by_weight.last()?;
            // Taking one from the heaviest must leave it no lighter than
            // the newcomer becomes, or two sources would trade a slot
            // back and forth.
            if heaviest == source || heaviest_count <= mine + 1 {
                return None;
            }
            let victim = table
                .sources
                .get(&heaviest)?
                .streams
                .keys()
                .next()
                .copied()?;
            if let Some(eviction) = table.remove(heaviest, victim) {
                eviction.evict();
            }
            metrics::counter!("waitroom_streams_evicted_total").increment(1);
        }
        let id = table.next_id;
        table.next_id += 1;
        let evicted = Eviction::default();
        table.add(source, id, evicted.clone());
        drop(table);
        Some(StreamSlot {
            sources: Arc::clone(self),
            source,
            id,
            evicted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([192, 0, 2, n])
    }

    #[test]
    fn one_source_is_capped() {
        let s = Arc::new(Sources::default());
        let a: Vec<_> = (0..3)
            .map(|_| s.admit(ip(1), 100, Some(3)).unwrap())
            .collect();
        assert!(s.admit(ip(1), 100, Some(3)).is_none(), "over its cap");
        assert!(s.admit(ip(2), 100, Some(3)).is_some(), "another source");
        drop(a);
        assert_eq!(s.count(ip(1)), 0, "slots free themselves");
        assert!(s.admit(ip(1), 100, Some(3)).is_some());
    }

    #[test]
    fn at_the_cap_the_heaviest_source_is_shed_first() {
        let s = Arc::new(Sources::default());
        let heavy: Vec<_> = (0..10).map(|_| s.admit(ip(1), 10, None).unwrap()).collect();
        assert_eq!(s.total(), 10);
        assert!(
            s.admit(ip(1), 10, None).is_none(),
            "the heaviest gets no more"
        );
        let light = s
            .admit(ip(2), 10, None)
            .expect("a lighter source takes a slot");
        assert!(!light.evicted.is_evicted());
        let gone = heavy.iter().filter(|h| h.evicted.is_evicted()).count();
        assert_eq!(
            gone, 1,
            "exactly one of the heaviest's streams is told to go"
        );
        assert_eq!((s.total(), s.count(ip(1)), s.count(ip(2))), (10, 9, 1));
        // Dropping the evicted stream later does not free a second slot.
        drop(heavy);
        assert_eq!((s.total(), s.count(ip(2))), (1, 1));
    }

    #[tokio::test]
    async fn an_evicted_stream_is_woken() {
        let s = Arc::new(Sources::default());
        let heavy: Vec<_> = (0..2).map(|_| s.admit(ip(1), 2, None).unwrap()).collect();
        let waits: Vec<_> = heavy
            .iter()
            .map(|slot| {
                let eviction = slot.evicted.clone();
                tokio::spawn(async move { eviction.wait().await })
            })
            .collect();
        tokio::task::yield_now().await;
        let _light = s.admit(ip(2), 2, None).expect("a lighter source");
        let mut woken = 0;
        for wait in waits {
            if tokio::time::timeout(std::time::Duration::from_secs(5), wait)
                .await
                .is_ok()
            {
                woken += 1;
            }
        }
        assert_eq!(woken, 1, "the evicted stream's wait ends, the other's not");
    }

    #[test]
    fn sources_even_out_and_do_not_trade_slots() {
        let s = Arc::new(Sources::default());
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(s.admit(ip(1), 4, None).unwrap());
        }
        held.push(s.admit(ip(2), 4, None).unwrap()); // 3 + 1
        held.push(s.admit(ip(2), 4, None).unwrap()); // 2 + 2
        assert!(s.admit(ip(2), 4, None).is_none(), "2 vs 2: no trade");
        assert!(s.admit(ip(1), 4, None).is_none());
        let third = s.admit(ip(3), 4, None).expect("a new source still gets in");
        drop(third);
        assert_eq!(s.total(), 3);
    }
}
