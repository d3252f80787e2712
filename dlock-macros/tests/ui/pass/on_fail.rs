//! `on_fail = handler` for return types that are not `Result`.
use dlock_runtime::{LockError, dlock};

fn busy(_: LockError) -> &'static str {
    "busy"
}

fn busy_string(error: LockError) -> String {
    format!("busy: {error}")
}

fn ignore(_: LockError) {}

mod handlers {
    pub fn zero(_: dlock_runtime::LockError) -> u64 {
        0
    }
}

#[dlock(key = "greeting", on_fail = busy)]
async fn greet() -> &'static str {
    "hello"
}

#[dlock(key = "name:<id>", on_fail = busy_string)]
async fn name(id: u64) -> String {
    if id == 0 {
        return String::new();
    }
    id.to_string()
}

#[dlock(key = "unit", on_fail = ignore)]
async fn unit() {
    println!("locked");
}

#[dlock(key = "count", on_fail = handlers::zero)]
async fn count() -> u64 {
    1
}

fn into_result(error: LockError) -> Result<(), String> {
    Err(error.to_string())
}

// `on_fail` also serves a `Result` whose error type has no `From<LockError>`.
#[dlock(key = "stringly", on_fail = into_result)]
async fn stringly() -> Result<(), String> {
    Err("failed".to_owned())?;
    Ok(())
}

fn main() {
    drop(greet());
    drop(name(1));
    drop(unit());
    drop(count());
    drop(stringly());
}
