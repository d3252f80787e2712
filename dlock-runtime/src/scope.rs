//! The holder scope: which holds the locked bodies running on this task have, for re-entry and
//! [`fencing_token`]. Its own module so that the locker, the guard and the attribute's entry
//! points all depend on it and not on each other.

use std::{future::Future, sync::Arc};

use crate::{Locker, guard::Hold};

/// What the locked bodies running on this task hold: the innermost body's hold, and those of
/// the bodies around it, innermost last (empty, so unallocated, for a body not nested in another).
struct Scope {
    innermost: Arc<Hold>,
    outer: Vec<Arc<Hold>>,
}

tokio::task_local! {
    static SCOPE: Scope;
}

/// `body` with `hold` added to the task's scope: re-entry and `fencing_token()` see it.
pub(crate) fn in_scope<F: Future>(
    hold: &Arc<Hold>,
    body: F,
) -> impl Future<Output = F::Output> + use<F> {
    let outer = SCOPE
        .try_with(|s| {
            let mut outer = Vec::with_capacity(s.outer.len() + 1);
            outer.extend(s.outer.iter().cloned());
            outer.push(s.innermost.clone());
            outer
        })
        .unwrap_or_default();
    let scope = Scope {
        innermost: hold.clone(),
        outer,
    };
    SCOPE.scope(scope, body)
}

/// The hold on `key` through `locker` that an enclosing scope of this task has.
pub(crate) fn scoped_hold(locker: &Locker, key: &str) -> Option<Arc<Hold>> {
    SCOPE
        .try_with(|scope| {
            std::iter::once(&scope.innermost)
                .chain(scope.outer.iter().rev())
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
    SCOPE.try_with(|scope| scope.innermost.fence()).ok()
}
