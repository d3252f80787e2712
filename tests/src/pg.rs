//! Helpers of the PostgreSQL tests: one throwaway cluster per test binary, a database per test
//! that needs a schema of its own, a plain client, and the tables the `dlock-pg-worker`
//! processes write.

use std::sync::{Arc, Mutex, Weak};

use crate::PostgresServer;

/// The tables `dlock-pg-worker` writes: a counter per key, the history of its values with the
/// fence of the holder that wrote each, and a fenced resource. [`shared_server`] creates them.
pub const TABLES: &str = "\
CREATE TABLE IF NOT EXISTS dlock_test_counter (key text PRIMARY KEY, n bigint NOT NULL);
CREATE TABLE IF NOT EXISTS dlock_test_history (key text, n bigint, fence bigint);
CREATE TABLE IF NOT EXISTS dlock_test_resource (key text PRIMARY KEY, fence bigint, value text);";

/// A write `dlock_test_resource` accepts only with a fence at least as high as every fence it
/// has seen for the key (`$1` key, `$2` fence, `$3` value); 1 row affected when accepted.
pub const FENCED_WRITE: &str = "\
INSERT INTO dlock_test_resource AS r (key, fence, value) VALUES ($1, $2, $3)
ON CONFLICT (key) DO UPDATE SET fence = EXCLUDED.fence, value = EXCLUDED.value
    WHERE r.fence <= EXCLUDED.fence";

/// The cluster the tests of this binary share (started by the first, stopped after the last
/// that runs at the same time), with the workers' tables ([`TABLES`], [`ORDER_TABLE`]). Tests that stop, freeze or restart a server start their own.
#[must_use]
pub fn shared_server() -> Arc<PostgresServer> {
    static SERVER: Mutex<Weak<PostgresServer>> = Mutex::new(Weak::new());
    let mut current = SERVER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(server) = current.upgrade() {
        return server;
    }
    let server = Arc::new(PostgresServer::start());
    // Once, here: concurrent `CREATE TABLE IF NOT EXISTS` can fail on the catalog.
    server
        .sql(&format!("{TABLES}\n{ORDER_TABLE};"))
        .expect("create the workers' tables");
    *current = Arc::downgrade(&server);
    server
}

/// A new empty database `name` on `server`, and the superuser's URL of it.
///
/// # Panics
/// When it cannot be created.
#[must_use]
pub fn database(server: &PostgresServer, name: &str) -> String {
    server
        .sql(&format!("CREATE DATABASE {name}"))
        .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
    format!(
        "postgres://{}@127.0.0.1:{}/{name}",
        crate::postgres::SUPERUSER,
        server.port()
    )
}

/// A plain client on `url`, its connection driven by a task.
///
/// # Panics
/// When it cannot connect.
pub async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to PostgreSQL: {e}"));
    tokio::spawn(connection);
    client
}

/// The order in which `dlock-pg-worker … fair-waiter` processes got the lock; [`shared_server`]
/// creates it.
pub const ORDER_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS dlock_test_order (seq bigserial, key text, name text)";

/// `server`'s URL through `proxy` (a [`crate::proxy::Proxy`] to its port).
#[must_use]
pub fn url_through(server: &PostgresServer, proxy: &crate::proxy::Proxy) -> String {
    server.url().replace(
        &format!(":{}/", server.port()),
        &format!(":{}/", proxy.port()),
    )
}

/// Makes `body` (PL/pgSQL statements, ending with `RETURN NEW;`) run before every insert into
/// `dlock_locks`, as the trigger `name` (and its function of the same name).
///
/// # Panics
/// When the trigger cannot be made.
pub async fn before_each_lock_insert(db: &tokio_postgres::Client, name: &str, body: &str) {
    db.batch_execute(&format!(
        "CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             {body}
         END $$;
         CREATE TRIGGER {name} BEFORE INSERT ON dlock_locks
             FOR EACH ROW EXECUTE FUNCTION {name}();"
    ))
    .await
    .expect("the trigger on dlock_locks");
}
