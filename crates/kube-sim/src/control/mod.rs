//! What an operator turns and reads while the simulator runs: fault injection
//! ([`faults`]), the server's concurrency limit ([`limits`]) and request accounting
//! ([`stats`]). The admin API and the [`crate::Simulator`] methods are two doors to
//! these same handles.

pub(crate) mod faults;
pub(crate) mod limits;
pub(crate) mod stats;
