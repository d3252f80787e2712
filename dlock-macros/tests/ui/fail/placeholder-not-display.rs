use dlock_runtime::{LockError, dlock};

pub struct OrderId(u64);

pub struct Request {
    pub id: OrderId,
    pub user: Vec<u8>,
}

#[dlock(key = "order:<id>")]
async fn create_order(id: OrderId) -> Result<u64, LockError> {
    Ok(id.0)
}

#[dlock(key = "order:<req.user>")]
async fn field(req: Request) -> Result<u64, LockError> {
    Ok(req.id.0)
}

fn main() {}
