//! The HTTP/2 client preface, read within a bound before an HTTP/2 server
//! (h2's or hyper's) takes the connection: neither bounds that wait.

use std::io;
use std::time::Duration;

use atunnel_tls::ActivityIo;
use bytes::Bytes;
use tokio::io::AsyncReadExt;

use crate::limits::MAX_FIRST_FRAME;

/// What an HTTP/2 client's connection preface begins with (RFC 9113, 3.4);
/// a SETTINGS frame follows.
const H2_MAGIC: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A frame header: length (3 bytes), type, flags, stream id (4 bytes).
const H2_FRAME_HEADER: usize = 9;
const H2_SETTINGS: u8 = 0x4;

/// Reads an HTTP/2 client's preface (the magic, then its SETTINGS frame)
/// within `timeout`, and leaves it in `io` for the HTTP/2 server to read.
/// Neither h2 nor hyper bounds that wait, so a client that finished TLS
/// and said nothing held its connection for ever. Later waits, for a first
/// request or between requests, stay unbounded: an idle connection is kept
/// (and hibernates).
pub async fn read_h2_preface(io: &mut ActivityIo, timeout: Duration) -> io::Result<()> {
    let read = async {
        let mut preface = vec![0u8; H2_MAGIC.len() + H2_FRAME_HEADER];
        io.read_exact(&mut preface).await?;
        let header = &preface[H2_MAGIC.len()..];
        let length =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        if !preface.starts_with(H2_MAGIC) || header[3] != H2_SETTINGS || length > MAX_FIRST_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not an HTTP/2 client preface",
            ));
        }
        let start = preface.len();
        preface.resize(start + length, 0);
        io.read_exact(&mut preface[start..]).await?;
        Ok(preface)
    };
    let preface = tokio::time::timeout(timeout, read).await.map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no HTTP/2 preface within {timeout:?}"),
        )
    })??;
    io.set_replay(Bytes::from(preface));
    Ok(())
}
