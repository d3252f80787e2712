use dlock_runtime::{LockError, dlock};

#[dlock(key = "order:<id>", expire = "auto", max_hold = "0ms")]
async fn create_order(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
