//! The core's integration tests: datadriven protocol traces, purity, state-format fixtures.
//!
//! One binary per crate (each former `tests/<name>.rs` is a module here), so the workspace links
//! a few test binaries rather than one per file.

mod client;
mod datadriven;
mod doc_paths;
mod layers;
mod purity;
mod state_format;
mod text_decisions;
