//! What `#[dlock]` expands to calls. Not public API: no semver guarantees.

use std::{future::Future, sync::Arc};

use crate::guard::Hold;
pub use crate::{LockError, LockGuard, LockOptions, Locker};

/// What the locked bodies running on this task hold, innermost last.
#[derive(Clone)]
struct Scope {
    holds: Vec<Arc<Hold>>,
}

tokio::task_local! {
    static SCOPE: Scope;
}

/// `body` with `hold` added to the task's scope: re-entry and `fencing_token()` see it.
pub(crate) fn in_scope<F: Future>(
    hold: &Arc<Hold>,
    body: F,
) -> impl Future<Output = F::Output> + use<F> {
    let mut holds = SCOPE.try_with(|s| s.holds.clone()).unwrap_or_default();
    holds.push(hold.clone());
    SCOPE.scope(Scope { holds }, body)
}

/// The hold on `key` through `locker` that an enclosing scope of this task has.
pub(crate) fn scoped_hold(locker: &Locker, key: &str) -> Option<Arc<Hold>> {
    SCOPE
        .try_with(|scope| {
            scope
                .holds
                .iter()
                .rev()
                .find(|h| h.key() == key && h.locker().same_as(locker))
                .cloned()
        })
        .ok()
        .flatten()
}

/// The fencing token of the lock held by the innermost `#[dlock]` function running on this task.
///
/// ```
/// # use dlock_runtime::{dlock, LockError};
/// #[dlock(key = "report", client = locker)]
/// async fn write_report(locker: &dlock_runtime::Locker) -> Result<u64, LockError> {
///     Ok(dlock_runtime::fencing_token().expect("inside a locked body"))
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # let locker = dlock_runtime::Locker::memory();
/// let first = write_report(&locker).await.unwrap();
/// let second = write_report(&locker).await.unwrap();
/// assert!(second > first);
/// assert_eq!(dlock_runtime::fencing_token(), None);
/// # }
/// ```
#[must_use]
pub fn fencing_token() -> Option<u64> {
    SCOPE
        .try_with(|scope| scope.holds.last().map(|h| h.fence()))
        .ok()
        .flatten()
}

/// The key text of a template.
#[must_use]
pub fn key(args: std::fmt::Arguments<'_>) -> String {
    args.to_string()
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

/// Options starting from the locker's defaults.
pub fn options() -> LockOptions {
    LockOptions::new()
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
    locker?.acquire(&key, options).await
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
/// # Errors
/// [`LockError::Lost`] when the lease was lost while the body ran and `on_lost` is
/// [`OnLost::Abort`]; the body's future has been dropped then.
pub async fn run<F: Future>(
    guard: LockGuard,
    on_lost: OnLost,
    body: F,
) -> Result<F::Output, LockError> {
    let body = in_scope(guard.hold(), body);
    let output = match on_lost {
        OnLost::Abort => {
            tokio::select! {
                biased;
                output = body => Some(output),
                () = guard.lost() => None,
            }
        }
        OnLost::Continue => Some(body.await),
    };
    match output {
        Some(output) => {
            // A release that finds the key gone has already been reported by the guard; the
            // body's result stands.
            let _ = guard.release().await;
            Ok(output)
        }
        None => {
            let error = guard.lost_error();
            let _ = guard.release().await;
            Err(error)
        }
    }
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
