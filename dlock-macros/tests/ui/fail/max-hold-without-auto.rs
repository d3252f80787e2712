use dlock_runtime::{LockError, dlock};

#[dlock(key = "order:<id>", expire = "30s", max_hold = "10m")]
async fn create_order(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
