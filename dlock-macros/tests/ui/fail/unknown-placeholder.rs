use dlock_runtime::{LockError, dlock};

#[dlock(key = "order:<idd>")]
async fn create_order(id: u64, qty: u32) -> Result<u64, LockError> {
    Ok(id + u64::from(qty))
}

#[dlock(key = "order:<self.id>")]
async fn free_function(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[dlock(key = "order:<id>")]
async fn no_parameters() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
