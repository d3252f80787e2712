//! Inherent methods with every receiver, and `<self.field>` / `<self.0>` placeholders.
use dlock_runtime::{LockError, dlock};

pub struct Account {
    id: u64,
    owner: Owner,
    balance: i64,
}

pub struct Owner(String, u32);

impl Account {
    #[dlock(key = "account:<self.id>")]
    pub async fn balance(&self) -> Result<i64, LockError> {
        Ok(self.balance)
    }

    #[dlock(key = "account:<self.id>:<self.owner.0>:<self.owner.1>")]
    pub async fn withdraw(&mut self, amount: i64) -> Result<i64, LockError> {
        self.balance -= amount;
        Ok(self.balance)
    }

    #[dlock(key = "account:<self.id>")]
    pub async fn close(self) -> Result<Owner, LockError> {
        Ok(self.owner)
    }

    #[dlock(key = "account:<self.id>")]
    async fn close_mut(mut self) -> Result<i64, LockError> {
        self.balance = 0;
        Ok(self.balance)
    }

    #[dlock(key = "account:<self.id>")]
    async fn boxed(self: Box<Self>) -> Result<u64, LockError> {
        Ok(self.id)
    }

    #[dlock(key = "accounts")]
    async fn associated(id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

pub struct Tenant(&'static str);

impl Tenant {
    #[dlock(key = "tenant:<self.0>")]
    async fn name(&self) -> Result<&'static str, LockError> {
        Ok(self.0)
    }

    #[dlock(key = "tenant:<self>")]
    async fn whole(&self) -> Result<(), LockError> {
        Ok(())
    }
}

impl std::fmt::Display for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

fn main() {
    let mut account = Account {
        id: 1,
        owner: Owner("a".into(), 1),
        balance: 5,
    };
    drop(account.balance());
    drop(account.withdraw(1));
    drop(Account::associated(1));
    let _ = Box::new(Account {
        id: 2,
        owner: Owner("b".into(), 2),
        balance: 0,
    })
    .boxed();
    let _ = Account {
        id: 3,
        owner: Owner("c".into(), 3),
        balance: 0,
    }
    .close_mut();
    let _ = account.close();
    let tenant = Tenant("t");
    drop(tenant.name());
    drop(tenant.whole());
}
