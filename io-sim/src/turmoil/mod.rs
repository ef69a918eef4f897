//! The turmoil lane: the production network stack on a simulated network.
//!
//! The madsim lane replaces tokio, and with it every socket, under the driver; what it cannot
//! reach is the code between the driver and the socket: tonic's channels and server, hyper's
//! HTTP/2 and HTTP/1 connections, axum's routing of the HTTP API, UDP gossip framing. Here that
//! code runs unchanged ([`drover_host::net::GrpcTransport`] and
//! [`drover_http::serve_with`] over [`sockets::TurmoilSockets`]) on turmoil's network,
//! which partitions hosts, delays and drops messages, and breaks TCP connections, in a normal
//! tokio build. Every host runs on the one thread turmoil drives, and that thread is marked as
//! simulating ([`drover_io_real::runtime::simulate_on_this_thread`]), so a seed replays exactly.

pub mod cluster;
pub mod http;
pub mod sockets;
