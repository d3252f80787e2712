//! The attribute accepts exactly the durations the runtime accepts: the lease's boundaries
//! compile here and run on the embedded backend (one step past them is
//! `ui/fail/duration-limits.rs`), and so do a wait and a renewal ceiling longer than any lease,
//! which the runtime does not limit, and the longest minimum hold (`hold_at_least`).
use std::time::Duration;

use dlock_runtime::{LockError, Locker, dlock};

#[dlock(key = "longest", client = locker, expire = "365days", timeout = "1000y")]
async fn longest(locker: &Locker) -> Result<(), LockError> {
    Ok(())
}

#[dlock(key = "shortest", client = locker, expire = "1ms")]
async fn shortest(locker: &Locker) -> Result<(), LockError> {
    Ok(())
}

#[dlock(key = "ceiling", client = locker, expire = "auto", max_hold = "1000y")]
async fn ceiling(locker: &Locker) -> Result<(), LockError> {
    Ok(())
}

#[dlock(key = "minimum", client = locker, timeout = "0s", hold_at_least = "365days")]
async fn minimum(locker: &Locker) -> Result<(), LockError> {
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // The numbers the attribute checks against are the runtime's.
    assert_eq!(dlock_runtime::MAX_LEASE, Duration::from_secs(365 * 24 * 3600));
    assert_eq!(dlock_runtime::MIN_LEASE, Duration::from_millis(1));
    let locker = Locker::memory();
    longest(&locker).await.unwrap();
    ceiling(&locker).await.unwrap();
    // The longest minimum hold the attribute accepts, the runtime accepts too; the key then
    // stays taken.
    minimum(&locker).await.unwrap();
    assert!(minimum(&locker).await.is_err_and(|e| e.is_timeout()));
    // A 1ms lease may run out before the body is polled; what matters is that the runtime does
    // not refuse it as a configuration error.
    match shortest(&locker).await {
        Ok(()) | Err(LockError::Lost { .. }) => {}
        Err(e) => panic!("the runtime refused a lease the attribute accepts: {e}"),
    }
}
