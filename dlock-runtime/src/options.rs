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
    pub(crate) lease: Option<Lease>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) fair: bool,
    pub(crate) name: Option<&'static str>,
}

/// The lease of one hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lease {
    /// Expires after this long unless extended by hand.
    Fixed(Duration),
    /// Renewed by a watchdog while held; each renewal is the configured default expire.
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
        self.lease = Some(Lease::Fixed(lease));
        self
    }

    /// A renewed lease: a watchdog extends it at a third of its length (the locker's default
    /// expire) while the guard lives, so a long critical section keeps the lock and a crashed
    /// process loses it within one lease.
    pub fn expire_auto(mut self) -> Self {
        self.lease = Some(Lease::Auto);
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
}

/// The longest lease accepted: 365 days. Longer ones are surely a mistake (and would overflow the
/// clocks they are added to). `#[dlock]` refuses a longer `expire` at compile time. Waits and
/// renewal ceilings are not limited (one past any clock means "never").
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The shortest lease accepted: 1ms (Redis keeps leases in whole milliseconds). `#[dlock]`
/// refuses a shorter `expire` at compile time.
pub const MIN_LEASE: Duration = Duration::from_millis(1);

/// A lease between [`MIN_LEASE`] and [`MAX_LEASE`].
pub(crate) fn check_lease(lease: Duration) -> Result<(), crate::LockError> {
    if lease < MIN_LEASE {
        Err(crate::LockError::config(
            "expire: the lease must be at least 1ms",
        ))
    } else if lease > MAX_LEASE {
        Err(crate::LockError::config(
            "expire: the lease must be at most 365 days",
        ))
    } else {
        Ok(())
    }
}
