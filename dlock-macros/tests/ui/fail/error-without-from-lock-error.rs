use dlock_runtime::dlock;

#[derive(Debug)]
pub struct AppError;

#[dlock(key = "order:<id>")]
async fn create_order(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
