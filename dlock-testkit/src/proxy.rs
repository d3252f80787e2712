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
/// - **Replies cut** ([`cut_replies`](Self::cut_replies)): requests still reach the server,
///   but nothing comes back: a request is carried out and its reply lost.
///   [`cut_replies_on`](Self::cut_replies_on) does so once the client writes a request that
///   contains given bytes, so that this request's reply is the first lost.
/// - **Heal** ([`heal`](Self::heal)): what waited is delivered, in order, and forwarding goes
///   on, as when the network comes back.
/// - **Reset** ([`reset`](Self::reset)): every connection open now is closed, what waited in
///   it dropped, and forwarding goes on for new connections: the client sees its connection
///   closed without the reply of a request the server may have carried out.
/// - **Drop**: the listener and every connection are closed; the threads end within ~50ms.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    state: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    cut: Mutex<Cut>,
    healed: Condvar,
    stopped: AtomicBool,
    /// The bytes of the request after which the replies are cut, when armed.
    cut_replies_on: Mutex<Option<Vec<u8>>>,
    streams: Mutex<Vec<TcpStream>>,
}

/// What the proxy holds back.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Cut {
    #[default]
    Nothing,
    Both,
    Replies,
}

impl State {
    /// Closes every connection open now, both ends.
    fn close_streams(&self) {
        for stream in self
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain(..)
        {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Cuts the replies when `request` has the armed bytes (it still goes through).
    fn cut_replies_on(&self, request: &[u8]) {
        let mut armed = self
            .cut_replies_on
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if armed
            .as_deref()
            .is_some_and(|bytes| request.windows(bytes.len()).any(|w| w == bytes))
        {
            *armed = None;
            *self
                .cut
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Cut::Replies;
        }
    }

    /// Blocks while the proxy is cut in this direction (`reply`: server to client); `false` once
    /// it is stopped.
    fn wait_open(&self, reply: bool) -> bool {
        let mut cut = self
            .cut
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while (*cut == Cut::Both || (reply && *cut == Cut::Replies))
            && !self.stopped.load(Ordering::SeqCst)
        {
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
        self.set(Cut::Both);
    }

    /// Stops forwarding the server's replies only (see *Behavior*).
    pub fn cut_replies(&self) {
        self.set(Cut::Replies);
    }

    /// Cuts the replies once the client writes a request containing `bytes` (see *Behavior*).
    pub fn cut_replies_on(&self, bytes: &[u8]) {
        *self
            .state
            .cut_replies_on
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(bytes.to_vec());
    }

    /// Whether the replies are cut now.
    #[must_use]
    pub fn replies_cut(&self) -> bool {
        *self
            .state
            .cut
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            == Cut::Replies
    }

    fn set(&self, cut: Cut) {
        *self
            .state
            .cut
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = cut;
        self.state.healed.notify_all();
    }

    /// Forwards again, first what waited.
    pub fn heal(&self) {
        self.set(Cut::Nothing);
    }

    /// Closes the connections open now, dropping what waited in them, and forwards again (see
    /// *Behavior*).
    pub fn reset(&self) {
        // Closed before the cut is lifted: what waited cannot reach the client.
        self.state.close_streams();
        self.heal();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        self.state.healed.notify_all();
        self.state.close_streams();
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
    for (from, to, reply) in [(client, server_out, false), (server, client_out, true)] {
        let state = state.clone();
        std::thread::spawn(move || pump(&state, from, to, reply));
    }
}

/// Copies `from` to `to` while the proxy is open; holds what it read while it is cut.
fn pump(state: &State, mut from: TcpStream, mut to: TcpStream, reply: bool) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buffer = [0u8; 16 * 1024];
    loop {
        // Not even read while cut: the bytes wait in the kernel's buffers.
        if !state.wait_open(reply) {
            return;
        }
        let n = match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        if !reply {
            state.cut_replies_on(&buffer[..n]);
        }
        // Cut after the read: the bytes wait here instead.
        if !state.wait_open(reply) || to.write_all(&buffer[..n]).is_err() {
            return;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
