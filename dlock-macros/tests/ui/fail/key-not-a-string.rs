use dlock_runtime::{LockError, dlock};

#[dlock(key = id)]
async fn create_order(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[dlock(key = format!("order:{}", id))]
async fn formatted(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
