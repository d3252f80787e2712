use dlock_runtime::{LockError, dlock};

#[dlock(key = "doc", read, write)]
async fn read_and_write() -> Result<(), LockError> {
    Ok(())
}

#[dlock(key = "doc", permits = 2, read)]
async fn permits_and_read() -> Result<(), LockError> {
    Ok(())
}

#[dlock(key = "doc", write, write)]
async fn write_twice() -> Result<(), LockError> {
    Ok(())
}

#[dlock(key = "doc", read = true)]
async fn read_with_a_value() -> Result<(), LockError> {
    Ok(())
}

#[dlock(key = "report", write, hold_at_least = "5m")]
async fn job_lock_of_a_writer() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
