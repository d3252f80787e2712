use dlock_runtime::{LockError, dlock};

#[dlock(key = "order:<id>", timeout = "5 parsecs")]
async fn create_order(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[dlock(key = "order:<id>", expire = "30")]
async fn no_unit(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[dlock(key = "order:<id>", timeout = 5)]
async fn not_a_string(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
