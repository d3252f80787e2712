//! Methods of trait impls: native `async fn` in traits (a public trait of the user's own: the
//! lint about auto-trait bounds is theirs to silence, not this case's).
#![allow(async_fn_in_trait)]
use dlock_runtime::{LockError, dlock};

pub trait Repository {
    async fn save(&self, id: u64) -> Result<u64, LockError>;
    async fn load(&mut self, id: u64) -> Result<(), LockError>;
}

pub struct Db {
    name: String,
}

impl Repository for Db {
    #[dlock(key = "db:<self.name>:<id>")]
    async fn save(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    #[dlock(key = "db:<self.name>:<id>", timeout = "1s")]
    async fn load(&mut self, id: u64) -> Result<(), LockError> {
        self.name.push_str(&id.to_string());
        Ok(())
    }
}

fn main() {
    let mut db = Db {
        name: String::new(),
    };
    drop(db.save(1));
    drop(db.load(1));
}
