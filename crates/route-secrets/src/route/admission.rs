//! This router's entry in a route's `status.ingress[]`.
//!
//! A router owns exactly one entry, the one with its `routerName`; entries of other
//! routers, and fields and conditions this crate does not model, are never touched.
//! [`record_admission`] writes an outcome and says whether anything changed;
//! [`records_admission`] says whether a route already shows an outcome, so that a
//! pipeline that sees its own status write come back through the watch does not write
//! again.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{ConditionStatus, Route, RouteIngress, RouteIngressCondition, RouteStatus};

/// The condition type a router sets on its entry.
pub const ADMITTED: &str = "Admitted";

/// Who this router is, as written into its status entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouterIdentity {
    /// `routerName`.
    pub name: String,
    /// `routerCanonicalHostname`, if the router has one.
    pub canonical_hostname: Option<String>,
    /// The router's domain (its `ROUTER_DOMAIN`): a route with `spec.subdomain` and no
    /// `spec.host` is served, and its entry written, as `<subdomain>.<domain>`.
    pub domain: Option<String>,
}

impl RouterIdentity {
    /// A router identity without canonical host name.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            canonical_hostname: None,
            domain: None,
        }
    }
}

/// The outcome to record: the `Admitted` condition's status, reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    /// `True` when the router serves the route.
    pub admitted: bool,
    /// A CamelCase reason, e.g. `ExternalCertificateValidationFailed`.
    pub reason: Option<String>,
    /// A message for people.
    pub message: Option<String>,
}

impl Admission {
    /// Admitted, without reason.
    pub fn admitted() -> Self {
        Self {
            admitted: true,
            reason: None,
            message: None,
        }
    }

    /// Rejected for `reason`.
    pub fn rejected(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            admitted: false,
            reason: Some(reason.into()),
            message: Some(message.into()),
        }
    }

    fn condition_status(&self) -> ConditionStatus {
        if self.admitted {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}

/// Empty and absent strings mean the same in a condition.
fn same_text(a: Option<&str>, b: Option<&str>) -> bool {
    a.filter(|s| !s.is_empty()) == b.filter(|s| !s.is_empty())
}

/// The entry of router `router_name`, if the route has one.
pub fn router_ingress<'a>(route: &'a Route, router_name: &str) -> Option<&'a RouteIngress> {
    route
        .status
        .as_ref()?
        .ingress
        .as_ref()?
        .iter()
        .find(|ingress| ingress.router_name.as_deref() == Some(router_name))
}

/// The `Admitted` condition of an entry.
pub fn admitted_condition(ingress: &RouteIngress) -> Option<&RouteIngressCondition> {
    ingress
        .conditions
        .as_ref()?
        .iter()
        .find(|condition| condition.type_ == ADMITTED)
}

/// Writes `admission` into this router's entry of `route.status.ingress[]`, creating the
/// entry if needed, and returns whether the status changed.
///
/// The entry's host and wildcard policy follow the route's spec (the host from
/// `spec.subdomain` and the router's domain when `spec.host` is empty), its canonical
/// host name
/// follows `router`. `lastTransitionTime` becomes `now` only when the condition's status
/// changes (or the condition is new). Duplicate entries with this router's name are
/// merged into the first. Other routers' entries, other conditions and unknown fields
/// are left as they are.
pub fn record_admission(
    route: &mut Route,
    router: &RouterIdentity,
    admission: &Admission,
    now: Timestamp,
) -> bool {
    let host = route
        .host_with_domain(router.domain.as_deref())
        .or_else(|| route.spec.host.clone());
    let wildcard_policy = route.spec.wildcard_policy.clone();
    let status = route.status.get_or_insert_with(RouteStatus::default);
    let ingresses = status.ingress.get_or_insert_with(Vec::new);

    let mut changed = false;
    let mut seen = false;
    ingresses.retain(|ingress| {
        let ours = ingress.router_name.as_deref() == Some(router.name.as_str());
        let duplicate = ours && seen;
        seen |= ours;
        changed |= duplicate;
        !duplicate
    });
    let index = match ingresses
        .iter()
        .position(|ingress| ingress.router_name.as_deref() == Some(router.name.as_str()))
    {
        Some(index) => index,
        None => {
            ingresses.push(RouteIngress {
                router_name: Some(router.name.clone()),
                ..RouteIngress::default()
            });
            changed = true;
            ingresses.len() - 1
        }
    };
    let ingress = &mut ingresses[index];
    changed |= set_if_different(&mut ingress.host, host);
    changed |= set_if_different(&mut ingress.wildcard_policy, wildcard_policy);
    changed |= set_if_different(
        &mut ingress.router_canonical_hostname,
        router.canonical_hostname.clone(),
    );

    let conditions = ingress.conditions.get_or_insert_with(Vec::new);
    let status = admission.condition_status();
    match conditions
        .iter_mut()
        .find(|condition| condition.type_ == ADMITTED)
    {
        Some(condition) => {
            if condition.status != status {
                condition.status = status;
                condition.last_transition_time = Some(Time(now));
                changed = true;
            }
            if !same_text(condition.reason.as_deref(), admission.reason.as_deref()) {
                condition.reason = admission.reason.clone();
                changed = true;
            }
            if !same_text(condition.message.as_deref(), admission.message.as_deref()) {
                condition.message = admission.message.clone();
                changed = true;
            }
        }
        None => {
            conditions.push(RouteIngressCondition {
                type_: ADMITTED.to_owned(),
                status,
                reason: admission.reason.clone(),
                message: admission.message.clone(),
                last_transition_time: Some(Time(now)),
                ..RouteIngressCondition::default()
            });
            changed = true;
        }
    }
    changed
}

fn set_if_different<T: PartialEq>(slot: &mut Option<T>, value: Option<T>) -> bool {
    if *slot == value {
        false
    } else {
        *slot = value;
        true
    }
}

/// Whether `route`'s status already shows `admission` for `router` exactly as
/// [`record_admission`] would write it (so writing it would change nothing).
pub fn records_admission(route: &Route, router: &RouterIdentity, admission: &Admission) -> bool {
    let mut copy = Route {
        metadata: Default::default(),
        spec: route.spec.clone(),
        status: route.status.clone(),
    };
    // The time is only used when something changes, and then the answer is `false`.
    !record_admission(&mut copy, router, admission, Timestamp::UNIX_EPOCH)
}

/// Removes this router's entries from the route's status; returns whether any existed.
pub fn clear_router_status(route: &mut Route, router_name: &str) -> bool {
    let Some(ingresses) = route
        .status
        .as_mut()
        .and_then(|status| status.ingress.as_mut())
    else {
        return false;
    };
    let before = ingresses.len();
    ingresses.retain(|ingress| ingress.router_name.as_deref() != Some(router_name));
    ingresses.len() != before
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::{RouteSpec, UnknownFields, WildcardPolicy};
    use serde_json::json;

    fn t(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn router() -> RouterIdentity {
        RouterIdentity {
            name: "default".into(),
            canonical_hostname: Some("router-default.apps.example.com".into()),
            domain: None,
        }
    }

    #[test]
    fn a_subdomain_route_is_recorded_at_its_host_in_the_routers_domain() {
        let mut route: Route = serde_json::from_value(serde_json::json!({
            "apiVersion": "route.openshift.io/v1", "kind": "Route",
            "metadata": {"name": "shop", "namespace": "team-a"},
            "spec": {"subdomain": "shop", "to": {"kind": "Service", "name": "shop"}},
        }))
        .unwrap();
        let mut with_domain = router();
        with_domain.domain = Some("apps.example.com".into());
        let admitted = Admission::admitted();
        assert!(record_admission(
            &mut route,
            &with_domain,
            &admitted,
            Timestamp::UNIX_EPOCH
        ));
        let ours = router_ingress(&route, "default").unwrap();
        assert_eq!(ours.host.as_deref(), Some("shop.apps.example.com"));
        assert!(records_admission(&route, &with_domain, &admitted));
        // Without a domain there is no host to write; with a host, the host wins.
        assert!(record_admission(
            &mut route,
            &router(),
            &admitted,
            Timestamp::UNIX_EPOCH
        ));
        assert_eq!(router_ingress(&route, "default").unwrap().host, None);
        route.spec.host = Some("own.example.com".into());
        record_admission(&mut route, &with_domain, &admitted, Timestamp::UNIX_EPOCH);
        assert_eq!(
            router_ingress(&route, "default").unwrap().host.as_deref(),
            Some("own.example.com")
        );
        let mut copy = route.clone();
        copy.spec.host = None;
        copy.apply_router_domain(Some("apps.example.com"));
        assert_eq!(copy.host(), Some("shop.apps.example.com"));
        copy.spec.host = None;
        copy.apply_router_domain(None);
        assert_eq!(copy.host(), None);
    }

    fn route_with_foreign_entry() -> Route {
        serde_json::from_value(json!({
            "apiVersion": "route.openshift.io/v1",
            "kind": "Route",
            "metadata": {"name": "shop", "namespace": "team-a"},
            "spec": {"host": "shop.example.com", "to": {"kind": "Service", "name": "shop"}},
            "status": {"ingress": [{
                "host": "shop.example.com",
                "routerName": "sharded",
                "conditions": [{"type": "Admitted", "status": "True", "lastTransitionTime": "2024-01-01T00:00:00Z"}],
                "extraField": 7
            }]}
        }))
        .unwrap()
    }

    fn foreign_entry(route: &Route) -> serde_json::Value {
        serde_json::to_value(router_ingress(route, "sharded").unwrap()).unwrap()
    }

    #[test]
    fn records_a_new_entry_and_leaves_others_alone() {
        let mut route = route_with_foreign_entry();
        let before = foreign_entry(&route);
        let rejection = Admission::rejected("ExternalCertificateValidationFailed", "gone");
        assert!(record_admission(&mut route, &router(), &rejection, t(100)));
        assert_eq!(foreign_entry(&route), before);
        let ours = router_ingress(&route, "default").unwrap();
        assert_eq!(ours.host.as_deref(), Some("shop.example.com"));
        assert_eq!(
            ours.router_canonical_hostname.as_deref(),
            Some("router-default.apps.example.com")
        );
        let condition = admitted_condition(ours).unwrap();
        assert_eq!(condition.status, ConditionStatus::False);
        assert_eq!(
            condition.reason.as_deref(),
            Some("ExternalCertificateValidationFailed")
        );
        assert_eq!(condition.message.as_deref(), Some("gone"));
        assert_eq!(condition.last_transition_time, Some(Time(t(100))));
        assert_eq!(
            route
                .status
                .as_ref()
                .unwrap()
                .ingress
                .as_ref()
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn recording_the_same_outcome_again_changes_nothing() {
        let mut route = route_with_foreign_entry();
        let rejection = Admission::rejected("ExternalCertificateValidationFailed", "bad key");
        assert!(!records_admission(&route, &router(), &rejection));
        assert!(record_admission(&mut route, &router(), &rejection, t(100)));
        assert!(records_admission(&route, &router(), &rejection));
        let snapshot = route.clone();
        assert!(!record_admission(&mut route, &router(), &rejection, t(200)));
        assert_eq!(route, snapshot);

        // Survives a trip through JSON, as when the write comes back through a watch.
        let echoed: Route = serde_json::from_value(serde_json::to_value(&route).unwrap()).unwrap();
        assert!(records_admission(&echoed, &router(), &rejection));
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let mut route = route_with_foreign_entry();
        let first = Admission::rejected("ExternalCertificateValidationFailed", "bad key");
        record_admission(&mut route, &router(), &first, t(100));
        let second = Admission::rejected("ExternalCertificateValidationFailed", "gone");
        assert!(!records_admission(&route, &router(), &second));
        assert!(record_admission(&mut route, &router(), &second, t(200)));
        let time = |route: &Route| {
            admitted_condition(router_ingress(route, "default").unwrap())
                .unwrap()
                .last_transition_time
                .clone()
        };
        assert_eq!(time(&route), Some(Time(t(100))));
        assert!(record_admission(
            &mut route,
            &router(),
            &Admission::admitted(),
            t(300)
        ));
        assert_eq!(time(&route), Some(Time(t(300))));
        let condition = admitted_condition(router_ingress(&route, "default").unwrap()).unwrap();
        assert_eq!(condition.status, ConditionStatus::True);
        assert_eq!(condition.reason, None);
        assert_eq!(condition.message, None);
    }

    #[test]
    fn host_change_is_a_change() {
        let mut route = route_with_foreign_entry();
        record_admission(&mut route, &router(), &Admission::admitted(), t(1));
        route.spec.host = Some("new.example.com".into());
        route.spec.wildcard_policy = Some(WildcardPolicy::None);
        assert!(!records_admission(
            &route,
            &router(),
            &Admission::admitted()
        ));
        assert!(record_admission(
            &mut route,
            &router(),
            &Admission::admitted(),
            t(2)
        ));
        let ours = router_ingress(&route, "default").unwrap();
        assert_eq!(ours.host.as_deref(), Some("new.example.com"));
        assert_eq!(ours.wildcard_policy, Some(WildcardPolicy::None));
    }

    /// The route's `status.ingress[]`, which the fixture has.
    fn ingresses(route: &mut Route) -> &mut Vec<RouteIngress> {
        route
            .status
            .as_mut()
            .and_then(|status| status.ingress.as_mut())
            .expect("the fixture has status.ingress")
    }

    #[test]
    fn other_conditions_and_fields_in_our_entry_survive() {
        let mut route = route_with_foreign_entry();
        ingresses(&mut route).push(
            serde_json::from_value(json!({
                "routerName": "default",
                "host": "shop.example.com",
                "conditions": [
                    {"type": "UnservableInFutureVersions", "status": "True"},
                    {"type": "Admitted", "status": "True"}
                ],
                "vendorField": "x"
            }))
            .unwrap(),
        );
        let rejection = Admission::rejected("ExternalCertificateGetFailed", "timeout");
        record_admission(&mut route, &router(), &rejection, t(5));
        let ours = router_ingress(&route, "default").unwrap();
        let conditions = ours.conditions.as_ref().unwrap();
        assert_eq!(conditions.len(), 2);
        assert_eq!(conditions[0].type_, "UnservableInFutureVersions");
        assert_eq!(ours.extra.get("vendorField"), Some(&json!("x")));
    }

    #[test]
    fn duplicate_entries_of_this_router_are_merged() {
        let mut route = route_with_foreign_entry();
        let entry = RouteIngress {
            router_name: Some("default".into()),
            ..RouteIngress::default()
        };
        ingresses(&mut route).extend([entry.clone(), entry]);
        record_admission(&mut route, &router(), &Admission::admitted(), t(1));
        let ingresses = route.status.as_ref().unwrap().ingress.as_ref().unwrap();
        assert_eq!(ingresses.len(), 2);
        assert!(records_admission(&route, &router(), &Admission::admitted()));
    }

    #[test]
    fn empty_and_absent_texts_are_equal() {
        let mut route = Route::new("r", RouteSpec::default());
        record_admission(
            &mut route,
            &RouterIdentity::new("default"),
            &Admission::admitted(),
            t(1),
        );
        let condition = route.status.as_mut().unwrap().ingress.as_mut().unwrap()[0]
            .conditions
            .as_mut()
            .unwrap();
        condition[0].reason = Some(String::new());
        condition[0].message = Some(String::new());
        assert!(records_admission(
            &route,
            &RouterIdentity::new("default"),
            &Admission::admitted()
        ));
    }

    #[test]
    fn clearing_removes_only_this_router() {
        let mut route = route_with_foreign_entry();
        assert!(!clear_router_status(&mut route, "default"));
        record_admission(&mut route, &router(), &Admission::admitted(), t(1));
        assert!(clear_router_status(&mut route, "default"));
        assert!(router_ingress(&route, "default").is_none());
        assert!(router_ingress(&route, "sharded").is_some());
        assert_eq!(route.status.as_ref().unwrap().extra, UnknownFields::new());
    }
}
