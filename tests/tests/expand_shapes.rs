//! Every passing UI shape, compiled as part of the ordinary test build: a shape that stops
//! compiling shows up here with rustc's full output, not only as a trybuild mismatch.
#![allow(dead_code, unreachable_pub, clippy::all, clippy::pedantic)]

#[path = "../../dlock-macros/tests/ui/pass/async_trait.rs"]
mod async_trait_impls;
#[path = "../../dlock-macros/tests/ui/pass/client.rs"]
mod client;
#[path = "../../dlock-macros/tests/ui/pass/crate_path.rs"]
mod crate_path;
#[path = "../../dlock-macros/tests/ui/pass/free_fns.rs"]
mod free_fns;
#[path = "../../dlock-macros/tests/ui/pass/generics.rs"]
mod generics;
#[path = "../../dlock-macros/tests/ui/pass/methods.rs"]
mod methods;
#[path = "../../dlock-macros/tests/ui/pass/on_fail.rs"]
mod on_fail;
#[path = "../../dlock-macros/tests/ui/pass/patterns.rs"]
mod patterns;
#[path = "../../dlock-macros/tests/ui/pass/send.rs"]
mod send;
#[path = "../../dlock-macros/tests/ui/pass/shadowing.rs"]
mod shadowing;
#[path = "../../dlock-macros/tests/ui/pass/trait_impls.rs"]
mod trait_impls;

#[test]
fn shapes_compile() {}

mod runs {
    //! A few shapes run against the embedded backend: the key is the template's text, and the
    //! lock is held while the body runs, for plain and `#[async_trait]` methods alike.
    use std::time::Duration;

    use dlock_runtime::{LockError, Locker, dlock};

    /// Whether `key` is held, asked from another task (so no re-entry can answer for us).
    async fn held(locker: &Locker, key: &'static str) -> bool {
        let locker = locker.clone();
        tokio::spawn(async move {
            locker
                .try_acquire(key, Duration::from_secs(1))
                .await
                .map(|guard| guard.is_none())
        })
        .await
        .expect("the probe task panicked")
        .expect("the probe failed")
    }

    struct Order {
        id: u64,
        sku: (String, u8),
    }

    #[dlock(key = "order:<order.id>:<order.sku.0>:{x}<<y>", client = locker)]
    async fn template(locker: &Locker, order: &Order) -> Result<bool, LockError> {
        Ok(held(locker, "order:42:abc:{x}<y>").await)
    }

    #[async_trait::async_trait]
    trait Shop {
        async fn sell(&self, Order { id, .. }: Order) -> Result<bool, LockError>;
    }

    struct Store {
        locks: Locker,
    }

    #[async_trait::async_trait]
    impl Shop for Store {
        #[dlock(key = "sell:<id>", client = &self.locks)]
        async fn sell(&self, Order { id, .. }: Order) -> Result<bool, LockError> {
            let _ = id;
            Ok(held(&self.locks, "sell:7").await)
        }
    }

    #[tokio::test]
    async fn key_is_the_template_text_and_is_held_during_the_body() {
        let locker = Locker::memory();
        let order = Order {
            id: 42,
            sku: ("abc".to_owned(), 1),
        };
        assert!(template(&locker, &order).await.unwrap());
        assert!(
            !held(&locker, "order:42:abc:{x}<y>").await,
            "released after the body"
        );
        let _ = order.sku.1;
    }

    #[tokio::test]
    async fn async_trait_methods_are_locked() {
        let store = Store {
            locks: Locker::memory(),
        };
        let order = Order {
            id: 7,
            sku: (String::new(), 0),
        };
        assert!(store.sell(order).await.unwrap());
        assert!(!held(&store.locks, "sell:7").await);
    }
}
