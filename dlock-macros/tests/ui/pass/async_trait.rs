//! `#[async_trait]` rewrites the methods before `#[dlock]` sees them; `#[dlock]` locks inside
//! the boxed future. The trait objects stay usable.
use std::sync::Arc;

use async_trait::async_trait;
use dlock_runtime::{LockError, Locker, dlock};

pub struct Path<T>(pub T);
pub struct Order {
    pub sku: String,
    pub qty: u32,
}

#[async_trait]
pub trait Service: Send + Sync {
    async fn get(&self, id: u64) -> Result<u64, LockError>;
    async fn update(&mut self, order: Order) -> Result<(), LockError>;
    async fn by_path(&self, path: Path<u64>, note: &str) -> Result<String, LockError>;
    async fn consume(self: Box<Self>) -> Result<(), LockError>;
    async fn unit(&self);

    #[dlock(key = "default:<id>")]
    async fn provided(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

pub struct Shop {
    tenant: String,
    locks: Arc<Locker>,
}

fn busy(_: LockError) {}

#[async_trait]
impl Service for Shop {
    #[dlock(key = "shop:<self.tenant>:<id>")]
    async fn get(&self, id: u64) -> Result<u64, LockError> {
        Ok(id + self.tenant.len() as u64)
    }

    #[dlock(key = "shop:<self.tenant>:<order.sku>", client = &self.locks)]
    async fn update(&mut self, order: Order) -> Result<(), LockError> {
        self.tenant.push_str(&order.sku);
        let _ = order.qty;
        Ok(())
    }

    #[dlock(key = "shop:<id>:<note>", timeout = "0s")]
    async fn by_path(&self, Path(id): Path<u64>, note: &str) -> Result<String, LockError> {
        if id == 0 {
            return Ok(String::new());
        }
        Ok(format!("{id}{note}{}", self.tenant))
    }

    #[dlock(key = "shop:<self.tenant>")]
    async fn consume(self: Box<Self>) -> Result<(), LockError> {
        drop(self.tenant);
        Ok(())
    }

    #[dlock(key = "shop:unit", on_fail = busy)]
    async fn unit(&self) {}
}

fn assert_send<T: Send>(_: &T) {}

fn main() {
    let shop = Shop {
        tenant: "t".into(),
        locks: Arc::new(Locker::memory()),
    };
    let service: Box<dyn Service> = Box::new(shop);
    let future = service.get(1);
    assert_send(&future);
    drop(future);
    drop(service.by_path(Path(1), "n"));
    drop(service.provided(1));
    drop(service.unit());
    drop(service.consume());
}
