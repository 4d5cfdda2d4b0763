//! The pipeline's secret events, waiting to be handled: one change at most per
//! registration, so that what waits is bounded by the number of registrations however
//! often secrets change, and a route's decision is made with its secret's latest
//! state. Changes are handed out in the order they first arrived.
//!
//! The secret monitor delivers events while it holds the secret's entry
//! ([`EventSink::deliver`] must return at once), so the mailbox takes every event
//! without waiting: a newer event replaces the one waiting for the same registration
//! (a deletion followed by a re-creation is the new version: what the route's answer
//! depends on is the secret's state, never its history).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use kube_common::hash::NameMap;
use secret_monitor::{EventSink, ObjectEvent};
use tokio::sync::Notify;

use crate::consumer::ConsumerKey;
use crate::machine::RegistrationId;
use crate::tls::TlsSecret;

/// Whose change it is: the consumer and the registration it was delivered to.
pub(crate) type Tag = (ConsumerKey, RegistrationId);

/// What happened to a registration's secret since it was last handed out.
#[derive(Clone, Debug)]
pub(crate) enum Change {
    /// The secret exists in this version.
    Present(Arc<TlsSecret>),
    /// The secret was deleted.
    Deleted,
}

impl Change {
    fn of(event: ObjectEvent<TlsSecret>) -> Self {
        match event {
            ObjectEvent::Added(new) | ObjectEvent::Updated { new, .. } => Self::Present(new),
            ObjectEvent::Deleted(_) => Self::Deleted,
        }
    }
}

/// Room for this many waiting changes is kept once the mailbox is empty; the room a
/// larger flood took is given back.
const KEPT_ROOM: usize = 1024;

/// The changes waiting, by registration, and their order.
#[derive(Debug, Default)]
struct Waiting {
    changes: NameMap<Tag, Change>,
    /// Registrations with a change waiting, in the order their change first arrived.
    order: VecDeque<Tag>,
}

/// The mailbox: shared by the pipeline (which takes changes out) and every
/// registration's [`MailboxSink`].
#[derive(Clone, Debug, Default)]
pub(crate) struct SecretMailbox {
    /// Guards the waiting changes. Held only to insert or take one change, never
    /// across an `.await`.
    waiting: Arc<Mutex<Waiting>>,
    /// Wakes the pipeline when a change arrives in an empty mailbox.
    arrived: Arc<Notify>,
}

impl SecretMailbox {
    /// A sink delivering the events of the registration `tag` here.
    pub(crate) fn sink(&self, tag: Tag) -> MailboxSink {
        MailboxSink {
            tag,
            mailbox: self.clone(),
        }
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        // Every critical section is one map and queue update that cannot panic
        // half-way: a poisoned mailbox is intact.
        kube_common::sync::lock(&self.waiting)
    }

    /// Files `event` for registration `tag`: the secret's state now replaces the change
    /// waiting for it.
    pub(crate) fn put(&self, tag: Tag, event: ObjectEvent<TlsSecret>) {
        {
            let mut waiting = self.waiting();
            let Waiting { changes, order } = &mut *waiting;
            // The latest state replaces what waits; a registration keeps its place.
            if changes.insert(tag.clone(), Change::of(event)).is_none() {
                order.push_back(tag);
            }
        }
        self.arrived.notify_one();
    }

    /// The oldest waiting change, if any.
    pub(crate) fn take(&self) -> Option<(Tag, Change)> {
        let mut waiting = self.waiting();
        let tag = waiting.order.pop_front()?;
        let change = waiting.changes.remove(&tag)?;
        if waiting.order.is_empty() && waiting.order.capacity() > KEPT_ROOM {
            // A start-up's flood (one change per route) is over: its room would stay
            // allocated for the process's life.
            *waiting = Waiting::default();
        }
        Some((tag, change))
    }

    /// How many registrations have a change waiting.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.waiting().order.len()
    }

    /// Returns once a change is waiting (at once if one is). Cancel-safe: it takes
    /// nothing out.
    pub(crate) async fn ready(&self) {
        loop {
            if !self.waiting().order.is_empty() {
                return;
            }
            self.arrived.notified().await;
        }
    }
}

/// Delivers one registration's events into the [`SecretMailbox`].
#[derive(Debug)]
pub(crate) struct MailboxSink {
    tag: Tag,
    mailbox: SecretMailbox,
}

impl EventSink<TlsSecret> for MailboxSink {
    fn deliver(&mut self, event: ObjectEvent<TlsSecret>) {
        self.mailbox.put(self.tag.clone(), event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::RouteKey;

    fn secret(resource_version: &str) -> Arc<TlsSecret> {
        let mut secret = k8s_openapi::api::core::v1::Secret::default();
        secret.metadata.namespace = Some("ns".to_owned());
        secret.metadata.name = Some("s".to_owned());
        secret.metadata.resource_version = Some(resource_version.to_owned());
        Arc::new(TlsSecret::from(&secret))
    }

    fn tag(route: &str, id: u64) -> Tag {
        (
            ConsumerKey::Route(RouteKey::new("ns", route)),
            RegistrationId(id),
        )
    }

    fn updated(resource_version: &str) -> ObjectEvent<TlsSecret> {
        ObjectEvent::Updated {
            old: secret("0"),
            new: secret(resource_version),
        }
    }

    fn taken(mailbox: &SecretMailbox) -> Vec<(String, String)> {
        std::iter::from_fn(|| mailbox.take())
            .map(|((consumer, _), change)| {
                let change = match change {
                    Change::Present(s) => format!("present {}", s.resource_version().unwrap_or("")),
                    Change::Deleted => "deleted".to_owned(),
                };
                let route = consumer.route().map(|route| route.name.to_string());
                (route.unwrap_or_default(), change)
            })
            .collect()
    }

    #[test]
    fn the_room_of_a_flood_is_given_back_once_it_is_taken() {
        let mailbox = SecretMailbox::default();
        for id in 0..5_000 {
            mailbox.put(tag(&format!("r{id}"), id), updated("2"));
        }
        assert!(mailbox.waiting().order.capacity() >= 5_000);
        let flood = taken(&mailbox);
        assert_eq!(flood.len(), 5_000);
        assert_eq!(flood[0], ("r0".to_owned(), "present 2".to_owned()));
        assert_eq!(flood[4_999], ("r4999".to_owned(), "present 2".to_owned()));
        let waiting = mailbox.waiting();
        assert!(waiting.order.capacity() <= KEPT_ROOM);
        assert!(waiting.changes.capacity() <= KEPT_ROOM);
        drop(waiting);
        // And the mailbox works on as before.
        mailbox.put(tag("a", 1), updated("3"));
        assert_eq!(
            taken(&mailbox),
            vec![("a".to_owned(), "present 3".to_owned())]
        );
    }

    #[test]
    fn a_flood_of_changes_waits_as_one_per_registration_in_arrival_order() {
        let mailbox = SecretMailbox::default();
        for version in 1..=1000 {
            mailbox.put(tag("a", 1), updated(&version.to_string()));
            if version == 10 {
                mailbox.put(tag("b", 2), updated("b1"));
            }
        }
        assert_eq!(mailbox.len(), 2);
        assert_eq!(
            taken(&mailbox),
            [
                ("a".to_owned(), "present 1000".to_owned()),
                ("b".to_owned(), "present b1".to_owned())
            ]
        );
        assert_eq!(mailbox.len(), 0);
    }

    #[test]
    fn the_latest_state_is_what_waits() {
        let mailbox = SecretMailbox::default();
        let cases: [(&[ObjectEvent<TlsSecret>], &str); 5] = [
            (
                &[updated("1"), ObjectEvent::Deleted(secret("1"))],
                "deleted",
            ),
            (
                &[
                    ObjectEvent::Deleted(secret("1")),
                    ObjectEvent::Added(secret("2")),
                ],
                "present 2",
            ),
            (
                &[
                    ObjectEvent::Deleted(secret("1")),
                    ObjectEvent::Added(secret("2")),
                    updated("3"),
                ],
                "present 3",
            ),
            (
                &[
                    ObjectEvent::Deleted(secret("1")),
                    ObjectEvent::Added(secret("2")),
                    ObjectEvent::Deleted(secret("2")),
                ],
                "deleted",
            ),
            (
                &[ObjectEvent::Added(secret("1")), updated("2")],
                "present 2",
            ),
        ];
        for (events, expected) in cases {
            for event in events {
                mailbox.put(tag("a", 1), event.clone());
            }
            assert_eq!(
                taken(&mailbox),
                [("a".to_owned(), expected.to_owned())],
                "{expected}"
            );
        }
    }
}
