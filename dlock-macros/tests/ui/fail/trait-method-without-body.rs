use dlock_runtime::{LockError, dlock};

pub trait Orders {
    #[dlock(key = "order:<id>")]
    async fn create_order(&self, id: u64) -> Result<u64, LockError>;
}

fn main() {}
