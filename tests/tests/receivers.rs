//! Methods under the lock, against a real `redis-server`: every receiver (`&self`, `&mut self`,
//! `self`, `mut self`, `self: Box<Self>`, `self: Arc<Self>`), `<self.field>` keys and
//! `client = &self.locks`, native `async fn` in a trait impl and `#[async_trait]` impls. The key
//! `dlock:<built key>` exists while the body runs and is gone after.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use dlock_runtime::{LockError, Locker, dlock};
use dlock_tests::{RedisServer, racy_increment};

struct Owner(String, u32);

struct Account {
    id: u64,
    owner: Owner,
    balance: i64,
    locks: Locker,
    server: Arc<RedisServer>,
    counter: Arc<AtomicU64>,
}

impl Account {
    fn new(server: &Arc<RedisServer>, id: u64) -> Self {
        Self {
            id,
            owner: Owner("ann".to_owned(), 3),
            balance: 100,
            locks: server.locker(),
            server: server.clone(),
            counter: Arc::new(AtomicU64::new(0)),
        }
    }

    fn held(&self, key: &str) -> bool {
        self.server.exists(key)
    }

    #[dlock(key = "account:<self.id>", client = &self.locks)]
    async fn balance(&self) -> Result<(bool, i64), LockError> {
        Ok((
            self.held(&format!("dlock:account:{}", self.id)),
            self.balance,
        ))
    }

    #[dlock(key = "account:<self.id>:<self.owner.0>:<self.owner.1>", client = &self.locks)]
    pub(crate) async fn withdraw(&mut self, amount: i64) -> Result<bool, LockError> {
        self.balance -= amount;
        Ok(self.held(&format!("dlock:account:{}:ann:3", self.id)))
    }

    #[dlock(key = "account:<self.id>", client = &self.locks.clone())]
    async fn close(self) -> Result<(bool, Owner), LockError> {
        Ok((self.held(&format!("dlock:account:{}", self.id)), self.owner))
    }

    #[dlock(key = "account:<self.id>", client = &self.locks.clone())]
    async fn zero(mut self) -> Result<(bool, i64), LockError> {
        self.balance = 0;
        Ok((
            self.held(&format!("dlock:account:{}", self.id)),
            self.balance,
        ))
    }

    #[dlock(key = "boxed:<self.id>", client = &self.locks.clone())]
    async fn boxed(self: Box<Self>) -> Result<bool, LockError> {
        Ok(self.held(&format!("dlock:boxed:{}", self.id)))
    }

    /// An associated function whose key and client come from ordinary parameters.
    #[dlock(key = "accounts:<id>", client = locker)]
    async fn associated(locker: &Locker, server: &RedisServer, id: u64) -> Result<bool, LockError> {
        Ok(server.exists(&format!("dlock:accounts:{id}")))
    }

    #[dlock(key = "shared:<self.id>", client = &self.locks)]
    async fn bump(self: Arc<Self>) -> Result<(), LockError> {
        racy_increment(&self.counter).await;
        Ok(())
    }
}

#[tokio::test]
async fn shared_reference_receiver() {
    let server = Arc::new(RedisServer::start());
    let account = Account::new(&server, 1);
    assert_eq!(account.balance().await.unwrap(), (true, 100));
    assert!(!server.exists("dlock:account:1"));
}

#[tokio::test]
async fn mutable_reference_receiver() {
    let server = Arc::new(RedisServer::start());
    let mut account = Account::new(&server, 2);
    assert!(account.withdraw(30).await.unwrap());
    assert_eq!(account.balance, 70, "the body mutated the receiver");
    assert!(!server.exists("dlock:account:2:ann:3"));
}

#[tokio::test]
async fn by_value_receivers() {
    let server = Arc::new(RedisServer::start());
    let (held, owner) = Account::new(&server, 3).close().await.unwrap();
    assert!(held);
    assert_eq!((owner.0.as_str(), owner.1), ("ann", 3));
    assert_eq!(Account::new(&server, 4).zero().await.unwrap(), (true, 0));
    assert!(Box::new(Account::new(&server, 5)).boxed().await.unwrap());
    assert!(
        Account::associated(&server.locker(), &server, 6)
            .await
            .unwrap()
    );
    for key in ["account:3", "account:4", "boxed:5", "accounts:6"] {
        assert!(!server.exists(&format!("dlock:{key}")), "{key} released");
    }
}

/// `self: Arc<Self>` with `client = &self.locks`: eight accounts, each with its own connection
/// and the same id, share one counter and lose no increment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arc_receivers_exclude_each_other() {
    let server = Arc::new(RedisServer::start());
    let counter = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let account = Arc::new(Account {
                counter: counter.clone(),
                ..Account::new(&server, 7)
            });
            tokio::spawn(account.bump())
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), 8);
    assert!(!server.exists("dlock:shared:7"));
}

/// Native `async fn` in a trait, locked in the impl.
trait Ledger {
    async fn post(&self, amount: i64) -> Result<(bool, i64), LockError>;
    async fn reset(&mut self) -> Result<bool, LockError>;
}

impl Ledger for Account {
    #[dlock(key = "ledger:<self.id>:<amount>", client = &self.locks)]
    async fn post(&self, amount: i64) -> Result<(bool, i64), LockError> {
        let held = self.held(&format!("dlock:ledger:{}:{amount}", self.id));
        Ok((held, self.balance + amount))
    }

    #[dlock(key = "ledger:<self.id>", client = &self.locks)]
    async fn reset(&mut self) -> Result<bool, LockError> {
        self.balance = 0;
        Ok(self.held(&format!("dlock:ledger:{}", self.id)))
    }
}

#[tokio::test]
async fn native_trait_impl_methods() {
    let server = Arc::new(RedisServer::start());
    let mut account = Account::new(&server, 8);
    assert_eq!(account.post(5).await.unwrap(), (true, 105));
    assert!(account.reset().await.unwrap());
    assert_eq!(account.balance, 0);
    assert!(!server.exists("dlock:ledger:8:5"));
    assert!(!server.exists("dlock:ledger:8"));
}

#[async_trait::async_trait]
trait Shop {
    async fn sell(&self, sku: &str, qty: u32) -> Result<bool, LockError>;
    async fn restock(&mut self, qty: u32) -> Result<bool, LockError>;
    async fn close(self) -> Result<bool, LockError>;
    async fn bump(&self) -> Result<(), LockError>;
}

struct Store {
    name: String,
    stock: u32,
    locks: Locker,
    server: Arc<RedisServer>,
    counter: Arc<AtomicU64>,
}

#[async_trait::async_trait]
impl Shop for Store {
    #[dlock(key = "sell:<self.name>:<sku>:<qty>", client = &self.locks)]
    async fn sell(&self, sku: &str, qty: u32) -> Result<bool, LockError> {
        let key = format!("dlock:sell:{}:{sku}:{qty}", self.name);
        Ok(self.server.exists(&key))
    }

    #[dlock(key = "stock:<self.name>", client = &self.locks)]
    async fn restock(&mut self, qty: u32) -> Result<bool, LockError> {
        self.stock += qty;
        Ok(self.server.exists(&format!("dlock:stock:{}", self.name)))
    }

    #[dlock(key = "close:<self.name>", client = &self.locks.clone())]
    async fn close(self) -> Result<bool, LockError> {
        Ok(self.server.exists(&format!("dlock:close:{}", self.name)))
    }

    #[dlock(key = "bump:<self.name>", client = &self.locks)]
    async fn bump(&self) -> Result<(), LockError> {
        racy_increment(&self.counter).await;
        Ok(())
    }
}

impl Store {
    fn new(server: &Arc<RedisServer>, counter: &Arc<AtomicU64>) -> Self {
        Self {
            name: "corner".to_owned(),
            stock: 1,
            locks: server.locker(),
            server: server.clone(),
            counter: counter.clone(),
        }
    }
}

#[tokio::test]
async fn async_trait_impl_methods() {
    let server = Arc::new(RedisServer::start());
    let mut store = Store::new(&server, &Arc::default());
    assert!(store.sell("tea", 2).await.unwrap());
    assert!(store.restock(4).await.unwrap());
    assert_eq!(store.stock, 5);
    assert!(store.close().await.unwrap());
    for key in ["sell:corner:tea:2", "stock:corner", "close:corner"] {
        assert!(!server.exists(&format!("dlock:{key}")), "{key} released");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_trait_methods_exclude_each_other() {
    let server = Arc::new(RedisServer::start());
    let counter = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = Store::new(&server, &counter);
            tokio::spawn(async move { store.bump().await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), 8);
}
