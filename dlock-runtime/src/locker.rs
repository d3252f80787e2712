//! The handle users hold: configuration plus one backend connection.

use std::{
    fmt,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::Instrument as _;

use crate::{
    LockError, LockGuard, LockOptions,
    backend::{
        Attempt, Backend, FAIR_PREFIX, FENCE_PREFIX, FairOrder, Queued, Request, Token,
        memory::MemoryBackend,
    },
    config::{BackendKind, Settings},
    error::BackendError,
    guard::{Hold, far_future},
    options::Lease,
};

/// A connection to a lock service, with its defaults. Cheap to clone (an `Arc`); clones share
/// the connection. `Send + Sync`.
///
/// ```
/// # async fn demo() -> Result<(), dlock_runtime::LockError> {
/// use std::time::Duration;
/// use dlock_runtime::{LockOptions, Locker};
///
/// let locker = Locker::memory();
/// let guard = locker
///     .acquire("order:42", LockOptions::new().timeout(Duration::from_secs(1)))
///     .await?;
/// assert_eq!(guard.key(), "dlock:order:42");
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
/// # Behavior
/// - **Connection**: [`from_env`](Self::from_env) and the [builder](Self::builder) do no I/O; the
///   Redis connection is made on first use, multiplexed for every lock of this locker and its
///   clones, and re-established by itself after the server or the network drops it.
/// - **Waiting**: an acquisition tries at once, then sleeps a jittered pause (`DLOCK_RETRY`,
///   never longer than the holder's remaining lease nor past the deadline) between attempts; the
///   last attempt is made at the deadline. A timeout of zero makes exactly one attempt.
/// - **Ambiguous replies**: an attempt whose reply is lost keeps the same token, so the next
///   attempt recognises a lock it set itself; giving up removes such a lock.
/// - **Cancellation**: dropping an acquisition future leaves no lock behind.
/// - **Backend errors** while waiting are retried until the deadline; the last one is returned as
///   [`LockError::Backend`] when the deadline passes. A refusal that asking again cannot cure (a
///   permission the server's ACL denies, a lock key holding another type) fails at once.
/// - **Notifications**: a waiter refused once subscribes to the key's release channel (one
///   pub/sub connection per locker; a channel stays subscribed 2s after its last waiter) and is
///   woken by releases; the pause is the fallback.
/// - **Hot keys**: waiters of one key on one locker queue in-process (first come, first served)
///   and only the first asks the engine. On Redis and the embedded engine that first waiter holds
///   the process's place in the key's queue, kept for the waiters behind it: a release names the
///   place first in line, so it wakes one waiter of one process. In the default mode a free lock
///   still goes to whoever asks first; `fair` takes it only at the head of the queue.
/// - **Passing** (default mode, Redis and the embedded engine): a holder that releases while a
///   waiter of its locker is first in line passes the lock straight to that waiter, in one
///   request (a compare-and-set of the key to the waiter's token, with a new fence) instead of
///   deleting it and waking someone. At most 4 times in a row; then the release frees the key
///   and wakes the place first in the queue, so another process's waiters get their turn.
/// - **Re-entry**: inside a `#[dlock]` body or [`LockGuard::scope`], acquiring a key that scope
///   holds through this locker (or a clone) returns at once; nowhere else.
#[derive(Clone)]
pub struct Locker {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Settings,
    backend: Arc<dyn Backend>,
    lines: Lines,
    /// How the engine orders waiters, read once: on [`FairOrder::Queue`] waiters wait in the
    /// engine's queue of places; on [`FairOrder::Native`] (etcd, ZooKeeper) every attempt takes
    /// a place in the engine's own line, so a waiter holding one there must never also wait
    /// behind this process's other waiters here, or they would wait for each other: every waiter
    /// joins the in-process line before its first attempt there, as a fair one does everywhere.
    order: FairOrder,
    /// The engine can pass a hold straight to another acquisition ([`Backend::pass`]).
    passes: bool,
    /// Acquisitions under way: [`Locker::close`] waits for them to give up.
    acquiring: TaskTracker,
    /// Releases and cleanups handed to the runtime (a guard dropped, a wait dropped, a
    /// removal that outlasted its bound): [`Locker::close`] waits for them.
    background: TaskTracker,
    /// Cancelled by [`Locker::close`]: no acquisition starts, waits give up.
    closing: CancellationToken,
    /// The holds guards still have, for [`Locker::close`].
    holds: Holds,
}

/// The holds of a locker's guards, by number, so that [`Locker::close`] can release those
/// still held. A hold adds itself when it is made and goes when it is dropped.
#[derive(Default)]
struct Holds {
    map: std::sync::Mutex<std::collections::HashMap<u64, std::sync::Weak<Hold>>>,
    next: AtomicU64,
}

impl Holds {
    fn map(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, std::sync::Weak<Hold>>> {
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The in-process lines of waiters, one per contended key: the waiters of a key on one locker
/// queue here first come, first served, and only the first of them asks the engine, so a
/// release wakes one waiter per process instead of every one of them. On an engine with a queue
/// ([`FairOrder::Queue`]) a line also holds one place in the engine's queue for all its waiters
/// in turn: releases name the place first in line, so only that process's first waiter wakes.
#[derive(Default)]
struct Lines {
    map: std::sync::Mutex<std::collections::HashMap<String, Arc<Line>>>,
    /// How many lines there are: an uncontended acquisition reads this, not the map.
    open: AtomicUsize,
}

/// The waiters of one key on one locker.
struct Line {
    turns: tokio::sync::Semaphore,
    /// This line's place in the engine's queue, held for its waiters in turn.
    place: Token,
    /// The place may be in the engine's queue: set before every request that may queue it, and
    /// cleared only by a grant that gave it up.
    queued: AtomicBool,
    /// How the last waiter left: [`NOT_HANDED_ON`] (it gave up, or nobody left yet), or holding
    /// the lock, when it had heard this many release wake-ups plus one (see [`Turn::handed_on`]).
    handed_on: AtomicU64,
    /// Waiters in the line (the first one included); changed under the map's lock.
    members: AtomicUsize,
    /// The first waiter's offer to take the lock straight from a holder of this locker.
    baton: std::sync::Mutex<Option<Baton>>,
    /// Holds passed from one waiter of this line to the next in a row; a release passes only
    /// while there were fewer than [`MAX_PASSES`], then lets the lock go round the processes.
    passes: AtomicU32,
}

/// How many times in a row a hold goes straight to the next waiter of the same locker (see
/// [`Baton`]) before a release frees the key and wakes the place first in the engine's queue:
/// a process with a hot key keeps the lock for at most this many holds more while other
/// processes wait, so none starves.
const MAX_PASSES: u32 = 4;

/// The first waiter of a line, in the default mode on an engine that can pass a hold
/// ([`Backend::pass`]), offers to take the lock straight from the holder: a holder of the same
/// locker that releases while the offer stands makes the key the waiter's in one request (a
/// compare-and-set with a new fence) instead of deleting it, publishing a wake-up, and waiting
/// for the waiter's own attempt. The waiter withdraws its offer before each attempt of its own,
/// and once a holder took it, waits for that holder's answer instead: the key is never set for
/// a waiter that does not know it.
struct Baton {
    token: Token,
    lease: Duration,
    reply: tokio::sync::oneshot::Sender<Passed>,
}

/// A holder's answer to a [`Baton`].
enum Passed {
    /// The key is the waiter's, with this fence, since a request sent at `sent_at`.
    Held { fence: u64, sent_at: Instant },
    /// The holder no longer held it: nothing changed.
    Refused,
    /// The pass failed without an answer (or the holder gave up waiting for one): the key may
    /// be the waiter's.
    Unknown,
}

impl Line {
    fn baton(&self) -> std::sync::MutexGuard<'_, Option<Baton>> {
        self.baton
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Offers to take the lock from a holder of this locker; the answer comes on the receiver.
    fn offer(&self, token: &Token, lease: Duration) -> tokio::sync::oneshot::Receiver<Passed> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        *self.baton() = Some(Baton {
            token: token.clone(),
            lease,
            reply,
        });
        answer
    }

    /// Takes `token`'s offer back; `false` when a holder took it first (its answer is coming).
    fn withdraw(&self, token: &Token) -> bool {
        self.baton().take_if(|b| b.token == *token).is_some()
    }
}

/// [`Line::handed_on`] when the last waiter did not leave holding the lock, or its wake-ups were
/// not counted (it had no watch).
const NOT_HANDED_ON: u64 = 0;

impl Lines {
    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Arc<Line>>> {
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `key` has waiters in this process already (then it is hot: a new waiter goes
    /// behind them without asking the engine first).
    fn busy(&self, key: &str) -> bool {
        self.open.load(Ordering::Relaxed) > 0 && self.map().contains_key(key)
    }

    /// Waits (until `deadline`) to be first in `key`'s line; `None` when the deadline (or the
    /// locker's closing) came first.
    /// Dropping the future, or the turn, gives the place up at once. The turn says whether it
    /// had to wait for it.
    async fn turn<'a>(
        &self,
        locker: &'a Locker,
        key: &str,
        deadline: Instant,
    ) -> Result<Option<Turn<'a>>, LockError> {
        let line = {
            let mut lines = self.map();
            let line = match lines.get(key) {
                Some(line) => line.clone(),
                None => {
                    let line = Arc::new(Line {
                        turns: tokio::sync::Semaphore::new(1),
                        place: Token::generate()?,
                        queued: AtomicBool::new(false),
                        handed_on: AtomicU64::new(NOT_HANDED_ON),
                        members: AtomicUsize::new(0),
                        baton: std::sync::Mutex::new(None),
                        passes: AtomicU32::new(0),
                    });
                    lines.insert(key.to_owned(), line.clone());
                    self.open.store(lines.len(), Ordering::Relaxed);
                    line
                }
            };
            line.members.fetch_add(1, Ordering::Relaxed);
            line
        };
        let mut turn = Turn {
            locker,
            key: key.to_owned(),
            line,
            permit: false,
            waited: false,
            leaving_holder: None,
            departed: false,
        };
        // The permit is given back by hand when the turn is dropped.
        turn.permit = turn.line.turns.try_acquire().map(|p| p.forget()).is_ok();
        if turn.permit {
            return Ok(Some(turn));
        }
        let line = turn.line.clone();
        let permit = tokio::select! {
            permit = tokio::time::timeout_at(deadline, line.turns.acquire()) => permit,
            () = locker.inner.closing.cancelled() => return Ok(None),
        };
        match permit {
            Ok(Ok(permit)) => permit.forget(),
            _ => return Ok(None),
        }
        turn.permit = true;
        turn.waited = true;
        Ok(Some(turn))
    }

    /// The offer of `key`'s first waiter to take the lock from a holder (see [`Baton`]), unless
    /// the line had its [`MAX_PASSES`] in a row.
    fn baton(&self, key: &str) -> Option<Baton> {
        if self.open.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let line = self.map().get(key)?.clone();
        if line.passes.load(Ordering::Acquire) >= MAX_PASSES {
            return None;
        }
        line.baton().take()
    }
}

/// Being first in a key's line; the next waiter's turn comes when it is dropped. The last one to
/// leave removes the line, and its place in the engine's queue.
struct Turn<'a> {
    locker: &'a Locker,
    key: String,
    line: Arc<Line>,
    /// Holds the line's one permit (forgotten when taken, given back on drop).
    permit: bool,
    /// Others were ahead: the lock may have changed hands meanwhile.
    waited: bool,
    /// Leaves holding the lock, having heard this many release wake-ups (`Some(None)`: it had
    /// no watch to count them).
    leaving_holder: Option<Option<u64>>,
    /// It left the line already ([`depart`](Self::depart)).
    departed: bool,
}

impl Turn<'_> {
    /// Others wait behind this one in the line (the place is worth keeping).
    fn others_waiting(&self) -> bool {
        self.line.members.load(Ordering::Relaxed) > 1
    }

    /// When the waiter before this one took the lock and kept the line's place in the engine's
    /// queue: how many release wake-ups it had heard then. Until this process hears another,
    /// there is nothing to ask (the lock is held here, and the place waits in the queue).
    fn handed_on(&self) -> Option<u64> {
        let heard = self.line.handed_on.load(Ordering::Acquire);
        (self.waited && heard != NOT_HANDED_ON && self.line.queued.load(Ordering::Acquire))
            .then(|| heard - 1)
    }
}

impl Turn<'_> {
    /// Leaves the line (the next waiter's turn comes); when this was its last waiter and the
    /// line's place may be in the engine's queue, the place, which must leave it.
    fn depart(&mut self) -> Option<Token> {
        if std::mem::replace(&mut self.departed, true) {
            return None;
        }
        if std::mem::take(&mut self.permit) {
            let handed_on = match self.leaving_holder {
                Some(Some(heard)) => heard.saturating_add(1),
                _ => NOT_HANDED_ON,
            };
            self.line.handed_on.store(handed_on, Ordering::Release);
            self.line.turns.add_permits(1);
        }
        let lines = &self.locker.inner.lines;
        let last = {
            let mut map = lines.map();
            let last = self.line.members.fetch_sub(1, Ordering::Relaxed) == 1;
            if last {
                map.remove(&self.key);
                lines.open.store(map.len(), Ordering::Relaxed);
            }
            last
        };
        // Nobody here waits any more: the place leaves the engine's queue.
        (last && self.line.queued.load(Ordering::Acquire)).then(|| self.line.place.clone())
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Some(place) = self.depart() {
            let (locker, key) = (self.locker.clone(), std::mem::take(&mut self.key));
            self.locker.spawn_background(None, async move {
                if let Err(error) = locker.backend().leave_queue(&key, &place).await {
                    tracing::debug!(key = %key, error = %error, "leaving the queue failed; the place lapses on its own");
                }
            });
        }
    }
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.inner.settings;
        f.debug_struct("Locker")
            .field("backend", &s.backend)
            .field("key_prefix", &s.key_prefix)
            .field("timeout", &s.timeout)
            .field("expire", &s.expire)
            .finish_non_exhaustive()
    }
}

impl Locker {
    /// Builds a locker from the `DLOCK_*` environment variables, without any I/O.
    ///
    /// # Errors
    /// [`LockError::Config`] naming the variable whose value is invalid.
    pub fn from_env() -> Result<Self, LockError> {
        LockerBuilder::from_env()?.build()
    }

    /// A locker on a new, private embedded table: locks exclude each other among this locker and
    /// its clones only. For tests and single-process programs.
    #[must_use]
    pub fn memory() -> Self {
        Self::with_backend(
            Settings {
                backend: BackendKind::Memory,
                ..Settings::default()
            },
            Arc::new(MemoryBackend::default()),
        )
    }

    /// A builder starting from the built-in defaults (not the environment; see
    /// [`LockerBuilder::from_env`]).
    pub fn builder() -> LockerBuilder {
        LockerBuilder::default()
    }

    fn with_backend(settings: Settings, backend: Arc<dyn Backend>) -> Self {
        Self {
            inner: Arc::new(Inner {
                settings,
                order: backend.fair_order(),
                passes: backend.passes(),
                backend,
                lines: Lines::default(),
                acquiring: TaskTracker::new(),
                background: TaskTracker::new(),
                closing: CancellationToken::new(),
                holds: Holds::default(),
            }),
        }
    }

    /// Closes the locker, and every clone of it, for a clean exit: a program that calls this
    /// before it ends leaves nothing in the engine.
    ///
    /// 1. No acquisition starts any more ([`LockError::Closed`]), and those waiting give up
    ///    with `Closed` once they removed what they had put in the engine.
    /// 2. What guards still hold is released; those holds count as lost (a `#[dlock]` body
    ///    still running under one is stopped, as on any loss, unless `on_lost = "continue"`).
    /// 3. Releases and cleanups handed to the background (dropped guards and waits) finish.
    /// 4. What the engine keeps for this client ends: the ZooKeeper session, etcd leases.
    ///
    /// All of it within about five request timeouts (`DLOCK_REQUEST_TIMEOUT`, at least 1s);
    /// calling it again does nothing more.
    ///
    /// ```
    /// # async fn demo() -> Result<(), dlock_runtime::LockError> {
    /// use dlock_runtime::{LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let guard = locker.acquire("nightly-report", LockOptions::new()).await?;
    /// // … the job …
    /// drop(guard); // its release goes to the background…
    /// locker.close().await?; // …and is done when this returns.
    /// assert!(locker.acquire("nightly-report", LockOptions::new()).await.unwrap_err().is_closed());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Backend`] when something could not be removed within the bound (a server
    /// down): it then lapses on the engine with its lease or session.
    pub async fn close(&self) -> Result<(), LockError> {
        let inner = &self.inner;
        let bound = (inner.settings.request_timeout * 5).max(Duration::from_secs(1));
        let deadline = Instant::now() + bound;
        inner.closing.cancel();
        inner.acquiring.close();
        let waits_ended = tokio::time::timeout_at(deadline, inner.acquiring.wait())
            .await
            .is_ok();
        let holds: Vec<Arc<Hold>> = inner
            .holds
            .map()
            .values()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        for hold in holds {
            self.spawn_background(None, async move {
                if let Err(error) = hold.close().await {
                    tracing::warn!(key = %hold.key(), error = %error, "closing the locker: the release failed; the lease will free the lock");
                }
            });
        }
        inner.background.close();
        let background_ended = tokio::time::timeout_at(deadline, inner.background.wait())
            .await
            .is_ok();
        let engine = tokio::time::timeout_at(deadline, self.backend().close()).await;
        let left = match engine {
            Ok(Ok(())) if waits_ended && background_ended => return Ok(()),
            Ok(Ok(())) => format!(
                "{} acquisitions and {} releases or cleanups were still under way after {bound:?}",
                inner.acquiring.len(),
                inner.background.len()
            ),
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!("the engine's session or leases did not end within {bound:?}"),
        };
        tracing::warn!(left = %left, "closing the locker: what could not be removed lapses with its lease or session");
        Err(LockError::Backend(BackendError::new(format!(
            "closing the locker: {left}"
        ))))
    }

    /// One round trip to the engine, for a check at start-up or a readiness probe: `Ok` with
    /// how long it took when the engine answers with these credentials (Redis `PING` on the
    /// locks' connection, a majority of RedLock's masters, an etcd read of the key prefix, a
    /// ZooKeeper look at the root, PostgreSQL `SELECT 1`). Bounded by two request timeouts.
    ///
    /// ```
    /// # async fn demo() -> Result<(), dlock_runtime::LockError> {
    /// let locker = dlock_runtime::Locker::memory();
    /// let round_trip = locker.ping().await?;
    /// assert!(round_trip < std::time::Duration::from_secs(1));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Backend`] when the engine does not answer in time or refuses;
    /// [`LockError::Closed`] (with an empty key) after [`close`](Self::close).
    pub async fn ping(&self) -> Result<Duration, LockError> {
        if self.is_closing() {
            return Err(LockError::Closed { key: String::new() });
        }
        let started = Instant::now();
        let bound = self.inner.settings.request_timeout * 2;
        match tokio::time::timeout(bound, self.backend().ping()).await {
            Ok(Ok(())) => Ok(started.elapsed()),
            Ok(Err(error)) => Err(LockError::Backend(error)),
            Err(_) => Err(LockError::Backend(BackendError::new(format!(
                "the engine did not answer a ping within {bound:?}"
            )))),
        }
    }

    /// Whether [`close`](Self::close) was called.
    fn is_closing(&self) -> bool {
        self.inner.closing.is_cancelled()
    }

    /// Runs `task` on `runtime` (or the current one), counted by [`close`](Self::close); `None`
    /// when there is no runtime to run it on.
    pub(crate) fn spawn_background<T: Send + 'static>(
        &self,
        runtime: Option<&tokio::runtime::Handle>,
        task: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Option<tokio::task::JoinHandle<T>> {
        let runtime = runtime
            .cloned()
            .or_else(|| tokio::runtime::Handle::try_current().ok())?;
        Some(self.inner.background.spawn_on(task, &runtime))
    }

    pub(crate) fn next_hold_id(&self) -> u64 {
        self.inner.holds.next.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn register_hold(&self, id: u64, hold: &Arc<Hold>) {
        self.inner.holds.map().insert(id, Arc::downgrade(hold));
    }

    pub(crate) fn forget_hold(&self, id: u64) {
        self.inner.holds.map().remove(&id);
    }

    /// The configured prefix of every lock key (`DLOCK_KEY_PREFIX`).
    #[must_use]
    pub fn key_prefix(&self) -> &str {
        &self.inner.settings.key_prefix
    }

    pub(crate) fn backend(&self) -> &dyn Backend {
        &*self.inner.backend
    }

    /// Waits for the lock on `key` (the configured prefix is put in front) and returns a guard
    /// that releases it when dropped or [released](LockGuard::release).
    ///
    /// # Errors
    /// - [`LockError::Timeout`] when another holder kept it for the whole wait;
    /// - [`LockError::Backend`] when the server could not be reached until the deadline;
    /// - [`LockError::InvalidKey`] for an empty key or one longer than `DLOCK_MAX_KEY_LEN`
    ///   (nothing is sent);
    /// - [`LockError::Config`] for a zero lease, or `max_hold` without `expire_auto`.
    pub async fn acquire(&self, key: &str, options: LockOptions) -> Result<LockGuard, LockError> {
        self.acquire_full(self.full_key(key)?, options).await
    }

    /// [`acquire`](Self::acquire) with a key the caller made for it (the attribute's): its
    /// buffer becomes the full key.
    pub(crate) async fn acquire_owned(
        &self,
        key: String,
        options: LockOptions,
    ) -> Result<LockGuard, LockError> {
        self.acquire_full(self.full_key_from(key)?, options).await
    }

    async fn acquire_full(
        &self,
        full_key: String,
        options: LockOptions,
    ) -> Result<LockGuard, LockError> {
        let settings = &self.inner.settings;
        let timeout = options.timeout.unwrap_or(settings.timeout);
        let lease = options.lease.unwrap_or(Lease::Fixed(settings.expire));
        let lease_len = match lease {
            Lease::Fixed(d) => d,
            Lease::Auto => settings.expire,
        };
        crate::options::check_lease(lease_len)?;
        if options.max_hold.is_some() && lease != Lease::Auto {
            // A fixed lease already ends on its own; a ceiling on renewal would be ignored.
            return Err(LockError::config(
                "max_hold: only a renewed lease (`expire_auto`) has a ceiling to set",
            ));
        }
        if let Some(guard) = self.reenter(&full_key) {
            return Ok(guard);
        }
        if self.is_closing() {
            return Err(LockError::Closed { key: full_key });
        }
        // Counted until it returns (or is dropped): `close` waits for it to give up.
        let _acquiring = self.inner.acquiring.token();
        if options.fair
            && let FairOrder::Unsupported(why) = self.inner.order
        {
            return Err(LockError::config(format!("fair: {why}")));
        }
        let span = tracing::debug_span!("dlock.acquire", key = %full_key, name = options.name, ?timeout, expire = ?lease);
        self.wait_for(full_key, timeout, lease, lease_len, &options)
            .instrument(span)
            .await
    }

    /// One attempt: the guard when the lock was free, `None` when it is held.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), except that a busy lock is `Ok(None)`.
    pub async fn try_acquire(
        &self,
        key: &str,
        expire: Duration,
    ) -> Result<Option<LockGuard>, LockError> {
        match self
            .acquire(
                key,
                LockOptions::new().timeout(Duration::ZERO).expire(expire),
            )
            .await
        {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Two attempts with one token, as when the first attempt's reply was lost and the wait
    /// tried again: the first attempt's fence (which its caller never learnt) and the guard of
    /// the second. For the shared semantic suite, through `__private`.
    pub(crate) async fn attempt_twice(
        &self,
        key: &str,
        lease: Duration,
    ) -> Result<(u64, LockGuard), LockError> {
        crate::options::check_lease(lease)?;
        let key = self.full_key(key)?;
        let token = Token::generate()?;
        let request = Request {
            key: &key,
            token: &token,
            lease,
            queue: None,
        };
        let Attempt::Acquired { fence: first, .. } = self.backend().acquire(request).await? else {
            return Err(LockError::Timeout {
                key,
                waited: Duration::ZERO,
            });
        };
        let sent_at = Instant::now();
        let Attempt::Acquired {
            fence,
            granted,
            lost,
        } = self.backend().acquire(request).await?
        else {
            return Err(LockError::Lost { key });
        };
        let lease = granted.unwrap_or(lease);
        let hold = Hold::new(self.clone(), key, token, fence, sent_at, lease, None);
        hold.follow_engine(lost);
        Ok((first, LockGuard::new(hold, Lease::Fixed(lease), None)))
    }

    pub(crate) fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// A further guard when an enclosing scope of this task (a locked body, or
    /// [`LockGuard::scope`]) holds `key` through this locker.
    fn reenter(&self, key: &str) -> Option<LockGuard> {
        let hold = crate::scope::scoped_hold(self, key)?;
        if !hold.reenter() {
            return None;
        }
        tracing::debug!(key = %key, fencing_token = hold.fence(), "lock re-entered by its holder");
        Some(LockGuard::reentered(hold))
    }

    fn full_key(&self, key: &str) -> Result<String, LockError> {
        self.check_key(key)?;
        let prefix = &self.inner.settings.key_prefix;
        let mut full = String::with_capacity(prefix.len() + key.len());
        full.push_str(prefix);
        full.push_str(key);
        self.engine_accepts(full)
    }

    /// [`full_key`](Self::full_key) made in `key`'s own buffer (no allocation when it has room
    /// for the prefix).
    fn full_key_from(&self, mut key: String) -> Result<String, LockError> {
        self.check_key(&key)?;
        key.insert_str(0, &self.inner.settings.key_prefix);
        self.engine_accepts(key)
    }

    /// The full key, unless the engine cannot store it.
    fn engine_accepts(&self, full: String) -> Result<String, LockError> {
        match self.backend().key_error(&full) {
            Some(reason) => {
                let key = &full[self.inner.settings.key_prefix.len()..];
                Err(LockError::invalid_key(key, reason))
            }
            None => Ok(full),
        }
    }

    /// The rules for a key, before its prefix.
    fn check_key(&self, key: &str) -> Result<(), LockError> {
        let settings = &self.inner.settings;
        if key.is_empty() {
            return Err(LockError::invalid_key(key, "the key is empty"));
        }
        let len = settings.key_prefix.len() + key.len();
        if len > settings.max_key_len {
            return Err(LockError::invalid_key(
                key,
                format!(
                    "the key is {len} bytes with its prefix; the longest accepted is {} (DLOCK_MAX_KEY_LEN)",
                    settings.max_key_len
                ),
            ));
        }
        // dlock's own keys: the fencing counters (`<prefix>__fence:{tag}`) and fair mode's
        // queues (`<prefix>__fair:{…}…`). A lock key must not be one.
        if [FENCE_PREFIX, FAIR_PREFIX]
            .iter()
            .any(|p| key.starts_with(p))
        {
            return Err(LockError::invalid_key(
                key,
                format!(
                    "keys starting with `{FENCE_PREFIX}` or `{FAIR_PREFIX}` (after the prefix) are \
                     reserved for dlock's own bookkeeping"
                ),
            ));
        }
        Ok(())
    }

    async fn wait_for(
        &self,
        key: String,
        timeout: Duration,
        lease: Lease,
        lease_len: Duration,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        let settings = &self.inner.settings;
        let token = Token::generate()?;
        let started = Instant::now();
        let deadline = started.checked_add(timeout).unwrap_or_else(far_future);
        let fair = options.fair;
        // Declared before the cleanup, so that a dropped wait withdraws its offer to take the
        // lock (see `Baton`) while it is still first in line: every wait withdraws its offer
        // before its turn goes, so the next waiter never finds one in the line.
        let mut turn = None;
        let mut orphan = OrphanCleanup {
            runtime: tokio::runtime::Handle::try_current().ok(),
            locker: self,
            key,
            token,
            armed: false,
            baton: None,
        };
        let (key, token) = (&orphan.key, &orphan.token);
        // On an engine with a queue, a waiter first in its line waits in the queue through the
        // line's place; a fair waiter takes the lock only at the head of the queue.
        let queue_engine = self.inner.order == FairOrder::Queue;
        let liveness = waiter_liveness(settings);
        // A waiter's release wake-up: armed before its first attempt when it waits in line from
        // the start, else after its first refusal (then it tries again at once: the release may
        // have come before the wake-up was armed). An uncontended acquisition asks for none, and
        // a single attempt needs none.
        let mut watch = None;
        let mut watch_asked = !settings.notify || timeout.is_zero();
        // The in-process line (see `Lines`): a fair waiter joins it before its first attempt
        // (even a single attempt: it asks from the line's place, so it never passes the queue),
        // and so does any waiter on an engine with its own line (`Inner::order`) or of a key that
        // has waiters here already; otherwise a waiter joins after its first refusal, so an
        // uncontended acquisition pays one atomic read for it.
        let lines = &self.inner.lines;
        // A first waiter in line offers to take the lock straight from a holder of this locker
        // (see `Baton`); `passed` is the holder's answer, once it came.
        let offers = !fair && self.inner.passes;
        let mut passed = None;
        // The waiter before this one took the lock, having heard this many release wake-ups:
        // nothing to ask until another comes.
        let mut handed_on = None;
        let native_line = self.inner.order == FairOrder::Native;
        if fair || (!timeout.is_zero() && (native_line || lines.busy(key))) {
            match lines.turn(self, key, deadline).await? {
                Some(first) => {
                    handed_on = first.handed_on().filter(|_| queue_engine);
                    // The waiters ahead subscribed, most likely: arm from that (no I/O).
                    if !watch_asked {
                        watch = self.backend().watching(key, token);
                        watch_asked = watch.is_some();
                    }
                    turn = Some(first);
                }
                None => return Err(orphan.timed_out(started, options.name)),
            }
        }
        let mut attempts: u32 = 0;
        let mut last_error = None;
        loop {
            // The offer is withdrawn before anything else; when a holder took it, its answer is
            // awaited instead (the key may be this waiter's by now).
            let mut late = false;
            if passed.is_none()
                && let Some((line, answer)) = orphan.baton.as_mut()
                && !line.withdraw(token)
            {
                passed = Some(answer.await.unwrap_or(Passed::Unknown));
                // An answer after the deadline ends the wait unless it is the lock: no attempt
                // is made after the deadline.
                late = Instant::now() > deadline;
            }
            orphan.baton = None;
            match passed.take() {
                Some(Passed::Held { fence, sent_at }) => {
                    tracing::debug!(attempts, waited = ?started.elapsed(), fencing_token = fence, "lock passed by a holder of this locker");
                    if let Some(t) = &turn {
                        t.line.passes.fetch_add(1, Ordering::AcqRel);
                    }
                    let heard = watch.as_ref().map(crate::backend::Watch::heard);
                    let grant = (fence, sent_at, lease_len, None);
                    return Ok(self.holding(turn, orphan, heard, grant, lease, options));
                }
                // The holder had lost it; or the pass may have made the key this waiter's,
                // which its next attempt recognises (and giving up removes).
                Some(Passed::Refused) | None => {}
                Some(Passed::Unknown) => orphan.armed = true,
            }
            if late || self.is_closing() {
                break;
            }
            // Armed before the request, so a release published while it is in flight still wakes us.
            let notify = watch.as_ref().map(crate::backend::Watch::notify);
            let mut notified = std::pin::pin!(notify.as_deref().map(tokio::sync::Notify::notified));
            if let Some(notified) = notified.as_mut().as_pin_mut() {
                notified.enable();
            }
            // Quiet only while no release was heard since the hand-off (read after arming, so a
            // release from now on wakes this waiter).
            let quiet = handed_on
                .take()
                .zip(watch.as_ref())
                .is_some_and(|(at, watch)| watch.heard() == at);
            let holder_ttl = if quiet {
                None
            } else {
                attempts += 1;
                let queue = turn.as_ref().filter(|_| queue_engine).map(|t| Queued {
                    place: &t.line.place,
                    liveness,
                    keep: t.others_waiting(),
                    strict: fair,
                });
                if let (Some(t), Some(_)) = (&turn, queue) {
                    t.line.queued.store(true, Ordering::Release);
                }
                let (in_queue, gives_up_place) = (queue.is_some(), queue.is_some_and(|q| !q.keep));
                let request = Request {
                    key,
                    token,
                    lease: lease_len,
                    queue,
                };
                let sent_at = Instant::now();
                // Until a definite answer arrives, the request may have set the key. A waiter
                // whose own token holds a place in line (an engine with a line) always leaves it
                // when it gives up.
                let was_armed = orphan.armed;
                orphan.armed = true;
                match self.backend().acquire(request).await {
                    Ok(Attempt::Acquired {
                        fence,
                        granted,
                        lost,
                    }) => {
                        let waited = started.elapsed();
                        tracing::debug!(attempts, ?waited, fencing_token = fence, "lock acquired");
                        if let Some(t) = &turn {
                            t.line.passes.store(0, Ordering::Release);
                            if gives_up_place {
                                t.line.queued.store(false, Ordering::Release);
                            }
                        }
                        let heard = watch.as_ref().map(crate::backend::Watch::heard);
                        let grant = (fence, sent_at, granted.unwrap_or(lease_len), lost);
                        return Ok(self.holding(turn, orphan, heard, grant, lease, options));
                    }
                    Ok(Attempt::Held { ttl, queued }) => {
                        // A definite "not ours" clears nothing an earlier lost reply may have
                        // set; a place in line of this token is given up with the wait.
                        orphan.armed = was_armed || (queued && !in_queue);
                        last_error = None;
                        if turn.is_none() && !timeout.is_zero() {
                            // Wait behind this process's other waiters of the key, then try at
                            // once: the lock may have changed hands meanwhile.
                            match lines.turn(self, key, deadline).await? {
                                Some(first) if first.waited => {
                                    handed_on = first.handed_on().filter(|_| queue_engine);
                                    turn = Some(first);
                                    // The waiters ahead subscribed already: arm from that (no
                                    // I/O) and skip the subscription's covering attempt.
                                    if !watch_asked {
                                        watch = self.backend().watching(key, token);
                                        watch_asked = watch.is_some();
                                    }
                                    continue;
                                }
                                Some(first) => {
                                    turn = Some(first);
                                    if queue_engine {
                                        // Not in the engine's queue yet: arm the wake-up, then
                                        // join the queue with the next attempt.
                                        if !watch_asked {
                                            watch_asked = true;
                                            watch = self.wake_up(key, token).await;
                                        }
                                        continue;
                                    }
                                    // First in line at once: this refusal stands; wait as usual.
                                }
                                None => break,
                            }
                        }
                        if !watch_asked && Instant::now() < deadline {
                            // Arm the wake-up on the first refusal, then try again at once: the
                            // release may have come before it was armed.
                            watch_asked = true;
                            watch = self.wake_up(key, token).await;
                            if watch.is_some() {
                                continue;
                            }
                        }
                        ttl
                    }
                    Err(error) if error.is_refused() => {
                        // Asking again cannot help (a permission, a key of another type): say so
                        // now. The cleanup stays armed: a script refused half-way may have set
                        // the key.
                        last_error = Some(error);
                        break;
                    }
                    Err(error) => {
                        // Said once, when the wait gives up (an outage is one line per
                        // failed acquisition, not one per attempt).
                        tracing::debug!(error = %error, "lock backend error; retrying until the deadline");
                        last_error = Some(error);
                        None
                    }
                }
            };
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            // A watch on this waiter's predecessor signals every change that matters: the pause
            // is then only a slow safety net, not a poll.
            let (min, max) = match &watch {
                Some(watch) if watch.is_reliable() => (RELIABLE_WATCH_PAUSE, RELIABLE_WATCH_PAUSE),
                _ => settings.retry,
            };
            let mut pause = jitter(min, max).min(deadline - now);
            if let Some(ttl) = holder_ttl {
                pause = pause.min(ttl.max(Duration::from_millis(1)));
            }
            // A release wakes us at once; the pause is the fallback (an expired lease publishes
            // nothing) and never outlasts the holder's lease nor the deadline.
            let wake_at = Instant::now() + pause;
            // Who a release must name for this waiter to look: its line's place in the queue;
            // anyone, on an engine without one.
            let me = turn
                .as_ref()
                .filter(|_| queue_engine)
                .map(|t| &t.line.place);
            if offers && let Some(t) = &turn {
                orphan.baton = Some((t.line.clone(), t.line.offer(token, lease_len)));
            }
            let answer = &mut orphan.baton;
            let mut answer = std::pin::pin!(async move {
                match answer {
                    Some((_, answer)) => answer.await.unwrap_or(Passed::Unknown),
                    None => std::future::pending().await,
                }
            });
            let mut sleep = std::pin::pin!(tokio::time::sleep_until(wake_at));
            // Closing ends the pause; the loop then gives up.
            let mut closing = std::pin::pin!(self.inner.closing.cancelled());
            passed = 'wait: {
                match (notified.as_mut().as_pin_mut(), &watch, &notify) {
                    (Some(first), Some(watch), Some(notify)) => {
                        let mut woken = tokio::select! {
                            () = &mut sleep => false,
                            () = first => true,
                            answer = &mut answer => break 'wait Some(answer),
                            () = &mut closing => break 'wait None,
                        };
                        // A release names the place first in line: the others keep waiting
                        // instead of all asking at once.
                        while woken
                            && let Some(me) = me
                            && !watch.may_be_for(me)
                        {
                            let mut again = std::pin::pin!(notify.notified());
                            again.as_mut().enable();
                            if watch.may_be_for(me) {
                                break;
                            }
                            woken = tokio::select! {
                                () = &mut sleep => false,
                                () = again => true,
                                answer = &mut answer => break 'wait Some(answer),
                                () = &mut closing => break 'wait None,
                            };
                        }
                        None
                    }
                    _ => tokio::select! {
                        () = &mut sleep => None,
                        answer = &mut answer => Some(answer),
                        () = &mut closing => None,
                    },
                }
            };
        }
        // What the wait put in the engine goes before it returns: a lock an ambiguous attempt
        // may have set, its place in line, the line's place in the queue when it was the last
        // waiter here. The offer is withdrawn while the waiter is still first in line.
        let (key, token) = orphan.give_up();
        let place = turn.as_mut().and_then(Turn::depart);
        drop(turn);
        // One event per failed acquisition, saying what it left to lapse, if anything.
        let left = self.remove_leftovers(&key, token, place, lease_len).await;
        let left = left.as_deref();
        let waited = started.elapsed();
        let name = options.name;
        if self.is_closing() {
            tracing::debug!(key = %key, name, attempts, ?waited, left, "lock wait ended: the locker was closed");
            return Err(LockError::Closed { key });
        }
        match last_error {
            Some(error) if error.is_refused() => {
                tracing::error!(key = %key, name, attempts, ?waited, error = %error, left, "lock backend refused the acquisition");
                Err(LockError::Backend(error))
            }
            Some(error) => {
                tracing::error!(key = %key, name, attempts, ?waited, error = %error, left, "lock backend unreachable until the deadline");
                Err(LockError::Backend(error))
            }
            None if left.is_some() => {
                tracing::warn!(key = %key, name, attempts, ?waited, left, "lock wait timed out; what it left in the engine lapses on its own");
                Err(LockError::Timeout { key, waited })
            }
            None => {
                tracing::info!(key = %key, name, attempts, ?waited, "lock wait timed out");
                Err(LockError::Timeout { key, waited })
            }
        }
    }
}

impl Locker {
    /// The guard of the hold a wait got, `grant` being its fence, the instant the request that
    /// set it was sent, its lease and the engine's loss signal. The waiter leaves its line
    /// holding the lock, having heard `heard` release wake-ups: the next waiter there asks
    /// nothing until another comes (or a pass does).
    fn holding(
        &self,
        turn: Option<Turn<'_>>,
        orphan: OrphanCleanup<'_>,
        heard: Option<u64>,
        grant: (u64, Instant, Duration, Option<crate::backend::LossSignal>),
        lease: Lease,
        options: &LockOptions,
    ) -> LockGuard {
        let (fence, sent_at, lease_len, lost) = grant;
        if let Some(mut t) = turn {
            t.leaving_holder = Some(heard);
        }
        let (key, token) = orphan.disarm();
        let hold = Hold::new(
            self.clone(),
            key,
            token,
            fence,
            sent_at,
            lease_len,
            options.name,
        );
        hold.follow_engine(lost);
        LockGuard::new(hold, lease, options.max_hold)
    }

    /// Releases `token`'s hold of `key`, or passes it straight to the first waiter of the key
    /// on this locker when that waiter offered to take it (see [`Baton`]). `Ok(false)` when
    /// `token` no longer held the key (nothing changed).
    pub(crate) async fn let_go(&self, key: &str, token: &Token) -> Result<bool, BackendError> {
        let Some(Baton {
            token: next,
            lease,
            reply,
        }) = self.inner.lines.baton(key)
        else {
            return self.backend().release(key, token).await;
        };
        let sent_at = Instant::now();
        let (answer, outcome) = match self.backend().pass(key, token, &next, lease).await {
            Ok(Some(fence)) => {
                tracing::debug!(key = %key, fencing_token = fence, "lock passed to the next waiter of this locker");
                (Passed::Held { fence, sent_at }, Ok(true))
            }
            Ok(None) => (Passed::Refused, Ok(false)),
            Err(error) => (Passed::Unknown, Err(error)),
        };
        if let Err(Passed::Held { .. } | Passed::Unknown) = reply.send(answer) {
            // The waiter left meanwhile: what it may have been given goes.
            spawn_release(None, self.clone(), key.to_owned(), next, false);
        }
        outcome
    }

    /// Removes what a wait that gives up left in the engine (`token`'s lock or place in line,
    /// the line's `place` in the queue) before the wait returns, within two request timeouts.
    /// When the removal fails, or takes longer, what is left lapses on its own (a removal still
    /// under way goes on in the background): said in the returned text, for the wait's event.
    async fn remove_leftovers(
        &self,
        key: &str,
        token: Option<Token>,
        place: Option<Token>,
        lease: Duration,
    ) -> Option<String> {
        if token.is_none() && place.is_none() {
            return None;
        }
        let (locker, owned_key) = (self.clone(), key.to_owned());
        let removal = self.spawn_background(None, async move {
            let backend = locker.backend();
            let release = async {
                match &token {
                    Some(token) => backend.release(&owned_key, token).await.map(drop),
                    None => Ok(()),
                }
            };
            let leave = async {
                match &place {
                    Some(place) => backend.leave_queue(&owned_key, place).await,
                    None => Ok(()),
                }
            };
            let (released, left) = tokio::join!(release, leave);
            released.and(left)
        });
        let lapses_within = self.backend().lapses_within(lease);
        let Some(removal) = removal else {
            return Some(format!(
                "no runtime to remove its entries; they lapse within {lapses_within:?}"
            ));
        };
        let bound = self.inner.settings.request_timeout * 2;
        let why = match tokio::time::timeout(bound, removal).await {
            Ok(Ok(Ok(()))) => return None,
            Ok(Ok(Err(error))) => format!("could not remove its entries ({error})"),
            Ok(Err(_)) => "the removal of its entries stopped".to_owned(),
            Err(_) => format!("the removal of its entries goes on after {bound:?}"),
        };
        Some(format!("{why}; they lapse within {lapses_within:?}"))
    }

    /// A release wake-up for `key`: a subscription already up (no I/O), or else a new one.
    async fn wake_up(&self, key: &str, token: &Token) -> Option<crate::backend::Watch> {
        match self.backend().watching(key, token) {
            Some(watch) => Some(watch),
            None => self.backend().watch(key, token).await,
        }
    }
}

/// Removes a lock that an attempt with a lost reply may have set, when the wait gives up or is
/// dropped. Compare-and-delete by token, so it never touches another holder's lock.
struct OrphanCleanup<'a> {
    /// The runtime the wait runs on, for a cleanup when the wait is dropped elsewhere.
    runtime: Option<tokio::runtime::Handle>,
    locker: &'a Locker,
    key: String,
    token: Token,
    armed: bool,
    /// The wait's standing offer to take the lock from a holder (see [`Baton`]), and where the
    /// answer comes.
    baton: Option<(Arc<Line>, tokio::sync::oneshot::Receiver<Passed>)>,
}

impl OrphanCleanup<'_> {
    /// Withdraws the wait's offer to take the lock from a holder; when a holder took it
    /// already, the key may be this waiter's: the cleanup is armed.
    fn withdraw_offer(&mut self) {
        if let Some((line, mut answer)) = self.baton.take()
            && !line.withdraw(&self.token)
        {
            // A holder took the offer. After `close` its answer either came, or will not come
            // (its send fails, and it removes what it gave); either way the key may be this
            // waiter's unless the holder said it changed nothing.
            answer.close();
            if !matches!(answer.try_recv(), Ok(Passed::Refused)) {
                self.armed = true;
            }
        }
    }

    /// The wait gives up: the key, and the token whose lock must be released when the engine
    /// may hold something of it.
    fn give_up(mut self) -> (String, Option<Token>) {
        self.withdraw_offer();
        let armed = std::mem::take(&mut self.armed);
        let (key, token) = self.disarm();
        (key, armed.then_some(token))
    }

    fn cleanup_now(&mut self) {
        self.withdraw_offer();
        if std::mem::take(&mut self.armed) {
            spawn_release(
                self.runtime.as_ref(),
                self.locker.clone(),
                self.key.clone(),
                self.token.clone(),
                false,
            );
        }
    }

    /// The timeout of a wait that never got its turn in the in-process line: no request was
    /// sent, nothing is left to clean.
    fn timed_out(self, started: Instant, name: Option<&'static str>) -> LockError {
        let closing = self.locker.is_closing();
        let (key, _) = self.disarm();
        if closing {
            return LockError::Closed { key };
        }
        tracing::info!(key = %key, name, waited = ?started.elapsed(), "lock wait timed out in the in-process line");
        LockError::Timeout {
            key,
            waited: started.elapsed(),
        }
    }

    /// Hands the key and token on (to a guard, or to an error) with nothing left to clean.
    fn disarm(mut self) -> (String, Token) {
        self.armed = false;
        (
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.token),
        )
    }
}

impl Drop for OrphanCleanup<'_> {
    fn drop(&mut self) {
        self.cleanup_now();
    }
}

/// Hands a compare-and-delete to `runtime` (the one the lock was taken on), or else to the
/// current one; the lease is the backstop when there is none. A hold's release (`hold`) may
/// pass the lock to a waiter instead ([`Locker::let_go`]).
pub(crate) fn spawn_release(
    runtime: Option<&tokio::runtime::Handle>,
    locker: Locker,
    key: String,
    token: Token,
    hold: bool,
) {
    let (background, warn_key) = (locker.clone(), key.clone());
    let spawned = background.spawn_background(runtime, async move {
        let released = if hold {
            locker.let_go(&key, &token).await
        } else {
            locker.backend().release(&key, &token).await
        };
        if let Err(error) = released {
            tracing::error!(key = %key, error = %error, "lock release after drop failed; the lease will free it");
        }
    });
    if spawned.is_none() {
        tracing::warn!(key = %warn_key, "no tokio runtime to release the lock on; the lease will free it");
    }
}

/// How long a fair waiter keeps its place in the queue without trying again: several of its
/// longest pauses plus the longest a slow attempt and subscription can take (four request
/// timeouts), so only a waiter that is gone loses its place.
fn waiter_liveness(settings: &Settings) -> Duration {
    (settings.retry.1 * 4 + settings.request_timeout * 4).max(Duration::from_millis(250))
}

/// The fallback pause of a waiter whose wake-up is a watch on its predecessor in line.
const RELIABLE_WATCH_PAUSE: Duration = Duration::from_secs(1);

/// A uniformly random pause in `min..=max`.
fn jitter(min: Duration, max: Duration) -> Duration {
    let span = u64::try_from((max - min).as_micros()).unwrap_or(u64::MAX);
    let r = getrandom::u64().unwrap_or(0);
    min + Duration::from_micros(if span == 0 { 0 } else { r % (span + 1) })
}

/// Sets everything by code. Start from the built-in defaults with [`Locker::builder`], or from
/// the environment with [`LockerBuilder::from_env`].
///
/// ```
/// use std::time::Duration;
/// use dlock_runtime::Locker;
///
/// let locker = Locker::builder()
///     .redis_url("redis://127.0.0.1:6379")
///     .key_prefix("shop:")
///     .timeout(Duration::from_secs(2))
///     .expire(Duration::from_secs(10))
///     .build()?;
/// # Ok::<(), dlock_runtime::LockError>(())
/// ```
#[derive(Clone, Default)]
#[must_use]
pub struct LockerBuilder {
    settings: Settings,
    url: Option<String>,
    /// `memory()` by code makes a private table; `DLOCK_BACKEND=memory` shares the process's.
    private_memory: bool,
}

impl fmt::Debug for LockerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockerBuilder")
            .field("settings", &self.settings)
            .field(
                "url",
                &self.url.as_deref().map(crate::config::RedisUrl::redact),
            )
            .finish_non_exhaustive()
    }
}

impl LockerBuilder {
    /// Starts from the `DLOCK_*` environment (see the crate docs for the table).
    ///
    /// # Errors
    /// [`LockError::Config`] naming the first invalid variable.
    pub fn from_env() -> Result<Self, LockError> {
        Ok(Self {
            settings: Settings::from_lookup(|name| std::env::var(name).ok())?,
            url: None,
            private_memory: false,
        })
    }

    /// The engine and its address, chosen by the URL's scheme (as `DLOCK_URL`):
    /// `redis://[user[:password]@]host[:port][/db]`, `rediss://…` (feature `tls`),
    /// `redis+cluster://[user:password@]h1:p1,h2:p2` (feature `redis-cluster`),
    /// `redis+sentinel://[user:password@]s1:p1,s2:p2/<master>` (feature `redis-sentinel`),
    /// `redis+redlock://[user:password@]h1:p1,h2:p2,h3:p3` (`rediss+redlock`; feature `redlock`:
    /// an odd number of at least 3 independent masters, and a request timeout at most a fifth
    /// of the lease), `postgres://[user[:password]@]host[:port]/dbname` or `postgresql://…`
    /// (feature `postgres`), `zk://h1:p1,h2:p2[/chroot]` (feature `zookeeper`), or
    /// `memory://` (the process's shared embedded table). Checked by [`build`](Self::build).
    /// Default: `redis://127.0.0.1:6379`.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// Use Redis at this URL (`redis://[user[:password]@]host[:port][/db]`); the same as
    /// [`url`](Self::url), which also takes the other engines' URLs.
    pub fn redis_url(self, url: impl Into<String>) -> Self {
        self.url(url)
    }

    /// Use a new private embedded table instead of a server.
    pub fn memory(mut self) -> Self {
        self.settings.backend = BackendKind::Memory;
        self.url = None;
        self.private_memory = true;
        self
    }

    /// Prefix of every lock key. Default: `dlock:`.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.settings.key_prefix = prefix.into();
        self
    }

    /// Default wait. Default: 5s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// Default lease, and the lease renewed by `expire = "auto"`. Default: 30s.
    pub fn expire(mut self, expire: Duration) -> Self {
        self.settings.expire = expire;
        self
    }

    /// Bounds of the jittered pause between attempts. Default: 10ms..50ms.
    pub fn retry(mut self, min: Duration, max: Duration) -> Self {
        self.settings.retry = (min, max);
        self
    }

    /// Longest key accepted, prefix included, in bytes. Default: 1024.
    pub fn max_key_len(mut self, max: usize) -> Self {
        self.settings.max_key_len = max;
        self
    }

    /// Bound on one backend request (a reply later than this is a failed, ambiguous attempt).
    /// Default: 500ms.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.settings.request_timeout = timeout;
        self
    }

    /// Wake waiters by release notifications (Redis pub/sub; in-process for memory) instead of
    /// only polling. Default: on (`DLOCK_NOTIFY=off` turns it off).
    pub fn notify(mut self, on: bool) -> Self {
        self.settings.notify = on;
        self
    }

    /// An acquisition counts only once this many replicas acknowledged it (Redis `WAIT`, within
    /// the request timeout); with fewer it is undone and the attempt fails with a
    /// [`LockError::Backend`] saying so, retried until the deadline. Redis, Sentinel and Cluster.
    /// Default: 0, off (`DLOCK_REDIS_WAIT`).
    pub fn redis_wait(mut self, replicas: u32) -> Self {
        self.settings.redis_wait = replicas;
        self
    }

    /// The session timeout asked of ZooKeeper (`zk://` URLs): the longest a crashed or paused
    /// holder keeps its lock, and the longest a lost connection lasts without losing the holds.
    /// Default: 10s (`DLOCK_ZK_SESSION_TIMEOUT`).
    pub fn zk_session_timeout(mut self, timeout: Duration) -> Self {
        self.settings.zk_session_timeout = timeout;
        self
    }

    /// Checks the settings and builds the locker, without any I/O.
    ///
    /// # Errors
    /// [`LockError::Config`] for an invalid URL, a zero lease, an empty retry range, or a prefix
    /// as long as the key limit.
    pub fn build(mut self) -> Result<Locker, LockError> {
        if let Some(url) = self.url.take() {
            self.settings.backend = crate::url::parse("LockerBuilder::url", &url)?;
        }
        self.settings.validate()?;
        let backend: Arc<dyn Backend> = match &self.settings.backend {
            BackendKind::Memory if self.private_memory => Arc::new(MemoryBackend::default()),
            BackendKind::Memory => Arc::new(MemoryBackend::shared()),
            #[cfg(feature = "redlock")]
            BackendKind::RedLock(_) => Arc::new(
                crate::backend::redlock::RedLockBackend::from_settings(&self.settings)?,
            ),
            #[cfg(feature = "postgres")]
            BackendKind::Postgres(_) => Arc::new(
                crate::backend::postgres::PostgresBackend::from_settings(&self.settings)?,
            ),
            #[cfg(feature = "etcd")]
            BackendKind::Etcd(_) => Arc::new(crate::backend::etcd::EtcdBackend::from_settings(
                &self.settings,
            )?),
            #[cfg(feature = "zookeeper")]
            BackendKind::ZooKeeper(_) => Arc::new(
                crate::backend::zookeeper::ZooKeeperBackend::from_settings(&self.settings)?,
            ),
            #[cfg(feature = "redis")]
            _ => Arc::new(crate::backend::redis::RedisBackend::from_settings(
                &self.settings,
            )?),
            #[cfg(not(feature = "redis"))]
            _ => {
                return Err(LockError::config(
                    "DLOCK_BACKEND: `redis` needs dlock-runtime's `redis` feature",
                ));
            }
        };
        Ok(Locker::with_backend(self.settings, backend))
    }
}

static GLOBAL: OnceLock<Locker> = OnceLock::new();

/// The process-wide locker used by `#[dlock]` functions without `client = …`: the one installed
/// by [`set_global`], or else one built from the environment on first use.
///
/// # Errors
/// [`LockError::Config`] when the environment is invalid (reported on every use until fixed).
pub fn global() -> Result<&'static Locker, LockError> {
    if let Some(locker) = GLOBAL.get() {
        return Ok(locker);
    }
    let locker = Locker::from_env()?;
    Ok(GLOBAL.get_or_init(|| locker))
}

/// Installs the process-wide locker. Call it before the first locked call.
///
/// # Errors
/// Gives the locker back when one is already installed (or was already built from the
/// environment by an earlier [`global`]).
pub fn set_global(locker: Locker) -> Result<(), Locker> {
    GLOBAL.set(locker)
}
