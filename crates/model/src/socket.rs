//! A socket as the kernel names it, so that two threads' calls on one
//! connection are known to be the same connection's.

/// The socket of a receive or send: its cookie, and for TCP and UDP its
/// ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Socket {
    /// The kernel's number for the socket (`bpf_get_socket_cookie`): given
    /// once, unique since boot, never 0.
    pub cookie: u64,
    /// The socket's own port (host byte order); 0 for a family without
    /// ports (Unix sockets).
    pub local_port: u16,
    /// The peer's port; 0 for a family without ports, or a socket with no
    /// peer (a listening or unconnected one).
    pub remote_port: u16,
}

impl Socket {
    /// Whether the socket is the server end of a connection from
    /// `client_port`, as a server span names it (`client.port`,
    /// `net.peer.port`), to `server_port` if the span names it too.
    pub fn serves(&self, client_port: u16, server_port: Option<u16>) -> bool {
        self.remote_port == client_port && server_port.is_none_or(|p| p == self.local_port)
    }
}
