//! Making clusters and load: the generator of routes, secrets, namespaces and router
//! RBAC ([`generate`]), certificates for it and for the server's TLS ([`certs`]), and
//! an HTTP/2 load generator for measuring the simulator itself ([`loadgen`]).

pub(crate) mod certs;
pub(crate) mod generate;
pub mod loadgen;
