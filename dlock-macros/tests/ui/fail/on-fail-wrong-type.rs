use dlock_runtime::{LockError, dlock};

fn busy(_: LockError) -> String {
    "busy".to_owned()
}

#[dlock(key = "order:<id>", on_fail = busy)]
async fn create_order(id: u64) -> u64 {
    id
}

fn main() {}
