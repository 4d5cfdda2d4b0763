//! The vocabulary certwatch's crates share, so that none of them borrows it from
//! another's internals (the daemon from the simulator, say).
//!
//! - [`verb`]: the Kubernetes API verbs, as one typed enum ([`Verb`]) instead of
//!   strings that every layer parses again.
//! - [`adaptive`]: the AIMD limiter that paces bursts of requests (first syncs,
//!   access reviews) to what the API server accepts.
//! - [`backoff`]: the retry policy every repeated request uses (client-go's reflector
//!   policy, with jitter that never exceeds the cap).
//! - [`duration`]: durations as Kubernetes users type them (`1m30s`, `1.5h`, `300ms`),
//!   the syntax of Go's `time.ParseDuration` that kubectl and client-go flags use.
//! - [`name`]: DNS-1123 label and subdomain checks, with the API server's messages.
//! - [`labels`]: label keys, values and selectors (parsed and matched), with
//!   Kubernetes' grammar and the API server's messages.
//! - [`kubeconfig`]: writing a kubeconfig file that holds credentials (mode 0600).
//! - [`request_info`]: what a request is about (resource, subresource, verb), read from
//!   its method and URL as kube-apiserver reads it.
//! - [`sync`]: the poison-ignoring lock helpers; [`time`]: `sleep_until` an optional
//!   deadline.
//! - [`hash`]: hash maps keyed by names tenants choose, with a faster keyed hasher
//!   than the standard library's.
//! - [`hint`]: what a caller tells the transport about a request ([`hint::LongLived`]).
//! - [`listing`]: a watch's (re-)listings gathered into one event, as a stream
//!   adapter ([`listing::ListingStreamExt::gather_listings`]).
//! - [`reconnect`]: one prober per API server, so that requests that failed during an
//!   outage go again as soon as the server answers, not after their grown backoff.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//!
//! use kube_common::{Verb, duration, name};
//!
//! assert_eq!(duration::parse("1m30s")?, Duration::from_secs(90));
//! assert!(duration::parse("60").is_err()); // unitless: 60 what?
//! assert_eq!("watch".parse::<Verb>()?, Verb::Watch);
//! assert!(name::subdomain("shop-tls").is_ok());
//! assert!(name::label("Team_A").is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod adaptive;
pub mod backoff;
pub mod duration;
pub mod hash;
pub mod hint;
pub mod kubeconfig;
pub mod labels;
pub mod listing;
pub mod name;
pub mod reconnect;
pub mod request_info;
pub mod sync;
pub mod time;
pub mod verb;

pub use duration::DurationParseError;
pub use name::NameError;
pub use verb::{UnknownVerb, Verb};
