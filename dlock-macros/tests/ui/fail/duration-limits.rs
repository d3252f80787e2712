use dlock_runtime::{LockError, dlock};

#[dlock(key = "a", expire = "365days 1ms")]
async fn lease_too_long() -> Result<(), LockError> {
    Ok(())
}

#[dlock(key = "b", expire = "1y")]
async fn a_calendar_year_is_too_long() -> Result<(), LockError> {
    Ok(())
}

#[dlock(key = "c", expire = "999us")]
async fn lease_too_short() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
