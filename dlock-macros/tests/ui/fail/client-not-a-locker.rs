use dlock_runtime::{LockError, dlock};

pub struct App {
    pub url: String,
}

#[dlock(key = "order:<id>", client = &app.url)]
async fn create_order(app: App, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
