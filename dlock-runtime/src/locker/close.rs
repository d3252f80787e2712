//! Closing a locker, and its readiness check.

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;

use super::{HeldLock, Locker};
use crate::{LockError, error::BackendError};

impl Locker {
    /// Closes the locker, and every clone of it, for a clean exit: a program that calls this
    /// before it ends leaves nothing in the engine.
    ///
    /// 1. No acquisition starts any more ([`LockError::Closed`]), and those waiting give up
    ///    with `Closed` once they removed what they had put in the engine.
    /// 2. What guards still hold is released; those holds count as lost (a `#[dlock]` body
    ///    still running under one is stopped, as on any loss, unless `on_lost = "continue"`).
    /// 3. Releases and cleanups handed to the background (dropped guards and waits) finish.
    /// 4. What the engine keeps for this client ends: the ZooKeeper session, etcd leases; on
    ///    RedLock, the wake-ups its last releases sent to waiting processes are delivered, and
    ///    releases being sent again to masters that missed them stop (a try under way is
    ///    waited for, one request timeout at most; what they leave lapses with its lease).
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
        let holds: Vec<Arc<dyn HeldLock>> = inner
            .holds
            .map()
            .values()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        for hold in holds {
            self.spawn_background(None, async move {
                match hold.close().await {
                    Err(error) if error.is_unsettled() => {
                        tracing::debug!(key = %hold.key(), error = %error, "closing the locker: the key was gone when its release was sent again");
                    }
                    Err(error) => {
                        tracing::warn!(key = %hold.key(), error = %error, "closing the locker: the release failed; the lease will free the lock");
                    }
                    Ok(()) => {}
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
}
