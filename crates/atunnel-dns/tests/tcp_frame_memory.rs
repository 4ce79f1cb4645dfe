//! What a DNS-over-TCP client can make the relay allocate with a length
//! prefix alone, and what an idle UDP relay holds. A binary of its own: it installs an allocator that records
//! the largest allocation made on the test's thread, and the relay runs on
//! a current-thread runtime on that thread, so nothing else is counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use atunnel_dns::{DnsRelay, RelayConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, noting the largest request made on a thread while
/// that thread tracks.
struct LargestOnThread;

fn note(size: usize) {
    // `try_with`: allocations during thread teardown are not ours to count.
    let _ = TRACKING.try_with(|tracking| {
        if tracking.get() {
            LARGEST.with(|largest| largest.set(largest.get().max(size)));
        }
    });
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged; `note` neither allocates nor touches the memory.
unsafe impl GlobalAlloc for LargestOnThread {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged; `ptr` came from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: LargestOnThread = LargestOnThread;

/// Turns a hang into a failure; nothing waits for it.
const GUARD: Duration = Duration::from_secs(10);

/// The largest allocation `future` made on this thread.
async fn largest_allocation_of<F: Future>(future: F) -> (usize, F::Output) {
    LARGEST.with(|l| l.set(0));
    TRACKING.with(|t| t.set(true));
    let output = future.await;
    TRACKING.with(|t| t.set(false));
    (LARGEST.with(Cell::get), output)
}

#[test]
fn a_length_prefix_alone_does_not_size_the_relays_buffer() {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let address = listener.local_addr().expect("address");
            // Never reached: no query is ever complete.
            let relay = DnsRelay::new(RelayConfig::new(vec!["127.0.0.1:9".parse().expect("addr")]))
                .expect("relay");
            let cancel = CancellationToken::new();
            let serve = tokio::spawn({
                let (relay, cancel) = (relay.clone(), cancel.clone());
                async move { relay.serve_tcp(listener, cancel).await }
            });

            // Connected before tracking, so the accept path's own
            // allocations of the connection are in the figure too.
            let mut client = TcpStream::connect(address).await.expect("connect");
            let (largest, closed) = largest_allocation_of(async {
                // Claims the largest message, sends 100 bytes of it and
                // closes its side: the relay must read those and give up.
                let mut frame = u16::MAX.to_be_bytes().to_vec();
                frame.extend_from_slice(&[0x5a; 100]);
                client.write_all(&frame).await.expect("write");
                client.shutdown().await.expect("shutdown");
                let mut rest = Vec::new();
                tokio::time::timeout(GUARD, client.read_to_end(&mut rest)).await
            })
            .await;
            let answered = closed
                .expect("the relay closed within the guard")
                .expect("read");
            assert_eq!(answered, 0, "no answer to a query never completed");
            eprintln!("largest allocation while the frame was read: {largest} bytes");
            // 64 KiB (the claim) before the fix; the relay's own
            // per-connection allocations (its task) are a few KiB.
            assert!(
                largest < 16 * 1024,
                "the relay allocated {largest} bytes at once for 102 bytes received"
            );

            cancel.cancel();
            tokio::time::timeout(GUARD, serve)
                .await
                .expect("serve_tcp returned")
                .expect("join");
            assert_eq!(relay.stats().tcp_queries, 0);
        });
}

#[test]
fn an_idle_udp_relay_allocates_no_receive_buffer() {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            let relay = DnsRelay::new(RelayConfig::new(vec!["127.0.0.1:9".parse().expect("addr")]))
                .expect("relay");
            let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
            let address = socket.local_addr().expect("address");
            let client = UdpSocket::bind("127.0.0.1:0").await.expect("bind client");
            let cancel = CancellationToken::new();
            let (largest, ()) = largest_allocation_of(async {
                let serve = relay.clone().serve_udp(socket, cancel.clone());
                let drive = async {
                    // Shorter than a DNS header: read, counted, dropped; the
                    // relay then waits for the next one.
                    client.send_to(&[0u8; 3], address).await.expect("send");
                    let dropped = async {
                        while relay.stats().dropped < 1 {
                            tokio::task::yield_now().await;
                        }
                    };
                    tokio::time::timeout(GUARD, dropped)
                        .await
                        .expect("the datagram was read within the guard");
                    cancel.cancel();
                };
                tokio::join!(serve, drive);
            })
            .await;
            eprintln!("largest allocation of an idle UDP relay: {largest} bytes");
            // A 4,097-byte receive buffer before the fix.
            assert!(
                largest < 1024,
                "an idle UDP relay allocated {largest} bytes at once"
            );
        });
}
