use dlock_runtime::dlock;

#[dlock(key = "order")]
pub struct Order;

fn main() {}
