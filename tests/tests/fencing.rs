//! `dlock_runtime::fencing_token()` inside a locked body, against a real `redis-server`: the
//! holder's token, the same across the body's `.await`s, increasing from one call to the next
//! and below any later holder's, and `None` outside a locked body.

use std::time::Duration;

use dlock_runtime::{LockError, LockOptions, Locker, dlock, fencing_token};
use dlock_tests::RedisServer;

#[dlock(key = "report:<id>", client = locker)]
async fn report(locker: &Locker, id: u8) -> Result<u64, LockError> {
    let before = fencing_token().expect("inside a locked body");
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(fencing_token(), Some(before), "stable across an `.await`");
    Ok(before)
}

#[dlock(key = "outer", client = locker)]
async fn outer(locker: &Locker) -> Result<(u64, u64, u64), LockError> {
    let mine = fencing_token().expect("inside");
    let inner = report(locker, 1).await?;
    Ok((
        mine,
        inner,
        fencing_token().expect("back in the outer body"),
    ))
}

#[tokio::test]
async fn token_is_some_and_increasing_inside_and_none_outside() {
    let server = RedisServer::start();
    let locker = server.locker();
    assert_eq!(fencing_token(), None);
    let mut tokens = Vec::new();
    for _ in 0..3 {
        tokens.push(report(&locker, 0).await.unwrap());
        assert_eq!(fencing_token(), None, "none after the call");
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    // A later holder, through the API and another connection, has a higher token.
    let later = server
        .locker()
        .acquire("report:0", LockOptions::new())
        .await
        .unwrap();
    assert!(later.fencing_token() > tokens[2]);
    assert_eq!(fencing_token(), None, "a plain guard is not a locked body");
    later.release().await.unwrap();
    assert!(report(&locker, 0).await.unwrap() > tokens[2]);
}

#[tokio::test]
async fn nested_bodies_see_their_own_token() {
    let server = RedisServer::start();
    let locker = server.locker();
    let (outer_token, inner_token, after) = outer(&locker).await.unwrap();
    assert_eq!(
        after, outer_token,
        "the outer token again after the inner call"
    );
    let holder = server
        .locker()
        .acquire("report:1", LockOptions::new())
        .await
        .unwrap();
    assert!(
        holder.fencing_token() > inner_token,
        "the inner token is `report:1`'s"
    );
}
