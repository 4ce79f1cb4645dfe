//! Helpers shared by the integration tests.

use tokio::net::{TcpListener, TcpStream};

/// A connected loopback TCP pair: (client, server).
pub async fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (c, s) = tokio::join!(TcpStream::connect(addr), listener.accept());
    (c.expect("connect"), s.expect("accept").0)
}
