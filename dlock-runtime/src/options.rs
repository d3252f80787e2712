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
}
