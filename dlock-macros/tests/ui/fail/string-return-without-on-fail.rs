use dlock_runtime::dlock;

#[dlock(key = "order:<id>")]
async fn create_order(id: u64) -> String {
    id.to_string()
}

fn main() {}
