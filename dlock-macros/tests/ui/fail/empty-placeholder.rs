use dlock_runtime::{LockError, dlock};

#[dlock(key = "order:<>")]
async fn create_order(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
