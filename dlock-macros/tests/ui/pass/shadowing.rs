//! Generated code names std through `::core` and the runtime by absolute path, so local items
//! named `core`, `std`, `Result`, `Option`, `Ok`, `Err`, `Some`, `None` or `dlock_runtime` do not
//! capture it.
#![allow(dead_code, non_snake_case, non_upper_case_globals)]

mod core {}
mod std {}

mod shadow {
    pub type Result<T> = ::core::result::Result<T, ::dlock_runtime::LockError>;
    pub struct Option;
    pub fn Ok() {}
    pub fn Err() {}
    pub fn Some() {}
    pub const None: () = ();
}

use shadow::*;

mod inner {
    pub mod dlock_runtime {}

    #[::dlock_runtime::dlock(key = "inner")]
    pub async fn shadowed_runtime() -> ::core::result::Result<(), ::dlock_runtime::LockError> {
        ::core::result::Result::Ok(())
    }
}

#[::dlock_runtime::dlock(key = "shadow:<id>", timeout = "1s", expire = "2s")]
async fn shadowed(id: u64) -> Result<u64> {
    ::core::result::Result::Ok(id)
}

fn main() {
    drop(shadowed(1));
    drop(inner::shadowed_runtime());
}
