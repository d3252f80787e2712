//! What `#[dlock]` expands to calls. Not public API: no semver guarantees.

use std::{future::Future, pin::pin, task::Poll};

use crate::guard::{Hold, in_scope};
pub use crate::{LockError, LockGuard, LockOptions, Locker};

/// The key text of a template.
#[must_use]
pub fn key(args: std::fmt::Arguments<'_>) -> String {
    // With room for a prefix, which the locker writes in front of it in this buffer.
    let mut key = String::with_capacity(64);
    let _ = std::fmt::Write::write_fmt(&mut key, args);
    key
}

/// The default client.
///
/// # Errors
/// As [`crate::global`].
pub fn global() -> Result<&'static Locker, LockError> {
    crate::global()
}

/// A `client = expr` argument.
///
/// # Errors
/// Never; the `Result` matches [`global`].
pub fn client(locker: &Locker) -> Result<&Locker, LockError> {
    Ok(locker)
}

/// Options starting from the locker's defaults, named by the attribute's key template.
pub fn options(template: &'static str) -> LockOptions {
    LockOptions::new().name(template)
}

/// Acquires for a locked function.
///
/// # Errors
/// As [`Locker::acquire`], or the client's own error.
pub async fn acquire(
    locker: Result<&Locker, LockError>,
    key: String,
    options: LockOptions,
) -> Result<LockGuard, LockError> {
    locker?.acquire_owned(key, options).await
}

/// Test support for the shared semantic suite: two acquisition attempts with one token, as when
/// the first attempt's reply was lost. Returns the first attempt's fence and the guard of the
/// second; every engine must give the second a new, higher fence.
///
/// # Errors
/// As [`Locker::acquire`]; `Timeout` when the key was busy.
pub async fn attempt_twice(
    locker: &Locker,
    key: &str,
    lease: std::time::Duration,
) -> Result<(u64, LockGuard), LockError> {
    locker.attempt_twice(key, lease).await
}

/// Test support: the names of the engines compiled in (`redis`, `zookeeper`, …), from the
/// table of engines, so the shared suite can check it runs on each.
#[must_use]
pub fn engines() -> Vec<&'static str> {
    crate::backend::compiled_engines()
}

/// What a locked function does when its lease is lost while the body runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnLost {
    /// Drop the body's future and return [`LockError::Lost`].
    Abort,
    /// Let the body finish; the loss is only reported.
    Continue,
}

/// Runs a locked body, then releases the lock (on every path: completion here, panic and
/// cancellation through the guard's `Drop`).
///
/// With [`OnLost::Abort`], no code of the body runs after its lease ran out on the client's
/// clock: the clock is read before every poll of the body, and the body's future is dropped
/// instead of polled once it has. A body that completes after that moment (a blocking step ran
/// past the lease) has its output dropped. With [`OnLost::Continue`] the body finishes and its
/// output is returned; the loss is only reported (a `warn` event).
///
/// # Errors
/// [`LockError::Lost`] with [`OnLost::Abort`] when the lease ran out or was lost before the body
/// finished, or when the release found the key gone or taken over.
pub async fn run<F: Future>(
    guard: LockGuard,
    on_lost: OnLost,
    body: F,
) -> Result<F::Output, LockError> {
    let hold = guard.hold().clone();
    let body = in_scope(&hold, body);
    match on_lost {
        OnLost::Abort => match while_held(&hold, body).await {
            Some(output) => match guard.release().await {
                // A release that could not reach the server leaves the key to its lease; the
                // body ran under the lock, so its result stands.
                Err(error) if error.is_lost() => Err(error),
                Ok(()) | Err(_) => Ok(output),
            },
            None => {
                let error = guard.lost_error();
                let _ = guard.release().await;
                Err(error)
            }
        },
        OnLost::Continue => {
            let output = body.await;
            // Reports a lease that ran out meanwhile; the release reports a key found gone.
            hold.still_held();
            let _ = guard.release().await;
            Ok(output)
        }
    }
}

/// Polls `body` only while `hold` is held, reading the clock before each poll and after the
/// last; `None` (with the body dropped) when the hold was lost before the body finished.
async fn while_held<F: Future>(hold: &Hold, body: F) -> Option<F::Output> {
    let mut body = pin!(body);
    let mut lost = pin!(hold.lost());
    std::future::poll_fn(|cx| {
        if !hold.still_held() {
            return Poll::Ready(None);
        }
        if let Poll::Ready(output) = body.as_mut().poll(cx) {
            // A body that blocked its thread past the lease and then completed ran unprotected.
            return Poll::Ready(hold.still_held().then_some(output));
        }
        // Wakes this task when the lease runs out or renewal reports the key gone.
        match lost.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// Test support: the index of RedLock's first master for the full lock key `key` among
/// `masters` (the one whose queue keeps the key's waiting places), as the engine picks it.
#[cfg(feature = "redlock")]
#[must_use]
pub fn redlock_first_master(key: &str, masters: usize) -> usize {
    crate::backend::redlock_first_master(key, masters)
}

/// How a lock failure becomes the function's return value when no `on_fail` is given.
#[diagnostic::on_unimplemented(
    message = "a `#[dlock]` function without `on_fail` must return `Result<T, E>` where `E: From<dlock_runtime::LockError>`; `{Self}` is not such a type",
    label = "this return type cannot carry a lock failure",
    note = "return `Result<T, E>` and add `impl From<dlock_runtime::LockError> for E`, or pass `on_fail = handler` with `fn handler(dlock_runtime::LockError) -> {Self}`"
)]
pub trait FailInto: Sized {
    /// The failure as the function's return value.
    fn from_lock_error(error: LockError) -> Self;
}

#[diagnostic::do_not_recommend]
impl<T, E: From<LockError>> FailInto for Result<T, E> {
    fn from_lock_error(error: LockError) -> Self {
        Err(E::from(error))
    }
}
