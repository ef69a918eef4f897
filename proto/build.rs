//! Compiles the `.proto` files with `protox` (pure Rust), so building Drover never needs a
//! system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/csi.proto", "proto/agent.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Unimplemented RPCs answer UNIMPLEMENTED, as the CSI spec expects of optional calls.
        .generate_default_stubs(true)
        .compile_fds(descriptors)?;
    Ok(())
}
