//! Release and cleanup: a hold's release (or its pass to the next waiter of the locker), the
//! removal of what a wait that gives up left in the engine, and the background tasks that do
//! the same for dropped guards and waits.

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;

use super::{
    Locker,
    line::{Baton, Line, Passed},
};
use crate::{LockError, LockKind, backend::Token, error::BackendError};

impl Locker {
    /// Releases `token`'s hold of `key` (a lock of `kind`), or passes a mutex straight to the
    /// first waiter of the key on this locker when that waiter offered to take it (see
    /// [`Baton`]). Before `keep_until` (a job lock's `hold_at_least`), neither: the hold stays
    /// in the engine until then, and lapses. `Ok(false)` when `token` no longer held the key
    /// (nothing changed).
    pub(crate) async fn let_go(
        &self,
        key: &str,
        kind: LockKind,
        token: &Token,
        keep_until: Option<Instant>,
    ) -> Result<bool, BackendError> {
        if let Some(rest) = rest_of_minimum(keep_until) {
            tracing::debug!(key = %key, ?rest, "lock kept for the rest of its minimum hold");
            return self.backend().keep(key, token, rest).await;
        }
        let Some(Baton {
            token: next,
            lease,
            reply,
        }) = self.inner.lines.baton(key).filter(|_| kind.is_mutex())
        else {
            return self.backend().release(key, kind, token).await;
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
            spawn_release(
                None,
                self.clone(),
                (key.to_owned(), kind),
                next,
                false,
                None,
            );
        }
        outcome
    }

    /// Removes what a wait that gives up left in the engine (`token`'s lock or place in line,
    /// the line's `place` in the queue) before the wait returns, within two request timeouts.
    /// When the removal fails, or takes longer, what is left lapses on its own (a removal still
    /// under way goes on in the background): said in the returned text, for the wait's event.
    pub(super) async fn remove_leftovers(
        &self,
        (key, kind): (&str, LockKind),
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
                    Some(token) => backend.release(&owned_key, kind, token).await.map(drop),
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
            // Gone when sent again: most likely removed by the first sending.
            Ok(Ok(Err(error))) if error.is_unsettled() => return None,
            Ok(Ok(Err(error))) => format!("could not remove its entries ({error})"),
            Ok(Err(_)) => "the removal of its entries stopped".to_owned(),
            Err(_) => format!("the removal of its entries goes on after {bound:?}"),
        };
        Some(format!("{why}; they lapse within {lapses_within:?}"))
    }
}

/// Removes a lock that an attempt with a lost reply may have set, when the wait gives up or is
/// dropped. Compare-and-delete by token, so it never touches another holder's lock.
pub(super) struct OrphanCleanup<'a> {
    /// The runtime the wait runs on, for a cleanup when the wait is dropped elsewhere.
    pub(super) runtime: Option<tokio::runtime::Handle>,
    pub(super) locker: &'a Locker,
    pub(super) key: String,
    pub(super) kind: LockKind,
    pub(super) token: Token,
    pub(super) armed: bool,
    /// The wait's standing offer to take the lock from a holder (see [`Baton`]), and where the
    /// answer comes.
    pub(super) baton: Option<(Arc<Line>, tokio::sync::oneshot::Receiver<Passed>)>,
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
    pub(super) fn give_up(mut self) -> (String, Option<Token>) {
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
                (self.key.clone(), self.kind),
                self.token.clone(),
                false,
                None,
            );
        }
    }

    /// The timeout of a wait that never got its turn in the in-process line: no request was
    /// sent, nothing is left to clean.
    pub(super) fn timed_out(self, started: Instant, name: Option<&'static str>) -> LockError {
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
    pub(super) fn disarm(mut self) -> (String, Token) {
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

/// What is left of a job lock's minimum hold (`hold_at_least`) that ends at `keep_until`:
/// while some is, a release keeps the hold in the engine for that long instead.
pub(crate) fn rest_of_minimum(keep_until: Option<Instant>) -> Option<std::time::Duration> {
    keep_until
        .and_then(|until| until.checked_duration_since(Instant::now()))
        .filter(|rest| !rest.is_zero())
}

/// Hands a compare-and-delete to `runtime` (the one the lock was taken on), or else to the
/// current one; the lease is the backstop when there is none. A hold's release (`hold`) may
/// pass the lock to a waiter instead, or keep it until `keep_until` ([`Locker::let_go`]).
pub(crate) fn spawn_release(
    runtime: Option<&tokio::runtime::Handle>,
    locker: Locker,
    (key, kind): (String, LockKind),
    token: Token,
    hold: bool,
    keep_until: Option<Instant>,
) {
    let (background, warn_key) = (locker.clone(), key.clone());
    let spawned = background.spawn_background(runtime, async move {
        let released = if hold {
            locker.let_go(&key, kind, &token, keep_until).await
        } else {
            locker.backend().release(&key, kind, &token).await
        };
        match released {
            // Most likely deleted by its first sending; nobody waits on this answer.
            Err(error) if error.is_unsettled() => {
                tracing::debug!(key = %key, error = %error, "lock release after drop: the key was gone when sent again");
            }
            Err(error) => {
                tracing::error!(key = %key, error = %error, "lock release after drop failed; the lease will free it");
            }
            Ok(_) => {}
        }
    });
    if spawned.is_none() {
        tracing::warn!(key = %warn_key, "no tokio runtime to release the lock on; the lease will free it");
    }
}
