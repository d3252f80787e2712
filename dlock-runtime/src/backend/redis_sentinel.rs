//! Sentinel: the master is whatever the sentinels name, checked with `ROLE` before it is used
//! (redis-rs's `SentinelClient` does both), and asked for again after any error that may mean it
//! moved: a demoted master's `READONLY`, a lost or silent connection. So a write never goes to a
//! server that does not itself claim to be the master.

use std::time::Duration;

use redis::{
    IntoConnectionInfo as _,
    sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType},
};

use crate::{LockError, error::BackendError, url::HostList};

const FORM: &str = "redis+sentinel://[user:password@]s1:p1,s2:p2/<master name>[/<db>]";

/// The sentinels of one master name.
pub(super) struct Master {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    request_timeout: Duration,
}

impl Master {
    /// Parses the URL; makes no connection. The URL's credentials and database are the
    /// master's; the sentinels are asked without credentials.
    pub(super) fn new(url: &str, request_timeout: Duration) -> Result<Self, LockError> {
        let bad = || LockError::config(format!("DLOCK_URL: expected `{FORM}`"));
        let hosts = HostList::parse("DLOCK_URL", url, FORM)?;
        let name = hosts.master_name("DLOCK_URL", FORM)?;
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
        let client =
            SentinelClient::build(sentinels, service, Some(node), SentinelServerType::Master)
                .map_err(|_| bad())?;
        Ok(Self {
            sentinels: tokio::sync::Mutex::new(client),
            request_timeout,
        })
    }

    /// Asks the sentinels for the master, and the master whether it is one.
    pub(super) async fn resolve(&self) -> Result<redis::Client, BackendError> {
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
