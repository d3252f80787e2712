use dlock_runtime::{LockError, dlock};

#[dlock(key = "report", timeout = "0s", hold_at_least = "0s")]
async fn nightly_report() -> Result<(), LockError> {
    Ok(())
}

#[dlock(key = "report", hold_at_least = "366days")]
async fn a_year_and_a_day() -> Result<(), LockError> {
    Ok(())
}

#[dlock(key = "report", hold_at_least = 300)]
async fn not_a_string() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
