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

/// How an acquisition ended, as the `outcome` label says it.
#[derive(Clone, Copy, Debug)]
enum Outcome {
    Acquired,
    Timeout,
    Error,
    Closed,
    Cancelled,
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

    fn label(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::Timeout => "timeout",
            Self::Error => "error",
            Self::Closed => "closed",
            Self::Cancelled => "cancelled",
        }
    }
}

fn label(name: Option<&'static str>) -> &'static str {
    name.unwrap_or(UNNAMED)
}

/// One acquisition of a lock named `name`, from its start: counted as waiting while it lives,
/// then by its outcome ([`finish`](Self::finish); `cancelled` when dropped unfinished).
#[derive(Debug)]
pub(crate) struct Waiting {
    name: Option<&'static str>,
    /// Read by the wait histogram only (no clock read on an acquisition without the feature).
    #[cfg(feature = "metrics")]
    started: Instant,
    finished: bool,
}

impl Waiting {
    pub(crate) fn start(name: Option<&'static str>) -> Self {
        #[cfg(feature = "metrics")]
        metrics::gauge!("dlock_waiting", "lock" => label(name)).increment(1.0);
        Self {
            name,
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
            let (lock, outcome) = (label(self.name), outcome.label());
            metrics::gauge!("dlock_waiting", "lock" => lock).decrement(1.0);
            metrics::counter!("dlock_acquisitions_total", "lock" => lock, "outcome" => outcome)
                .increment(1);
            metrics::histogram!("dlock_wait_seconds", "lock" => lock, "outcome" => outcome)
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
    metrics::gauge!("dlock_held", "lock" => label(name)).increment(1.0);
    #[cfg(not(feature = "metrics"))]
    let _ = name;
}

/// A hold of `name` ended after `held`.
pub(crate) fn hold_ended(name: Option<&'static str>, held: Duration) {
    #[cfg(feature = "metrics")]
    {
        let lock = label(name);
        metrics::gauge!("dlock_held", "lock" => lock).decrement(1.0);
        metrics::histogram!("dlock_hold_seconds", "lock" => lock).record(held.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (name, held);
}

/// A hold of `name` was lost.
pub(crate) fn lost(name: Option<&'static str>) {
    #[cfg(feature = "metrics")]
    metrics::counter!("dlock_lost_total", "lock" => label(name)).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = name;
}

/// A renewal of a hold of `name` failed (to be retried).
pub(crate) fn renewal_failed(name: Option<&'static str>) {
    #[cfg(feature = "metrics")]
    metrics::counter!("dlock_renewals_failed_total", "lock" => label(name)).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = name;
}

/// A lock of `name` was passed to the next waiter of its locker.
pub(crate) fn passed(name: Option<&'static str>) {
    #[cfg(feature = "metrics")]
    metrics::counter!("dlock_passes_total", "lock" => label(name)).increment(1);
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
