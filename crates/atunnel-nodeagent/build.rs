//! Generates the AteomSupport client and server from the proto. The proto
//! is parsed by protox, in Rust, so building needs no `protoc` installed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/ateom_support.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
