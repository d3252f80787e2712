//! Builds the process-wide locker from this process's environment, takes one lock through a
//! `#[dlock]` function without `client`, and prints the outcome: `ok <locker>` or `error <message>`.
//! The env tests run it with different `DLOCK_*` variables (the environment is per process).

use dlock_runtime::{LockError, dlock};

#[dlock(key = "env-check")]
async fn locked() -> Result<Option<u64>, LockError> {
    Ok(dlock_runtime::fencing_token())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let locker = match dlock_runtime::global() {
        Ok(locker) => locker,
        Err(e) => {
            println!("error {e}");
            println!("debug {e:?}");
            return;
        }
    };
    match locked().await {
        Ok(fence) => println!("ok {locker:?} fence={fence:?}"),
        Err(e) => {
            println!("error {e}");
            println!("debug {e:?}");
        }
    }
}
