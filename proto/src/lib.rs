//! Wire definitions shared by every Drover process: the CSI v1.9 protocol (`csi::v1`) and the
//! agent's own RPC envelope (`agent::v1`). Both are generated at build time by prost/tonic from
//! the `.proto` files in `proto/`, compiled by `protox` so no system `protoc` is needed.

#![allow(clippy::all, clippy::pedantic, missing_docs)]

pub mod csi {
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/csi.v1.rs"));
    }
}

pub mod agent {
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/drover.agent.v1.rs"));
    }
}

/// The well-known types the CSI messages use (`Timestamp`), for callers building them.
pub use prost_types;
