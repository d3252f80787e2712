//! Free functions keep their visibility, docs and attributes; `return` and `?` keep their meaning.
use dlock_runtime::{LockError, dlock};

#[derive(Debug)]
pub enum AppError {
    Lock(LockError),
    Parse(std::num::ParseIntError),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(error: std::num::ParseIntError) -> Self {
        AppError::Parse(error)
    }
}

/// Documented, public, with every argument.
#[dlock(
    key = "order:<id>:<qty>",
    timeout = "0s",
    expire = "auto",
    max_hold = "1h",
    on_lost = "continue"
)]
#[inline]
#[must_use = "the result says whether the order was created"]
pub async fn create_order(id: u64, qty: u32) -> Result<u64, AppError> {
    if qty == 0 {
        return Ok(0);
    }
    let parsed: u64 = "7".parse()?;
    Ok(id * u64::from(qty) + parsed)
}

#[dlock(
    key = "text {braces} a<<b > c",
    timeout = "250ms",
    expire = "1m30s",
    on_lost = "abort"
)]
pub(crate) async fn literal_text() -> Result<(), LockError> {
    Ok(())
}

#[dlock(key = "str:<name>:<count>")]
async fn borrowed(name: &str, count: &mut usize) -> Result<usize, LockError> {
    *count += name.len();
    Ok(*count)
}

type AppResult<T> = Result<T, AppError>;

#[dlock(key = "alias")]
async fn alias() -> AppResult<()> {
    Ok(())
}

#[dlock(key = "boxed")]
async fn boxed_error() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    Err("nope")?;
    Ok(())
}

mod nested {
    #[dlock_runtime::dlock(key = "nested")]
    pub async fn path_attribute() -> Result<(), dlock_runtime::LockError> {
        Ok(())
    }
}

fn main() {
    let _ = create_order(1, 2);
    let _ = literal_text();
    let mut count = 0;
    let _ = borrowed("x", &mut count);
    let _ = alias();
    let _ = boxed_error();
    let _ = nested::path_attribute();
}
