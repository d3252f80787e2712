//! What the locks report through the [`metrics`](https://docs.rs/metrics) facade, with the
//! `metrics` feature: nothing is recorded until the program installs a recorder (a Prometheus
//! exporter, say), and without the feature these calls compile to nothing.
//!
//! The series are listed on [`describe_metrics`](crate::describe_metrics).

// Without the feature, the labels are computed by nothing.
#![cfg_attr(not(feature = "metrics"), allow(dead_code))]

use std::time::Duration;
#[cfg(feature = "metrics")]
use std::time::Instant;

/// The label value of a lock without a name.
const UNNAMED: &str = "unnamed";

/// How an acquisition ended, as the `outcome` label says it; its value indexes
/// `Keys::acquisitions` and `Keys::wait_seconds`.
#[derive(Clone, Copy, Debug)]
enum Outcome {
    Acquired = 0,
    Timeout = 1,
    Error = 2,
    Closed = 3,
    Cancelled = 4,
}

impl Outcome {
    /// The outcome of an acquisition's result.
    fn of<T>(result: &Result<T, crate::LockError>) -> Self {
        match result {
            Ok(_) => Self::Acquired,
            Err(crate::LockError::Timeout { .. }) => Self::Timeout,
            Err(crate::LockError::Closed { .. }) => Self::Closed,
            Err(_) => Self::Error,
        }
    }

    const fn label(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::Timeout => "timeout",
            Self::Error => "error",
            Self::Closed => "closed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// The keys of the series of one lock name, made once and kept (an unnamed lock's at compile
/// time). The `metrics` macros build a key without allocating only from literal labels: with
/// the lock's name as a label value they made a `Vec` of labels and hashed the key at every
/// call, a recorder installed or not (7 allocations per acquisition and release, measured).
#[cfg(feature = "metrics")]
#[derive(Debug)]
struct Keys {
    waiting: metrics::Key,
    /// By [`Outcome`].
    acquisitions: [metrics::Key; 5],
    /// By [`Outcome`].
    wait_seconds: [metrics::Key; 5],
    held: metrics::Key,
    hold_seconds: metrics::Key,
    lost: metrics::Key,
    renewals_failed: metrics::Key,
    passes: metrics::Key,
}

/// The labels [`Keys`] are made of: `lock`, and `lock` with each `outcome`.
#[cfg(feature = "metrics")]
struct Labels {
    lock: [metrics::Label; 1],
    outcome: [[metrics::Label; 2]; 5],
}

#[cfg(feature = "metrics")]
impl Labels {
    const fn of(lock: &'static str) -> Self {
        use metrics::Label;
        const fn pair(lock: &'static str, outcome: Outcome) -> [Label; 2] {
            [
                Label::from_static_parts("lock", lock),
                Label::from_static_parts("outcome", outcome.label()),
            ]
        }
        Self {
            lock: [Label::from_static_parts("lock", lock)],
            // In the order of `Outcome`'s values.
            outcome: [
                pair(lock, Outcome::Acquired),
                pair(lock, Outcome::Timeout),
                pair(lock, Outcome::Error),
                pair(lock, Outcome::Closed),
                pair(lock, Outcome::Cancelled),
            ],
        }
    }
}

#[cfg(feature = "metrics")]
impl Keys {
    const fn of(labels: &'static Labels) -> Self {
        use metrics::Key;
        const fn by_outcome(name: &'static str, labels: &'static Labels) -> [Key; 5] {
            [
                Key::from_static_parts(name, &labels.outcome[0]),
                Key::from_static_parts(name, &labels.outcome[1]),
                Key::from_static_parts(name, &labels.outcome[2]),
                Key::from_static_parts(name, &labels.outcome[3]),
                Key::from_static_parts(name, &labels.outcome[4]),
            ]
        }
        Self {
            waiting: Key::from_static_parts("dlock_waiting", &labels.lock),
            acquisitions: by_outcome("dlock_acquisitions_total", labels),
            wait_seconds: by_outcome("dlock_wait_seconds", labels),
            held: Key::from_static_parts("dlock_held", &labels.lock),
            hold_seconds: Key::from_static_parts("dlock_hold_seconds", &labels.lock),
            lost: Key::from_static_parts("dlock_lost_total", &labels.lock),
            renewals_failed: Key::from_static_parts("dlock_renewals_failed_total", &labels.lock),
            passes: Key::from_static_parts("dlock_passes_total", &labels.lock),
        }
    }

    /// The keys of `name`'s series. A name is a `&'static str` that the program keeps for
    /// good: its keys, kept too, grow with the names the program has, as they do.
    ///
    /// Each thread remembers the last name it looked up, by its address and length (a
    /// `&'static str`'s bytes never change, and an attribute's name is one literal, so the
    /// calls of one lock find it there): an acquisition and its hold look their name up three
    /// times (more on a loss, a failed renewal, a pass), and the shared map's lock and hash
    /// cost more than the rest of the metrics.
    fn named(name: Option<&'static str>) -> &'static Self {
        use std::cell::Cell;
        static UNNAMED_LABELS: Labels = Labels::of(UNNAMED);
        static UNNAMED_KEYS: Keys = Keys::of(&UNNAMED_LABELS);
        thread_local! {
            static LAST: Cell<Option<(&'static str, &'static Keys)>> = const { Cell::new(None) };
        }
        let Some(name) = name else {
            return &UNNAMED_KEYS;
        };
        if let Some((last, keys)) = LAST.get()
            && std::ptr::eq(last, name)
        {
            return keys;
        }
        let keys = Self::shared(name);
        LAST.set(Some((name, keys)));
        keys
    }

    /// The keys of `name` from the map every thread shares, made on the first lookup.
    fn shared(name: &'static str) -> &'static Self {
        use std::collections::HashMap;
        use std::sync::{OnceLock, PoisonError, RwLock};
        static NAMED: OnceLock<RwLock<HashMap<&'static str, &'static Keys>>> = OnceLock::new();
        let named = NAMED.get_or_init(RwLock::default);
        if let Some(keys) = named
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
        {
            return keys;
        }
        named
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(name)
            .or_insert_with(|| {
                let labels: &'static Labels = Box::leak(Box::new(Labels::of(name)));
                Box::leak(Box::new(Self::of(labels)))
            })
    }
}

/// What the `metrics` macros do, with a key made once.
#[cfg(feature = "metrics")]
mod series {
    use metrics::{Counter, Gauge, Histogram, Key, Level, Metadata};

    /// As the macros in `stats` made it: their module's path.
    static METADATA: Metadata<'static> = Metadata::new(
        "dlock_runtime::stats",
        Level::INFO,
        Some("dlock_runtime::stats"),
    );

    pub(super) fn counter(key: &Key) -> Counter {
        metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA))
    }

    pub(super) fn gauge(key: &Key) -> Gauge {
        metrics::with_recorder(|recorder| recorder.register_gauge(key, &METADATA))
    }

    pub(super) fn histogram(key: &Key) -> Histogram {
        metrics::with_recorder(|recorder| recorder.register_histogram(key, &METADATA))
    }
}

/// One acquisition of a lock named `name`, from its start: counted as waiting while it lives,
/// then by its outcome ([`finish`](Self::finish); `cancelled` when dropped unfinished).
#[derive(Debug)]
pub(crate) struct Waiting {
    /// The lock name's, found once at the start.
    #[cfg(feature = "metrics")]
    keys: &'static Keys,
    /// Read by the wait histogram only (no clock read on an acquisition without the feature).
    #[cfg(feature = "metrics")]
    started: Instant,
    finished: bool,
}

impl Waiting {
    pub(crate) fn start(name: Option<&'static str>) -> Self {
        #[cfg(feature = "metrics")]
        let keys = Keys::named(name);
        #[cfg(feature = "metrics")]
        series::gauge(&keys.waiting).increment(1.0);
        #[cfg(not(feature = "metrics"))]
        let _ = name;
        Self {
            #[cfg(feature = "metrics")]
            keys,
            #[cfg(feature = "metrics")]
            started: Instant::now(),
            finished: false,
        }
    }

    /// The acquisition ended with `result`.
    pub(crate) fn finish<T>(mut self, result: &Result<T, crate::LockError>) {
        self.finished = true;
        self.end(Outcome::of(result));
    }

    fn end(&self, outcome: Outcome) {
        #[cfg(feature = "metrics")]
        {
            let keys = self.keys;
            series::gauge(&keys.waiting).decrement(1.0);
            series::counter(&keys.acquisitions[outcome as usize]).increment(1);
            series::histogram(&keys.wait_seconds[outcome as usize])
                .record(self.started.elapsed().as_secs_f64());
        }
        #[cfg(not(feature = "metrics"))]
        let _ = outcome;
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if !self.finished {
            self.end(Outcome::Cancelled);
        }
    }
}

/// A hold of `name` began.
pub(crate) fn hold_began(name: Option<&'static str>) {
    #[cfg(feature = "metrics")]
    series::gauge(&Keys::named(name).held).increment(1.0);
    #[cfg(not(feature = "metrics"))]
    let _ = name;
}

/// A hold of `name` ended after `held`.
pub(crate) fn hold_ended(name: Option<&'static str>, held: Duration) {
    #[cfg(feature = "metrics")]
    {
        let keys = Keys::named(name);
        series::gauge(&keys.held).decrement(1.0);
        series::histogram(&keys.hold_seconds).record(held.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (name, held);
}

/// A hold of `name` was lost.
pub(crate) fn lost(name: Option<&'static str>) {
    #[cfg(feature = "metrics")]
    series::counter(&Keys::named(name).lost).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = name;
}

/// A renewal of a hold of `name` failed (to be retried).
pub(crate) fn renewal_failed(name: Option<&'static str>) {
    #[cfg(feature = "metrics")]
    series::counter(&Keys::named(name).renewals_failed).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = name;
}

/// A lock of `name` was passed to the next waiter of its locker.
pub(crate) fn passed(name: Option<&'static str>) {
    #[cfg(feature = "metrics")]
    series::counter(&Keys::named(name).passes).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = name;
}

/// Describes dlock's metrics (their help text and units) to the installed recorder: call it once
/// after installing one, so that an exporter shows them with `# HELP` and `# UNIT` lines. Without
/// it the metrics are recorded all the same.
///
/// dlock records, through the [`metrics`](https://docs.rs/metrics) facade:
///
/// Every series carries the label `lock`: the attribute's key template (`order:<id>`) or the
/// [`LockOptions::name`](crate::LockOptions::name) an API caller gives, `unnamed` otherwise;
/// never the key itself, so a series' count is bounded by the code, not by the data.
///
/// | name | kind | labels | what |
/// | --- | --- | --- | --- |
/// | `dlock_acquisitions_total` | counter | `lock`, `outcome` | acquisitions that ended: `acquired`, `timeout`, `error` (the engine failed or refused), `closed` (the locker was closing), `cancelled` (the caller dropped the wait) |
/// | `dlock_wait_seconds` | histogram | `lock`, `outcome` | how long each of those waited |
/// | `dlock_hold_seconds` | histogram | `lock` | how long each hold lasted, from its acquisition to its release (or its guard's drop) |
/// | `dlock_held` | gauge | `lock` | holds of this process now |
/// | `dlock_waiting` | gauge | `lock` | acquisitions of this process waiting now |
/// | `dlock_lost_total` | counter | `lock` | holds lost while held (lease ran out, key gone or taken) |
/// | `dlock_renewals_failed_total` | counter | `lock` | lease renewals that failed and were retried (engine unreachable) |
/// | `dlock_passes_total` | counter | `lock` | locks passed straight to the next waiter of the same locker (hot keys) |
///
/// Re-entries of a lock its task already holds are not acquisitions and are not counted, nor
/// are calls refused before they start (an invalid key or option).
///
/// ```
/// dlock_runtime::describe_metrics();
/// ```
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe_metrics() {
    use metrics::Unit;
    metrics::describe_counter!(
        "dlock_acquisitions_total",
        "Lock acquisitions that ended, by outcome: acquired, timeout, error, closed"
    );
    metrics::describe_histogram!(
        "dlock_wait_seconds",
        Unit::Seconds,
        "How long lock acquisitions waited, by outcome"
    );
    metrics::describe_histogram!(
        "dlock_hold_seconds",
        Unit::Seconds,
        "How long locks were held"
    );
    metrics::describe_gauge!("dlock_held", "Locks held by this process");
    metrics::describe_gauge!("dlock_waiting", "Lock acquisitions of this process waiting");
    metrics::describe_counter!("dlock_lost_total", "Locks lost while held");
    metrics::describe_counter!(
        "dlock_renewals_failed_total",
        "Lease renewals that failed and were retried"
    );
    metrics::describe_counter!(
        "dlock_passes_total",
        "Locks passed straight to the next waiter of the same locker"
    );
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::Keys;

    fn lock_label(keys: &Keys) -> String {
        keys.held
            .labels()
            .map(|label| label.value().to_owned())
            .collect()
    }

    #[test]
    fn a_name_finds_its_own_keys_whatever_the_thread_looked_up_before() {
        // Two names with the same bytes at different addresses, and another name.
        let a: &'static str = Box::leak(String::from("order:<id>").into_boxed_str());
        let b: &'static str = Box::leak(String::from("order:<id>").into_boxed_str());
        let c: &'static str = "stock:<sku>";
        assert!(!std::ptr::eq(a, b));
        let first = Keys::named(Some(a));
        // Looked up again, from the thread's last one, and after others in between.
        assert!(std::ptr::eq(Keys::named(Some(a)), first));
        assert!(std::ptr::eq(Keys::named(Some(b)), first));
        let other = Keys::named(Some(c));
        assert!(!std::ptr::eq(other, first));
        assert_eq!(lock_label(other), "stock:<sku>");
        assert!(std::ptr::eq(Keys::named(Some(a)), first));
        assert_eq!(lock_label(first), "order:<id>");
        assert_eq!(lock_label(Keys::named(None)), "unnamed");
        // Another thread finds the same keys through the shared map.
        let there = std::thread::spawn(move || Keys::named(Some(b)) as *const Keys as usize)
            .join()
            .unwrap();
        assert_eq!(there, first as *const Keys as usize);
    }
}
