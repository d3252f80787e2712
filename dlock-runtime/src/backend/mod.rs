//! The backends behind one trait. A backend knows nothing of waiting, leases on the client's
//! clock or guards: it answers single requests, each atomic on the server.

use std::{any::Any, fmt, future::Future, pin::Pin, sync::Arc, time::Duration};

use tokio::sync::Notify;

use crate::error::BackendError;

#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod memory;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(feature = "redlock")]
pub(crate) mod redlock;
#[cfg(feature = "zookeeper")]
pub(crate) mod zookeeper;

/// What follows the key prefix in the names of the fencing counters; lock keys may not start so.
pub(crate) const FENCE_PREFIX: &str = "__fence:";
/// What follows the key prefix in the names of fair mode's queue keys; lock keys may not start so.
pub(crate) const FAIR_PREFIX: &str = "__fair:";

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The answer to one acquisition attempt.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// The lock is ours (newly, or already from an earlier attempt whose reply was lost: then
    /// with a new fence).
    Acquired {
        /// Greater than every fence handed out for this key before.
        fence: u64,
        /// The lease the engine granted when it differs from the one asked for (etcd rounds up to
        /// whole seconds); the guard's lease clock counts this one.
        granted: Option<Duration>,
        /// Resolves when the engine itself learns the hold is gone (etcd's watch on the holder
        /// key, a ZooKeeper session expiry); the hold is then lost at once.
        lost: Option<LossSignal>,
    },
    /// Someone else holds it, or is ahead in line.
    Held {
        /// The holder's remaining lease, when the engine knows it.
        ttl: Option<Duration>,
        /// The engine keeps a place in line for this token (Redis fair mode's queue, etcd's and
        /// ZooKeeper's waiter nodes): a wait that gives up must release it.
        queued: bool,
    },
}

impl Attempt {
    /// A plain grant: this fence, the lease asked for, no loss signal of the engine's own.
    pub(crate) fn acquired(fence: u64) -> Self {
        Self::Acquired {
            fence,
            granted: None,
            lost: None,
        }
    }
}

/// A future that resolves when the engine reports a hold lost.
pub(crate) struct LossSignal(pub(crate) BoxFuture<'static, ()>);

impl fmt::Debug for LossSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LossSignal")
    }
}

/// How an engine serves `fair` acquisitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(
    dead_code,
    reason = "`Native` is for etcd and ZooKeeper, `Unsupported` for RedLock"
)]
pub(crate) enum FairOrder {
    /// A queue of places the engine keeps when a [`Request`] asks for one (Redis, memory).
    Queue,
    /// Every waiter holds a place in line by construction (etcd revisions, ZooKeeper
    /// sequence numbers): `fair` changes nothing.
    Native,
    /// The engine cannot promise an order: a `fair` acquisition is a configuration error.
    Unsupported(&'static str),
}

/// One acquisition attempt.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request<'a> {
    pub(crate) key: &'a str,
    pub(crate) token: &'a Token,
    pub(crate) lease: Duration,
    /// A place in the key's queue, on an engine that keeps one ([`FairOrder::Queue`]): the
    /// attempt joins the queue (or refreshes its place) when it does not get the lock.
    pub(crate) queue: Option<Queued<'a>>,
}

/// How an attempt waits in the engine's queue ([`FairOrder::Queue`]). Releases name the place
/// first in line, so only the waiters of that place wake.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Queued<'a> {
    /// Who holds the place: the in-process line of the waiter's locker, which keeps one place
    /// for the waiters of the key in that process, in turn.
    pub(crate) place: &'a Token,
    /// A place not refreshed by an attempt within this long counts as gone.
    pub(crate) liveness: Duration,
    /// On success, keep the place (moved to the back of the queue): more waiters of this
    /// process wait behind this one.
    pub(crate) keep: bool,
    /// Take the lock only when the place is first in the queue (fair mode). Otherwise take it
    /// whenever it is free: the queue then only says whom a release wakes.
    pub(crate) strict: bool,
}

/// One lock service. Every engine (Redis, Cluster, Sentinel, the embedded table, and those to
/// come) is one implementation; the waiting loop, the lease clock, renewal and the guard are
/// the locker's and the same for all.
///
/// - `acquire`: take the key for `token` if it is free (and, for a strict [`Queued`] request or
///   on an engine with a line, its place is first) or already ours; otherwise say so, with the
///   holder's remaining lease when known, and whether the engine keeps a place in line (the
///   request's [`Queued::place`], or `token`'s own on an engine with a line). A key left
///   without expiry is given one (the TTL recheck) where the engine can have such keys.
/// - `release`: give up `token`'s hold, or its place in line on an engine with a line (deleting
///   nothing of anyone else's; `false` when it held nothing), and wake the key's waiters: on an
///   engine with a queue, by naming the place now first in it.
/// - `leave_queue`: take a [`Queued::place`] out of the key's queue (its process has no more
///   waiters), waking the place then first; engines without a queue have nothing to do.
/// - `pass`: hand `from`'s hold straight to `to`, another acquisition of the same process,
///   without freeing the key (a compare-and-set, with a new fence); engines that can say so in
///   `passes`.
/// - `extend`: reset the lease only while `token` holds the key; never re-creates it.
/// - `watch`: a wake-up for when `token` may have become first (any release of the key, or the
///   deletion of `token`'s predecessor on an engine with a line), shared by this client's
///   waiters where it can be; `None` when the engine cannot give one now (waiters poll).
///   `watching`: the same when it needs no I/O.
pub(crate) trait Backend: Send + Sync + 'static {
    fn acquire<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Attempt, BackendError>>;

    fn release<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<bool, BackendError>>;

    fn leave_queue<'a>(
        &'a self,
        _key: &'a str,
        _place: &'a Token,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn watch<'a>(&'a self, key: &'a str, token: &'a Token) -> BoxFuture<'a, Option<Watch>>;

    /// A wake-up for `key` that is in place already (no I/O), so a waiter armed with it before
    /// its first attempt misses no release; `None` otherwise.
    fn watching(&self, _key: &str, _token: &Token) -> Option<Watch> {
        None
    }

    fn extend<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>>;

    /// Whether [`pass`](Self::pass) is implemented.
    fn passes(&self) -> bool {
        false
    }

    /// While `from` holds `key`, makes it `to`'s for `lease`, in one atomic step and without a
    /// wake-up (the key was never free): the new hold's fence, greater than every earlier one;
    /// `None` (nothing changed) when `from` does not hold it. Called only when
    /// [`passes`](Self::passes).
    fn pass<'a>(
        &'a self,
        _key: &'a str,
        _from: &'a Token,
        _to: &'a Token,
        _lease: Duration,
    ) -> BoxFuture<'a, Result<Option<u64>, BackendError>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    /// How `fair` acquisitions are served.
    fn fair_order(&self) -> FairOrder {
        FairOrder::Queue
    }

    /// Why the engine cannot store the full lock key `key` (longer than its index holds),
    /// checked before any request is sent: the acquisition fails with `InvalidKey`.
    fn key_error(&self, _key: &str) -> Option<String> {
        None
    }

    /// How long an entry that could not be removed (a waiter's place, a lock set by an attempt
    /// whose reply was lost) stays in the engine at most, for an acquisition with `lease`:
    /// said in the warning when the removal fails.
    fn lapses_within(&self, lease: Duration) -> Duration {
        lease
    }

    /// One round trip to the engine (a readiness check): it answers, with these credentials.
    fn ping(&self) -> BoxFuture<'_, Result<(), BackendError>>;

    /// Ends what the engine keeps for this client (a ZooKeeper session, etcd leases), once
    /// every hold is released and every cleanup done ([`Locker::close`](crate::Locker::close)).
    fn close(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// What the release wake-ups of one key said, shared by the key's waiters: whom the last one
/// named (the place first in line, or anyone), and how many there have been, so that a waiter
/// can tell whether one came since it last looked.
#[derive(Clone, Default)]
pub(crate) struct NextInLine(Arc<std::sync::Mutex<Heard>>);

#[derive(Default)]
struct Heard {
    next: Option<String>,
    count: u64,
}

impl NextInLine {
    fn heard_mut(&self) -> std::sync::MutexGuard<'_, Heard> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a wake-up naming `next` (8 hex digits of a place), or anyone; call before waking
    /// the key's waiters.
    pub(crate) fn heard(&self, next: Option<&str>) {
        let mut heard = self.heard_mut();
        heard.next = next.map(str::to_owned);
        heard.count += 1;
    }
}

/// The release wake-ups of an engine whose releases reach this process as messages naming a
/// key (the embedded table, PostgreSQL's `NOTIFY`): one entry per key, alive while a waiter
/// holds its [`Watch`].
#[derive(Default)]
pub(crate) struct Watchers(
    std::sync::Mutex<std::collections::HashMap<String, (std::sync::Weak<Notify>, NextInLine)>>,
);

impl fmt::Debug for Watchers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watchers").finish_non_exhaustive()
    }
}

impl Watchers {
    fn map(
        &self,
    ) -> std::sync::MutexGuard<
        '_,
        std::collections::HashMap<String, (std::sync::Weak<Notify>, NextInLine)>,
    > {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A wake-up for releases of `key`, shared with the key's other waiters.
    pub(crate) fn register(&self, key: &str) -> Watch {
        let mut watchers = self.map();
        // Dead entries go now and then, so the map stays as small as the keys waited for.
        if watchers.len() >= 1024 && watchers.len().is_power_of_two() {
            watchers.retain(|_, (notify, _)| notify.strong_count() > 0);
        }
        let live = watchers
            .get(key)
            .and_then(|(notify, next)| Some((notify.upgrade()?, next.clone())));
        let (notify, next) = live.unwrap_or_else(|| {
            let notify = Arc::new(Notify::new());
            let next = NextInLine::default();
            watchers.insert(key.to_owned(), (Arc::downgrade(&notify), next.clone()));
            (notify, next)
        });
        Watch::new(notify, next, ())
    }

    /// Wakes the waiters of `key` (of every key when `None`), telling them whom the release
    /// named.
    pub(crate) fn wake(&self, key: Option<&str>, next: Option<&str>) {
        let watchers = self.map();
        let wake = |(notify, named): &(std::sync::Weak<Notify>, NextInLine)| {
            if let Some(notify) = notify.upgrade() {
                named.heard(next);
                notify.notify_waiters();
            }
        };
        match key {
            None => watchers.values().for_each(wake),
            Some(key) => watchers.get(key).into_iter().for_each(wake),
        }
    }

    /// Whether any waiter holds a wake-up.
    #[cfg(feature = "postgres")]
    pub(crate) fn anyone_waits(&self) -> bool {
        self.map()
            .values()
            .any(|(notify, _)| notify.strong_count() > 0)
    }
}

/// A registration for release wake-ups of one key; dropping it unregisters.
pub(crate) struct Watch {
    notify: Arc<Notify>,
    next: NextInLine,
    /// Every moment the waiter may have become first is signalled (a watch on its predecessor):
    /// the waiting loop's fallback pause can be long.
    reliable: bool,
    _registration: Box<dyn Any + Send + Sync>,
}

impl Watch {
    pub(crate) fn new(
        notify: Arc<Notify>,
        next: NextInLine,
        registration: impl Any + Send + Sync,
    ) -> Self {
        Self {
            notify,
            next,
            reliable: false,
            _registration: Box::new(registration),
        }
    }

    /// Marks the wake-up as covering every change that matters to this waiter, as a watch on
    /// its predecessor in line does: the waiting loop then polls only as a slow fallback.
    #[allow(dead_code, reason = "for the engines with a line (etcd, ZooKeeper)")]
    pub(crate) fn reliable(mut self) -> Self {
        self.reliable = true;
        self
    }

    pub(crate) fn is_reliable(&self) -> bool {
        self.reliable
    }

    pub(crate) fn notify(&self) -> Arc<Notify> {
        self.notify.clone()
    }

    /// Whether the last wake-up may be for `place`: it named no one, or it named `place` (by the
    /// first 8 hex digits: releases never publish a whole token or place).
    pub(crate) fn may_be_for(&self, place: &Token) -> bool {
        self.next
            .heard_mut()
            .next
            .as_deref()
            .is_none_or(|next| place.0.starts_with(next))
    }

    /// How many wake-ups of this key this process has heard: a waiter compares two readings to
    /// tell whether a release came in between.
    pub(crate) fn heard(&self) -> u64 {
        self.next.heard_mut().count
    }
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Watch")
    }
}

/// 128 bits from the OS random generator, read 32 tokens' worth at a time per thread: one
/// `getrandom` call per acquisition was a measurable part of an uncontended cycle's client CPU.
/// The buffer is dropped when the process id changes, so a forked child never repeats its
/// parent's tokens.
fn random_128() -> Result<[u8; 16], BackendError> {
    const TOKENS: usize = 32;
    struct Pool {
        pid: u32,
        used: usize,
        bytes: [u8; 16 * TOKENS],
    }
    thread_local! {
        static POOL: std::cell::RefCell<Pool> = const {
            std::cell::RefCell::new(Pool { pid: 0, used: TOKENS, bytes: [0; 16 * TOKENS] })
        };
    }
    POOL.with_borrow_mut(|pool| {
        let pid = std::process::id();
        if pool.used == TOKENS || pool.pid != pid {
            getrandom::fill(&mut pool.bytes)
                .map_err(|e| BackendError::new(format!("the OS random generator failed: {e}")))?;
            pool.pid = pid;
            pool.used = 0;
        }
        let start = pool.used * 16;
        let mut out = [0u8; 16];
        out.copy_from_slice(&pool.bytes[start..start + 16]);
        // Not left behind for a later reader of this memory.
        pool.bytes[start..start + 16].fill(0);
        pool.used += 1;
        Ok(out)
    })
}

/// 128 random bits from the OS generator, unique to one acquisition, as 32 hex digits.
/// `Debug` never shows it.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Token(String);

impl Token {
    pub(crate) fn generate() -> Result<Self, BackendError> {
        let bytes = random_128()?;
        let mut hex = String::with_capacity(32);
        for b in bytes {
            hex.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
            hex.push(char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0'));
        }
        Ok(Self(hex))
    }

    #[cfg(any(feature = "redis", feature = "postgres", test))]
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(***)")
    }
}

/// Milliseconds for a server lease, at least 1.
#[cfg(any(feature = "redis", feature = "postgres"))]
pub(crate) fn lease_millis(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::Token;

    #[test]
    fn tokens_are_128_bit_hex_and_distinct() {
        let a = Token::generate().unwrap();
        let b = Token::generate().unwrap();
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert_eq!(format!("{a:?}"), "Token(***)");
    }

    #[test]
    fn tokens_never_repeat_across_pool_refills_and_threads() {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    (0..500)
                        .map(|_| Token::generate().unwrap().0)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all = std::collections::HashSet::new();
        for t in threads {
            for token in t.join().unwrap() {
                assert_ne!(token, "0".repeat(32));
                assert!(all.insert(token), "a token repeated");
            }
        }
        assert_eq!(all.len(), 2000);
    }
}
