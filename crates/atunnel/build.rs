//! Generates the control API's client and server from its proto. The proto
//! is parsed by protox, in Rust, so building needs no `protoc` installed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/atunnel/control/v1/control.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // `atunnel ctl` prints the answers as JSON; the phase by its name.
        .message_attribute(".atunnel.control.v1", "#[derive(serde::Serialize)]")
        .field_attribute(
            ".atunnel.control.v1.ActorStatus.phase",
            "#[serde(serialize_with = \"crate::control::client::phase_name\")]",
        )
        .compile_fds(descriptors)?;
    Ok(())
}
