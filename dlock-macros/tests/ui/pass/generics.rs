//! Generic functions, `impl Trait` arguments and returns, where-clauses, lifetimes.
use std::fmt::Display;

use dlock_runtime::{LockError, dlock};

#[dlock(key = "generic:<id>")]
async fn generic<T: Display + Send, U>(id: T, other: U) -> Result<U, LockError>
where
    U: Clone + Send,
{
    let _ = id;
    Ok(other.clone())
}

#[dlock(key = "impl:<id>")]
async fn impl_arg(
    id: impl Display + Send,
    items: impl IntoIterator<Item = u8>,
) -> Result<usize, LockError> {
    Ok(items.into_iter().count() + id.to_string().len())
}

#[dlock(key = "life:<name>")]
async fn lifetimes<'a, 'b: 'a>(name: &'a str, other: &'b str) -> Result<&'a str, LockError> {
    if other.is_empty() {
        Ok(name)
    } else {
        Ok(other)
    }
}

#[dlock(key = "elided:<name>")]
async fn elided(name: &str) -> Result<&str, LockError> {
    Ok(name)
}

fn to_display(_: LockError) -> Box<dyn Display> {
    Box::new("busy")
}

fn busy_iter(_: LockError) -> std::vec::IntoIter<u8> {
    Vec::new().into_iter()
}

#[dlock(key = "dyn", on_fail = to_display)]
async fn boxed_display() -> Box<dyn Display> {
    Box::new(1)
}

#[dlock(key = "iter", on_fail = busy_iter)]
async fn returns_concrete_iter() -> std::vec::IntoIter<u8> {
    vec![1, 2].into_iter()
}

#[dlock(key = "result-impl")]
async fn result_impl_trait() -> Result<impl Display, LockError> {
    Ok(5)
}

struct Wrapper<T>(T);

impl<T: Display + Sync> Wrapper<T> {
    #[dlock(key = "wrapper:<self.0>")]
    async fn show(&self) -> Result<String, LockError> {
        Ok(self.0.to_string())
    }
}

#[dlock(key = "const:<len>")]
async fn const_generic<const N: usize>(items: [u8; N], len: usize) -> Result<usize, LockError> {
    Ok(items.len() + len)
}

fn main() {
    drop(generic(1, "x"));
    drop(impl_arg("x", vec![1]));
    drop(lifetimes("a", "b"));
    drop(elided("a"));
    drop(boxed_display());
    drop(returns_concrete_iter());
    drop(result_impl_trait());
    drop(Wrapper(1).show());
    drop(const_generic([1, 2], 2));
}
