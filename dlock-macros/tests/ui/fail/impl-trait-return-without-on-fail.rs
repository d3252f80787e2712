use dlock_runtime::dlock;

#[dlock(key = "order:<id>")]
async fn create_order(id: u64) -> impl std::fmt::Display {
    id
}

#[dlock(key = "order:<id>")]
async fn reference(id: &str) -> &str {
    id
}

#[dlock(key = "order:<id>")]
async fn tuple(id: u64) -> (u64, u64) {
    (id, id)
}

fn main() {}
