//! The sink's services as the actors dial them, the few byte patterns
//! the bench drives through tunnels to them, and how a connection held
//! unread sees its end (the actors' and the hostile actor's holds).

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The sink's services, as the actors dial them (the sink answers by port
/// and dials nothing; its echo is the one the fixtures name).
pub const ECHO: &str = atunnel_support::gateway::SINK_ECHO;
pub const DISCARD: &str = "192.0.2.10:9";
/// The sink answers by port, so an IPv6 destination is only a name too:
/// the actor's dial goes through the sandbox's IPv6 redirect and the tunnel
/// as `CONNECT [2001:db8::10]:port`.
pub const ECHO6: &str = "[2001:db8::10]:7";
pub const DISCARD6: &str = "[2001:db8::10]:9";
pub const HTTP: &str = "192.0.2.10:80";
pub const SOURCE: &str = "192.0.2.10:19";
/// The sink's answer to each request on port 80 (64-byte body).
pub const HTTP_ANSWER_LEN: usize = "HTTP/1.1 200 OK\r\nContent-Length: 64\r\n\r\n".len() + 64;

static ZEROS: [u8; 256 * 1024] = [0x5a; 256 * 1024];

/// Sends `bytes` and half-closes, then waits for the far end's close (the
/// sink's discard service closes once it has read everything), so the time
/// taken covers delivery, not just the local socket buffer.
pub async fn upload(mut s: TcpStream, bytes: u64) -> std::io::Result<u64> {
    let mut left = bytes;
    while left > 0 {
        let n = left.min(ZEROS.len() as u64) as usize;
        s.write_all(&ZEROS[..n]).await?;
        left -= n as u64;
    }
    s.shutdown().await?;
    let mut rest = [0u8; 1024];
    while s.read(&mut rest).await? > 0 {}
    Ok(bytes)
}

/// One byte there and back: the tunnel is open end to end.
pub async fn ping(s: &mut TcpStream) -> std::io::Result<()> {
    s.write_all(b"p").await?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b).await?;
    if &b != b"p" {
        return Err(std::io::Error::other("echo returned the wrong byte"));
    }
    Ok(())
}

/// Returns once the peer has closed or reset `tcp`, without reading a byte:
/// readiness is cleared by hand until it says the read side is closed.
pub async fn closed_unread(tcp: &TcpStream) {
    use tokio::io::Interest;
    loop {
        match tcp.ready(Interest::READABLE | Interest::ERROR).await {
            Ok(r) if !r.is_read_closed() && !r.is_error() => {
                let _ = tcp.try_io(Interest::READABLE, || {
                    Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
                });
            }
            _ => return,
        }
    }
}
