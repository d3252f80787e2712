//! A TCP proxy on a free loopback port that the test can cut and heal: a partition between a
//! client and one server, without touching either.

use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{Shutdown, TcpListener, TcpStream},
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

/// Forwards every connection made to [`port`](Self::port) to `127.0.0.1:<target>`.
///
/// # Behavior
/// - **Cut** ([`cut`](Self::cut)): nothing more is forwarded either way. Connections stay open
///   and new ones are accepted, but bytes wait in the proxy and the kernel's buffers, as on a
///   network that silently drops packets while TCP keeps retransmitting: the client sees
///   requests without replies.
/// - **Heal** ([`heal`](Self::heal)): what waited is delivered, in order, and forwarding goes
///   on, as when the network comes back.
/// - **Drop**: the listener and every connection are closed; the threads end within ~50ms.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    state: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    cut: Mutex<bool>,
    healed: Condvar,
    stopped: AtomicBool,
    streams: Mutex<Vec<TcpStream>>,
}

impl State {
    /// Blocks while the proxy is cut; `false` once it is stopped.
    fn wait_open(&self) -> bool {
        let mut cut = self
            .cut
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while *cut && !self.stopped.load(Ordering::SeqCst) {
            cut = self
                .healed
                .wait_timeout(cut, Duration::from_millis(50))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        !self.stopped.load(Ordering::SeqCst)
    }
}

impl Proxy {
    /// A proxy to `127.0.0.1:<target>`, forwarding.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    #[must_use]
    pub fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("a local address").port();
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let state = Arc::new(State::default());
        let accepting = state.clone();
        std::thread::spawn(move || {
            while !accepting.stopped.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let _ = client.set_nonblocking(false);
                        if let Ok(server) = TcpStream::connect(("127.0.0.1", target)) {
                            connect(&accepting, client, server);
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self { port, state }
    }

    /// The port clients connect to instead of the target's.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops forwarding (see *Behavior*).
    pub fn cut(&self) {
        *self
            .state
            .cut
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = true;
    }

    /// Forwards again, first what waited.
    pub fn heal(&self) {
        *self
            .state
            .cut
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = false;
        self.state.healed.notify_all();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        self.state.healed.notify_all();
        for stream in self
            .state
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain(..)
        {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Pumps both ways between `client` and `server`, one thread per direction.
fn connect(state: &Arc<State>, client: TcpStream, server: TcpStream) {
    let (Ok(client_out), Ok(server_out)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    if let (Ok(a), Ok(b)) = (client.try_clone(), server.try_clone()) {
        state
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend([a, b]);
    }
    for (from, to) in [(client, server_out), (server, client_out)] {
        let state = state.clone();
        std::thread::spawn(move || pump(&state, from, to));
    }
}

/// Copies `from` to `to` while the proxy is open; holds what it read while it is cut.
fn pump(state: &State, mut from: TcpStream, mut to: TcpStream) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buffer = [0u8; 16 * 1024];
    loop {
        // Not even read while cut: the bytes wait in the kernel's buffers.
        if !state.wait_open() {
            return;
        }
        let n = match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        // Cut after the read: the bytes wait here instead.
        if !state.wait_open() || to.write_all(&buffer[..n]).is_err() {
            return;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
