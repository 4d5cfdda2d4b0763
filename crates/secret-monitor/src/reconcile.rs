//! Turns the watch protocol's events for one object into handler events.
//!
//! A state machine plus a step function, in the style of kube-runtime's watcher. The
//! watch ([`machine`](crate::machine)) re-lists after a `410 Gone` (`Init`,
//! `InitApply`..., `InitDone`); [`Reconciler::step`] compares what the re-list found
//! with what handlers last saw and emits the difference, so that changes made while the
//! watch was down are never lost:
//!
//! | last seen | re-list finds              | handlers get              |
//! |-----------|----------------------------|---------------------------|
//! | nothing   | the object                 | `Added`                   |
//! | object    | nothing                    | `Deleted`                 |
//! | object    | same uid, other version    | `Updated`                 |
//! | object    | another uid (re-created)   | `Deleted`, then `Added`   |
//! | object    | same version               | nothing                   |

use std::sync::Arc;

use crate::{ObjectEvent, WatchedObject};

/// What the watch protocol learned about the object, in the order it learned it.
#[derive(Debug)]
pub(crate) enum Event<K> {
    /// A (re-)list starts: forget what earlier lists found.
    Init,
    /// The (re-)list found this object.
    InitApply(K),
    /// The (re-)list is complete.
    InitDone,
    /// The watch saw the object created or changed.
    Apply(K),
    /// The watch saw the object deleted (its final state).
    Delete(K),
}

/// What one protocol event means for the entry.
#[derive(Debug)]
pub(crate) enum Step<K> {
    /// Nothing changed (a marker event, a duplicate, or a re-list in progress).
    Unchanged,
    /// The first complete listing: the object's initial state.
    FirstSync(Option<Arc<K>>),
    /// The object changed: its new state and the events that lead there.
    Changed {
        object: Option<Arc<K>>,
        events: Vec<ObjectEvent<K>>,
    },
}

/// Tracks the last state handlers saw and any re-list in progress.
#[derive(Debug)]
pub(crate) struct Reconciler<K> {
    name: String,
    /// What handlers last saw. `None` until the first sync and when absent.
    seen: Option<Arc<K>>,
    synced: bool,
    /// `Some` while a (re-)list is in progress: the object it found so far.
    relist: Option<Option<Arc<K>>>,
}

impl<K: WatchedObject> Reconciler<K> {
    /// A reconciler for the object called `name`.
    pub(crate) fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            seen: None,
            synced: false,
            relist: None,
        }
    }

    /// Whether the first listing has completed.
    pub(crate) fn is_synced(&self) -> bool {
        self.synced
    }

    /// Feeds one protocol event.
    pub(crate) fn step(&mut self, event: Event<K>) -> Step<K> {
        match event {
            Event::Init => {
                self.relist = Some(None);
                Step::Unchanged
            }
            Event::InitApply(object) => {
                // The field selector already restricts the list to one name; checking
                // again guards against a server that ignores it.
                if object.object_name() == Some(self.name.as_str()) {
                    self.relist = Some(Some(Arc::new(object)));
                }
                Step::Unchanged
            }
            Event::InitDone => {
                let listed = self.relist.take().flatten();
                if self.synced {
                    self.transition(listed)
                } else {
                    self.synced = true;
                    self.seen = listed.clone();
                    Step::FirstSync(listed)
                }
            }
            Event::Apply(object) => {
                if object.object_name() != Some(self.name.as_str()) {
                    return Step::Unchanged;
                }
                self.transition(Some(Arc::new(object)))
            }
            Event::Delete(object) => {
                if self.seen.is_none() || object.object_name() != Some(self.name.as_str()) {
                    return Step::Unchanged;
                }
                // Report the server's final state of the object rather than our last copy.
                self.seen = None;
                Step::Changed {
                    object: None,
                    events: vec![ObjectEvent::Deleted(Arc::new(object))],
                }
            }
        }
    }

    fn transition(&mut self, next: Option<Arc<K>>) -> Step<K> {
        let events = match (&self.seen, &next) {
            (None, None) => Vec::new(),
            (None, Some(new)) => vec![ObjectEvent::Added(Arc::clone(new))],
            (Some(old), None) => vec![ObjectEvent::Deleted(Arc::clone(old))],
            (Some(old), Some(new)) if old.object_uid() != new.object_uid() => vec![
                ObjectEvent::Deleted(Arc::clone(old)),
                ObjectEvent::Added(Arc::clone(new)),
            ],
            (Some(old), Some(new))
                if old.object_resource_version() == new.object_resource_version() =>
            {
                Vec::new()
            }
            (Some(old), Some(new)) => vec![ObjectEvent::Updated {
                old: Arc::clone(old),
                new: Arc::clone(new),
            }],
        };
        if events.is_empty() {
            return Step::Unchanged;
        }
        self.seen = next.clone();
        Step::Changed {
            object: next,
            events,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::ObjectMeta;

    use super::*;

    fn secret(name: &str, uid: &str, rv: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                resource_version: Some(rv.into()),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        }
    }

    fn kinds(step: &Step<Secret>) -> Vec<String> {
        match step {
            Step::Unchanged => vec![],
            Step::FirstSync(obj) => vec![format!("first:{}", obj.is_some())],
            Step::Changed { events, .. } => events
                .iter()
                .map(|e| match e {
                    ObjectEvent::Added(o) => format!(
                        "add:{}",
                        o.metadata.resource_version.as_deref().unwrap_or("")
                    ),
                    ObjectEvent::Updated { old, new } => format!(
                        "update:{}->{}",
                        old.metadata.resource_version.as_deref().unwrap_or(""),
                        new.metadata.resource_version.as_deref().unwrap_or("")
                    ),
                    ObjectEvent::Deleted(o) => format!(
                        "delete:{}",
                        o.metadata.resource_version.as_deref().unwrap_or("")
                    ),
                })
                .collect(),
        }
    }

    fn relist(r: &mut Reconciler<Secret>, found: Option<Secret>) -> Vec<String> {
        assert!(matches!(r.step(Event::Init), Step::Unchanged));
        if let Some(obj) = found {
            assert!(matches!(r.step(Event::InitApply(obj)), Step::Unchanged));
        }
        kinds(&r.step(Event::InitDone))
    }

    #[test]
    fn first_sync_reports_presence_and_absence() {
        let mut present = Reconciler::new("a");
        assert_eq!(
            relist(&mut present, Some(secret("a", "u1", "5"))),
            ["first:true"]
        );
        assert!(present.is_synced());
        let mut absent = Reconciler::<Secret>::new("a");
        assert_eq!(relist(&mut absent, None), ["first:false"]);
    }

    #[test]
    fn watch_events_after_sync() {
        let mut r = Reconciler::new("a");
        relist(&mut r, None);
        assert_eq!(
            kinds(&r.step(Event::Apply(secret("a", "u1", "6")))),
            ["add:6"]
        );
        assert_eq!(
            kinds(&r.step(Event::Apply(secret("a", "u1", "7")))),
            ["update:6->7"]
        );
        // A duplicate delivery of the same version is not an update.
        assert!(kinds(&r.step(Event::Apply(secret("a", "u1", "7")))).is_empty());
        assert_eq!(
            kinds(&r.step(Event::Delete(secret("a", "u1", "8")))),
            ["delete:8"]
        );
        // A second delete of an absent object is not an event.
        assert!(kinds(&r.step(Event::Delete(secret("a", "u1", "8")))).is_empty());
    }

    #[test]
    fn relist_emits_the_difference() {
        let mut r = Reconciler::new("a");
        relist(&mut r, Some(secret("a", "u1", "5")));
        // Changed while disconnected.
        assert_eq!(
            relist(&mut r, Some(secret("a", "u1", "9"))),
            ["update:5->9"]
        );
        // Unchanged.
        assert!(relist(&mut r, Some(secret("a", "u1", "9"))).is_empty());
        // Deleted and re-created while disconnected: both are observed.
        assert_eq!(
            relist(&mut r, Some(secret("a", "u2", "12"))),
            ["delete:9", "add:12"]
        );
        // Deleted while disconnected.
        assert_eq!(relist(&mut r, None), ["delete:12"]);
        // Created while disconnected.
        assert_eq!(relist(&mut r, Some(secret("a", "u3", "20"))), ["add:20"]);
    }

    #[test]
    fn objects_with_other_names_are_ignored() {
        let mut r = Reconciler::new("a");
        assert_eq!(
            relist(&mut r, Some(secret("b", "u1", "5"))),
            ["first:false"]
        );
        assert!(kinds(&r.step(Event::Apply(secret("b", "u1", "6")))).is_empty());
    }
}
