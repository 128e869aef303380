//! Connecting to a granted TCP peer from a guest, the same way in every
//! guest that needs a socket (the Redis backend, the `tcp` fabric).

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Instant;

/// Resolve `address` (`host:port`), connect by `deadline`, make sure the
/// handshake really succeeded, and turn Nagle off. The error says what
/// failed, with a hint at the grant that may be missing; callers prefix it
/// with the peer's name.
pub fn connect(address: &str, deadline: Instant) -> Result<TcpStream, String> {
    let peer: SocketAddr = address
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve the address: {e} (is `dns = true` granted?)"))?
        .next()
        .ok_or("the address resolves to nothing")?;
    let wait = deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or("no time left to connect")?;
    let stream = TcpStream::connect_timeout(&peer, wait).map_err(|e| {
        let hint = match e.kind() {
            ErrorKind::PermissionDenied => " (the peer is not granted in `net`)",
            _ => "",
        };
        format!("cannot connect: {e}{hint}")
    })?;
    // On wasm32-wasip2, std's `connect_timeout` can return before the
    // handshake has failed (a refused port); ask the socket.
    if let Some(e) = stream.take_error().ok().flatten() {
        return Err(format!("cannot connect: {e}"));
    }
    stream
        .peer_addr()
        .map_err(|e| format!("cannot connect: {e} (is the server up?)"))?;
    stream
        .set_nodelay(true)
        .map_err(|e| format!("cannot set TCP_NODELAY: {e}"))?;
    Ok(stream)
}
