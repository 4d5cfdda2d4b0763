//! RBAC authorization.
//!
//! RBAC objects are ordinary store objects; the authorizer evaluates the store's
//! current contents through an index of grants per subject, rebuilt lazily when the
//! store's RBAC generation changes, so each authorization is a few hash lookups.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube_common::Verb;
use serde_json::{Value, json};

use crate::auth::users::{MASTERS_GROUP, UserInfo};
use crate::storage::store::Store;

/// The verb an authorization question is about. A request asks about its API verb
/// (for a non-resource URL: its lower-cased HTTP method); an access review may ask
/// about any verb an RBAC rule can name (`use`, `bind`, `escalate`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessVerb {
    /// A verb of the API.
    Api(Verb),
    /// Any other word, as the review or the HTTP method spelled it.
    Named(String),
}

impl AccessVerb {
    /// The API verb `word` names, else the word itself.
    pub fn parse(word: &str) -> AccessVerb {
        match word.parse::<Verb>() {
            Ok(verb) => AccessVerb::Api(verb),
            Err(_) => AccessVerb::Named(word.to_string()),
        }
    }

    /// The word RBAC rules are matched against.
    pub fn as_str(&self) -> &str {
        match self {
            AccessVerb::Api(verb) => verb.as_str(),
            AccessVerb::Named(word) => word,
        }
    }
}

impl From<Verb> for AccessVerb {
    fn from(verb: Verb) -> Self {
        AccessVerb::Api(verb)
    }
}

/// What is being asked for.
#[derive(Debug, Clone)]
pub struct Attributes {
    /// The verb (`get`, `list`, `watch`, `create`, ...).
    pub verb: AccessVerb,
    /// API group.
    pub group: String,
    /// Resource (plural).
    pub resource: String,
    /// Subresource, or empty.
    pub subresource: String,
    /// Namespace, or empty for cluster scope.
    pub namespace: String,
    /// Object name, or empty (for list/watch: the `metadata.name` field selector).
    pub name: String,
    /// For non-resource requests: the URL path.
    pub path: Option<String>,
}

impl Attributes {
    /// A question about a non-resource URL (`/version`, `/metrics`, ...).
    pub fn non_resource(verb: AccessVerb, path: impl Into<String>) -> Attributes {
        Attributes {
            verb,
            group: String::new(),
            resource: String::new(),
            subresource: String::new(),
            namespace: String::new(),
            name: String::new(),
            path: Some(path.into()),
        }
    }
}

/// An authorization decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request is allowed.
    pub allowed: bool,
    /// Which grant allowed it (empty when denied).
    pub reason: String,
}

#[derive(Debug, Clone)]
struct Rule {
    verbs: Vec<String>,
    api_groups: Vec<String>,
    resources: Vec<String>,
    resource_names: Vec<String>,
    non_resource_urls: Vec<String>,
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn contains_or_star(list: &[String], wanted: &str) -> bool {
    list.iter().any(|s| s == "*" || s == wanted)
}

impl Rule {
    fn parse(v: &Value) -> Rule {
        Rule {
            verbs: strings(v, "verbs"),
            api_groups: strings(v, "apiGroups"),
            resources: strings(v, "resources"),
            resource_names: strings(v, "resourceNames"),
            non_resource_urls: strings(v, "nonResourceURLs"),
        }
    }

    fn allows(&self, a: &Attributes) -> bool {
        if !contains_or_star(&self.verbs, a.verb.as_str()) {
            return false;
        }
        if let Some(path) = &a.path {
            return self.non_resource_urls.iter().any(|u| {
                u == "*" || u == path || (u.ends_with('*') && path.starts_with(&u[..u.len() - 1]))
            });
        }
        if !contains_or_star(&self.api_groups, &a.group) {
            return false;
        }
        let combined = if a.subresource.is_empty() {
            a.resource.clone()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        let resource_ok = self.resources.iter().any(|r| {
            r == "*"
                || *r == combined
                || (!a.subresource.is_empty()
                    && r.len() == a.subresource.len() + 2
                    && r.starts_with("*/")
                    && r.ends_with(&a.subresource))
        });
        if !resource_ok {
            return false;
        }
        // A resourceNames rule never matches a request without a name (for list and
        // watch the name comes from a metadata.name field selector).
        self.resource_names.is_empty()
            || (!a.name.is_empty() && self.resource_names.contains(&a.name))
    }

    fn to_review_json(&self) -> (Option<Value>, Option<Value>) {
        let resource = (!self.resources.is_empty()).then(|| {
            let mut r = json!({
                "verbs": self.verbs,
                "apiGroups": self.api_groups,
                "resources": self.resources,
            });
            if !self.resource_names.is_empty() {
                r["resourceNames"] = json!(self.resource_names);
            }
            r
        });
        let non_resource = (!self.non_resource_urls.is_empty())
            .then(|| json!({ "verbs": self.verbs, "nonResourceURLs": self.non_resource_urls }));
        (resource, non_resource)
    }
}

/// The rules of one role as one binding grants them to one of its subjects.
struct Grant {
    /// `RoleBinding "name/namespace" of Role "x" to ServiceAccount "sa/namespace"`,
    /// as kube-apiserver names the grant in a decision's reason.
    source: String,
    /// Where kube-apiserver's authorizer meets this grant: cluster bindings before
    /// namespaced ones, bindings in name order, subjects in list order. The first
    /// grant that allows a request is the one its reason names.
    order: (bool, usize, usize),
    rules: Arc<Vec<Rule>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Subject {
    User(String),
    Group(String),
}

#[derive(Default)]
struct RbacIndex {
    generation: u64,
    cluster: HashMap<Subject, Vec<Arc<Grant>>>,
    namespaced: HashMap<String, HashMap<Subject, Vec<Arc<Grant>>>>,
}

/// A binding's subjects, each with how a decision's reason describes it
/// (`User "alice"`, `Group "g"`, `ServiceAccount "name/namespace"`).
fn subjects_of(binding: &Value, binding_ns: &str) -> Vec<(Subject, String)> {
    let Some(list) = binding.get("subjects").and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|s| {
            let name = s.get("name").and_then(Value::as_str)?;
            match s.get("kind").and_then(Value::as_str)? {
                "User" => Some((Subject::User(name.to_string()), format!("User {name:?}"))),
                "Group" => Some((Subject::Group(name.to_string()), format!("Group {name:?}"))),
                "ServiceAccount" => {
                    let ns = s
                        .get("namespace")
                        .and_then(Value::as_str)
                        .filter(|n| !n.is_empty())
                        .unwrap_or(binding_ns);
                    Some((
                        Subject::User(format!("system:serviceaccount:{ns}:{name}")),
                        format!("ServiceAccount {:?}", format!("{name}/{ns}")),
                    ))
                }
                _ => None,
            }
        })
        .collect()
}

fn rules_of(role: &Value) -> Arc<Vec<Rule>> {
    Arc::new(
        role.get("rules")
            .and_then(Value::as_array)
            .map(|r| r.iter().map(Rule::parse).collect())
            .unwrap_or_default(),
    )
}

fn meta<'a>(v: &'a Value, key: &str) -> &'a str {
    crate::objects::meta::meta_str(v, key).unwrap_or_default()
}

impl RbacIndex {
    fn build(store: &Store) -> RbacIndex {
        let objs = store.rbac_objects();
        let cluster_roles: HashMap<&str, Arc<Vec<Rule>>> = objs
            .cluster_roles
            .iter()
            .map(|r| (meta(r, "name"), rules_of(r)))
            .collect();
        let roles: HashMap<(&str, &str), Arc<Vec<Rule>>> = objs
            .roles
            .iter()
            .map(|r| ((meta(r, "namespace"), meta(r, "name")), rules_of(r)))
            .collect();
        let mut index = RbacIndex {
            generation: objs.generation,
            ..RbacIndex::default()
        };
        for (position, b) in objs.cluster_role_bindings.iter().enumerate() {
            let role_name = b
                .pointer("/roleRef/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let Some(rules) = cluster_roles.get(role_name) else {
                continue;
            };
            for (nth, (subject, described)) in subjects_of(b, "").into_iter().enumerate() {
                let grant = Arc::new(Grant {
                    source: format!(
                        "ClusterRoleBinding {:?} of ClusterRole {role_name:?} to {described}",
                        meta(b, "name")
                    ),
                    order: (false, position, nth),
                    rules: rules.clone(),
                });
                index.cluster.entry(subject).or_default().push(grant);
            }
        }
        for (position, b) in objs.role_bindings.iter().enumerate() {
            let ns = meta(b, "namespace");
            let kind = b
                .pointer("/roleRef/kind")
                .and_then(Value::as_str)
                .unwrap_or("");
            let role_name = b
                .pointer("/roleRef/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let rules = match kind {
                "Role" => roles.get(&(ns, role_name)),
                "ClusterRole" => cluster_roles.get(role_name),
                _ => None,
            };
            let Some(rules) = rules else { continue };
            let by_subject = index.namespaced.entry(ns.to_string()).or_default();
            for (nth, (subject, described)) in subjects_of(b, ns).into_iter().enumerate() {
                let grant = Arc::new(Grant {
                    source: format!(
                        "RoleBinding {:?} of {kind} {role_name:?} to {described}",
                        format!("{}/{ns}", meta(b, "name"))
                    ),
                    order: (true, position, nth),
                    rules: rules.clone(),
                });
                by_subject.entry(subject).or_default().push(grant);
            }
        }
        index
    }

    /// The grants that apply to `user` in `namespace`, in the authorizer's order.
    fn grants<'a>(&'a self, user: &UserInfo, namespace: &str) -> Vec<&'a Arc<Grant>> {
        let subjects = std::iter::once(Subject::User(user.name.clone()))
            .chain(user.groups.iter().map(|g| Subject::Group(g.clone())));
        let local = (!namespace.is_empty())
            .then(|| self.namespaced.get(namespace))
            .flatten();
        let mut found: Vec<&Arc<Grant>> = subjects
            .flat_map(|s| {
                let cluster = self.cluster.get(&s).into_iter().flatten();
                let local = local.and_then(|m| m.get(&s)).into_iter().flatten();
                cluster.chain(local)
            })
            .collect();
        found.sort_by_key(|grant| grant.order);
        found
    }
}

/// Decides requests against the store's RBAC objects.
pub(crate) struct Authorizer {
    store: Arc<Store>,
    /// Guards the cached index; replaced when the store's RBAC generation moves.
    /// Lock order: this, then the store's lock (taken while rebuilding).
    cache: Mutex<Arc<RbacIndex>>,
}

impl Authorizer {
    pub(crate) fn new(store: Arc<Store>) -> Authorizer {
        Authorizer {
            store,
            cache: Mutex::new(Arc::new(RbacIndex {
                generation: u64::MAX,
                ..RbacIndex::default()
            })),
        }
    }

    fn index(&self) -> Arc<RbacIndex> {
        let generation = self.store.rbac_generation();
        let mut cache = kube_common::sync::lock(&self.cache);
        if cache.generation != generation {
            *cache = Arc::new(RbacIndex::build(&self.store));
        }
        cache.clone()
    }

    /// Decides one request.
    pub(crate) fn authorize(&self, user: &UserInfo, a: &Attributes) -> Decision {
        if user.groups.iter().any(|g| g == MASTERS_GROUP) {
            return Decision {
                allowed: true,
                reason: format!("user is in group {MASTERS_GROUP:?}"),
            };
        }
        let index = self.index();
        let namespace = if a.path.is_some() {
            ""
        } else {
            a.namespace.as_str()
        };
        for grant in index.grants(user, namespace) {
            if grant.rules.iter().any(|r| r.allows(a)) {
                return Decision {
                    allowed: true,
                    reason: format!("RBAC: allowed by {}", grant.source),
                };
            }
        }
        Decision {
            allowed: false,
            reason: String::new(),
        }
    }

    /// The rules that apply to `user` in `namespace`, as a SelfSubjectRulesReview
    /// status: (resourceRules, nonResourceRules).
    pub(crate) fn rules_for(&self, user: &UserInfo, namespace: &str) -> (Vec<Value>, Vec<Value>) {
        if user.groups.iter().any(|g| g == MASTERS_GROUP) {
            return (
                vec![json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})],
                vec![json!({"verbs": ["*"], "nonResourceURLs": ["*"]})],
            );
        }
        let index = self.index();
        let mut resource_rules = Vec::new();
        let mut non_resource_rules = Vec::new();
        for grant in index.grants(user, namespace) {
            for rule in grant.rules.iter() {
                let (r, n) = rule.to_review_json();
                resource_rules.extend(r);
                non_resource_rules.extend(n);
            }
        }
        (resource_rules, non_resource_rules)
    }
}

/// The message kube-apiserver puts in a 403 for a denied request.
pub(crate) fn forbidden_reason(user: &str, a: &Attributes) -> String {
    let resource = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    if a.namespace.is_empty() {
        format!(
            "User {user:?} cannot {} resource {resource:?} in API group {:?} at the cluster scope",
            a.verb.as_str(),
            a.group
        )
    } else {
        format!(
            "User {user:?} cannot {} resource {resource:?} in API group {:?} in the namespace {:?}",
            a.verb.as_str(),
            a.group,
            a.namespace
        )
    }
}
