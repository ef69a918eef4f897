//! Compiles the `.proto` files with `protox` (pure Rust), so building Drover never needs a
//! system `protoc`. The gRPC clients and servers come only with the `grpc` feature: the
//! simulation carries the messages alone.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/csi.proto", "proto/agent.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(grpc)
        .build_server(grpc)
        // Unimplemented RPCs answer UNIMPLEMENTED, as the CSI spec expects of optional calls.
        .generate_default_stubs(grpc)
        .compile_fds(descriptors)?;
    Ok(())
}
