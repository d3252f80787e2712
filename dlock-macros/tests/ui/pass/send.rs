//! A locked function's future is `Send` when its body's is (axum needs it), and it runs.
use std::sync::Arc;

use dlock_runtime::{LockError, Locker, dlock};

fn assert_send<T: Send>(_: &T) {}
fn assert_send_static<T: Send + 'static>(_: &T) {}

pub struct State<T>(pub T);

#[derive(Clone)]
pub struct App {
    locks: Arc<Locker>,
}

#[dlock(key = "order:<id>", client = &app.locks)]
async fn handler(State(app): State<App>, id: u64) -> Result<String, LockError> {
    tokio::task::yield_now().await;
    drop(app);
    Ok(id.to_string())
}

#[dlock(key = "text:<text>", client = locks)]
async fn borrowed(locks: &Locker, text: &str) -> Result<usize, LockError> {
    tokio::task::yield_now().await;
    Ok(text.len())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let app = App {
        locks: Arc::new(Locker::memory()),
    };
    let future = handler(State(app.clone()), 42);
    assert_send_static(&future);
    assert_eq!(tokio::spawn(future).await.unwrap().unwrap(), "42");
    let locks = Locker::memory();
    let future = borrowed(&locks, "abc");
    assert_send(&future);
    assert_eq!(future.await.unwrap(), 3);
}
