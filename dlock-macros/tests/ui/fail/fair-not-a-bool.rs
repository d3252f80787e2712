use dlock_runtime::{LockError, dlock};

#[dlock(key = "ticket:<event>", fair = "yes")]
async fn buy_ticket(event: u32) -> Result<(), LockError> {
    let _ = event;
    Ok(())
}

fn main() {}
