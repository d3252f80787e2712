//! `crate = "..."` names the runtime when it is renamed.
extern crate dlock_runtime as renamed;

mod reexport {
    pub use dlock_runtime as inner;
}

use dlock_runtime as locks;

#[renamed::dlock(key = "a:<id>", crate = "renamed")]
async fn extern_renamed(id: u64) -> Result<u64, renamed::LockError> {
    Ok(id)
}

#[locks::dlock(key = "b", crate = "locks", timeout = "1s")]
async fn use_renamed() -> Result<(), locks::LockError> {
    Ok(())
}

#[reexport::inner::dlock(key = "c", crate = "self::reexport::inner")]
async fn through_module() -> Result<(), reexport::inner::LockError> {
    Ok(())
}

#[locks::dlock(key = "d", crate = "::dlock_runtime")]
async fn absolute() -> Result<(), locks::LockError> {
    Ok(())
}

fn main() {
    drop(extern_renamed(1));
    drop(use_renamed());
    drop(through_module());
    drop(absolute());
}
