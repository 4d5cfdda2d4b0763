//! Direct store access for tests and tools, as cluster admin: no HTTP, latency,
//! faults, RBAC or accounting — but every write takes a new resourceVersion and
//! produces watch events exactly like an API write.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ApiError, SimError};
use crate::objects::patch::{PatchBody, PatchKind};
use crate::objects::validation;
use crate::resources::{self, ResourceId};
use crate::storage::store::{Key, Preconditions, Store, UpdateTarget, WriteOptions};

/// A namespace argument: `"ns"`, `Some("ns")`, or `""`/`None` for cluster-scoped
/// objects (and, for `list`, all namespaces).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceArg<'a>(pub Option<&'a str>);

impl<'a> From<&'a str> for NamespaceArg<'a> {
    fn from(s: &'a str) -> Self {
        NamespaceArg((!s.is_empty()).then_some(s))
    }
}

impl<'a> From<&'a String> for NamespaceArg<'a> {
    fn from(s: &'a String) -> Self {
        NamespaceArg::from(s.as_str())
    }
}

impl<'a> From<Option<&'a str>> for NamespaceArg<'a> {
    fn from(s: Option<&'a str>) -> Self {
        NamespaceArg(s.filter(|s| !s.is_empty()))
    }
}

impl<'a> From<Option<&'a String>> for NamespaceArg<'a> {
    fn from(s: Option<&'a String>) -> Self {
        NamespaceArg::from(s.map(String::as_str))
    }
}

/// Handle on the simulator's object store (see the module documentation).
///
/// Resources are named by plural (`"secrets"`, `"routes"`, `"namespaces"`,
/// `"roles"`, `"rolebindings"`, `"clusterroles"`, `"clusterrolebindings"`), singular or
/// kind. Objects are `serde_json::Value`s as the API serves them. Writes of namespaced
/// objects create a missing namespace. Unlike API writes, store writes keep a given
/// `metadata.uid`/`creationTimestamp` and write `status` along with the rest.
#[derive(Clone)]
pub struct StoreHandle {
    pub(crate) store: Arc<Store>,
}

fn resolve(resource: &str) -> Result<ResourceId, SimError> {
    resources::by_name(resource).ok_or_else(|| {
        SimError::Api(ApiError::bad_request(format!(
            "unknown resource {resource:?} (served: namespaces, secrets, routes, roles, rolebindings, clusterroles, clusterrolebindings)"
        )))
    })
}

fn check_kind(id: ResourceId, obj: &Value) -> Result<(), SimError> {
    let def = id.def();
    match obj.get("kind").and_then(Value::as_str) {
        Some(k) if !k.is_empty() && k != def.kind => Err(SimError::Api(ApiError::bad_request(
            format!("object of kind {k} given for resource {}", def.name),
        ))),
        _ => Ok(()),
    }
}

fn key(id: ResourceId, ns: NamespaceArg<'_>, name: &str) -> Key {
    let ns = if id.def().namespaced {
        ns.0.unwrap_or("").to_string()
    } else {
        String::new()
    };
    (ns, name.to_string())
}

fn key_of(id: ResourceId, obj: &Value) -> Key {
    let name = crate::objects::meta::meta_str(obj, "name").unwrap_or("");
    let ns = crate::objects::meta::meta_str(obj, "namespace").filter(|s| !s.is_empty());
    key(id, NamespaceArg(ns), name)
}

const DIRECT: WriteOptions = WriteOptions {
    api: false,
    auto_namespace: true,
    skip_validation: false,
    dry_run: false,
};

impl StoreHandle {
    /// Creates an object (409 AlreadyExists if it exists, 422 if invalid).
    pub fn create(&self, resource: &str, object: Value) -> Result<Value, SimError> {
        let id = resolve(resource)?;
        check_kind(id, &object)?;
        Ok((*self.store.create(id, object, DIRECT)?).clone())
    }

    /// Replaces an object, addressed by its metadata. A `metadata.resourceVersion`
    /// in `object` is checked (409 Conflict if stale); without one the update is
    /// unconditional.
    pub fn update(&self, resource: &str, object: Value) -> Result<Value, SimError> {
        let id = resolve(resource)?;
        check_kind(id, &object)?;
        let k = key_of(id, &object);
        let (stored, _created) = self
            .store
            .update(id, k, object, UpdateTarget::Main, DIRECT)?;
        Ok((*stored).clone())
    }

    /// Creates the object, or replaces it if it exists (ignoring any
    /// `metadata.resourceVersion` in `object`).
    pub fn upsert(&self, resource: &str, object: Value) -> Result<Value, SimError> {
        let id = resolve(resource)?;
        check_kind(id, &object)?;
        upsert(&self.store, id, object, DIRECT)
    }

    /// Applies a JSON merge patch (RFC 7386) to an existing object.
    pub fn merge_patch<'a>(
        &self,
        resource: &str,
        namespace: impl Into<NamespaceArg<'a>>,
        name: &str,
        patch: Value,
    ) -> Result<Value, SimError> {
        let id = resolve(resource)?;
        let body = PatchBody {
            kind: PatchKind::Merge,
            patch,
        };
        let (v, _) = self.store.patch(
            id,
            key(id, namespace.into(), name),
            &body,
            UpdateTarget::Main,
            DIRECT,
        )?;
        Ok((*v).clone())
    }

    /// Deletes an object (a namespace with everything in it); returns its last state.
    pub fn delete<'a>(
        &self,
        resource: &str,
        namespace: impl Into<NamespaceArg<'a>>,
        name: &str,
    ) -> Result<Value, SimError> {
        let id = resolve(resource)?;
        let v = self.store.delete(
            id,
            key(id, namespace.into(), name),
            &Preconditions::default(),
            DIRECT,
        )?;
        Ok((*v).clone())
    }

    /// One object, if it exists.
    pub fn get<'a>(
        &self,
        resource: &str,
        namespace: impl Into<NamespaceArg<'a>>,
        name: &str,
    ) -> Option<Value> {
        let id = resources::by_name(resource)?;
        self.store
            .get(id, &key(id, namespace.into(), name))
            .map(|v| (*v).clone())
    }

    /// All objects of a resource in one namespace (or all namespaces), in
    /// (namespace, name) order.
    pub fn list<'a>(&self, resource: &str, namespace: impl Into<NamespaceArg<'a>>) -> Vec<Value> {
        let Some(id) = resources::by_name(resource) else {
            return Vec::new();
        };
        self.store
            .all(id, namespace.into().0)
            .into_iter()
            .map(|v| (*v).clone())
            .collect()
    }

    /// Stores an object without validating it (to model objects a real server
    /// would refuse, e.g. a `kubernetes.io/tls` secret without `tls.key`). The
    /// resource comes from `apiVersion` and `kind`; an existing object is replaced.
    pub fn insert_unchecked(&self, object: Value) -> Result<Value, SimError> {
        let id = validation::resource_of(&object)
            .map_err(|e| SimError::Api(ApiError::bad_request(e)))?;
        upsert(
            &self.store,
            id,
            object,
            WriteOptions {
                skip_validation: true,
                ..DIRECT
            },
        )
    }

    /// The current (last issued) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.store.current_rv()
    }
}

pub(crate) fn upsert(
    store: &Store,
    id: ResourceId,
    mut object: Value,
    opts: WriteOptions,
) -> Result<Value, SimError> {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
    }
    let k = key_of(id, &object);
    for _ in 0..3 {
        if store.get(id, &k).is_some() {
            match store.update(id, k.clone(), object.clone(), UpdateTarget::Main, opts) {
                Err(e) if e.code == 404 => continue,
                other => return Ok((*other?.0).clone()),
            }
        }
        match store.create(id, object.clone(), opts) {
            Err(e) if e.code == 409 && e.reason == "AlreadyExists" => continue,
            other => return Ok((*other?).clone()),
        }
    }
    Err(SimError::Api(ApiError::conflict(
        id.def(),
        &k.1,
        "the object kept changing during upsert",
    )))
}

/// Loads multi-document YAML or JSON manifests (also `kind: List`), creating or
/// replacing each object. Namespaced objects without a namespace go to `default`.
pub(crate) fn load_manifests(store: &Store, text: &str) -> Result<usize, SimError> {
    let mut count = 0;
    for (index, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(doc).map_err(|e| SimError::Manifest {
            index,
            message: format!("not valid YAML or JSON: {e}"),
        })?;
        if value.is_null() {
            continue;
        }
        let items = if value.get("kind").and_then(Value::as_str) == Some("List")
            || value.get("items").is_some_and(Value::is_array)
        {
            value
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        } else {
            vec![value]
        };
        for mut item in items {
            let id = validation::resource_of(&item)
                .map_err(|message| SimError::Manifest { index, message })?;
            if id.def().namespaced
                && crate::objects::meta::meta_str(&item, "namespace").is_none_or(str::is_empty)
                && let Some(meta) = item.get_mut("metadata").and_then(Value::as_object_mut)
            {
                meta.insert("namespace".into(), json!("default"));
            }
            let name = crate::objects::meta::meta_str(&item, "name")
                .unwrap_or("")
                .to_string();
            upsert(store, id, item, DIRECT).map_err(|e| SimError::Manifest {
                index,
                message: format!("{} {name:?}: {e}", id.def().kind),
            })?;
            count += 1;
        }
    }
    Ok(count)
}
