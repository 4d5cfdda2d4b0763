//! Host claims, as openshift/router's unique-host admission decides them: every route
//! with a host claims it (with its path); the oldest claim wins. Pure bookkeeping: the
//! machine asks who keeps a route from its host, and which routes' answer changed when
//! a claim came, went or moved.
//!
//! The rules (`pkg/router/controller/unique_host.go`):
//!
//! * Claims are ordered by creation time (routes without one last), then uid (the
//!   router's `RouteLessThan`), then namespace and name: the older claim wins.
//! * Namespace ownership (unless disabled): a host belongs to the namespace of its
//!   oldest claim; a route of another namespace is refused whatever its path.
//! * Within the owning namespace (or anywhere, with the ownership check disabled),
//!   routes of the same host but different paths are all admitted; of routes with the
//!   same host and path, only the oldest is.
//! * A refused claim stays on file: when the claims before it go away (the route is
//!   deleted, or changes host or path), it takes over.
use std::sync::Arc;

use jiff::Timestamp;
use kube_common::hash::NameMap;

use crate::route::{Route, RouteKey};

/// One route's claim on its host.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Claim {
    /// Sorts claims without a creation time (not from an API server) last.
    undated: bool,
    /// When the route was created (to the second, as the API server records it).
    created: Option<Timestamp>,
    /// `metadata.uid`: the router's tie-break between routes created in the same
    /// second (compared as strings, as Go compares them).
    uid: Option<Arc<str>>,
    /// The route (namespace, then name: the tie-break without uids).
    route: RouteKey,
    /// `spec.path`, empty when unset.
    path: String,
}

impl Claim {
    /// The route's claim: its host, and the claim on it. `None` without a host.
    pub fn of(route: &Route) -> Option<(String, Self)> {
        let host = route.host()?.to_ascii_lowercase();
        let created = route.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let claim = Self {
            undated: created.is_none(),
            created,
            uid: route.metadata.uid.as_deref().map(Arc::from),
            route: route.key()?,
            path: route.spec.path.clone().unwrap_or_default(),
        };
        Some((host, claim))
    }
}

/// Why a route does not get its host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Blocked {
    /// The older route that holds the host.
    pub owner: RouteKey,
    /// The host.
    pub host: String,
    /// Whether the host is refused for belonging to the owner's namespace (the
    /// namespace-ownership check), rather than for an older claim on the same path.
    pub by_namespace: bool,
}

/// Every route's claim, by host.
#[derive(Debug, Default)]
pub(super) struct HostClaims {
    /// Claims per host, oldest first, without duplicates. A sorted `Vec`, not a
    /// `BTreeSet`: nearly every host has one claim, and a B-tree node holds room for
    /// eleven (about 1 KB per host at 10,000 routes).
    by_host: NameMap<Arc<str>, Vec<Claim>>,
    /// The host each route claims (its claim is in `by_host`): one copy of each claim,
    /// and one of each host's name.
    of_route: NameMap<RouteKey, Arc<str>>,
}

impl HostClaims {
    /// Makes room for `additional` more routes' claims (each on its own host, as
    /// nearly every route's is), so that a listing does not grow the maps step by step.
    pub fn reserve(&mut self, additional: usize) {
        self.by_host.reserve(additional);
        self.of_route.reserve(additional);
    }

    /// Replaces `route`'s claim with `claim` (`None`: the route claims nothing).
    /// Returns whether anything changed.
    pub fn set(&mut self, route: &RouteKey, claim: Option<(String, Claim)>) -> bool {
        let current = self.claim_of(route);
        if current == claim.as_ref().map(|(host, claim)| (host.as_str(), claim)) {
            return false;
        }
        if let Some(host) = self.of_route.remove(route)
            && let Some(claims) = self.by_host.get_mut(&host)
        {
            claims.retain(|claim| claim.route != *route);
            if claims.is_empty() {
                self.by_host.remove(&host);
            }
        }
        if let Some((host, new)) = claim {
            let host = match self.by_host.get_key_value(host.as_str()) {
                Some((shared, _)) => Arc::clone(shared),
                None => Arc::from(host),
            };
            let claims = self
                .by_host
                .entry(Arc::clone(&host))
                // Exactly one slot: the usual host never gets a second claim.
                .or_insert_with(|| Vec::with_capacity(1));
            if let Err(index) = claims.binary_search(&new) {
                claims.insert(index, new);
            }
            self.of_route.insert(route.clone(), host);
        }
        true
    }

    /// `route`'s current host and claim.
    fn claim_of(&self, route: &RouteKey) -> Option<(&str, &Claim)> {
        let host = self.of_route.get(route)?;
        let claim = self
            .by_host
            .get(host)?
            .iter()
            .find(|claim| claim.route == *route)?;
        Some((host, claim))
    }

    /// The other routes claiming `route`'s current host or `host`: those whose answer
    /// to [`blocker`](Self::blocker) a change of `route`'s claim can change.
    pub fn neighbours(&self, route: &RouteKey, host: Option<&str>) -> Vec<RouteKey> {
        let current = self.of_route.get(route).map(|host| &**host);
        let mut hosts = vec![current, host];
        hosts.dedup();
        hosts
            .into_iter()
            .flatten()
            .filter_map(|host| self.by_host.get(host))
            .flatten()
            .map(|claim| claim.route.clone())
            .filter(|other| other != route)
            .collect()
    }

    /// The older claim that keeps `route` from its host, if any.
    pub fn blocker(&self, route: &RouteKey, namespace_ownership: bool) -> Option<Blocked> {
        let (host, mine) = self.claim_of(route)?;
        let claims = self.by_host.get(host)?;
        let oldest = claims.first()?;
        let blocked_by = |owner: &Claim, by_namespace| Blocked {
            owner: owner.route.clone(),
            host: host.to_owned(),
            by_namespace,
        };
        if namespace_ownership && oldest.route.namespace != mine.route.namespace {
            return Some(blocked_by(oldest, true));
        }
        claims[..claims.partition_point(|claim| claim < mine)]
            .iter()
            .find(|older| {
                older.path == mine.path
                    // Claims of other namespaces are refused themselves when
                    // ownership is checked: they keep nobody out.
                    && (!namespace_ownership || older.route.namespace == mine.route.namespace)
            })
            .map(|older| blocked_by(older, false))
    }

    /// How many routes claim a host.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.of_route.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(namespace: &str, name: &str, age: Option<i64>, path: &str) -> Claim {
        let created = age.map(|age| Timestamp::from_second(1_700_000_000 + age).expect("time"));
        Claim {
            undated: created.is_none(),
            created,
            uid: None,
            route: RouteKey::new(namespace, name),
            path: path.to_owned(),
        }
    }

    /// Each case: claims on one host (namespace, name, age, path), and for each route
    /// who keeps it out, with the ownership check on and off.
    #[test]
    fn who_keeps_whom_out() {
        type Case = (
            &'static str,
            &'static [(&'static str, &'static str, Option<i64>, &'static str)],
            &'static [(&'static str, Option<&'static str>, Option<&'static str>)],
        );
        let cases: &[Case] = &[
            (
                "same namespace, same path: the older wins",
                &[("a", "old", Some(1), ""), ("a", "new", Some(2), "")],
                &[("new", Some("old"), Some("old")), ("old", None, None)],
            ),
            (
                "same namespace, other paths: both served",
                &[("a", "root", Some(1), ""), ("a", "api", Some(2), "/api")],
                &[("root", None, None), ("api", None, None)],
            ),
            (
                "other namespace: refused whatever its path, unless ownership is off",
                &[("a", "owner", Some(1), ""), ("b", "api", Some(2), "/api")],
                &[("api", Some("owner"), None), ("owner", None, None)],
            ),
            (
                "other namespace, same path: the older wins either way",
                &[("a", "owner", Some(1), ""), ("b", "thief", Some(2), "")],
                &[("thief", Some("owner"), Some("owner"))],
            ),
            (
                "a refused claim of another namespace keeps nobody out",
                &[
                    ("a", "owner", Some(1), ""),
                    ("b", "other", Some(2), "/x"),
                    ("a", "x", Some(3), "/x"),
                ],
                &[("x", None, Some("other")), ("other", Some("owner"), None)],
            ),
            (
                "same creation time: namespace, then name",
                &[("b", "a", Some(1), ""), ("a", "z", Some(1), "")],
                &[("a", Some("z"), Some("z")), ("z", None, None)],
            ),
            (
                "no creation time: last",
                &[("a", "undated", None, ""), ("a", "dated", Some(9), "")],
                &[("undated", Some("dated"), Some("dated"))],
            ),
        ];
        for (name, claims, expected) in cases {
            let mut hosts = HostClaims::default();
            for (namespace, route, age, path) in *claims {
                let claim = claim(namespace, route, *age, path);
                assert!(hosts.set(&claim.route.clone(), Some(("h.example".to_owned(), claim))));
            }
            let key_of = |route: &str| {
                claims
                    .iter()
                    .find(|c| c.1 == route)
                    .map(|c| RouteKey::new(c.0, c.1))
                    .expect("a route of the case")
            };
            for (route, with_ownership, without) in *expected {
                for (ownership, owner) in [(true, with_ownership), (false, without)] {
                    let got = hosts.blocker(&key_of(route), ownership).map(|b| b.owner);
                    assert_eq!(
                        got,
                        owner.map(key_of),
                        "{name}: {route} (ownership check {ownership})"
                    );
                }
            }
        }
    }

    /// A claim of another namespace on the same path is refused either way, for the
    /// namespace with the ownership check, for the path without it: the message must
    /// not ask to disable a check that is off.
    #[test]
    fn the_rule_that_refuses_is_named() {
        let mut hosts = HostClaims::default();
        for claim in [
            claim("a", "owner", Some(1), ""),
            claim("b", "late", Some(2), ""),
        ] {
            hosts.set(&claim.route.clone(), Some(("h".into(), claim)));
        }
        let late = RouteKey::new("b", "late");
        let by_namespace = |ownership| hosts.blocker(&late, ownership).map(|b| b.by_namespace);
        assert_eq!(by_namespace(true), Some(true));
        assert_eq!(by_namespace(false), Some(false));
    }

    #[test]
    fn a_refused_claim_takes_over_when_the_older_goes_or_moves() {
        let mut hosts = HostClaims::default();
        let (old, new) = (
            claim("a", "old", Some(1), ""),
            claim("b", "new", Some(2), ""),
        );
        let (old_key, new_key) = (old.route.clone(), new.route.clone());
        assert!(hosts.set(&old_key, Some(("h".into(), old.clone()))));
        assert_eq!(hosts.neighbours(&new_key, Some("h")), vec![old_key.clone()]);
        assert!(hosts.set(&new_key, Some(("h".into(), new))));
        assert!(hosts.blocker(&new_key, true).is_some());
        // The older route moves to another host: the newer one is among those to ask
        // again, and has the host now.
        assert_eq!(
            hosts.neighbours(&old_key, Some("elsewhere")),
            vec![new_key.clone()]
        );
        assert!(hosts.set(&old_key, Some(("elsewhere".into(), old.clone()))));
        assert_eq!(hosts.blocker(&new_key, true), None);
        // Back, then deleted.
        hosts.set(&old_key, Some(("h".into(), old)));
        assert!(hosts.blocker(&new_key, true).is_some());
        assert_eq!(hosts.neighbours(&old_key, None), vec![new_key.clone()]);
        assert!(hosts.set(&old_key, None));
        assert_eq!(hosts.blocker(&new_key, true), None);
        // The same claim again changes nothing.
        let same = hosts
            .claim_of(&new_key)
            .map(|(host, claim)| (host.to_owned(), claim.clone()));
        assert!(!hosts.set(&new_key, same));
        assert_eq!(hosts.len(), 1);
    }

    /// Routes created in the same second: the router's tie-break is the uid (as a
    /// string), whatever the names.
    #[test]
    fn the_uid_breaks_ties_of_the_same_second() {
        let mut a = claim("ns", "a", Some(1), "");
        let mut b = claim("ns", "b", Some(1), "");
        a.uid = Some(Arc::from("f0"));
        b.uid = Some(Arc::from("0f"));
        assert!(b < a, "the smaller uid is the older claim");
        let older = claim("ns", "z", Some(0), "");
        assert!(older < b, "an older second wins before any uid");
    }
}
