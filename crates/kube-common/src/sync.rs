//! Locks that ignore poisoning, for the bookkeeping locks of certwatch's crates.
//!
//! A `std::sync::Mutex` is poisoned when a thread panics while holding it, and every
//! later `lock()` returns an error. Every lock here guards bookkeeping whose updates
//! are single map or field operations, never held across an `.await`: a panic in one
//! critical section leaves the data consistent, and passing the poison on would turn
//! one failed task into the failure of every task that shares the lock (one tenant's
//! bad input into everyone's outage). So the guard is taken either way.
//!
//! ```
//! use std::sync::Mutex;
//!
//! let counts = Mutex::new(0);
//! *kube_common::sync::lock(&counts) += 1;
//! assert_eq!(*kube_common::sync::lock(&counts), 1);
//! ```

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `mutex`, poisoned or not.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Locks `lock` for reading, poisoned or not.
pub fn read<T: ?Sized>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// Locks `lock` for writing, poisoned or not.
pub fn write<T: ?Sized>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_under_the_lock_does_not_lock_everyone_else_out() {
        let counts = std::sync::Arc::new(Mutex::new(1));
        let poisoner = std::sync::Arc::clone(&counts);
        let panicked = std::thread::spawn(move || {
            let _guard = lock(&poisoner);
            panic!("a task fails while it holds the lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(counts.is_poisoned());
        *lock(&counts) += 1;
        assert_eq!(*lock(&counts), 2);
    }
}
