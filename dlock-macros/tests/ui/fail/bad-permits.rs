use dlock_runtime::{LockError, dlock};

#[dlock(key = "export", permits = 0)]
async fn zero() -> Result<(), LockError> {
    Ok(())
}

#[dlock(key = "export", permits = "3")]
async fn quoted() -> Result<(), LockError> {
    Ok(())
}

#[dlock(key = "export", permits = -1)]
async fn negative() -> Result<(), LockError> {
    Ok(())
}

#[dlock(key = "export", permits = 5000000000)]
async fn too_many() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
