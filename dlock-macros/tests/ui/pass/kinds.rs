//! `permits`, `read` and `write` in every position, with the other arguments, on methods and
//! free functions; `u32::MAX` permits compile and run on the embedded backend.
use dlock_runtime::{LockError, LockKind, Locker, dlock};

#[dlock(permits = 4294967295, key = "many", client = locker)]
async fn many(locker: &Locker) -> Result<LockKind, LockError> {
    Ok(LockKind::semaphore(u32::MAX))
}

#[dlock(key = "export:<tenant>", permits = 3, client = locker, expire = "auto", timeout = "1s")]
async fn export(locker: &Locker, tenant: &str) -> Result<(), LockError> {
    Ok(())
}

struct Docs {
    locker: Locker,
}

impl Docs {
    #[dlock(key = "doc:<id>", read, client = &self.locker, fair = false)]
    async fn show(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    #[dlock(write, key = "doc:<id>", client = &self.locker, on_lost = "continue")]
    async fn edit(&mut self, id: u64) -> Result<u64, LockError> {
        self.show(id).await
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let locker = Locker::memory();
    many(&locker).await.unwrap();
    export(&locker, "acme").await.unwrap();
    let mut docs = Docs { locker };
    assert_eq!(docs.show(7).await.unwrap(), 7);
    assert_eq!(docs.edit(7).await.unwrap(), 7);
}
