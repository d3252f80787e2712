//! Per-call options.

use std::time::Duration;

/// How one acquisition waits and how long it holds.
///
/// What is not set comes from the [`Locker`](crate::Locker)'s configuration
/// (`DLOCK_TIMEOUT`, `DLOCK_EXPIRE`, or the builder).
///
/// ```
/// use std::time::Duration;
/// use dlock_runtime::LockOptions;
///
/// let wait_then_hold = LockOptions::new()
///     .timeout(Duration::from_secs(2))
///     .expire(Duration::from_secs(10));
/// let try_once = LockOptions::new().timeout(Duration::ZERO);
/// let renewed = LockOptions::new().expire_auto().max_hold(Duration::from_secs(600));
/// let first_come_first_served = LockOptions::new().fair();
/// # let _ = (wait_then_hold, try_once, renewed, first_come_first_served);
/// ```
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct LockOptions {
    pub(crate) timeout: Option<Duration>,
    pub(crate) expire: Option<Expire>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) fair: bool,
    pub(crate) name: Option<&'static str>,
    pub(crate) hold_at_least: Option<Duration>,
    pub(crate) kind: LockKind,
}

/// What kind of lock an acquisition takes, or a held lock is ([`LockInfo::kind`](crate::LockInfo::kind)).
///
/// One key is one kind of lock: acquiring it as another kind while it is held (a mutex where
/// a semaphore is held, a semaphore with another permit count) fails with
/// [`LockError::Conflict`](crate::LockError::Conflict) instead of sharing it unsafely.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// One holder at a time. The default.
    #[default]
    Mutex,
    /// A permit of a counting semaphore: at most `permits` holders at once, each with its own
    /// lease ([`LockOptions::permits`]).
    #[non_exhaustive]
    Semaphore {
        /// How many holders the key admits at once.
        permits: u32,
    },
    /// A shared hold of a read/write lock: many readers at once, never beside a writer
    /// ([`LockOptions::read`]).
    Read,
    /// The exclusive hold of a read/write lock: one writer, no readers
    /// ([`LockOptions::write`]).
    Write,
}

impl LockKind {
    /// A semaphore of `permits` permits.
    #[must_use]
    pub fn semaphore(permits: u32) -> Self {
        Self::Semaphore { permits }
    }

    /// `true` for a mutex.
    #[must_use]
    pub fn is_mutex(self) -> bool {
        self == Self::Mutex
    }

    /// `true` for the kinds that several holders share: a semaphore's permits and read holds.
    #[must_use]
    pub fn is_shared(self) -> bool {
        matches!(self, Self::Semaphore { .. } | Self::Read)
    }
}

impl std::fmt::Display for LockKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Mutex => f.write_str("mutex"),
            Self::Semaphore { permits } => write!(f, "semaphore of {permits} permits"),
            Self::Read => f.write_str("read lock"),
            Self::Write => f.write_str("write lock"),
        }
    }
}

/// What `expire` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expire {
    /// A lease of this length, extended only by hand.
    Fixed(Duration),
    /// A lease of the locker's default length, renewed by a watchdog while held.
    Auto,
}

impl LockOptions {
    /// Options that take everything from the locker's configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long to wait for the lock. `Duration::ZERO` makes exactly one attempt (try-lock).
    /// Default: the locker's (`DLOCK_TIMEOUT`, 5s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// A fixed lease: the lock expires this long after it is taken unless released or
    /// [extended](crate::LockGuard::extend) first. Default: the locker's (`DLOCK_EXPIRE`, 30s).
    ///
    /// A zero lease is refused by [`Locker::acquire`](crate::Locker::acquire) with
    /// [`LockError::Config`](crate::LockError::Config).
    pub fn expire(mut self, lease: Duration) -> Self {
        self.expire = Some(Expire::Fixed(lease));
        self
    }

    /// A renewed lease: a watchdog extends it at a third of its length (the locker's default
    /// expire) while the guard lives, so a long critical section keeps the lock and a crashed
    /// process loses it within one lease.
    pub fn expire_auto(mut self) -> Self {
        self.expire = Some(Expire::Auto);
        self
    }

    /// Fair mode: waiters are served in turn instead of whoever retries first. A queue next to
    /// the lock key holds one place per waiting process (per locker), in the order they came;
    /// the lock goes to the process whose place is first, and that process's waiters take it in
    /// the order they came, one per turn of its place: with waiters p1 and p2 of one process
    /// and q1 of another, arriving in that order, the lock goes to p1, q1, p2. A waiter that gives up or is
    /// dropped leaves the queue at once; one that vanishes (a crashed process) is dropped from it
    /// once it has not tried again for a while (see the crate docs). Use it for every
    /// acquisition of a key or for none: a non-fair acquisition does not look at the queue.
    /// Default: off.
    pub fn fair(mut self) -> Self {
        self.fair = true;
        self
    }

    /// A name for this kind of lock in logs (and metrics): `#[dlock]` gives its key template,
    /// `order:<id>`. Choose one with few distinct values, never the full key, which the events
    /// carry anyway. Default: none.
    pub fn name(mut self, name: &'static str) -> Self {
        self.name = Some(name);
        self
    }

    /// With [`expire_auto`](Self::expire_auto): stop renewing this long after the lock was taken,
    /// so a hung task cannot hold a key forever. The hold is then lost when the last lease runs
    /// out. Default: no ceiling. Without `expire_auto`, acquiring fails with
    /// [`LockError::Config`](crate::LockError::Config).
    pub fn max_hold(mut self, ceiling: Duration) -> Self {
        self.max_hold = Some(ceiling);
        self
    }

    /// A job lock's minimum hold (ShedLock's `lockAtLeastFor`): the lock stays taken until at
    /// least this long after it was acquired, even when it is released (or its guard dropped,
    /// or its locker closed) sooner, and whether or not the process lives on after that: a
    /// release before then leaves the key held for the rest of that time, renewed by nobody,
    /// and returns at once. Another instance's run of the same schedule finds it taken and
    /// skips, instead of running the job twice because its clock is a little late. Passing to
    /// a waiter of the same locker waits for it too. A process that dies *while holding* the
    /// lock (before any release) frees it when its lease ends, as ever: give a lease at least
    /// as long as the minimum (ShedLock's `lockAtMostFor` ≥ `lockAtLeastFor`) when a crash
    /// must not shorten it.
    ///
    /// At most [`MAX_LEASE`](crate::MAX_LEASE). On ZooKeeper, whose lock nodes end with their
    /// session, acquiring fails with [`LockError::Config`](crate::LockError::Config). Default:
    /// none.
    ///
    /// ```
    /// # async fn demo() -> Result<(), dlock_runtime::LockError> {
    /// use std::time::Duration;
    /// use dlock_runtime::{LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let once = || {
    ///     LockOptions::new()
    ///         .timeout(Duration::ZERO)
    ///         .hold_at_least(Duration::from_secs(60))
    /// };
    /// let guard = locker.acquire("nightly-report", once()).await?;
    /// // … the job …
    /// guard.release().await?; // the key stays taken for the rest of the minute
    /// let again = locker.acquire("nightly-report", once()).await;
    /// assert!(again.is_err_and(|e| e.is_timeout()), "another run skips");
    /// # Ok(()) }
    /// ```
    pub fn hold_at_least(mut self, minimum: Duration) -> Self {
        self.hold_at_least = Some(minimum);
        self
    }

    /// A permit of a counting semaphore instead of the mutex: at most `permits` holders of the
    /// key at once (Redisson's `RPermitExpirableSemaphore`, Curator's
    /// `InterProcessSemaphoreV2`). Each permit has its own lease, renewal, loss detection and
    /// fencing token (strictly increasing per key, in the order permits are granted); a
    /// holder that dies frees its permit when its lease ends. The count is part of the key:
    /// while the key is held, an acquisition with another count fails with
    /// [`LockError::Conflict`](crate::LockError::Conflict) instead of over-admitting. `0`
    /// fails with [`LockError::Config`](crate::LockError::Config). Same as
    /// [`Locker::acquire_permit`](crate::Locker::acquire_permit). Default: the mutex.
    ///
    /// ```
    /// # async fn demo() -> Result<(), dlock_runtime::LockError> {
    /// use std::time::Duration;
    /// use dlock_runtime::{LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let export = || LockOptions::new().permits(2).timeout(Duration::ZERO);
    /// let a = locker.acquire("export:acme", export()).await?;
    /// let b = locker.acquire("export:acme", export()).await?;
    /// let third = locker.acquire("export:acme", export()).await;
    /// assert!(third.is_err_and(|e| e.is_timeout()), "two permits at most");
    /// assert!(b.fencing_token() > a.fencing_token());
    /// # Ok(()) }
    /// ```
    pub fn permits(mut self, permits: u32) -> Self {
        self.kind = LockKind::Semaphore { permits };
        self
    }

    /// A read (shared) hold of a read/write lock instead of the mutex: readers of the key hold
    /// it together, never while a writer does; a writer waiting for the key stops new readers
    /// from joining (writers do not starve). Same as
    /// [`Locker::acquire_read`](crate::Locker::acquire_read). Default: the mutex.
    pub fn read(mut self) -> Self {
        self.kind = LockKind::Read;
        self
    }

    /// The write (exclusive) hold of a read/write lock instead of the mutex: one writer, no
    /// readers. Inside a read hold of the same key (a `#[dlock(read)]` body, or
    /// [`LockGuard::scope`](crate::LockGuard::scope)) it fails with
    /// [`LockError::Conflict`](crate::LockError::Conflict): a read lock is never upgraded
    /// (two readers upgrading would wait for each other forever). Same as
    /// [`Locker::acquire_write`](crate::Locker::acquire_write). Default: the mutex.
    ///
    /// ```
    /// # async fn demo() -> Result<(), dlock_runtime::LockError> {
    /// use std::time::Duration;
    /// use dlock_runtime::{LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let now = || LockOptions::new().timeout(Duration::ZERO);
    /// let r1 = locker.acquire("doc:7", now().read()).await?;
    /// let r2 = locker.acquire("doc:7", now().read()).await?; // readers share it
    /// let w = locker.acquire("doc:7", now().write()).await;
    /// assert!(w.is_err_and(|e| e.is_timeout()), "no writer beside readers");
    /// drop((r1, r2));
    /// # Ok(()) }
    /// ```
    pub fn write(mut self) -> Self {
        self.kind = LockKind::Write;
        self
    }
}
