//! What Drover's tests and benches share, so that none copies it from another: ports no
//! concurrently running test holds ([`ports`]), a tiny blocking HTTP/1.1 client for the API
//! ([`http`]) and polling until a condition holds ([`wait`]).
//!
//! A dev-dependency only (of `drover-http` and `drover`); it depends on nothing of Drover's,
//! so any test crate can use it.

pub mod http;
pub mod ports;
pub mod wait;

pub use http::{get_json, http, http_get, http_status};
pub use ports::{free_port, free_ports};
pub use wait::{wait_for, wait_for_every};
