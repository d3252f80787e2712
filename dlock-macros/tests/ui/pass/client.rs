//! `client = <expr>` may borrow an argument that the body then takes by value.
use std::sync::Arc;

use dlock_runtime::{LockError, Locker, dlock};

pub struct State<T>(pub T);

#[derive(Clone)]
pub struct App {
    pub locks: Arc<Locker>,
    pub name: String,
}

#[dlock(key = "stock:<sku>", client = &state.locks)]
async fn reserve(state: App, sku: String) -> Result<App, LockError> {
    let moved = state;
    drop(sku);
    Ok(moved)
}

#[dlock(key = "stock:<sku>", client = &app.locks)]
async fn extractor(State(app): State<App>, sku: &str) -> Result<String, LockError> {
    Ok(app.name + sku)
}

#[dlock(key = "plain", client = locker)]
async fn by_ref(locker: &Locker) -> Result<(), LockError> {
    let _ = locker;
    Ok(())
}

fn pick(app: &App) -> &Locker {
    &app.locks
}

#[dlock(key = "call", client = pick(&app))]
async fn computed(app: App) -> Result<App, LockError> {
    Ok(app)
}

pub struct Service {
    locks: Locker,
}

impl Service {
    #[dlock(key = "svc", client = &self.locks)]
    async fn method(&self) -> Result<(), LockError> {
        Ok(())
    }

    #[dlock(key = "svc", client = &self.locks)]
    async fn owned(self) -> Result<Service, LockError> {
        Ok(self)
    }
}

fn assert_send<T: Send>(_: &T) {}

fn main() {
    let app = App {
        locks: Arc::new(Locker::memory()),
        name: "a".into(),
    };
    let future = reserve(app.clone(), "s".into());
    assert_send(&future);
    drop(future);
    drop(extractor(State(app.clone()), "s"));
    let locker = Locker::memory();
    drop(by_ref(&locker));
    drop(computed(app));
    let service = Service {
        locks: Locker::memory(),
    };
    drop(service.method());
    drop(service.owned());
}
