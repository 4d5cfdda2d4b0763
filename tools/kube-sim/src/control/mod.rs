//! What an operator turns and reads while the simulator runs: fault injection
//! ([`faults`]), the server's concurrency limits — a simple one ([`limits`]) and API
//! Priority and Fairness ([`flow_control`]), held together by each request
//! ([`admission`]) — and request accounting: the simulator's own counters and request
//! log ([`stats`]) and kube-apiserver's metrics ([`metrics`]). The admin API and the [`crate::Simulator`] methods are two doors to
//! these same handles.

pub(crate) mod admission;
pub(crate) mod faults;
pub(crate) mod flow_control;
pub(crate) mod limits;
pub(crate) mod metrics;
pub(crate) mod stats;
