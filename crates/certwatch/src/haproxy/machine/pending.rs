//! The certificates HAProxy may not hold as wanted, oldest change first.
//!
//! A batch takes the oldest pending certificates, and at start-up every route's
//! certificate is pending at once (100,000 at the frontier): planning a batch must cost
//! in proportion to the batch, not to what is pending. So the set keeps an index by
//! (when the oldest unserved change came, name) beside the lookup by name: taking the
//! oldest, adding and removing one cost O(log n), and no batch sorts the whole set.
//! A name is allocated once and shared by both.
//!
//! Each entry also says whether it is a certificate to serve (its wanted state has a
//! line) or a removal, and the set counts the former: how many routes HAProxy does not
//! serve yet is read without a walk over the set, however often the status is
//! published.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

/// Pending certificates: each with when its oldest unserved change came.
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// Name → its entry.
    entries: HashMap<Arc<str>, Entry>,
    /// The same names ordered by (since, name): the oldest change first, ties by name.
    order: BTreeSet<(Instant, Arc<str>)>,
    /// Entries whose `serves` is set.
    serving: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    /// When the oldest unserved change came.
    since: Instant,
    /// Whether the wanted state is a line to serve (not a removal).
    serves: bool,
}

impl Pending {
    /// Whether nothing is pending.
    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many certificates are pending.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// How many pending certificates are to be served (not removals).
    pub(super) fn to_serve(&self) -> usize {
        self.serving
    }

    /// Whether `name` is pending.
    #[cfg(test)]
    pub(super) fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Makes `name` pending since `since`, unless it is already: a certificate keeps the
    /// time of its oldest unserved change. `serves` says whether its wanted state is a
    /// line to serve; it is updated either way.
    pub(super) fn insert_if_absent(&mut self, name: &str, since: Instant, serves: bool) {
        if self.entries.contains_key(name) {
            self.set_serves(name, serves);
            return;
        }
        let name: Arc<str> = Arc::from(name);
        self.order.insert((since, Arc::clone(&name)));
        self.entries.insert(name, Entry { since, serves });
        self.serving += usize::from(serves);
    }

    /// `name`'s wanted state changed: whether it is a line to serve (nothing if `name`
    /// is not pending).
    pub(super) fn set_serves(&mut self, name: &str, serves: bool) {
        if let Some(entry) = self.entries.get_mut(name)
            && entry.serves != serves
        {
            entry.serves = serves;
            if serves {
                self.serving += 1;
            } else {
                self.serving -= 1;
            }
        }
    }

    /// `name` is no longer pending; when its oldest unserved change came, if it was.
    pub(super) fn remove(&mut self, name: &str) -> Option<Instant> {
        let (name, entry) = self.entries.remove_entry(name)?;
        self.order.remove(&(entry.since, name));
        self.serving -= usize::from(entry.serves);
        Some(entry.since)
    }

    /// When the oldest pending change came.
    pub(super) fn oldest(&self) -> Option<Instant> {
        self.order.first().map(|(since, _)| *since)
    }

    /// Pending names, the oldest change first (ties by name).
    pub(super) fn oldest_first(&self) -> impl Iterator<Item = &str> {
        self.order.iter().map(|(_, name)| &**name)
    }

    /// Pending names, in no particular order.
    pub(super) fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(|name| &**name)
    }
}

/// Whether the two views of the set (the lookup and the order) and the count agree.
#[cfg(test)]
impl Pending {
    fn consistent(&self) -> bool {
        self.entries.len() == self.order.len()
            && self
                .order
                .iter()
                .all(|(since, name)| self.entries.get(name).map(|e| e.since) == Some(*since))
            && self.serving == self.entries.values().filter(|e| e.serves).count()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_oldest_change_comes_first_and_ties_go_by_name() {
        let start = Instant::now();
        let mut pending = Pending::default();
        pending.insert_if_absent("b", start + Duration::from_secs(1), true);
        pending.insert_if_absent("c", start, false);
        pending.insert_if_absent("a", start + Duration::from_secs(1), true);
        let order: Vec<&str> = pending.oldest_first().collect();
        assert_eq!(order, ["c", "a", "b"]);
        assert_eq!(pending.oldest(), Some(start));
        assert_eq!(pending.to_serve(), 2);
        assert!(pending.consistent());
    }

    #[test]
    fn a_certificate_keeps_the_time_of_its_oldest_change() {
        let start = Instant::now();
        let mut pending = Pending::default();
        pending.insert_if_absent("a", start, true);
        pending.insert_if_absent("a", start + Duration::from_secs(5), false);
        assert_eq!(pending.len(), 1);
        assert_eq!(
            pending.to_serve(),
            0,
            "the newest wanted state is a removal"
        );
        assert_eq!(pending.remove("a"), Some(start));
        assert!(pending.is_empty());
        assert!(pending.consistent());
    }

    /// Random inserts and removals, against the plain map sorted on every read that
    /// the index replaces.
    #[test]
    fn the_order_is_the_sorted_map_after_random_changes() {
        let start = Instant::now();
        let mut pending = Pending::default();
        let mut model: std::collections::HashMap<String, (Instant, bool)> = Default::default();
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let name = format!("c{}", next() % 200);
            let since = start + Duration::from_millis(next() % 50);
            let serves = next() % 4 != 0;
            match next() % 4 {
                0 => assert_eq!(
                    pending.remove(&name),
                    model.remove(&name).map(|(since, _)| since)
                ),
                1 => {
                    pending.set_serves(&name, serves);
                    if let Some(entry) = model.get_mut(&name) {
                        entry.1 = serves;
                    }
                }
                _ => {
                    pending.insert_if_absent(&name, since, serves);
                    model.entry(name).or_insert((since, serves)).1 = serves;
                }
            }
        }
        let mut sorted: Vec<(Instant, &str)> = model
            .iter()
            .map(|(name, (since, _))| (*since, name.as_str()))
            .collect();
        sorted.sort_unstable();
        let expected: Vec<&str> = sorted.iter().map(|(_, name)| *name).collect();
        assert_eq!(pending.oldest_first().collect::<Vec<_>>(), expected);
        assert_eq!(pending.oldest(), sorted.first().map(|(since, _)| *since));
        assert_eq!(pending.len(), model.len());
        let to_serve = model.values().filter(|(_, serves)| *serves).count();
        assert_eq!(pending.to_serve(), to_serve);
        assert!(pending.consistent());
    }

    #[test]
    fn removing_keeps_both_views_in_step() {
        let start = Instant::now();
        let mut pending = Pending::default();
        for (i, name) in ["x", "y", "z"].into_iter().enumerate() {
            pending.insert_if_absent(name, start + Duration::from_millis(i as u64 + 1), true);
        }
        assert_eq!(pending.remove("y"), Some(start + Duration::from_millis(2)));
        assert_eq!(pending.remove("y"), None);
        assert!(!pending.contains("y"));
        assert_eq!(pending.oldest_first().collect::<Vec<_>>(), ["x", "z"]);
        let mut names: Vec<&str> = pending.names().collect();
        names.sort_unstable();
        assert_eq!(names, ["x", "z"]);
        pending.remove("z");
        pending.insert_if_absent("z", start, true);
        assert_eq!(pending.oldest_first().collect::<Vec<_>>(), ["z", "x"]);
        assert!(pending.consistent());
    }
}
