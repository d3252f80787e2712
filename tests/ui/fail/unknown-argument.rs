use dlock_runtime::{LockError, dlock};

#[dlock(key = "order:<id>", ttl = "5s")]
async fn create_order(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// `fair` is not implemented yet.
#[dlock(key = "order:<id>", fair = true)]
async fn fair(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
