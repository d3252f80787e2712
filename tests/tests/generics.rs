//! Generic locked functions, against a real `redis-server`: type parameters, `impl Trait`
//! arguments and returns, where-clauses, lifetimes, generic impls and `client = &Arc<Locker>`.
//! The key exists while the body runs and is gone after.

use std::{
    borrow::Borrow,
    fmt::Display,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use dlock_runtime::{LockError, Locker, dlock};
use dlock_tests::{RedisServer, racy_increment};

#[dlock(key = "item:<item>", client = locker)]
async fn generic<T: Display + Send>(
    locker: &Locker,
    server: &RedisServer,
    item: T,
) -> Result<(bool, T), LockError> {
    Ok((server.exists(&format!("dlock:item:{item}")), item))
}

#[dlock(key = "impl:<id>:<label>", client = locker)]
async fn impl_trait(
    locker: &Locker,
    server: &RedisServer,
    id: impl Display,
    label: &impl Display,
) -> Result<(bool, impl Display), LockError> {
    let key = format!("dlock:impl:{id}:{label}");
    Ok((server.exists(&key), key))
}

#[dlock(key = "kv:<k>", client = locker)]
async fn where_clause<K, V>(
    locker: &Locker,
    server: &RedisServer,
    k: K,
    v: &V,
) -> Result<(bool, V), LockError>
where
    K: Display + Send,
    V: Clone + Sync,
{
    Ok((server.exists(&format!("dlock:kv:{k}")), v.clone()))
}

#[dlock(key = "name:<name>", client = locker)]
async fn lifetimes<'a, 'b: 'a>(
    locker: &'a Locker,
    server: &'b RedisServer,
    name: &'a str,
) -> Result<(bool, &'a str), LockError> {
    Ok((server.exists(&format!("dlock:name:{name}")), name))
}

#[dlock(key = "arc:<id>", client = locks)]
async fn arc_client(locks: &Arc<Locker>, server: &RedisServer, id: u8) -> Result<bool, LockError> {
    Ok(server.exists(&format!("dlock:arc:{id}")))
}

struct Repo<T> {
    name: &'static str,
    locks: Locker,
    items: Vec<T>,
}

impl<T: Display + Clone + Send + Sync> Repo<T> {
    #[dlock(key = "repo:<self.name>:<at>", client = &self.locks)]
    async fn get<const N: usize>(
        &self,
        server: &RedisServer,
        at: usize,
    ) -> Result<(bool, [T; N]), LockError> {
        let held = server.exists(&format!("dlock:repo:{}:{at}", self.name));
        Ok((held, std::array::from_fn(|i| self.items[at + i].clone())))
    }
}

#[tokio::test]
async fn type_parameters_impl_trait_and_where_clauses() {
    let server = RedisServer::start();
    let locker = server.locker();
    assert_eq!(
        generic(&locker, &server, "x".to_owned()).await.unwrap(),
        (true, "x".to_owned())
    );
    assert_eq!(generic(&locker, &server, 3.5).await.unwrap(), (true, 3.5));
    let (held, key) = impl_trait(&locker, &server, 1u8, &'c').await.unwrap();
    assert!(held);
    assert_eq!(key.to_string(), "dlock:impl:1:c");
    assert_eq!(
        where_clause(&locker, &server, 'k', &vec![1, 2])
            .await
            .unwrap(),
        (true, vec![1, 2])
    );
    for key in ["item:x", "item:3.5", "impl:1:c", "kv:k"] {
        assert!(!server.exists(&format!("dlock:{key}")), "{key} released");
    }
}

#[tokio::test]
async fn lifetimes_arc_clients_and_generic_impls() {
    let server = RedisServer::start();
    let locker = server.locker();
    let name = String::from("borrowed");
    assert_eq!(
        lifetimes(&locker, &server, &name).await.unwrap(),
        (true, "borrowed")
    );
    assert!(
        arc_client(&Arc::new(server.locker()), &server, 4)
            .await
            .unwrap()
    );
    let repo = Repo {
        name: "r",
        locks: server.locker(),
        items: vec![10, 20, 30],
    };
    assert_eq!(repo.get::<2>(&server, 1).await.unwrap(), (true, [20, 30]));
    for key in ["name:borrowed", "arc:4", "repo:r:1"] {
        assert!(!server.exists(&format!("dlock:{key}")), "{key} released");
    }
}

#[dlock(key = "count:<id>", client = &locker)]
async fn bump<C>(locker: Locker, counter: C, id: impl Display + Send) -> Result<(), LockError>
where
    C: Borrow<AtomicU64> + Send,
{
    racy_increment(counter.borrow()).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_functions_exclude_each_other() {
    let server = RedisServer::start();
    let counter = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|_| tokio::spawn(bump(server.locker(), counter.clone(), "g")))
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), 8);
    assert!(!server.exists("dlock:count:g"));
}
