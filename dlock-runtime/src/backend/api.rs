//! What the core and an engine say to each other: the [`Backend`] trait an engine implements,
//! the requests and answers that cross it, the wake-ups of waiters, the tokens, and what an
//! engine's folder exports to the table of engines ([`Built`]).

use std::{any::Any, fmt, future::Future, pin::Pin, sync::Arc, time::Duration};

use tokio::{sync::Notify, time::Instant};

use crate::{
    LockError, LockInfo, LockKind, config::Settings, error::BackendError, lease::LossSignal,
    url::EngineUrl,
};

/// Makes an engine's backend from its URL and the common settings, without I/O.
pub(crate) type BuildFn = fn(&EngineUrl, &Settings) -> Result<Arc<dyn Backend>, LockError>;

/// The compiled part of an engine: its URL check, its build, its options.
pub(crate) struct Built {
    /// Checks a URL of this engine without I/O; `var` names where it came from.
    pub(crate) check: fn(var: &str, url: &str) -> Result<(), LockError>,
    /// The backend for `url` with the common `settings`; makes no connection.
    pub(crate) build: BuildFn,
    /// The options it reads from the URL's query.
    pub(crate) options: &'static [EngineOption],
}

/// An engine option: a query parameter of its URL, also set by an older environment variable
/// (kept as an alias) or a builder method when the URL does not give it.
pub(crate) struct EngineOption {
    /// The query parameter: `wait`, `session_timeout`.
    pub(crate) name: &'static str,
    /// The environment variable that sets it when the URL does not: `DLOCK_REDIS_WAIT`.
    pub(crate) var: &'static str,
    /// A valid value, for the docs and the tests: `1`, `10s`.
    #[allow(dead_code, reason = "read by the tests")]
    pub(crate) example: &'static str,
    /// Checks a value; the error says what is expected.
    pub(crate) check: fn(&str) -> Result<(), String>,
}

#[cfg_attr(
    not(feature = "__options"),
    allow(dead_code, reason = "for the engines with options")
)]
/// The value of option `name` for `url`: the URL's own query parameter, else what an alias
/// (environment variable or builder method) set; with where it came from, for errors.
pub(crate) fn option<'a>(
    url: &'a EngineUrl,
    settings: &'a Settings,
    name: &str,
) -> Option<(&'a str, String)> {
    match url.query_param(name) {
        Some(value) => Some((value, format!("DLOCK_URL's `{name}`"))),
        None => settings
            .engine_options
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, value, from)| (value.as_str(), (*from).to_owned())),
    }
}

/// What a waiter's release wake-up covers, which sets its fallback pause while it has one that
/// hears (see `pause_bounds` in the waiting loop).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WakeUp {
    /// No release wake-up that waiters can count on (the embedded engine's waiters are woken
    /// in-process): the pause stays `DLOCK_RETRY`.
    Partial,
    /// A release wakes the waiting place it names (the first live one in the key's queue), over
    /// a connection whose loss, and whose return, wakes every waiter (Redis, PostgreSQL; RedLock,
    /// whose releasing client names the place first in the first master's queue, and whose
    /// release that master missed is sent to it again and then names it): the pause covers
    /// a place first in line whose process is gone (until that place lapses) and the waiter's
    /// own place, so it can be longer (`NAMED_WATCH_PAUSE`), while the wake-up hears (its
    /// connection is up: see [`Watch::hears`]) and the last attempt did not fail (after failures
    /// in a row it backs off from `DLOCK_RETRY` to that pause). On RedLock it also covers a
    /// release that some of the other masters missed.
    #[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
    Named,
    /// A watch on the waiter's predecessor in line signals every moment it may have become
    /// first (etcd, ZooKeeper): the pause is a slow safety net.
    #[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
    Predecessor,
}

/// What an engine can do, read once by the locker.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Capabilities {
    /// How `fair` acquisitions are served.
    pub(crate) fair: FairOrder,
    /// A hold can go straight to another acquisition of this process ([`Backend::pass`]).
    pub(crate) passes: bool,
    /// What a waiter's release wake-up covers: how long its fallback pause may be once it has
    /// the wake-up.
    pub(crate) wake_up: WakeUp,
    /// Why a hold cannot outlive its holder ([`Backend::keep`]), on an engine where it cannot:
    /// `hold_at_least` is then a configuration error.
    pub(crate) cannot_keep: Option<&'static str>,
    /// Why the engine cannot hold a semaphore or a read/write lock safely, on an engine where
    /// it cannot: acquiring one is then a configuration error.
    pub(crate) cannot_share: Option<&'static str>,
    /// A mutex's waiting processes keep a place in a queue of the engine though it has no fair
    /// order to offer (RedLock: in the key's first master's), so that a release wakes the
    /// process it names rather than every waiting one.
    pub(crate) places: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            fair: FairOrder::Queue,
            passes: false,
            wake_up: WakeUp::Partial,
            cannot_keep: None,
            cannot_share: None,
            places: false,
        }
    }
}

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
        /// Fired when the engine itself learns the hold is gone (etcd's watch on the holder
        /// key, a ZooKeeper or etcd session's end, the engine's client-side `expire`, a
        /// PostgreSQL grant that could not be taken up in time); the hold
        /// is then lost at once.
        lost: Option<LossSignal>,
        /// When the engine's own clock for the hold started, where it counts the lease later
        /// than the request's send: ZooKeeper and etcd bound `expire` on the client from the
        /// grant's reply, after their session opened. The guard's lease clock starts there
        /// (never before the request was sent).
        counted_from: Option<Instant>,
    },
    /// Someone else holds it, or is ahead in line.
    Held {
        /// The holder's remaining lease, when the engine knows it.
        ttl: Option<Duration>,
        /// The engine keeps a place in line for this token (Redis fair mode's queue, etcd's and
        /// ZooKeeper's waiter nodes): a wait that gives up must release it.
        queued: bool,
    },
    /// The key is held as another kind of lock, or as a semaphore with another permit count:
    /// why, for [`LockError::Conflict`]. Nothing was taken.
    Conflict(String),
}

impl Attempt {
    /// A plain grant: this fence, the lease asked for, no loss signal of the engine's own.
    pub(crate) fn acquired(fence: u64) -> Self {
        Self::Acquired {
            fence,
            granted: None,
            lost: None,
            counted_from: None,
        }
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
    /// What is asked: the mutex, a permit, a read or a write hold.
    pub(crate) kind: LockKind,
    /// How long a waiting writer's claim on the key stays without another attempt (writers
    /// of a read/write lock keep new readers out while they wait).
    pub(crate) liveness: Duration,
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
    /// Join the queue, or refresh the place's deadline there, even when the key is held.
    /// `false` when this place is in the queue and was refreshed less than a quarter of
    /// `liveness` ago: an engine may then answer a held key by reading the lock alone (a woken
    /// waiter refused because the releasing process took the key again costs the server one
    /// read, not the queue's bookkeeping). A free key is always taken through the queue.
    pub(crate) refresh: bool,
}

/// One lock service. Every engine (Redis, Cluster, Sentinel, the embedded table, and those to
/// come) is one implementation; the waiting loop, the lease clock, renewal and the guard are
/// the locker's and the same for all.
///
/// Every hold has a kind ([`LockKind`]): the mutex, a semaphore's permit, a read or a write
/// hold. An engine keeps the shared kinds where it keeps its mutex, in the shape that kind has
/// there, and is told the kind again at each release, renewal and keep; a key held as one kind
/// refuses another ([`Attempt::Conflict`]).
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
///   `place`: the waiter's [`Queued::place`] when it waits from one (a mutex on an engine with
///   a queue): the releases that name that place are all it needs to hear, and an engine that
///   can deliver them to that place alone (Redis: a channel per place) spares the other
///   waiting processes. `watching`: the same when it needs no I/O.
pub(crate) trait Backend: Send + Sync + 'static {
    fn acquire<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Attempt, BackendError>>;

    fn release<'a>(
        &'a self,
        key: &'a str,
        kind: LockKind,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<bool, BackendError>>;

    fn leave_queue<'a>(
        &'a self,
        _key: &'a str,
        _place: &'a Token,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn watch<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
        place: Option<&'a Token>,
    ) -> BoxFuture<'a, Option<Watch>>;

    /// A wake-up for `key` that is in place already (no I/O), so a waiter armed with it before
    /// its first attempt misses no release; `None` otherwise.
    fn watching(&self, _key: &str, _token: &Token, _place: Option<&Token>) -> Option<Watch> {
        None
    }

    fn extend<'a>(
        &'a self,
        key: &'a str,
        kind: LockKind,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>>;

    /// Leaves `token`'s hold of `key` in place for `rest` more, renewed by nobody, and forgets
    /// it here: it then lapses on the engine's clock, whether or not this process lives (a job
    /// lock's `hold_at_least`). `false` when `token` does not hold the key. Engines whose
    /// holds cannot outlive their holder say why in
    /// [`cannot_keep`](Capabilities::cannot_keep). Only a mutex is kept.
    fn keep<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
        rest: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.extend(key, LockKind::Mutex, token, rest)
    }

    /// What the engine can do.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// While `from` holds `key`, makes it `to`'s for `lease`, in one atomic step (RedLock: one
    /// round, held by a majority) and without a wake-up (the key was never free): the new
    /// hold's fence, greater than every earlier one; `None` when `from` does not hold it, and
    /// nothing of `to`'s is left (RedLock releases what was left of `from`'s too). An error
    /// when `to` may hold something (its waiter removes it). Called only when the engine's
    /// [capabilities](Self::capabilities) say it passes.
    fn pass<'a>(
        &'a self,
        _key: &'a str,
        _from: &'a Token,
        _to: &'a Token,
        _lease: Duration,
    ) -> BoxFuture<'a, Result<Option<u64>, BackendError>> {
        Box::pin(std::future::ready(Ok(None)))
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

    /// What the engine records of `key`'s hold (the full key): its holder, fence, remaining
    /// lease and waiters where it can tell; `None` when `key` is free.
    fn inspect<'a>(&'a self, key: &'a str)
    -> BoxFuture<'a, Result<Option<LockInfo>, BackendError>>;

    /// The full keys of the locks held now whose full key starts with `prefix`, in no order.
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, BackendError>>;

    /// Frees `key` whoever holds it (an operator's forced release), waking its waiters: what it
    /// held, or `None` when it was free. Every later hold's fence is above the freed one's; the
    /// holder finds its hold gone at its next renewal (or at once, where the engine watches).
    fn force_release<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, BackendError>>;

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

    /// Whether the last wake-up may be for `place`: it named no one, or it named `place` (by the
    /// first 8 hex digits: releases never publish a whole token or place).
    pub(crate) fn names(&self, place: &Token) -> bool {
        self.heard_mut()
            .next
            .as_deref()
            .is_none_or(|next| place.0.starts_with(next))
    }

    /// How many wake-ups there have been.
    pub(crate) fn count(&self) -> u64 {
        self.heard_mut().count
    }

    /// Records a wake-up naming `next` (8 hex digits of a place), or anyone; call before waking
    /// the key's waiters.
    pub(crate) fn heard(&self, next: Option<&str>) {
        let mut heard = self.heard_mut();
        heard.next = next.map(str::to_owned);
        heard.count += 1;
    }
}

/// Whether a wake-up hears releases now (see [`Watch::hearing`]).
pub(crate) type Hearing = Arc<dyn Fn() -> bool + Send + Sync>;

/// A registration for release wake-ups of one key; dropping it unregisters.
pub(crate) struct Watch {
    notify: Arc<Notify>,
    next: NextInLine,
    /// `None`: it hears every release as long as it lives.
    hearing: Option<Hearing>,
    /// Its count of wake-ups is its own, not the key's (or the place's) that every waiter of
    /// it shares: no other waiter's reading compares with it.
    own_count: bool,
    _registration: Box<dyn Any + Send + Sync>,
}

impl Watch {
    /// A wake-up rung by `notify`; on an engine with a queue of places, `next` says whom each
    /// wake-up named (a fresh `NextInLine::default()` elsewhere: every wake-up is for anyone).
    pub(crate) fn new(
        notify: Arc<Notify>,
        next: NextInLine,
        registration: impl Any + Send + Sync,
    ) -> Self {
        Self {
            notify,
            next,
            hearing: None,
            own_count: false,
            _registration: Box::new(registration),
        }
    }

    /// The same wake-up, which hears releases only while `hearing` says so: a notification
    /// connection that dropped (it woke every waiter then) hears nothing until it is back, and
    /// a waiter that keeps it meanwhile asks at `DLOCK_RETRY` and for another wake-up.
    #[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
    pub(crate) fn hearing(mut self, hearing: Hearing) -> Self {
        self.hearing = Some(hearing);
        self
    }

    /// Whether releases reach this wake-up now.
    pub(crate) fn hears(&self) -> bool {
        self.hearing.as_ref().is_none_or(|hears| hears())
    }

    /// The same wake-up, counting its wake-ups on its own (a RedLock combination of the
    /// masters' wake-ups): [`heard`](Self::heard) says nothing to compare.
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(crate) fn counted_alone(mut self) -> Self {
        self.own_count = true;
        self
    }

    /// What [`hears`](Self::hears) asks, for a wake-up made of this one and others.
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(crate) fn hearing_of(&self) -> Option<Hearing> {
        self.hearing.clone()
    }

    pub(crate) fn notify(&self) -> Arc<Notify> {
        self.notify.clone()
    }

    /// Whether the last wake-up may be for `place` (see [`NextInLine::names`]).
    pub(crate) fn may_be_for(&self, place: &Token) -> bool {
        self.next.names(place)
    }

    /// How many wake-ups of this key this process has heard: a waiter compares two readings to
    /// tell whether a release came in between. `None` for a wake-up that counts on its own.
    pub(crate) fn heard(&self) -> Option<u64> {
        (!self.own_count).then(|| self.next.count())
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

/// Appends 128 fresh bits from the OS random generator (see [`random_128`]) to `out`, as 32
/// hex digits.
pub(crate) fn push_random_hex(out: &mut String) -> Result<(), BackendError> {
    push_hex(out, random_128()?);
    Ok(())
}

/// Appends `bytes` to `out` as lower-case hex, each byte's high digit first (written into an
/// array and appended once: a `push` per digit was most of a token's making, counted).
fn push_hex(out: &mut String, bytes: [u8; 16]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = [0u8; 32];
    for (pair, b) in hex.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0xf)];
    }
    out.push_str(std::str::from_utf8(&hex).expect("hex digits are ASCII"));
}

/// 128 random bits from the OS generator, unique to one acquisition, as 32 hex digits.
/// `Debug` never shows it.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Token(pub(super) String);

impl Token {
    pub(crate) fn generate() -> Result<Self, BackendError> {
        let mut hex = String::with_capacity(32);
        push_random_hex(&mut hex)?;
        Ok(Self(hex))
    }

    /// This token with its first 8 hex digits taken from `tag`: a locker's places in the
    /// engines' queues share them, as releases name a place by them (on Redis, on a channel of
    /// those digits).
    pub(crate) fn tagged(mut self, tag: &Token) -> Self {
        self.0.replace_range(..8, &tag.0[..8]);
        self
    }

    #[cfg(any(feature = "__token-lease", test))]
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
#[cfg(feature = "__token-lease")]
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
        assert!(
            a.as_str()
                .bytes()
                .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
        );
        assert_ne!(a, b);
        assert_eq!(format!("{a:?}"), "Token(***)");
    }

    #[test]
    fn hex_is_each_byte_high_digit_first_after_what_was_there() {
        let mut out = "x:".to_owned();
        let mut bytes = [0u8; 16];
        bytes[0] = 0x01;
        bytes[1] = 0xab;
        bytes[15] = 0xf0;
        super::push_hex(&mut out, bytes);
        assert_eq!(out, "x:01ab00000000000000000000000000f0");
    }

    #[test]
    fn bytes_are_written_as_lower_case_hex_high_digit_first() {
        let mut out = String::from("x");
        super::push_hex(
            &mut out,
            [
                0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xf0, 0x0f, 0x10, 0xa5, 0x5a, 0x00,
                0xff, 0x9c,
            ],
        );
        assert_eq!(out, "x0123456789abcdeff00f10a55a00ff9c");
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
