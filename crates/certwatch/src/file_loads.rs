//! Loads of the cert directory's files in progress: what keeps a file in place while a
//! HAProxy that may have read a crt-list naming it is still loading.
//!
//! A load (a start or reload certwatch asks of HAProxy) reads the crt-list, then opens
//! every file it names, one after the other. A flush that writes a crt-list without a
//! route and then removes that route's link would pull the link from under a load that
//! read the older crt-list: the load fails. So a file the crt-list no longer names is
//! removed only once every load that began before that crt-list was on disk has ended
//! (its new worker answers, or its failure is known): a load that begins later reads
//! the newer crt-list, which does not name the file.
//!
//! Each load takes a number when it begins ([`FileLoads::begin`], before HAProxy is
//! told to load) and gives it back when it ends (its [`LoadGuard`] dropped). A flush
//! takes a [`FileLoads::mark`] once its crt-list is on disk; a file unwanted since
//! that mark may go once [`FileLoads::ended_before`] says so. Loads may overlap (the
//! routing task and the certificates' controller both reload): the marks compare with
//! every load in progress, not with a count.

use std::collections::BTreeSet;
use std::sync::Arc;

use tokio::sync::watch;

/// What is known of the loads: the next load's number and those in progress.
#[derive(Debug, Default)]
pub struct LoadsState {
    next: u64,
    in_progress: BTreeSet<u64>,
}

/// The loads of one cert directory's files, shared by whoever starts loads and the
/// cert directory (clones share the same state).
#[derive(Clone, Debug)]
pub struct FileLoads {
    state: Arc<watch::Sender<LoadsState>>,
}

impl Default for FileLoads {
    fn default() -> Self {
        Self::new()
    }
}

impl FileLoads {
    /// No load in progress.
    pub fn new() -> Self {
        Self {
            state: Arc::new(watch::Sender::new(LoadsState::default())),
        }
    }

    /// A load begins: called before HAProxy is told to load (start or reload), kept
    /// until the load has ended, however it ends.
    pub fn begin(&self) -> LoadGuard {
        let mut number = 0;
        self.state.send_modify(|state| {
            number = state.next;
            state.next += 1;
            state.in_progress.insert(number);
        });
        LoadGuard {
            loads: self.clone(),
            number,
        }
    }

    /// The number the next load takes: taken once a crt-list is on disk, it tells the
    /// loads that may have read an older one (those numbered below it).
    pub fn mark(&self) -> u64 {
        self.state.borrow().next
    }

    /// Whether every load that began before `mark` has ended.
    pub fn ended_before(&self, mark: u64) -> bool {
        self.state
            .borrow()
            .in_progress
            .first()
            .is_none_or(|oldest| *oldest >= mark)
    }

    /// Whether a load is in progress.
    pub fn loading(&self) -> bool {
        !self.state.borrow().in_progress.is_empty()
    }

    /// Changes each time a load begins or ends.
    pub fn subscribe(&self) -> watch::Receiver<LoadsState> {
        self.state.subscribe()
    }
}

/// A load in progress; dropping it ends the load.
#[derive(Debug)]
pub struct LoadGuard {
    loads: FileLoads,
    number: u64,
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        let number = self.number;
        self.loads.state.send_modify(|state| {
            state.in_progress.remove(&number);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_waits_for_the_loads_begun_before_it_only() {
        let loads = FileLoads::new();
        assert!(loads.ended_before(loads.mark()));
        let first = loads.begin();
        let second = loads.begin();
        let mark = loads.mark();
        let later = loads.begin();
        assert!(!loads.ended_before(mark));
        // Out of order: the older load still runs.
        drop(second);
        assert!(!loads.ended_before(mark));
        drop(first);
        // A load begun after the mark read the newer crt-list.
        assert!(loads.ended_before(mark));
        assert!(loads.loading());
        assert!(!loads.ended_before(loads.mark()));
        drop(later);
        assert!(!loads.loading());
    }
}
