use dlock_runtime::{LockError, dlock};

#[dlock(timeout = "5s")]
async fn create_order(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[dlock]
async fn no_arguments() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
