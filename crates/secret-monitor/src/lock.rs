//! The mutual-exclusion primitive the registry is generic over.
//!
//! Production code uses [`StdLocks`] (a `std::sync::Mutex`). The model-checking tests
//! substitute shuttle's mutex so that the scheduler can preempt at every lock
//! acquisition and explore the interleavings of concurrent registrations.
//!
//! The only way to touch the protected value is [`Lock::with`], whose closure is
//! synchronous: a guard can never live across an `.await`, by construction.

/// A mutex that exposes its value only inside a synchronous closure.
pub(crate) trait Lock<T>: Send + Sync {
    /// Wraps `value`.
    fn new(value: T) -> Self;

    /// Runs `f` with exclusive access to the value.
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R;
}

/// A family of locks, so that one type parameter selects the lock for every value the
/// registry protects.
pub(crate) trait LockFamily: Send + Sync + 'static {
    /// The lock protecting a value of type `T`.
    type Lock<T: Send>: Lock<T>;
}

/// Locks backed by `std::sync::Mutex`.
#[derive(Debug)]
pub(crate) struct StdLocks;

impl LockFamily for StdLocks {
    type Lock<T: Send> = StdLock<T>;
}

/// A `std::sync::Mutex` behind the [`Lock`] interface.
#[derive(Debug)]
pub(crate) struct StdLock<T>(std::sync::Mutex<T>);

impl<T: Send> Lock<T> for StdLock<T> {
    fn new(value: T) -> Self {
        Self(std::sync::Mutex::new(value))
    }

    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        // A panic inside a critical section cannot leave the registry's maps in a
        // state that is unsafe to read (every mutation is a single insert/remove), so
        // a poisoned lock is recovered rather than propagated to every later caller.
        let mut guard = kube_common::sync::lock(&self.0);
        f(&mut guard)
    }
}
