//! The admission gate for heavy work: every request whose cost grows with the document (a
//! rebuild at a position or a version, a whole-document encode, a diff, a fork, an export)
//! passes here and nowhere else.
//!
//! - **Off the runtime.** Admitted work runs on tokio's blocking pool
//!   ([`Admission::run`]), never on the threads that drive sockets and rooms.
//! - **Bounded.** At most `per_node` computations run at once on the node and `per_doc` per
//!   document; at most `queue` requests wait (for their document's share or a node slot),
//!   each at most `wait`. Beyond that the caller is refused: [`Refused::Document`] (429, its
//!   document's share did not come free in time) or [`Refused::Node`] (503, the queue is full
//!   or no node slot came free), both with a time to retry after. Nothing queues without end.
//! - **Computed once.** A result is cached by (document, what was read, at which version or
//!   position) within a byte budget, least recently used out first; readers asking for the
//!   same thing while it is being computed wait for that one computation
//!   ([`Gate::cached`]). Content at a log position or a version never changes, so a cached
//!   answer is never stale (a deleted document's id is never reused).
//!
//! The permit is held by the blocking work itself: a client that hangs up does not free a
//! slot its computation still occupies.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{OnceCell, OwnedSemaphorePermit, Semaphore};

pub use crate::config::GateConfig;
use crate::metrics::Metrics;

/// Why the gate refused a request; each says when to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The document's `per_doc` shares stayed taken for `wait` (429).
    Document(Duration),
    /// Every node slot is taken and the queue is full or the wait ran out (503).
    Node(Duration),
}

/// What is cached: a document's content in one form at one point of its history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    pub doc: i64,
    pub at: At,
    pub form: Form,
}

/// A point of a document's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum At {
    /// The content at this log position.
    Position(i64),
    /// The content recorded as this version.
    Version(i64),
}

/// The form an answer takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Form {
    /// `GET /json`: the roots as JSON text.
    Json,
    /// `GET /update`: the whole state as a Yjs v1 update.
    UpdateV1,
    /// The whole state as a Yjs v2 update (diffs, forks).
    StateV2,
}

pub struct Gate {
    config: GateConfig,
    node: Arc<Semaphore>,
    state: Mutex<State>,
    metrics: Arc<Metrics>,
    /// Where each [`Inflight`] waits once its drop has given everything back (tests force
    /// two drops to overlap with it).
    #[cfg(test)]
    dropped: Mutex<Option<Arc<std::sync::Barrier>>>,
}

#[derive(Default)]
struct State {
    /// Each document with heavy requests running or waiting: its shares, and how many
    /// requests hold or wait for one (the entry goes when that is none).
    per_doc: HashMap<i64, (Arc<Semaphore>, usize)>,
    /// Requests waiting for a node slot.
    waiting: usize,
    cache: Cache,
    /// Computations under way: later readers of the same key wait for them.
    inflight: HashMap<Key, Arc<OnceCell<Bytes>>>,
    /// Whole-document requests in flight per caller (the entry goes when that is none): by
    /// user, which is the address when the server takes no credentials
    /// (`Principal::open`).
    callers: HashMap<String, usize>,
}

/// One of a caller's whole-document requests in flight, from before its admission until its
/// answer is sent (or its connection is gone): given back when dropped.
pub struct CallerSlot {
    gate: Arc<Gate>,
    caller: String,
}

impl Drop for CallerSlot {
    fn drop(&mut self) {
        let mut state = self.gate.state();
        if let Some(n) = state.callers.get_mut(&self.caller) {
            *n -= 1;
            if *n == 0 {
                state.callers.remove(&self.caller);
            }
        }
    }
}

/// The cached answers, least recently used first out, within a byte budget.
struct Cache {
    entries: lru::LruCache<Key, Bytes>,
    bytes: usize,
}

impl Default for Cache {
    fn default() -> Self {
        Cache {
            entries: lru::LruCache::unbounded(),
            bytes: 0,
        }
    }
}

/// A document's admission: a node slot and one of the document's shares, released when the
/// work it runs ends (or when it is dropped unused).
pub struct Admission {
    _slot: OwnedSemaphorePermit,
    _share: OwnedSemaphorePermit,
    user: DocUser,
}

/// A request holding or waiting for one of a document's shares: the document's entry stays
/// while there is one, however the request ends (a client that hangs up while it waits
/// included).
struct DocUser {
    gate: Arc<Gate>,
    doc: i64,
}

impl Drop for DocUser {
    fn drop(&mut self) {
        let mut state = self.gate.state();
        if let Some((_, users)) = state.per_doc.get_mut(&self.doc) {
            *users -= 1;
            if *users == 0 {
                state.per_doc.remove(&self.doc);
            }
        }
    }
}

/// A place in the queue (for a document's share or a node slot), given back when dropped.
struct Waiting<'a>(&'a Gate);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.state().waiting -= 1;
        self.0.metrics.heavy_waiting.dec();
    }
}

/// A computation under way for a key, forgotten when its last reader is done with it (or
/// gone): later readers then find the cache, or start afresh. Its reference to the cell is
/// given back under the map's lock, where the count is read: of two readers dropping at once
/// on two workers, the second to take the lock sees only the map's reference and removes it.
struct Inflight<'a> {
    gate: &'a Gate,
    key: Key,
    cell: Option<Arc<OnceCell<Bytes>>>,
}

impl Inflight<'_> {
    fn cell(&self) -> &OnceCell<Bytes> {
        // (Taken only in `drop`.)
        self.cell.as_deref().unwrap_or(&EMPTY_CELL)
    }
}

/// What [`Inflight::cell`] answers after `drop` took the cell (never reached).
static EMPTY_CELL: OnceCell<Bytes> = OnceCell::const_new();

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        let mut state = self.gate.state();
        let Some(cell) = self.cell.take() else {
            return;
        };
        let mine = state
            .inflight
            .get(&self.key)
            .is_some_and(|c| Arc::ptr_eq(c, &cell));
        drop(cell);
        // Only the map's reference is left: no other reader waits on this cell.
        if mine
            && state
                .inflight
                .get(&self.key)
                .is_some_and(|c| Arc::strong_count(c) == 1)
        {
            state.inflight.remove(&self.key);
        }
        drop(state);
        #[cfg(test)]
        if let Some(both) = self.gate.dropped.lock().ok().and_then(|b| b.clone()) {
            both.wait();
        }
    }
}

/// How long a refused caller is told to wait: about one computation.
const RETRY_AFTER: Duration = Duration::from_secs(1);

impl Gate {
    pub fn new(config: GateConfig, metrics: Arc<Metrics>) -> Arc<Gate> {
        Arc::new(Gate {
            node: Arc::new(Semaphore::new(config.per_node)),
            config,
            state: Mutex::new(State::default()),
            metrics,
            #[cfg(test)]
            dropped: Mutex::default(),
        })
    }

    pub fn config(&self) -> &GateConfig {
        &self.config
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits one heavy computation on document `doc`: at once if one of the document's shares
    /// and a node slot are free, else after a bounded wait in a bounded queue; refused beyond.
    pub async fn admit(self: &Arc<Gate>, doc: i64) -> Result<Admission, Refused> {
        let shares = {
            let mut state = self.state();
            let per_doc = self.config.per_doc;
            let entry = state
                .per_doc
                .entry(doc)
                .or_insert_with(|| (Arc::new(Semaphore::new(per_doc)), 0));
            entry.1 += 1;
            entry.0.clone()
        };
        let user = DocUser {
            gate: self.clone(),
            doc,
        };
        let deadline = tokio::time::Instant::now() + self.config.wait;
        let share = match shares.clone().try_acquire_owned() {
            Ok(share) => share,
            Err(_) => {
                let _place = self.enqueue()?;
                match tokio::time::timeout_at(deadline, shares.acquire_owned()).await {
                    Ok(Ok(share)) => share,
                    _ => return Err(self.refused(Refused::Document(RETRY_AFTER))),
                }
            }
        };
        let slot = match self.node.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                let _place = self.enqueue()?;
                match tokio::time::timeout_at(deadline, self.node.clone().acquire_owned()).await {
                    Ok(Ok(slot)) => slot,
                    _ => return Err(self.refused(Refused::Node(RETRY_AFTER))),
                }
            }
        };
        self.metrics.heavy_admitted.inc();
        self.metrics.heavy_running.inc();
        Ok(Admission {
            _slot: slot,
            _share: share,
            user,
        })
    }

    /// One of `caller`'s `per_caller` whole-document requests, or `None` (429) when all are in
    /// flight: a caller's own requests (answers it does not read included) never take more.
    pub fn caller_slot(self: &Arc<Gate>, caller: &str) -> Option<CallerSlot> {
        let mut state = self.state();
        let n = state.callers.entry(caller.to_owned()).or_insert(0);
        if *n >= self.config.per_caller {
            drop(state);
            self.metrics
                .heavy_refused
                .with_label_values(&["caller"])
                .inc();
            return None;
        }
        *n += 1;
        Some(CallerSlot {
            gate: self.clone(),
            caller: caller.to_owned(),
        })
    }

    /// A place in the wait queue, or 503 when it is full.
    fn enqueue(&self) -> Result<Waiting<'_>, Refused> {
        let mut state = self.state();
        if state.waiting >= self.config.queue {
            drop(state);
            return Err(self.refused(Refused::Node(RETRY_AFTER)));
        }
        state.waiting += 1;
        self.metrics.heavy_waiting.inc();
        Ok(Waiting(self))
    }

    fn refused(&self, refused: Refused) -> Refused {
        let why = match refused {
            Refused::Document(_) => "document",
            Refused::Node(_) => "node",
        };
        self.metrics.heavy_refused.with_label_values(&[why]).inc();
        refused
    }

    /// The cached answer for `key`, if there is one.
    pub fn peek(&self, key: &Key) -> Option<Bytes> {
        let hit = self.state().cache.entries.get(key).cloned();
        if hit.is_some() {
            self.metrics.heavy_cache_hits.inc();
        }
        hit
    }

    /// The answer for `key`: from the cache, from a computation another reader started, or
    /// computed by `build` (which passes the gate itself, through [`Gate::admit`]). A failed
    /// computation is not cached: the next reader tries again.
    pub async fn cached<E, F>(&self, key: Key, build: F) -> Result<Bytes, E>
    where
        F: Future<Output = Result<Bytes, E>>,
    {
        let cell = {
            let mut state = self.state();
            if let Some(hit) = state.cache.entries.get(&key).cloned() {
                drop(state);
                self.metrics.heavy_cache_hits.inc();
                return Ok(hit);
            }
            state.inflight.entry(key).or_default().clone()
        };
        let inflight = Inflight {
            gate: self,
            key,
            cell: Some(cell),
        };
        let mut built = false;
        let result = inflight
            .cell()
            .get_or_try_init(|| {
                built = true;
                build
            })
            .await
            .cloned();
        if !built {
            self.metrics.heavy_cache_hits.inc();
        }
        if let (true, Ok(bytes)) = (built, &result) {
            self.metrics.heavy_cache_misses.inc();
            let mut state = self.state();
            state.insert(key, bytes.clone(), self.config.cache_bytes);
            self.metrics.heavy_cache_bytes.set(state.cache.bytes as i64);
        }
        drop(inflight);
        result
    }

    /// Bytes of answers cached now.
    pub fn cached_bytes(&self) -> usize {
        self.state().cache.bytes
    }
}

impl State {
    fn insert(&mut self, key: Key, value: Bytes, budget: usize) {
        if value.len() > budget {
            return;
        }
        if let Some(old) = self.cache.entries.put(key, value.clone()) {
            self.cache.bytes -= old.len();
        }
        self.cache.bytes += value.len();
        while self.cache.bytes > budget {
            match self.cache.entries.pop_lru() {
                Some((_, old)) => self.cache.bytes -= old.len(),
                None => break,
            }
        }
    }
}

impl Admission {
    /// Runs `work` on the blocking pool, holding the admission until it returns (even if the
    /// caller stops waiting). `None` if it panicked.
    pub async fn run<T, F>(self, work: F) -> Option<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        tokio::task::spawn_blocking(move || {
            let _admission = self;
            work()
        })
        .await
        .ok()
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        // (The slot and the share go back as they drop, then the document's entry.)
        self.user.gate.metrics.heavy_running.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(per_node: usize, per_doc: usize, queue: usize, cache_bytes: usize) -> Arc<Gate> {
        Gate::new(
            GateConfig {
                per_node,
                per_doc,
                queue,
                wait: Duration::from_millis(200),
                cache_bytes,
                per_caller: 2,
            },
            Arc::new(Metrics::new()),
        )
    }

    fn key(doc: i64, seq: i64) -> Key {
        Key {
            doc,
            at: At::Position(seq),
            form: Form::Json,
        }
    }

    #[tokio::test]
    async fn a_document_over_its_share_waits_then_is_refused_while_others_go_on() {
        let gate = gate(4, 2, 8, 1 << 20);
        let a = gate.admit(1).await.expect("first");
        let b = gate.admit(1).await.expect("second");
        // A third waits for a share, in the queue; none comes free within `wait`: 429.
        assert!(matches!(gate.admit(1).await, Err(Refused::Document(_))));
        assert_eq!(gate.state().waiting, 0);
        // One that waits gets the share as soon as it is given back.
        let third = tokio::spawn({
            let gate = gate.clone();
            async move { gate.admit(1).await.map(drop) }
        });
        tokio::task::yield_now().await;
        drop(b);
        assert!(third.await.expect("joins").is_ok());
        let b = gate.admit(1).await.expect("second again");
        let other = gate
            .admit(2)
            .await
            .expect("another document is not held up");
        drop((a, other));
        let c = gate.admit(1).await.expect("a share was given back");
        drop((b, c));
        assert!(gate.state().per_doc.is_empty(), "counts return to zero");
    }

    #[tokio::test]
    async fn past_the_node_slots_callers_wait_a_bounded_time_in_a_bounded_queue() {
        let gate = gate(1, 8, 1, 1 << 20);
        let held = gate.admit(1).await.expect("the one slot");
        // One may wait; it gets the slot when it is given back.
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.admit(2).await.map(drop) }
        });
        tokio::task::yield_now().await;
        assert_eq!(gate.state().waiting, 1);
        // The queue is full: refused at once.
        assert!(matches!(gate.admit(3).await, Err(Refused::Node(_))));
        drop(held);
        assert!(waiter.await.expect("joins").is_ok());
        // Waiting longer than `wait` is refused too.
        let held = gate.admit(1).await.expect("the slot again");
        let late = gate.admit(2).await;
        assert!(matches!(late, Err(Refused::Node(_))), "{:?}", late.err());
        drop(held);
        assert!(gate.state().per_doc.is_empty());
        assert_eq!(gate.state().waiting, 0);
    }

    #[tokio::test]
    async fn a_caller_that_gives_up_while_it_waits_gives_its_places_back() {
        let gate = gate(1, 1, 1, 1 << 20);
        let held = gate.admit(1).await.expect("the one slot");
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.admit(2).await.map(drop) }
        });
        tokio::task::yield_now().await;
        assert_eq!(gate.state().waiting, 1);
        // The client hangs up: its request's future is dropped while it waits.
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(gate.state().waiting, 0, "its place in the queue is free");
        assert!(
            !gate.state().per_doc.contains_key(&2),
            "its document's entry is gone"
        );
        drop(held);
        gate.admit(2)
            .await
            .expect("document 2 is not held up")
            .run(|| ())
            .await;
    }

    #[tokio::test]
    async fn the_slot_is_held_until_the_blocking_work_ends() {
        let gate = gate(1, 1, 0, 1 << 20);
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let admission = gate.admit(1).await.expect("admitted");
        let work = tokio::spawn(admission.run(move || hold.recv().is_ok()));
        tokio::task::yield_now().await;
        // The caller gave up waiting; the work still runs and still holds the slot.
        work.abort();
        // (The queue holds none: both are refused at once.)
        assert!(gate.admit(1).await.is_err(), "the document's share is held");
        assert!(matches!(gate.admit(2).await, Err(Refused::Node(_))));
        release.send(()).expect("work waits");
        for _ in 0..200 {
            if gate.admit(2).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the slot was not given back");
    }

    #[test]
    fn the_single_flight_map_forgets_a_key_whose_readers_drop_together() {
        // A builder and a waiter of one computation dropped at the same moment on two
        // threads: each waits for the other at the end of its drop, so both have checked the
        // map before either is gone. Whichever checks last must find only the map's reference.
        let gate = gate(4, 4, 8, 1 << 20);
        *gate.dropped.lock().expect("not poisoned") = Some(Arc::new(std::sync::Barrier::new(2)));
        for round in 0..100 {
            let cell: Arc<OnceCell<Bytes>> = Arc::default();
            gate.state().inflight.insert(key(1, round), cell.clone());
            let readers = [cell.clone(), cell];
            let barrier = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                for cell in readers {
                    let (gate, barrier) = (&gate, &barrier);
                    s.spawn(move || {
                        let reader = Inflight {
                            gate,
                            key: key(1, round),
                            cell: Some(cell),
                        };
                        barrier.wait();
                        drop(reader);
                    });
                }
            });
            assert!(
                gate.state().inflight.is_empty(),
                "round {round}: the entry outlived its readers"
            );
        }
    }

    #[tokio::test]
    async fn readers_of_the_same_key_share_one_computation_and_the_cache_keeps_its_budget() {
        let gate = gate(4, 4, 8, 10);
        let builds = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (go, wait) = tokio::sync::watch::channel(false);
        let mut readers = Vec::new();
        for _ in 0..5 {
            let (gate, builds, mut wait) = (gate.clone(), builds.clone(), wait.clone());
            readers.push(tokio::spawn(async move {
                gate.cached(key(1, 7), async move {
                    builds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let _ = wait.wait_for(|go| *go).await;
                    Ok::<_, ()>(Bytes::from_static(b"12345"))
                })
                .await
            }));
        }
        tokio::task::yield_now().await;
        go.send(true).expect("readers wait");
        for r in readers {
            assert_eq!(r.await.expect("joins"), Ok(Bytes::from_static(b"12345")));
        }
        assert_eq!(builds.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Cached: no build.
        let again = gate.cached(key(1, 7), async { Err::<Bytes, ()>(()) }).await;
        assert_eq!(again, Ok(Bytes::from_static(b"12345")));
        // Two more answers of 5 bytes: the least recently used goes.
        let five = || async { Ok::<_, ()>(Bytes::from_static(b"abcde")) };
        gate.cached(key(1, 8), five()).await.expect("built");
        gate.cached(key(1, 9), five()).await.expect("built");
        assert_eq!(gate.cached_bytes(), 10);
        let rebuilt = gate.cached(key(1, 7), async { Err::<Bytes, ()>(()) }).await;
        assert_eq!(rebuilt, Err(()), "evicted, so built again (and failed)");
        // An answer larger than the budget is not kept.
        let big = || async { Ok::<_, ()>(Bytes::from(vec![0u8; 11])) };
        gate.cached(key(2, 1), big()).await.expect("built");
        assert_eq!(gate.cached_bytes(), 10);
        assert!(gate.state().inflight.is_empty());
    }
}
