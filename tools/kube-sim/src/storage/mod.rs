//! Storage and watch: the object store with its single resourceVersion sequence
//! ([`store`]), its bounded event history indexed the way watchers are ([`history`]),
//! the index that hands each committed change to exactly the watchers that may care
//! ([`watch`]), and the direct, HTTP-free handle tests and tools use ([`handle`]).

pub(crate) mod handle;
pub(crate) mod history;
pub(crate) mod store;
pub(crate) mod watch;
