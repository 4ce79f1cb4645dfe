//! What the runtime charges per idle connection, for docs/memory.md: heap
//! per spawned task beyond its future, and per socket registered with the
//! reactor. Run: `cargo run --release -p atunnel-core --example idle_costs`.

use std::alloc::System;

use atunnel_core::alloc::{CountingAlloc, CountingWith, live_bytes};

#[global_allocator]
static ALLOC: CountingAlloc = CountingWith(System);

const N: usize = 10_000;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // Tasks: a future of known size that never finishes.
    let before = live_bytes();
    let mut tasks = Vec::with_capacity(N);
    let handles_bytes = live_bytes() - before;
    for _ in 0..N {
        let payload = [0u8; 512];
        tasks.push(tokio::spawn(async move {
            std::future::pending::<()>().await;
            std::hint::black_box(&payload);
        }));
    }
    let per_task = (live_bytes() - before - handles_bytes) as f64 / N as f64;
    let future = {
        let payload = [0u8; 512];
        std::mem::size_of_val(&async move {
            std::future::pending::<()>().await;
            std::hint::black_box(&payload);
        })
    };
    println!(
        "task: {per_task:.0} B of heap for a {future} B future: {:.0} B of runtime overhead per task",
        per_task - future as f64
    );

    // Sockets: registration with the reactor (the kernel socket is not heap).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut std_socks = Vec::with_capacity(N);
    let mut accepted = Vec::with_capacity(N);
    for _ in 0..N.min(4_000) {
        let c = std::net::TcpStream::connect(addr).expect("connect");
        c.set_nonblocking(true).expect("nonblocking");
        // Accepted ends are kept (unregistered) so the backlog never fills.
        accepted.push(listener.accept().expect("accept").0);
        std_socks.push(c);
    }
    let n = std_socks.len();
    let mut registered = Vec::with_capacity(n);
    let before = live_bytes();
    for s in std_socks {
        registered.push(tokio::net::TcpStream::from_std(s).expect("register"));
    }
    let per_socket = (live_bytes() - before) as f64 / n as f64;
    println!(
        "socket registration: {per_socket:.0} B of heap per TcpStream (tokio::net::TcpStream itself is {} B, inline in its owner)",
        std::mem::size_of::<tokio::net::TcpStream>()
    );
    for t in tasks {
        t.abort();
    }
}
