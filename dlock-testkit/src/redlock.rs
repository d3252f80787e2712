//! Independent Redis masters for RedLock: N throwaway servers, no replication between them.

use super::RedisServer;

/// N `redis-server`s, each a [`RedisServer`] of its own (no persistence, loopback only, free
/// port), that a `redis+redlock://` URL names as its masters.
///
/// # Behavior
/// - **Start**: the servers start side by side (one thread each); the start returns once every
///   one answers `PING`.
/// - **Faults**: each server is reachable by index ([`server`](Self::server),
///   [`server_mut`](Self::server_mut)) for the faults [`RedisServer`] has: kill, restart empty
///   on the same port, SIGSTOP/SIGCONT.
/// - **Drop**: every server is killed and its directory removed.
#[derive(Debug)]
pub struct RedLockServers {
    servers: Vec<RedisServer>,
}

impl RedLockServers {
    /// Five masters: a majority is 3, and any two may fail.
    ///
    /// # Panics
    /// When `redis-server` is not installed (with the install command) or a server does not
    /// come up.
    #[must_use]
    pub fn start() -> Self {
        Self::start_n(5)
    }

    /// `n` masters.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    #[must_use]
    pub fn start_n(n: usize) -> Self {
        Self::try_start_n(n).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`start_n`](Self::start_n), returning why a server did not come up instead of panicking.
    ///
    /// # Errors
    /// As [`RedisServer::try_start`].
    pub fn try_start_n(n: usize) -> std::io::Result<Self> {
        let starting: Vec<_> = (0..n)
            .map(|_| std::thread::spawn(RedisServer::try_start))
            .collect();
        let servers = starting
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("a server start panicked")))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Self { servers })
    }

    /// `redis+redlock://127.0.0.1:p1,127.0.0.1:p2,…`.
    #[must_use]
    pub fn url(&self) -> String {
        Self::url_of(&self.ports())
    }

    /// `redis+redlock://` naming these ports of 127.0.0.1 (some of them proxies, say).
    #[must_use]
    pub fn url_of(ports: &[u16]) -> String {
        let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+redlock://{}", hosts.join(","))
    }

    /// The masters' ports, in the URL's order.
    #[must_use]
    pub fn ports(&self) -> Vec<u16> {
        self.servers.iter().map(RedisServer::port).collect()
    }

    /// How many masters there are.
    #[must_use]
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// `true` when there are none (never, once started).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// The master at `index`.
    ///
    /// # Panics
    /// When there is no such master.
    #[must_use]
    pub fn server(&self, index: usize) -> &RedisServer {
        &self.servers[index]
    }

    /// The master at `index`, for the faults that need `&mut` (kill, restart).
    ///
    /// # Panics
    /// When there is no such master.
    pub fn server_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.servers[index]
    }

    /// Every master.
    #[must_use]
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }
}
