//! The fixed set of resources the simulator serves, with what discovery and the
//! handlers need to know about each.

use kube_common::Verb;

/// How the API treats a resource's objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceKind {
    /// Objects kept in the store (get/list/watch/create/update/patch/delete).
    Stored,
    /// Create-only reviews answered by the authorizer and never stored.
    AccessReview,
}

/// Static description of one served resource.
#[derive(Debug)]
pub struct ResourceDef {
    /// Plural resource name (`secrets`).
    pub name: &'static str,
    /// Singular name (`secret`).
    pub singular: &'static str,
    /// Object kind (`Secret`).
    pub kind: &'static str,
    /// List kind (`SecretList`).
    pub list_kind: &'static str,
    /// API group (`""` for core).
    pub group: &'static str,
    /// API version.
    pub version: &'static str,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Verbs listed in discovery.
    pub verbs: &'static [Verb],
    /// kubectl short names.
    pub short_names: &'static [&'static str],
    /// Whether a `status` subresource exists.
    pub status_subresource: bool,
    /// Stored objects or access reviews.
    pub storage: ResourceKind,
    /// Field selector labels supported beyond `metadata.name`/`metadata.namespace`.
    pub extra_fields: &'static [&'static str],
    /// Whether `metadata.generation` is maintained (bumped on spec changes).
    pub tracks_generation: bool,
}

/// Identifies a resource by its index in [`RESOURCES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceId(pub(crate) usize);

impl ResourceId {
    /// The static description.
    pub fn def(self) -> &'static ResourceDef {
        &RESOURCES[self.0]
    }
}

/// The verbs of stored resources, in the order discovery lists them.
const STORED_VERBS: &[Verb] = &[
    Verb::Create,
    Verb::Delete,
    Verb::DeleteCollection,
    Verb::Get,
    Verb::List,
    Verb::Patch,
    Verb::Update,
    Verb::Watch,
];

/// Index of `namespaces` in [`RESOURCES`].
pub const NAMESPACES: ResourceId = ResourceId(0);
/// Index of `secrets`.
pub const SECRETS: ResourceId = ResourceId(1);
/// Index of `routes`.
pub const ROUTES: ResourceId = ResourceId(2);
/// Index of `roles`.
pub const ROLES: ResourceId = ResourceId(3);
/// Index of `rolebindings`.
pub const ROLE_BINDINGS: ResourceId = ResourceId(4);
/// Index of `clusterroles`.
pub const CLUSTER_ROLES: ResourceId = ResourceId(5);
/// Index of `clusterrolebindings`.
pub const CLUSTER_ROLE_BINDINGS: ResourceId = ResourceId(6);
/// Index of `services`.
pub const SERVICES: ResourceId = ResourceId(11);
/// Index of `endpointslices`.
pub const ENDPOINT_SLICES: ResourceId = ResourceId(12);

/// Every resource the simulator serves.
pub static RESOURCES: &[ResourceDef] = &[
    ResourceDef {
        name: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        list_kind: "NamespaceList",
        group: "",
        version: "v1",
        namespaced: false,
        verbs: &[
            Verb::Create,
            Verb::Delete,
            Verb::Get,
            Verb::List,
            Verb::Patch,
            Verb::Update,
            Verb::Watch,
        ],
        short_names: &["ns"],
        status_subresource: true,
        storage: ResourceKind::Stored,
        extra_fields: &["status.phase"],
        tracks_generation: false,
    },
    ResourceDef {
        name: "secrets",
        singular: "secret",
        kind: "Secret",
        list_kind: "SecretList",
        group: "",
        version: "v1",
        namespaced: true,
        verbs: STORED_VERBS,
        short_names: &[],
        status_subresource: false,
        storage: ResourceKind::Stored,
        extra_fields: &["type"],
        tracks_generation: false,
    },
    ResourceDef {
        name: "routes",
        singular: "route",
        kind: "Route",
        list_kind: "RouteList",
        group: "route.openshift.io",
        version: "v1",
        namespaced: true,
        verbs: STORED_VERBS,
        short_names: &[],
        status_subresource: true,
        storage: ResourceKind::Stored,
        extra_fields: &["spec.host", "spec.path", "spec.to.name"],
        tracks_generation: true,
    },
    ResourceDef {
        name: "roles",
        singular: "role",
        kind: "Role",
        list_kind: "RoleList",
        group: "rbac.authorization.k8s.io",
        version: "v1",
        namespaced: true,
        verbs: STORED_VERBS,
        short_names: &[],
        status_subresource: false,
        storage: ResourceKind::Stored,
        extra_fields: &[],
        tracks_generation: false,
    },
    ResourceDef {
        name: "rolebindings",
        singular: "rolebinding",
        kind: "RoleBinding",
        list_kind: "RoleBindingList",
        group: "rbac.authorization.k8s.io",
        version: "v1",
        namespaced: true,
        verbs: STORED_VERBS,
        short_names: &[],
        status_subresource: false,
        storage: ResourceKind::Stored,
        extra_fields: &[],
        tracks_generation: false,
    },
    ResourceDef {
        name: "clusterroles",
        singular: "clusterrole",
        kind: "ClusterRole",
        list_kind: "ClusterRoleList",
        group: "rbac.authorization.k8s.io",
        version: "v1",
        namespaced: false,
        verbs: STORED_VERBS,
        short_names: &[],
        status_subresource: false,
        storage: ResourceKind::Stored,
        extra_fields: &[],
        tracks_generation: false,
    },
    ResourceDef {
        name: "clusterrolebindings",
        singular: "clusterrolebinding",
        kind: "ClusterRoleBinding",
        list_kind: "ClusterRoleBindingList",
        group: "rbac.authorization.k8s.io",
        version: "v1",
        namespaced: false,
        verbs: STORED_VERBS,
        short_names: &[],
        status_subresource: false,
        storage: ResourceKind::Stored,
        extra_fields: &[],
        tracks_generation: false,
    },
    ResourceDef {
        name: "subjectaccessreviews",
        singular: "subjectaccessreview",
        kind: "SubjectAccessReview",
        list_kind: "SubjectAccessReviewList",
        group: "authorization.k8s.io",
        version: "v1",
        namespaced: false,
        verbs: &[Verb::Create],
        short_names: &[],
        status_subresource: false,
        storage: ResourceKind::AccessReview,
        extra_fields: &[],
        tracks_generation: false,
    },
    ResourceDef {
        name: "selfsubjectaccessreviews",
        singular: "selfsubjectaccessreview",
        kind: "SelfSubjectAccessReview",
        list_kind: "SelfSubjectAccessReviewList",
        group: "authorization.k8s.io",
        version: "v1",
        namespaced: false,
        verbs: &[Verb::Create],
        short_names: &[],
        status_subresource: false,
        storage: ResourceKind::AccessReview,
        extra_fields: &[],
        tracks_generation: false,
    },
    ResourceDef {
        name: "selfsubjectrulesreviews",
        singular: "selfsubjectrulesreview",
        kind: "SelfSubjectRulesReview",
        list_kind: "SelfSubjectRulesReviewList",
        group: "authorization.k8s.io",
        version: "v1",
        namespaced: false,
        verbs: &[Verb::Create],
        short_names: &[],
        status_subresource: false,
        storage: ResourceKind::AccessReview,
        extra_fields: &[],
        tracks_generation: false,
    },
    ResourceDef {
        name: "localsubjectaccessreviews",
        singular: "localsubjectaccessreview",
        kind: "LocalSubjectAccessReview",
        list_kind: "LocalSubjectAccessReviewList",
        group: "authorization.k8s.io",
        version: "v1",
        namespaced: true,
        verbs: &[Verb::Create],
        short_names: &[],
        status_subresource: false,
        storage: ResourceKind::AccessReview,
        extra_fields: &[],
        tracks_generation: false,
    },
    ResourceDef {
        name: "services",
        singular: "service",
        kind: "Service",
        list_kind: "ServiceList",
        group: "",
        version: "v1",
        namespaced: true,
        verbs: STORED_VERBS,
        short_names: &["svc"],
        status_subresource: true,
        storage: ResourceKind::Stored,
        extra_fields: &["spec.clusterIP", "spec.type"],
        tracks_generation: false,
    },
    ResourceDef {
        name: "endpointslices",
        singular: "endpointslice",
        kind: "EndpointSlice",
        list_kind: "EndpointSliceList",
        group: "discovery.k8s.io",
        version: "v1",
        namespaced: true,
        verbs: STORED_VERBS,
        short_names: &[],
        status_subresource: false,
        storage: ResourceKind::Stored,
        extra_fields: &[],
        // Bumped when anything but metadata changes, or the labels do (see
        // `validation::endpoint_slice_generation_changes`).
        tracks_generation: true,
    },
];

/// The API groups served, with their single version, in discovery order.
pub const GROUPS: &[(&str, &str)] = &[
    ("route.openshift.io", "v1"),
    ("rbac.authorization.k8s.io", "v1"),
    ("authorization.k8s.io", "v1"),
    ("discovery.k8s.io", "v1"),
];

impl ResourceDef {
    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether `field` is a supported field selector label.
    pub fn supports_field(&self, field: &str) -> bool {
        field == "metadata.name"
            || (field == "metadata.namespace")
            || self.extra_fields.contains(&field)
    }
}

/// Looks a resource up by group, version and plural name.
pub fn find(group: &str, version: &str, name: &str) -> Option<ResourceId> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.name == name)
        .map(ResourceId)
}

/// Looks a resource up by plural name (`secrets`), singular name or kind, ignoring
/// case; stored resources only.
pub fn by_name(name: &str) -> Option<ResourceId> {
    RESOURCES
        .iter()
        .position(|r| {
            r.storage == ResourceKind::Stored
                && (r.name.eq_ignore_ascii_case(name)
                    || r.singular.eq_ignore_ascii_case(name)
                    || r.kind.eq_ignore_ascii_case(name)
                    || r.short_names.iter().any(|s| s.eq_ignore_ascii_case(name)))
        })
        .map(ResourceId)
}

/// Looks a stored resource up by `apiVersion` and `kind` of an object.
pub fn by_kind(api_version: &str, kind: &str) -> Option<ResourceId> {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    RESOURCES
        .iter()
        .position(|r| {
            r.storage == ResourceKind::Stored
                && r.group == group
                && r.version == version
                && r.kind == kind
        })
        .map(ResourceId)
}

/// Every resource of one group/version.
pub fn in_group_version(group: &str, version: &str) -> Vec<ResourceId> {
    RESOURCES
        .iter()
        .enumerate()
        .filter(|(_, r)| r.group == group && r.version == version)
        .map(|(i, _)| ResourceId(i))
        .collect()
}

/// Number of served resources.
pub fn count() -> usize {
    RESOURCES.len()
}
