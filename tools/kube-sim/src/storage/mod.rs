//! Storage and watch: the object store with its single resourceVersion sequence and
//! bounded event history ([`store`]), the index that hands each committed change to
//! exactly the watchers that may care ([`watch`]), and the direct, HTTP-free handle
//! tests and tools use ([`handle`]).

pub(crate) mod handle;
pub(crate) mod store;
pub(crate) mod watch;
