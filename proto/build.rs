//! With the `regen` feature, compiles the `.proto` files with `protox` (pure Rust, no system
//! `protoc`) and writes what prost and tonic generate into `src/generated/`: `plain/` holds the
//! messages alone (the simulation's), `grpc/` the messages with tonic's clients and servers.
//! `src/generated/SOURCES` records a hash of the `.proto` files they came from, which a unit
//! test compares. Without `regen` there is nothing to do: the generated code is committed.

const PROTOS: [&str; 2] = ["proto/csi.proto", "proto/agent.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    #[cfg(feature = "regen")]
    {
        // Generated again when the committed code was edited too, so `--check` compares.
        println!("cargo:rerun-if-changed=src/generated");
        regen()?;
    }
    Ok(())
}

#[cfg(feature = "regen")]
fn regen() -> Result<(), Box<dyn std::error::Error>> {
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    for grpc in [false, true] {
        let out = std::path::Path::new("src/generated").join(if grpc { "grpc" } else { "plain" });
        std::fs::create_dir_all(&out)?;
        tonic_prost_build::configure()
            .out_dir(&out)
            .build_client(grpc)
            .build_server(grpc)
            // Unimplemented RPCs answer UNIMPLEMENTED, as the CSI spec expects of optional calls.
            .generate_default_stubs(grpc)
            .compile_fds(descriptors.clone())?;
    }
    let fnv = include!("src/fnv.rs");
    let mut sources = Vec::new();
    for proto in PROTOS {
        sources.extend(std::fs::read(proto)?);
    }
    std::fs::write("src/generated/SOURCES", format!("{:016x}\n", fnv(&sources)))?;
    Ok(())
}
