//! The connection to etcd: the endpoints, one client at a time on one of them, every request
//! bounded by the request timeout, and the errors.

use std::{
    sync::{Mutex, PoisonError},
    time::Duration,
};

use etcd_client::{Client, ConnectOptions};

use crate::{LockError, error::BackendError};

/// The endpoints, one client at a time on one of them, and the request bound.
pub(super) struct Conn {
    pub(super) endpoints: Vec<String>,
    options: ConnectOptions,
    pub(super) request_timeout: Duration,
    /// The client in use, on `endpoints[current.1]`, and how many times the endpoint changed
    /// (so that concurrent failures move on once).
    current: Mutex<(Option<Client>, usize, u64)>,
    connecting: tokio::sync::Mutex<()>,
}

impl Conn {
    pub(super) fn new(
        endpoints: Vec<String>,
        options: ConnectOptions,
        request_timeout: Duration,
    ) -> Self {
        // Lockers start on different members, so that many of them spread their load (every
        // member serves; followers forward writes to the leader).
        let start = crate::backend::api::Token::generate()
            .map_or(0, |t| usize::from_str_radix(&t.0[..4], 16).unwrap_or(0));
        Self {
            endpoints,
            options,
            request_timeout,
            current: Mutex::new((None, start, 0)),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    /// The client in use, made (without I/O unless the URL has credentials) on first use.
    pub(super) async fn client(&self) -> Result<(Client, u64), BackendError> {
        if let (Some(client), _, epoch) =
            &*self.current.lock().unwrap_or_else(PoisonError::into_inner)
        {
            return Ok((client.clone(), *epoch));
        }
        let _one = self.connecting.lock().await;
        let (index, epoch) = {
            let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(client) = &current.0 {
                return Ok((client.clone(), current.2));
            }
            (current.1, current.2)
        };
        let endpoint = self.endpoints[index % self.endpoints.len()].clone();
        let connect = Client::connect([endpoint], Some(self.options.clone()));
        let client = match tokio::time::timeout(self.request_timeout, connect).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                self.next_endpoint(epoch);
                return Err(error("connect", &e));
            }
            Err(_) => {
                self.next_endpoint(epoch);
                return Err(BackendError::new(
                    "etcd: could not connect within the request timeout",
                ));
            }
        };
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        current.0 = Some(client.clone());
        Ok((client, current.2))
    }

    /// Drops the client and moves to the next endpoint, once per failure of `epoch`.
    pub(super) fn next_endpoint(&self, epoch: u64) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.2 == epoch {
            current.0 = None;
            current.1 = (current.1 + 1) % self.endpoints.len();
            current.2 += 1;
        }
    }

    /// One request, bounded by the request timeout; a transport failure moves to the next
    /// endpoint for the following requests.
    pub(super) async fn call<T, F, Fut>(&self, what: &str, f: F) -> Result<T, BackendError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let (client, epoch) = self.client().await?;
        match tokio::time::timeout(self.request_timeout, f(client)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                if is_transport(&e) {
                    self.next_endpoint(epoch);
                }
                Err(error(what, &e))
            }
            Err(_) => {
                self.next_endpoint(epoch);
                Err(BackendError::new(format!(
                    "etcd: no reply within the request timeout ({:?}) to {what}",
                    self.request_timeout
                )))
            }
        }
    }
}

/// Whether the error is the link's rather than the server's answer.
pub(super) fn is_transport(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            // Unknown, deadline exceeded, unavailable, cancelled, aborted.
            matches!(status.code() as i32, 1 | 2 | 4 | 10 | 14)
        }
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

/// Whether etcd said the lease is gone (expired or revoked).
pub(super) fn lease_gone(e: &BackendError) -> bool {
    e.to_string().contains("lease not found")
}

/// A backend error for a failed `what`; permissions and credentials are refusals.
pub(super) fn error(what: &str, e: &etcd_client::Error) -> BackendError {
    let refused = matches!(e, etcd_client::Error::GRpcStatus(s)
        if matches!(s.code() as i32, 7 | 16));
    let message = match e {
        etcd_client::Error::GRpcStatus(s) => format!("etcd: could not {what}: {}", s.message()),
        other => format!("etcd: could not {what}: {other}"),
    };
    let error = BackendError::new(message);
    if refused { error.refused() } else { error }
}

#[cfg(feature = "tls")]
pub(super) fn tls_options(options: ConnectOptions) -> Result<ConnectOptions, LockError> {
    let mut tls = etcd_client::TlsOptions::new();
    match std::env::var_os("SSL_CERT_FILE") {
        Some(file) => {
            let pem = std::fs::read(&file).map_err(|e| {
                LockError::config(format!("SSL_CERT_FILE: could not read the CA file: {e}"))
            })?;
            tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
        }
        None => tls = tls.with_native_roots(),
    }
    Ok(options.with_tls(tls))
}

#[cfg(not(feature = "tls"))]
pub(super) fn tls_options(_: ConnectOptions) -> Result<ConnectOptions, LockError> {
    Err(LockError::config(
        "DLOCK_URL: `etcds://` (TLS) needs dlock-runtime's `tls` feature; use `etcd://` or enable it",
    ))
}
