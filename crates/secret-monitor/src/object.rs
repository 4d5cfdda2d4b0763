//! What the monitor reads of the objects it watches.

use std::borrow::Cow;

use kube::Resource;
use kube::core::NamespaceResourceScope;

/// A namespaced object the monitor can watch: what it reads of the type (the plural
/// resource name and the collection's path) and of each object (name, uid and
/// resourceVersion), and nothing else.
///
/// Every `kube::Resource` of a namespaced type known at compile time implements it (the
/// `k8s_openapi` types, `#[derive(CustomResource)]` types), so
/// [`ObjectMonitor`](crate::ObjectMonitor) watches any of them. A type that is not a
/// `kube::Resource` can implement it to be watched and cached without a whole
/// `ObjectMeta`: at thousands of cached objects, the fields it never reads are a
/// large part of each one (route-secrets' `TlsSecret` keeps four of its fifteen).
pub trait WatchedObject {
    /// The plural resource name, e.g. `secrets` (named in errors).
    fn resource_plural() -> Cow<'static, str>;
    /// The collection's URL path in `namespace`, e.g. `/api/v1/namespaces/shop/secrets`.
    fn collection_path(namespace: &str) -> String;
    /// `metadata.name`.
    fn object_name(&self) -> Option<&str>;
    /// `metadata.uid`: another uid under the same name is a re-created object.
    fn object_uid(&self) -> Option<&str>;
    /// `metadata.resourceVersion`: where a watch resumes, and what tells a change.
    fn object_resource_version(&self) -> Option<&str>;
}

impl<K> WatchedObject for K
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    fn resource_plural() -> Cow<'static, str> {
        <K as Resource>::plural(&())
    }

    fn collection_path(namespace: &str) -> String {
        <K as Resource>::url_path(&(), Some(namespace))
    }

    fn object_name(&self) -> Option<&str> {
        self.meta().name.as_deref()
    }

    fn object_uid(&self) -> Option<&str> {
        self.meta().uid.as_deref()
    }

    fn object_resource_version(&self) -> Option<&str> {
        self.meta().resource_version.as_deref()
    }
}
