//! What Drover's tests and benches share, so that none copies it from another: ports no
//! concurrently running test holds ([`ports`]), a tiny blocking HTTP/1.1 client for the API
//! ([`http`]), polling until a condition holds ([`wait`]), a child process killed on drop
//! ([`process`]) and the files and mounts a test leaves behind ([`fs`]).
//!
//! A dev-dependency only (of `drover-http` and `drover`); it depends on nothing of Drover's,
//! so any test crate can use it.

pub mod fs;
pub mod http;
pub mod ports;
pub mod process;
pub mod wait;

pub use fs::{UnmountUnder, files_under, mounts_under};
pub use http::{get_json, http, http_get, http_status};
pub use ports::{free_port, free_ports};
pub use process::ChildGuard;
pub use wait::{wait_for, wait_for_every};
