//! Sentinel: the master is whatever the sentinels name, checked with `ROLE` before it is used
//! (redis-rs's `SentinelClient` does both), and asked for again after any error that may mean it
//! moved (a demoted master's `READONLY`, a lost or silent connection) and as soon as a sentinel
//! announces a failover (`+switch-master`): a demoted master keeps accepting writes until the
//! sentinels reconfigure it, and loses them when it resynchronises from the new one.

use std::{
    sync::{
        Arc, Weak,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures_util::StreamExt as _;

use redis::{
    IntoConnectionInfo as _,
    sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType},
};

use crate::{LockError, error::BackendError, url::HostList};

const FORM: &str = "redis+sentinel://[user:password@]s1:p1,s2:p2/<master name>[/<db>]";

/// Checks a `redis+sentinel://` URL: its sentinels and master name.
pub(super) fn check(var: &str, url: &str) -> Result<(), LockError> {
    let hosts = HostList::parse(var, url, FORM)?;
    master_name(&hosts, var).map(drop)
}

/// The master's name: the first path segment, not empty.
fn master_name<'a>(hosts: &HostList<'a>, var: &str) -> Result<&'a str, LockError> {
    let name = hosts.path.split('/').next().unwrap_or("");
    if name.is_empty() {
        return Err(LockError::config(format!(
            "{var}: the master name is missing; expected `{FORM}`"
        )));
    }
    Ok(name)
}

/// The sentinels of one master name.
pub(super) struct Master {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    request_timeout: Duration,
    name: String,
    sentinel_urls: Vec<String>,
    /// Failovers announced since start: a connection made before the last one is stale.
    generation: Arc<AtomicU64>,
    /// One `+switch-master` listener per sentinel, started on first use (and again when the
    /// runtime they ran on has gone).
    listeners: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Master {
    /// Parses the URL; makes no connection. The URL's credentials and database are the
    /// master's; the sentinels are asked without credentials.
    pub(super) fn new(url: &str, request_timeout: Duration) -> Result<Self, LockError> {
        let bad = || LockError::config(format!("DLOCK_URL: expected `{FORM}`"));
        let hosts = HostList::parse("DLOCK_URL", url, FORM)?;
        let name = master_name(&hosts, "DLOCK_URL")?;
        let db = match hosts.path.split('/').nth(1).filter(|d| !d.is_empty()) {
            Some(db) => format!("/{}", db.parse::<u32>().map_err(|_| bad())?),
            None => String::new(),
        };
        let master = HostList {
            hosts: vec![("master", 6379)],
            ..hosts.clone()
        };
        let master_info = master.node_urls(&db)[0]
            .as_str()
            .into_connection_info()
            .map_err(|_| bad())?;
        let mut node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(master_info.redis_settings().clone());
        if hosts.tls {
            node = node.set_tls_mode(redis::TlsMode::Secure);
        }
        let sentinels = HostList {
            userinfo: None,
            ..hosts.clone()
        }
        .node_urls("");
        // An owned name: `build` takes a `String` unless redis-rs's rustls feature is on.
        let service: String = name.to_owned();
        let client = SentinelClient::build(
            sentinels.clone(),
            service,
            Some(node),
            SentinelServerType::Master,
        )
        .map_err(|_| bad())?;
        Ok(Self {
            sentinels: tokio::sync::Mutex::new(client),
            request_timeout,
            name: name.to_owned(),
            sentinel_urls: sentinels,
            generation: Arc::new(AtomicU64::new(0)),
            listeners: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// How many failovers the sentinels have announced since the listeners started.
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Starts the `+switch-master` listeners unless they run.
    fn listen(&self) {
        let mut listeners = self
            .listeners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !listeners.is_empty() && listeners.iter().all(|l| !l.is_finished()) {
            return;
        }
        for listener in listeners.drain(..) {
            listener.abort();
        }
        for url in &self.sentinel_urls {
            listeners.push(tokio::spawn(announcements(
                url.clone(),
                self.name.clone(),
                Arc::downgrade(&self.generation),
                self.request_timeout,
            )));
        }
    }

    /// Asks the sentinels for the master, and the master whether it is one.
    pub(super) async fn resolve(&self) -> Result<redis::Client, BackendError> {
        self.listen();
        let mut sentinels = self.sentinels.lock().await;
        match tokio::time::timeout(self.request_timeout * 2, sentinels.async_get_client()).await {
            Ok(Ok(client)) => {
                tracing::debug!(
                    master = %client.get_connection_info().addr(),
                    "Redis master found through the sentinels"
                );
                Ok(client)
            }
            Ok(Err(error)) => Err(BackendError::with_source(
                "no sentinel named a reachable master for the configured name",
                error,
            )),
            Err(_) => Err(BackendError::new(format!(
                "the sentinels did not name a master within {:?}",
                self.request_timeout * 2
            ))),
        }
    }
}

impl Drop for Master {
    fn drop(&mut self) {
        for listener in self
            .listeners
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain(..)
        {
            listener.abort();
        }
    }
}

/// Listens to one sentinel's `+switch-master` announcements of `name` and counts them in
/// `generation`, reconnecting after a pause when the sentinel goes away, until the locker is
/// dropped.
async fn announcements(url: String, name: String, generation: Weak<AtomicU64>, timeout: Duration) {
    let prefix = format!("{name} ");
    while generation.strong_count() > 0 {
        let subscribed = async {
            let client = redis::Client::open(url.as_str()).ok()?;
            let mut pubsub = tokio::time::timeout(timeout, client.get_async_pubsub())
                .await
                .ok()?
                .ok()?;
            tokio::time::timeout(timeout, pubsub.subscribe("+switch-master"))
                .await
                .ok()?
                .ok()?;
            Some(pubsub)
        }
        .await;
        if let Some(mut pubsub) = subscribed {
            let mut messages = pubsub.on_message();
            while let Some(message) = messages.next().await {
                let payload: String = message.get_payload().unwrap_or_default();
                if payload.starts_with(&prefix) {
                    let Some(generation) = generation.upgrade() else {
                        return;
                    };
                    generation.fetch_add(1, Ordering::AcqRel);
                    tracing::debug!(
                        "a sentinel announced a failover; the master is asked for again"
                    );
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
