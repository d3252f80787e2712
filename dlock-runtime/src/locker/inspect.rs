//! What an operator asks of a locker: who holds a lock ([`Locker::inspect`]), which locks are
//! held ([`Locker::list`]), and freeing a lock whose holder is gone ([`Locker::force_release`]).

use super::Locker;
use crate::{LockError, LockInfo, error::BackendError};

impl Locker {
    /// Who holds `key` (the configured prefix is put in front), since when, with which fence,
    /// for how much longer, and how many wait for it; `None` when it is free. A field the
    /// engine cannot tell is `None` (see [`LockInfo`]).
    ///
    /// ```
    /// # async fn demo() -> Result<(), dlock_runtime::LockError> {
    /// use dlock_runtime::{LockOptions, Locker};
    ///
    /// let locker = Locker::builder().memory().owner("billing").build()?;
    /// let guard = locker.acquire("order:42", LockOptions::new()).await?;
    /// let info = locker.inspect("order:42").await?.expect("held");
    /// assert_eq!(info.holder.expect("recorded").owner, "billing");
    /// assert_eq!(info.fence, Some(guard.fencing_token()));
    /// guard.release().await?;
    /// assert_eq!(locker.inspect("order:42").await?, None);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] as for [`acquire`](Self::acquire); [`LockError::Backend`]
    /// when the engine does not answer in time or refuses.
    pub async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let full = self.full_key(key)?;
        let info = self
            .bounded("inspect", self.backend().inspect(&full))
            .await?;
        Ok(info.map(|info| self.short(info)))
    }

    /// The locks held now whose key (without the configured prefix) starts with `prefix`
    /// (`""`: every lock under the prefix), sorted by key. Each is read as
    /// [`inspect`](Self::inspect) reads it; a lock released meanwhile is left out.
    ///
    /// On Redis this scans the keys under the prefix (`SCAN`, on every master of a Cluster),
    /// on etcd and PostgreSQL it is one range read, on ZooKeeper one listing of the prefix's
    /// node: meant for operators, not for a hot path.
    ///
    /// # Errors
    /// [`LockError::Backend`] when the engine does not answer in time or refuses.
    pub async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>, LockError> {
        let full_prefix = format!("{}{prefix}", self.key_prefix());
        let mut keys = self
            .bounded_by(
                self.inner.settings.request_timeout * 20,
                "list",
                self.backend().list(&full_prefix),
            )
            .await?;
        keys.sort();
        keys.dedup();
        let mut held = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(info) = self
                .bounded("inspect", self.backend().inspect(&key))
                .await?
            {
                held.push(self.short(info));
            }
        }
        Ok(held)
    }

    /// Frees `key` whoever holds it: for a lock whose holder is gone (a frozen or partitioned
    /// process whose lease is long). Returns what was held (`None`: it was free). Waiters are
    /// woken; every later hold's fence is above the freed hold's, so a resource that checks
    /// fences refuses the old holder's late writes once the next holder wrote; the old holder
    /// finds its hold gone at its next renewal or release (its guard reports `Lost`), or at
    /// once on etcd for a hold older than a second (a watch on its key). A warning event
    /// (target `dlock::audit`) records who was freed.
    ///
    /// It frees whoever holds the key when it runs: a hold that lapsed between an operator's
    /// look and this call may have been followed by a live one, which it frees instead.
    ///
    /// This breaks the lock's promise for the holder it frees: use it when that holder is
    /// known to be gone or stuck, never to hurry a live one.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] as for [`acquire`](Self::acquire); [`LockError::Backend`]
    /// when the engine does not answer in time or refuses.
    pub async fn force_release(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let full = self.full_key(key)?;
        let freed = self
            .bounded("force release", self.backend().force_release(&full))
            .await?;
        let freed = freed.map(|info| self.short(info));
        if let Some(info) = &freed {
            let holder = info
                .holder
                .as_ref()
                .map_or_else(|| "an unrecorded holder".to_owned(), ToString::to_string);
            tracing::warn!(
                target: "dlock::audit",
                key = %full,
                holder = %holder,
                fencing_token = info.fence,
                "lock released by force"
            );
        }
        Ok(freed)
    }

    /// `info` with its key as the caller names it (without the prefix).
    fn short(&self, mut info: LockInfo) -> LockInfo {
        if let Some(key) = info.key.strip_prefix(self.key_prefix()) {
            info.key = key.to_owned();
        }
        info
    }

    async fn bounded<T>(
        &self,
        what: &str,
        request: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, LockError> {
        self.bounded_by(self.inner.settings.request_timeout * 2, what, request)
            .await
    }

    async fn bounded_by<T>(
        &self,
        bound: std::time::Duration,
        what: &str,
        request: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, LockError> {
        match tokio::time::timeout(bound, request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(LockError::Backend(error)),
            Err(_) => Err(LockError::Backend(BackendError::new(format!(
                "the engine did not answer the {what} within {bound:?}"
            )))),
        }
    }
}
