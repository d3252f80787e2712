//! The lease, one type from the options to the engine and back: how long the engine keeps a
//! hold, whether a watchdog renews it, and the client's clock of it (the part of the lease the
//! client counts on).

use std::time::Duration;

use tokio::time::Instant;

use crate::LockError;

/// The longest lease accepted: 365 days. Longer ones are surely a mistake (and would overflow the
/// clocks they are added to). `#[dlock]` refuses a longer `expire` at compile time. Waits and
/// renewal ceilings are not limited (one past any clock means "never").
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The shortest lease accepted: 1ms (Redis keeps leases in whole milliseconds). `#[dlock]`
/// refuses a shorter `expire` at compile time.
pub const MIN_LEASE: Duration = Duration::from_millis(1);

/// A lease between [`MIN_LEASE`] and [`MAX_LEASE`].
pub(crate) fn check_lease(lease: Duration) -> Result<(), LockError> {
    if lease < MIN_LEASE {
        Err(LockError::config("expire: the lease must be at least 1ms"))
    } else if lease > MAX_LEASE {
        Err(LockError::config(
            "expire: the lease must be at most 365 days",
        ))
    } else {
        Ok(())
    }
}

pub(crate) use loss::LossSignal;
#[cfg(any(feature = "zookeeper", feature = "etcd", feature = "postgres"))]
pub(crate) use loss::loss_signal;
#[cfg(any(feature = "zookeeper", feature = "etcd"))]
pub(crate) use loss::{LossAlarm, fire_held};

/// The engines' reports of a lost hold (see [`LossSignal`]).
#[cfg_attr(
    not(any(feature = "zookeeper", feature = "etcd")),
    allow(
        dead_code,
        reason = "only the ZooKeeper and etcd engines report losses of sessions; PostgreSQL \
                  only a grant's take-up"
    )
)]
mod loss {
    use std::{
        collections::HashMap,
        sync::{Arc, Mutex, PoisonError},
    };

    /// The engine's own report that a hold is lost (a ZooKeeper or etcd session's end, etcd's watch
    /// on the holder's key, the engine letting the hold go at its `expire`, a PostgreSQL grant
    /// whose take-up failed): the engine keeps the
    /// [`LossAlarm`] and fires it; the hold hooks its reaction on this end. No task waits for it.
    pub(crate) struct LossSignal(Arc<Mutex<Link>>);

    /// The engine's end of a [`LossSignal`].
    #[derive(Clone)]
    pub(crate) struct LossAlarm(Arc<Mutex<Link>>);

    enum Link {
        Armed,
        Fired,
        Hooked(Box<dyn FnOnce() + Send>),
    }

    /// A loss signal and its alarm.
    pub(crate) fn loss_signal() -> (LossAlarm, LossSignal) {
        let link = Arc::new(Mutex::new(Link::Armed));
        (LossAlarm(link.clone()), LossSignal(link))
    }

    /// Fires the alarm `alarm_of` picks from each of `entries` (a session's holds when it ended),
    /// collected under the lock and fired after it.
    pub(crate) fn fire_held<T>(
        entries: &Mutex<HashMap<String, T>>,
        alarm_of: impl Fn(&T) -> Option<&LossAlarm>,
    ) {
        let alarms: Vec<LossAlarm> = (entries.lock().unwrap_or_else(PoisonError::into_inner))
            .values()
            .filter_map(|e| alarm_of(e).cloned())
            .collect();
        for alarm in alarms {
            alarm.fire();
        }
    }

    impl LossSignal {
        /// Runs `reaction` when the alarm fires, or at once when it has fired already.
        pub(crate) fn on_fire(self, reaction: impl FnOnce() + Send + 'static) {
            let mut link = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            if matches!(*link, Link::Fired) {
                drop(link);
                reaction();
            } else {
                *link = Link::Hooked(Box::new(reaction));
            }
        }
    }

    impl LossAlarm {
        /// Reports the loss: the hold's reaction runs now (on the caller), or when it is hooked.
        pub(crate) fn fire(&self) {
            let reaction = {
                let mut link = self.0.lock().unwrap_or_else(PoisonError::into_inner);
                match std::mem::replace(&mut *link, Link::Fired) {
                    Link::Hooked(reaction) => Some(reaction),
                    Link::Armed | Link::Fired => None,
                }
            };
            if let Some(reaction) = reaction {
                reaction();
            }
        }
    }

    impl std::fmt::Debug for LossSignal {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("LossSignal")
        }
    }

    impl std::fmt::Debug for LossAlarm {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("LossAlarm")
        }
    }
}

/// The lease of one hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lease {
    /// How long the engine keeps the hold without a renewal.
    pub(crate) length: Duration,
    /// A watchdog renews it while the guard lives (`expire_auto`).
    pub(crate) renewed: bool,
}

impl Lease {
    /// The lease as the engine granted it: `length` when it differs from the one asked for
    /// (etcd rounds up to whole seconds).
    pub(crate) fn granted(self, length: Option<Duration>) -> Self {
        Self {
            length: length.unwrap_or(self.length),
            ..self
        }
    }
}

/// A hold the engine granted: its fence, when the request that set it was sent (the lease
/// counts from then), the lease as granted, and the engine's own signal of its loss.
#[derive(Debug)]
pub(crate) struct Grant {
    pub(crate) fence: u64,
    pub(crate) sent_at: Instant,
    pub(crate) lease: Lease,
    pub(crate) lost: Option<LossSignal>,
}

/// The part of a lease the client does not count on: the clock-drift allowance of the Redlock
/// analysis (1%) plus 2ms for the reply's travel.
pub(crate) fn valid_until(sent_at: Instant, lease: Duration) -> Instant {
    let margin = lease / 100 + Duration::from_millis(2);
    // Leases are capped when options are checked; saturate anyway rather than panic.
    sent_at
        .checked_add(lease.saturating_sub(margin))
        .unwrap_or_else(far_future)
}

/// An instant no lease or wait reaches (about 30 years away).
pub(crate) fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(30 * 365 * 24 * 3600)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::valid_until;

    /// The client counts on the lease less 1% and 2ms (RedLock's validity is the same clock).
    #[test]
    fn the_lease_clock_leaves_the_drift_out() {
        let t0 = Instant::now();
        assert_eq!(
            valid_until(t0, Duration::from_secs(10)),
            t0 + Duration::from_millis(9898)
        );
        assert_eq!(valid_until(t0, Duration::from_millis(2)), t0);
    }
}
