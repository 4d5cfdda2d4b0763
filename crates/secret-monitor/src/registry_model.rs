//! Model checking of the registry with shuttle.
//!
//! The registry is the production code, instantiated with shuttle's mutex so that the
//! scheduler can preempt at every lock acquisition (and at every `.await`). Each
//! execution runs concurrent callers of one key — adding, removing, being cancelled
//! mid-wait, retrying after a failure — against sync drivers that succeed or fail at a
//! point the scheduler picks. After every execution the checks below must hold; a
//! waiter that could hang forever shows up as a shuttle deadlock.

use std::sync::Arc;

use shuttle::future::{self, JoinHandle};
use shuttle::rand::{Rng, thread_rng};
use shuttle::sync::Mutex;
use tokio::sync::mpsc;

use crate::lock::{Lock, LockFamily};
use crate::registry::{KeyCounts, Registry, SyncDriver};
use crate::{MonitorError, MonitorErrorKind, ObjectEvent, ObjectKey};

struct ShuttleLocks;

impl LockFamily for ShuttleLocks {
    type Lock<T: Send> = ShuttleLock<T>;
}

struct ShuttleLock<T>(Mutex<T>);

impl<T: Send> Lock<T> for ShuttleLock<T> {
    fn new(value: T) -> Self {
        Self(Mutex::new(value))
    }

    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut guard = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut guard)
    }
}

/// The watched object: a version number.
#[derive(Debug, PartialEq, Eq)]
struct Obj(u32);

type Reg = Registry<Obj, ShuttleLocks>;

/// What the model's drivers did, checked at the end.
#[derive(Default)]
struct Ledger {
    drivers: Vec<JoinHandle<()>>,
    started: usize,
    /// Drivers whose entry reached `stopped()`.
    stopped: usize,
}

fn key() -> ObjectKey {
    ObjectKey::new("ns", "k")
}

fn sync_error() -> MonitorError {
    MonitorError::new(
        "objs",
        key(),
        MonitorErrorKind::Forbidden {
            verb: kube_common::Verb::List,
            message: "denied".into(),
        },
    )
}

/// Drives one entry: after a scheduler-chosen delay, its first sync succeeds (then the
/// object changes once) or fails. Runs until the registry stops the entry.
async fn drive(driver: SyncDriver<Obj, ShuttleLocks>, ledger: Arc<Mutex<Ledger>>) {
    let succeed = thread_rng().gen_bool(0.6);
    future::yield_now().await;
    if succeed {
        driver.synced(Some(Arc::new(Obj(1))));
        future::yield_now().await;
        let old = Arc::new(Obj(1));
        let new = Arc::new(Obj(2));
        driver.publish(Some(Arc::clone(&new)), &[ObjectEvent::Updated { old, new }]);
    } else {
        driver.failed(sync_error());
    }
    driver.stopped().await;
    assert!(driver.is_stopped());
    if let Ok(mut ledger) = ledger.lock() {
        ledger.stopped += 1;
    }
}

/// Joins the key and waits for the sync, spawning the driver when this call created
/// the entry — what `ObjectMonitor::add_sink` does.
async fn add(
    registry: &Reg,
    ledger: &Arc<Mutex<Ledger>>,
    sink: mpsc::UnboundedSender<ObjectEvent<Obj>>,
) -> Result<crate::HandlerHandle, MonitorError> {
    let (ticket, driver) = registry.join(&key());
    if let Some(driver) = driver {
        let handle = future::spawn(drive(driver, Arc::clone(ledger)));
        let mut ledger = ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        ledger.started += 1;
        ledger.drivers.push(handle);
    }
    ticket.synced().await?;
    ticket.attach(Box::new(sink))
}

/// Checks that a handler's events are a valid history: first `Added`, then updates
/// that chain from the previous state.
fn assert_valid_history(events: &[ObjectEvent<Obj>]) {
    let Some((first, rest)) = events.split_first() else {
        return;
    };
    let ObjectEvent::Added(mut current) = first.clone() else {
        panic!("first event is not Added: {first:?}");
    };
    for event in rest {
        match event {
            ObjectEvent::Updated { old, new } => {
                assert_eq!(old, &current, "update does not start from the last state");
                current = Arc::clone(new);
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
}

fn drain(mut events: mpsc::UnboundedReceiver<ObjectEvent<Obj>>) -> Vec<ObjectEvent<Obj>> {
    let mut all = Vec::new();
    while let Ok(event) = events.try_recv() {
        all.push(event);
    }
    all
}

/// A caller that registers, reads the cache, and removes its handler; on a failed sync
/// it checks the error and retries once with a fresh entry.
async fn registering_caller(registry: Reg, ledger: Arc<Mutex<Ledger>>) {
    for _attempt in 0..2 {
        let (sink, events) = mpsc::unbounded_channel();
        match add(&registry, &ledger, sink).await {
            Ok(handle) => {
                future::yield_now().await;
                // A handler that registered successfully is never torn down by others.
                let object = registry
                    .get(&handle)
                    .expect("registered handler lost its entry");
                assert!(object.is_some());
                registry.remove(&handle).expect("first removal succeeds");
                assert!(
                    matches!(
                        registry.remove(&handle),
                        Err(e) if matches!(e.kind(), MonitorErrorKind::NotRegistered { .. })
                    ),
                    "second removal reports NotRegistered"
                );
                let history = drain(events);
                assert!(!history.is_empty(), "a synced object is delivered as Added");
                assert_valid_history(&history);
                return;
            }
            Err(err) => {
                assert!(
                    err == sync_error() || matches!(err.kind(), MonitorErrorKind::Cancelled),
                    "unexpected error {err:?}"
                );
                // The failed entry is gone: joining again never lands on it.
                let (ticket, driver) = registry.join(&key());
                assert!(
                    !matches!(ticket.state(), crate::registry::SyncState::Failed(_)),
                    "a caller after a failed sync joined the failed entry"
                );
                if let Some(driver) = driver {
                    // Hand the fresh entry to a driver, as `add` would have.
                    let handle = future::spawn(drive(driver, Arc::clone(&ledger)));
                    let mut ledger = ledger
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    ledger.started += 1;
                    ledger.drivers.push(handle);
                }
                drop(ticket);
            }
        }
    }
}

/// A caller whose registration is cancelled (its task aborted) at a point the
/// scheduler picks.
async fn cancelled_caller(registry: Reg, ledger: Arc<Mutex<Ledger>>) {
    let task = future::spawn({
        let registry = registry.clone();
        let ledger = Arc::clone(&ledger);
        async move {
            let (sink, _events) = mpsc::unbounded_channel();
            add(&registry, &ledger, sink).await
        }
    });
    future::yield_now().await;
    task.abort();
    // If the abort came too late the registration completed: undo it, as a caller
    // that gave up would.
    if let Ok(Ok(handle)) = task.await {
        registry
            .remove(&handle)
            .expect("completed registration is removable");
    }
}

fn model() {
    future::block_on(async {
        let registry: Reg = Registry::new("objs");
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let callers = vec![
            future::spawn(registering_caller(registry.clone(), Arc::clone(&ledger))),
            future::spawn(registering_caller(registry.clone(), Arc::clone(&ledger))),
            future::spawn(cancelled_caller(registry.clone(), Arc::clone(&ledger))),
        ];
        for caller in callers {
            caller.await.expect("caller panicked");
        }
        // Nothing is left: every hold was released, every entry left the map.
        assert!(
            registry.snapshot().is_empty(),
            "entries left behind: {:?}",
            registry.snapshot()
        );
        assert_eq!(registry.counts(), KeyCounts::default());
        let drivers = std::mem::take(&mut ledger.lock().expect("ledger").drivers);
        for driver in drivers {
            driver.await.expect("driver panicked");
        }
        let ledger = ledger.lock().expect("ledger");
        assert_eq!(ledger.started, ledger.stopped, "a watch was never stopped");
        assert!(ledger.started >= 1);
    });
}

#[test]
fn registry_random_schedules() {
    shuttle::check_random(model, 3_000);
}

#[test]
fn registry_pct_schedules() {
    shuttle::check_pct(model, 3_000, 3);
}

/// Many callers of one key that all succeed share one entry: one driver is started.
#[test]
fn concurrent_callers_share_one_sync() {
    shuttle::check_random(
        || {
            future::block_on(async {
                let registry: Reg = Registry::new("objs");
                let drivers = Arc::new(Mutex::new(Vec::new()));
                let mut callers = Vec::new();
                for _ in 0..4 {
                    let registry = registry.clone();
                    let drivers = Arc::clone(&drivers);
                    callers.push(future::spawn(async move {
                        let (ticket, driver) = registry.join(&key());
                        if let Some(driver) = driver {
                            drivers.lock().expect("drivers").push(driver);
                        }
                        ticket
                    }));
                }
                let mut tickets = Vec::new();
                for caller in callers {
                    tickets.push(caller.await.expect("caller"));
                }
                let mut drivers = std::mem::take(&mut *drivers.lock().expect("drivers"));
                assert_eq!(drivers.len(), 1, "one key, one watch");
                let driver = drivers.remove(0);
                driver.synced(None);
                let mut handles = Vec::new();
                for ticket in tickets {
                    ticket.synced().await.expect("synced");
                    let (sink, _) = mpsc::unbounded_channel();
                    handles.push(ticket.attach(Box::new(sink)).expect("attach"));
                }
                assert_eq!(registry.snapshot()[&key()].handlers, 4);
                assert_eq!(
                    registry.counts(),
                    KeyCounts {
                        watched: 1,
                        synced: 1
                    }
                );
                for handle in &handles {
                    assert_eq!(registry.get(handle).expect("registered"), None);
                    registry.remove(handle).expect("remove");
                }
                assert!(driver.is_stopped(), "last removal stops the watch");
            })
        },
        500,
    );
}
