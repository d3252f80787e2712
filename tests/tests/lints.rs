//! Locked functions compile cleanly under strict lints: the generated code must not make a
//! user's `#![deny(...)]` fail (thiserror's `test_lints.rs`). Run under clippy too:
//! `cargo clippy -p dlock-tests --tests`.
#![deny(warnings, unused_qualifications, clippy::pedantic)]

use std::fmt::Display;
use std::sync::Arc;

use dlock_runtime::{LockError, Locker, dlock};

/// An application error.
#[derive(Debug)]
pub enum AppError {
    /// The lock.
    Lock(LockError),
    /// Anything else.
    Other(String),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

/// A service holding its locker.
#[derive(Debug)]
pub struct Service {
    locks: Arc<Locker>,
    tenant: String,
    total: u64,
}

impl Service {
    /// Every argument.
    ///
    /// # Errors
    /// When the lock cannot be had.
    #[dlock(
        key = "order:<self.tenant>:<id>:<qty>",
        timeout = "0s",
        expire = "auto",
        max_hold = "1m",
        on_lost = "continue",
        client = &self.locks,
        crate = "::dlock_runtime"
    )]
    pub async fn create(&self, id: u64, qty: u32) -> Result<u64, AppError> {
        if qty == 0 {
            return Err(AppError::Other("empty".to_owned()));
        }
        Ok(id * u64::from(qty))
    }

    /// Owned, mutable receiver.
    ///
    /// # Errors
    /// When the lock cannot be had.
    #[dlock(key = "total:<self.tenant>", expire = "5s")]
    pub async fn reset(mut self) -> Result<u64, LockError> {
        self.total = 0;
        Ok(self.total)
    }
}

fn busy(_: LockError) -> &'static str {
    "busy"
}

/// `on_fail`, no key placeholders.
#[dlock(key = "greeting", on_fail = busy)]
pub async fn greet() -> &'static str {
    "hello"
}

/// `impl Trait` argument, `?` in the body.
///
/// # Errors
/// When the lock cannot be had or the text does not parse.
#[dlock(key = "parse:<text>:<label>")]
pub async fn parse(text: &str, label: impl Display) -> Result<u64, AppError> {
    let _ = label.to_string();
    let value = text
        .parse::<u64>()
        .map_err(|error| AppError::Other(error.to_string()))?;
    Ok(value)
}

/// Patterns and generics.
///
/// # Errors
/// When the lock cannot be had.
#[dlock(key = "pair:<a>:<b>")]
pub async fn pair<T>((a, b): (u8, T)) -> Result<T, LockError>
where
    T: Display + Send,
{
    let _ = a;
    Ok(b)
}

#[test]
fn compiles_under_strict_lints() {
    let service = Service {
        locks: Arc::new(Locker::memory()),
        tenant: "t".to_owned(),
        total: 1,
    };
    drop(service.create(1, 2));
    drop(service.reset());
    drop(greet());
    drop(parse("1", 2));
    drop(pair((1, "b")));
}
