//! Containers: the `docker` task driver ([`ContainerDriver`]) over an [`Engine`], the seam
//! between what the driver does and who runs the containers. `drover-docker` supplies the
//! Engine of a host (the Docker Engine API through bollard, or podman's compatible API);
//! io-sim supplies a simulated one with faults. What the driver decides is core's
//! (`client::container_spec`, `client::containers`).

mod driver;
pub mod engine;
pub mod logs;

pub use driver::ContainerDriver;
pub use engine::{ContainerState, Engine, EngineError, EngineFailure, EngineResult, ListedContainer, Output};
