//! The object store: every object of every resource, one global resourceVersion, the
//! bounded event history, and the watcher index.
//!
//! One mutex guards all of it so that a commit, its history entry and its delivery
//! to watchers happen in resourceVersion order, and a watch registers at an exact
//! point of that order (no gap, no duplicate). Work done under the lock is bounded
//! and never waits: delivery uses `try_send`, and serialization of events to JSON
//! happens outside (lazily, once per event). The one serialization under the lock is
//! a written object's own JSON (bounded by the object's size), kept with it so that
//! lists and streaming lists send it without serializing it again, as kube-apiserver
//! encodes an object once when it stores it.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::error::{ApiError, FieldError};
use crate::objects::meta::{meta_str, metadata_mut, now_timestamp, set_resource_version};
use crate::objects::network;
use crate::objects::patch::{PatchBody, PatchKind};
use crate::objects::selectors::ObjectFilter;
use crate::objects::validation;
use crate::objects::{lease, schema};
use crate::resources::{
    self, CLUSTER_ROLE_BINDINGS, CLUSTER_ROLES, ENDPOINT_SLICES, LEASES, NAMESPACES, ROLE_BINDINGS,
    ROLES, ResourceDef, ResourceId, SERVICES,
};
use crate::storage::history::History;
use crate::storage::watch::{Bucket, ChangeKind, Delivery, DeliveryItem, StoredEvent, WatchIndex};

/// Object key within one resource: (namespace or "" for cluster-scoped, name).
pub(crate) type Key = (String, String);

fn generated_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// How a write treats system fields and checks.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WriteOptions {
    /// Client-facing API semantics: client-supplied uid and creationTimestamp are
    /// replaced, a new Route's status is cleared, and PUT on the main resource keeps
    /// the stored status. Direct store writes keep what they are given.
    pub api: bool,
    /// Create a missing namespace instead of answering 404.
    pub auto_namespace: bool,
    /// Skip validation (to model objects a real server would refuse).
    pub skip_validation: bool,
    /// Check everything but store nothing (`dryRun=All`).
    pub dry_run: bool,
}

/// Which part of an object an update writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UpdateTarget {
    /// The main resource (status is kept as stored when a status subresource exists
    /// and API semantics apply).
    Main,
    /// The `status` subresource: only `status` changes.
    Status,
}

/// Delete preconditions (`DeleteOptions.preconditions`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// Which state a list reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListVersion {
    /// Unset resourceVersion: the most recent state.
    Latest,
    /// `resourceVersion=0`: any state (the simulator serves the most recent).
    Any,
    /// `resourceVersionMatch=NotOlderThan`.
    NotOlderThan(u64),
    /// `resourceVersionMatch=Exact`: the state at exactly that version.
    Exact(u64),
}

/// Position of a paginated list: the snapshot version and the last key returned.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ContinueToken {
    rv: u64,
    ns: String,
    name: String,
}

impl ContinueToken {
    pub(crate) fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    pub(crate) fn decode(s: &str) -> Result<ContinueToken, ApiError> {
        URL_SAFE_NO_PAD
            .decode(s)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "continue key is not valid: {s:?} was not issued by this server"
                ))
            })
    }
}

/// One page of a list.
pub(crate) struct ListPage {
    pub items: Vec<Arc<Value>>,
    /// Each item's JSON where it was encoded when written (`None`: serialize it).
    pub encoded: Vec<Option<Bytes>>,
    pub rv: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchStart {
    /// At the current version, first sending every matching object as ADDED.
    CurrentWithState,
    /// After the given version, replaying history.
    After(u64),
}

/// Why a watch could not start.
#[derive(Debug)]
pub(crate) enum WatchStartError {
    /// The version is older than the history reaches.
    Expired { requested: u64, oldest: u64 },
    /// The version is newer than any the server has issued.
    TooLarge { requested: u64, current: u64 },
}

/// Something the watch sends before live events.
pub(crate) enum InitialItem {
    /// A current object, sent as a synthetic ADDED, with its JSON when it was encoded
    /// when written.
    Current(Arc<Value>, Option<Bytes>),
    /// A historical event after the requested version.
    Replay(Arc<StoredEvent>, Delivery),
}

/// A registered watcher: initial items, then live events from `rx`. Dropping it
/// removes the watcher from the index.
pub(crate) struct Subscription {
    pub initial: VecDeque<InitialItem>,
    /// The version the initial state corresponds to.
    pub start_rv: u64,
    /// The store's version when the watcher was registered: the initial state or
    /// replay reaches it, and live events come after it.
    pub registered_rv: u64,
    pub rx: mpsc::Receiver<DeliveryItem>,
    _registration: Registration,
}

struct Registration {
    store: Arc<Store>,
    resource: ResourceId,
    bucket: Bucket,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut st = self.store.lock();
        st.watchers.remove(self.resource, &self.bucket, self.id);
    }
}

/// RBAC objects at one store generation.
pub(crate) struct RbacObjects {
    pub generation: u64,
    pub roles: Vec<Arc<Value>>,
    pub role_bindings: Vec<Arc<Value>>,
    pub cluster_roles: Vec<Arc<Value>>,
    pub cluster_role_bindings: Vec<Arc<Value>>,
}

struct StoreState {
    /// The last resourceVersion issued.
    rv: u64,
    /// Objects per resource (indexed by `ResourceId`), ordered by (namespace, name).
    objects: Vec<BTreeMap<Key, Arc<Value>>>,
    /// The current objects' JSON, per resource like `objects`.
    encoded: Vec<HashMap<Key, EncodedObject>>,
    /// Recent events in resourceVersion order, indexed like the watchers.
    history: History,
    /// Every event with a resourceVersion above `floor` is in `history`.
    floor: u64,
    watchers: WatchIndex,
}

/// A stored object's JSON, encoded once when it was written.
struct EncodedObject {
    /// The object encoded: a reader holding another version gets no JSON from here.
    object: Arc<Value>,
    json: Bytes,
}

impl StoreState {
    /// The JSON of `object`, stored at `key`, if it is the current version.
    fn encoded(&self, id: ResourceId, key: &Key, object: &Arc<Value>) -> Option<Bytes> {
        self.encoded[id.0]
            .get(key)
            .filter(|encoded| Arc::ptr_eq(&encoded.object, object))
            .map(|encoded| encoded.json.clone())
    }
}

/// The store. See the module documentation for its locking discipline.
pub(crate) struct Store {
    /// Guards objects, the resourceVersion counter, the history and the watcher
    /// index. Never held across an `.await`.
    state: Mutex<StoreState>,
    /// The last resourceVersion whose event has been delivered to watchers (written
    /// under `state` after delivery; read without it for bookmarks).
    published_rv: AtomicU64,
    /// Bumped (under `state`) whenever an RBAC object changes.
    rbac_generation: AtomicU64,
    /// Watchers terminated because their buffer was full.
    slow_watchers_terminated: AtomicU64,
    watch_buffer: usize,
}

fn key_of(def: &ResourceDef, obj: &Value) -> Result<Key, ApiError> {
    let name = meta_str(obj, "name").unwrap_or_default().to_string();
    if name.is_empty() {
        return Err(ApiError::invalid(
            def,
            "",
            &[FieldError::required(
                "metadata.name",
                "name or generateName is required",
            )],
        ));
    }
    let ns = if def.namespaced {
        let ns = meta_str(obj, "namespace").unwrap_or_default().to_string();
        if ns.is_empty() {
            return Err(ApiError::invalid(
                def,
                &name,
                &[FieldError::required("metadata.namespace", "")],
            ));
        }
        ns
    } else {
        String::new()
    };
    Ok((ns, name))
}

fn is_rbac(id: ResourceId) -> bool {
    matches!(
        id,
        ROLES | ROLE_BINDINGS | CLUSTER_ROLES | CLUSTER_ROLE_BINDINGS
    )
}

/// Makes `obj` an object of resource `id` with a metadata map and a name (from
/// `generateName` if needed). Cluster-scoped objects lose any namespace.
fn prepare_shape(id: ResourceId, obj: &mut Value) -> Result<(), ApiError> {
    let def = id.def();
    let Some(map) = obj.as_object_mut() else {
        return Err(ApiError::bad_request(format!(
            "the body of a {} must be a JSON object",
            def.kind
        )));
    };
    map.insert("apiVersion".into(), json!(def.api_version()));
    map.insert("kind".into(), json!(def.kind));
    let meta =
        metadata_mut(obj).ok_or_else(|| ApiError::bad_request("metadata must be an object"))?;
    if !def.namespaced {
        meta.remove("namespace");
    }
    let has_name = meta
        .get("name")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    if !has_name
        && let Some(prefix) = meta.get("generateName").and_then(Value::as_str)
        && !prefix.is_empty()
    {
        let name = format!("{prefix}{}", generated_suffix());
        meta.insert("name".into(), json!(name));
    }
    Ok(())
}

impl Store {
    pub(crate) fn new(history_limit: usize, watch_buffer: usize) -> Arc<Store> {
        Arc::new(Store {
            state: Mutex::new(StoreState {
                rv: 0,
                objects: (0..resources::count()).map(|_| BTreeMap::new()).collect(),
                encoded: (0..resources::count()).map(|_| HashMap::new()).collect(),
                history: History::new(history_limit, resources::count()),
                floor: 0,
                watchers: WatchIndex::new(resources::count()),
            }),
            published_rv: AtomicU64::new(0),
            rbac_generation: AtomicU64::new(0),
            slow_watchers_terminated: AtomicU64::new(0),
            watch_buffer: watch_buffer.max(1),
        })
    }

    fn lock(&self) -> MutexGuard<'_, StoreState> {
        kube_common::sync::lock(&self.state)
    }

    /// The last resourceVersion whose event reached the watchers.
    pub(crate) fn published_rv(&self) -> u64 {
        self.published_rv.load(Ordering::Acquire)
    }

    /// The current resourceVersion.
    pub(crate) fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    pub(crate) fn rbac_generation(&self) -> u64 {
        self.rbac_generation.load(Ordering::Acquire)
    }

    pub(crate) fn slow_watchers_terminated(&self) -> u64 {
        self.slow_watchers_terminated.load(Ordering::Relaxed)
    }

    fn commit(
        &self,
        st: &mut StoreState,
        id: ResourceId,
        key: Key,
        change: ChangeKind,
        mut obj: Value,
        prev: Option<Arc<Value>>,
    ) -> Arc<Value> {
        st.rv += 1;
        let rv = st.rv;
        set_resource_version(&mut obj, rv);
        let obj = Arc::new(obj);
        match change {
            ChangeKind::Deleted => {
                st.objects[id.0].remove(&key);
                st.encoded[id.0].remove(&key);
            }
            ChangeKind::Added | ChangeKind::Modified => {
                st.objects[id.0].insert(key.clone(), obj.clone());
                // Serializing a `Value` into a Vec cannot fail.
                let json = Bytes::from(serde_json::to_vec(&*obj).unwrap_or_default());
                let encoded = EncodedObject {
                    object: obj.clone(),
                    json,
                };
                st.encoded[id.0].insert(key.clone(), encoded);
            }
        }
        let event = Arc::new(StoredEvent::new(
            rv,
            id,
            key.0,
            key.1,
            change,
            obj.clone(),
            prev,
        ));
        let slow = st.watchers.dispatch(&event);
        if slow > 0 {
            self.slow_watchers_terminated
                .fetch_add(slow as u64, Ordering::Relaxed);
            tracing::debug!(slow, "terminated watchers that could not keep up");
        }
        if let Some(dropped) = st.history.push(event) {
            st.floor = dropped;
        }
        if is_rbac(id) {
            self.rbac_generation.fetch_add(1, Ordering::AcqRel);
        }
        self.published_rv.store(rv, Ordering::Release);
        obj
    }

    fn ensure_namespace(
        &self,
        st: &mut StoreState,
        def: &ResourceDef,
        ns: &str,
        opts: WriteOptions,
    ) -> Result<(), ApiError> {
        if !def.namespaced
            || st.objects[NAMESPACES.0].contains_key(&(String::new(), ns.to_string()))
        {
            return Ok(());
        }
        if !opts.auto_namespace {
            return Err(ApiError::not_found(NAMESPACES.def(), ns));
        }
        if opts.dry_run {
            return Ok(());
        }
        let mut obj = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": { "name": ns, "uid": uuid::Uuid::new_v4().to_string(), "creationTimestamp": now_timestamp() },
        });
        validation::apply_defaults(NAMESPACES, &mut obj);
        self.commit(
            st,
            NAMESPACES,
            (String::new(), ns.to_string()),
            ChangeKind::Added,
            obj,
            None,
        );
        Ok(())
    }

    /// Creates an object. 409 AlreadyExists if the name is taken, 404 if its
    /// namespace does not exist (unless `auto_namespace`), 422 if invalid.
    pub(crate) fn create(
        &self,
        id: ResourceId,
        mut obj: Value,
        opts: WriteOptions,
    ) -> Result<Arc<Value>, ApiError> {
        let def = id.def();
        prepare_shape(id, &mut obj)?;
        if id == LEASES {
            lease::decode(&mut obj)?;
        }
        if opts.api {
            schema::prune_unknown(def, &mut obj);
        }
        let key = key_of(def, &obj)?;
        if let Some(meta) = metadata_mut(&mut obj) {
            meta.remove("resourceVersion");
            meta.remove("selfLink");
            meta.remove("deletionTimestamp");
            if opts.api || !meta.get("uid").is_some_and(Value::is_string) {
                meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
            }
            if opts.api || !meta.get("creationTimestamp").is_some_and(Value::is_string) {
                meta.insert("creationTimestamp".into(), json!(now_timestamp()));
            }
            if def.tracks_generation {
                meta.insert("generation".into(), json!(1));
            } else {
                meta.remove("generation");
            }
        }
        if opts.api
            && def.status_subresource
            && def.name == "routes"
            && let Some(map) = obj.as_object_mut()
        {
            map.insert("status".into(), json!({}));
        }
        validation::apply_defaults(id, &mut obj);
        if !opts.skip_validation {
            let errs = validation::validate(id, &obj, None);
            if !errs.is_empty() {
                return Err(ApiError::invalid(def, &key.1, &errs));
            }
        }
        let mut st = self.lock();
        self.ensure_namespace(&mut st, def, &key.0, opts)?;
        if st.objects[id.0].contains_key(&key) {
            return Err(ApiError::already_exists(def, &key.1));
        }
        if id == SERVICES {
            // Addresses are allocated under the lock: two creates never share one.
            network::allocate_service(&mut obj, st.objects[id.0].values().map(|s| &**s));
            if !opts.skip_validation {
                let errs = validation::validate(id, &obj, None);
                if !errs.is_empty() {
                    return Err(ApiError::invalid(def, &key.1, &errs));
                }
            }
        }
        if opts.dry_run {
            return Ok(Arc::new(obj));
        }
        Ok(self.commit(&mut st, id, key, ChangeKind::Added, obj, None))
    }

    /// Builds the object an update would store, checking the resourceVersion
    /// precondition, keeping system fields and validating.
    fn build_update(
        id: ResourceId,
        old: &Value,
        mut incoming: Value,
        target: UpdateTarget,
        opts: WriteOptions,
        key: &Key,
    ) -> Result<Value, ApiError> {
        let def = id.def();
        prepare_shape(id, &mut incoming)?;
        if id == LEASES {
            lease::decode(&mut incoming)?;
        }
        if opts.api {
            schema::prune_unknown(def, &mut incoming);
        }
        if opts.api
            && target == UpdateTarget::Main
            && def.update_requires_resource_version()
            && meta_str(&incoming, "resourceVersion").is_none_or(str::is_empty)
        {
            return Err(ApiError::resource_version_required(def, &key.1));
        }
        let old_rv = meta_str(old, "resourceVersion").unwrap_or_default();
        if let Some(rv) = meta_str(&incoming, "resourceVersion")
            && !rv.is_empty()
            && rv != old_rv
        {
            return Err(ApiError::stale(def, &key.1));
        }
        let old_uid = meta_str(old, "uid").unwrap_or_default();
        if let Some(uid) = meta_str(&incoming, "uid")
            && !uid.is_empty()
            && uid != old_uid
        {
            return Err(ApiError::conflict(
                def,
                &key.1,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}"
                ),
            ));
        }
        let mut new = match target {
            UpdateTarget::Main => {
                if opts.api
                    && def.status_subresource
                    && let Some(map) = incoming.as_object_mut()
                {
                    match old.get("status") {
                        Some(s) => map.insert("status".into(), s.clone()),
                        None => map.remove("status"),
                    };
                }
                incoming
            }
            UpdateTarget::Status => {
                let mut n = old.clone();
                if let Some(map) = n.as_object_mut() {
                    match incoming.get("status") {
                        Some(s) => map.insert("status".into(), s.clone()),
                        None => map.remove("status"),
                    };
                }
                n
            }
        };
        let meta = metadata_mut(&mut new)
            .ok_or_else(|| ApiError::bad_request("metadata must be an object"))?;
        meta.insert("name".into(), json!(key.1));
        if def.namespaced {
            meta.insert("namespace".into(), json!(key.0));
        }
        meta.insert("resourceVersion".into(), json!(old_rv));
        for field in ["uid", "creationTimestamp", "deletionTimestamp"] {
            match old.get("metadata").and_then(|m| m.get(field)) {
                Some(v) => meta.insert(field.into(), v.clone()),
                None => meta.remove(field),
            };
        }
        meta.remove("selfLink");
        let old_generation = old.pointer("/metadata/generation").and_then(Value::as_i64);
        validation::apply_defaults(id, &mut new);
        if id == SERVICES {
            network::keep_allocated(old, &mut new);
        }
        if def.tracks_generation {
            let g = old_generation.unwrap_or(1);
            let changed = if id == ENDPOINT_SLICES {
                network::endpoint_slice_generation_changes(old, &new)
            } else {
                new.get("spec") != old.get("spec")
            };
            let g = if changed { g + 1 } else { g };
            if let Some(meta) = metadata_mut(&mut new) {
                meta.insert("generation".into(), json!(g));
            }
        } else if let Some(meta) = metadata_mut(&mut new) {
            meta.remove("generation");
        }
        // A status update validates the status only, as kube-apiserver's status
        // strategies do: a route whose spec an older server let through must still be
        // able to have its status written.
        if !opts.skip_validation && target == UpdateTarget::Main {
            let errs = validation::validate(id, &new, Some(old));
            if !errs.is_empty() {
                return Err(ApiError::invalid(def, &key.1, &errs));
            }
        }
        Ok(new)
    }

    fn write_update(
        &self,
        st: &mut StoreState,
        id: ResourceId,
        key: Key,
        old: Arc<Value>,
        new: Value,
        opts: WriteOptions,
    ) -> Arc<Value> {
        // Like kube-apiserver, an update that changes nothing is not written: no new
        // resourceVersion, no event.
        if new == *old {
            return old;
        }
        if opts.dry_run {
            return Arc::new(new);
        }
        self.commit(st, id, key, ChangeKind::Modified, new, Some(old))
    }

    /// Replaces an object (PUT); returns it and whether it was created. 404 if missing
    /// (unless the resource creates on update, as Leases do through the API), 409 on a
    /// stale resourceVersion.
    pub(crate) fn update(
        &self,
        id: ResourceId,
        key: Key,
        mut incoming: Value,
        target: UpdateTarget,
        opts: WriteOptions,
    ) -> Result<(Arc<Value>, bool), ApiError> {
        let def = id.def();
        let mut st = self.lock();
        let Some(old) = st.objects[id.0].get(&key).cloned() else {
            if !(opts.api && target == UpdateTarget::Main && def.creates_on_update()) {
                return Err(ApiError::not_found(def, &key.1));
            }
            drop(st);
            // kube-apiserver creates it as a POST would, whatever resourceVersion the
            // body names.
            if let Some(meta) = metadata_mut(&mut incoming) {
                meta.insert("name".into(), json!(key.1));
                if def.namespaced {
                    meta.insert("namespace".into(), json!(key.0));
                }
            }
            return Ok((self.create(id, incoming, opts)?, true));
        };
        let new = Self::build_update(id, &old, incoming, target, opts, &key)?;
        Ok((self.write_update(&mut st, id, key, old, new, opts), false))
    }

    /// Patches an object. Returns the result and whether it was created (an apply
    /// patch creates a missing object).
    pub(crate) fn patch(
        &self,
        id: ResourceId,
        key: Key,
        patch: &PatchBody,
        target: UpdateTarget,
        opts: WriteOptions,
    ) -> Result<(Arc<Value>, bool), ApiError> {
        let def = id.def();
        let mut st = self.lock();
        let Some(old) = st.objects[id.0].get(&key).cloned() else {
            if patch.kind != PatchKind::Apply || target == UpdateTarget::Status {
                return Err(ApiError::not_found(def, &key.1));
            }
            drop(st);
            let mut obj = patch.patch.clone();
            if let Some(meta) = metadata_mut(&mut obj) {
                meta.insert("name".into(), json!(key.1));
                if def.namespaced {
                    meta.insert("namespace".into(), json!(key.0));
                }
            }
            return Ok((self.create(id, obj, opts)?, true));
        };
        let mut doc = (*old).clone();
        patch.apply_to(&mut doc)?;
        let new = Self::build_update(id, &old, doc, target, opts, &key)?;
        Ok((self.write_update(&mut st, id, key, old, new, opts), false))
    }

    /// Deletes an object (and, for a namespace, everything in it). Returns the
    /// object's last state.
    pub(crate) fn delete(
        &self,
        id: ResourceId,
        key: Key,
        pre: &Preconditions,
        opts: WriteOptions,
    ) -> Result<Arc<Value>, ApiError> {
        let def = id.def();
        let mut st = self.lock();
        let old = st.objects[id.0]
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(def, &key.1))?;
        if let Some(uid) = &pre.uid {
            let actual = meta_str(&old, "uid").unwrap_or_default();
            if uid != actual {
                return Err(ApiError::conflict(
                    def,
                    &key.1,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                    ),
                ));
            }
        }
        if let Some(rv) = &pre.resource_version {
            let actual = meta_str(&old, "resourceVersion").unwrap_or_default();
            if rv != actual {
                return Err(ApiError::conflict(
                    def,
                    &key.1,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {actual}"
                    ),
                ));
            }
        }
        if opts.dry_run {
            return Ok(old);
        }
        if id == NAMESPACES {
            for (i, r) in resources::RESOURCES.iter().enumerate() {
                if !r.namespaced {
                    continue;
                }
                let doomed: Vec<(Key, Arc<Value>)> = st.objects[i]
                    .range((key.1.clone(), String::new())..)
                    .take_while(|(k, _)| k.0 == key.1)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                for (k, v) in doomed {
                    self.commit(
                        &mut st,
                        ResourceId(i),
                        k,
                        ChangeKind::Deleted,
                        (*v).clone(),
                        Some(v),
                    );
                }
            }
        }
        let last = (*old).clone();
        Ok(self.commit(&mut st, id, key, ChangeKind::Deleted, last, Some(old)))
    }

    /// Deletes every object matching `filter`; returns their last states.
    pub(crate) fn delete_collection(
        &self,
        id: ResourceId,
        filter: &ObjectFilter,
        opts: WriteOptions,
    ) -> Result<Vec<Arc<Value>>, ApiError> {
        let keys: Vec<Key> = {
            let st = self.lock();
            scan(&st.objects[id.0], filter, None)
                .filter(|(_, v)| filter.matches(v))
                .map(|(k, _)| k.clone())
                .collect()
        };
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            match self.delete(id, key, &Preconditions::default(), opts) {
                Ok(v) => out.push(v),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// One object.
    pub(crate) fn get(&self, id: ResourceId, key: &Key) -> Option<Arc<Value>> {
        self.lock().objects[id.0].get(key).cloned()
    }

    /// All objects of a resource, optionally in one namespace, in key order.
    pub(crate) fn all(&self, id: ResourceId, namespace: Option<&str>) -> Vec<Arc<Value>> {
        let filter = ObjectFilter {
            namespace: namespace.map(str::to_string),
            ..ObjectFilter::default()
        };
        let st = self.lock();
        scan(&st.objects[id.0], &filter, None)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// One page of a list.
    pub(crate) fn list(
        &self,
        id: ResourceId,
        filter: &ObjectFilter,
        limit: Option<usize>,
        cont: Option<&ContinueToken>,
        version: ListVersion,
    ) -> Result<ListPage, ApiError> {
        let st = self.lock();
        let (snapshot_rv, after) = match cont {
            Some(t) => (t.rv, Some((t.ns.clone(), t.name.clone()))),
            None => match version {
                ListVersion::Latest | ListVersion::Any => (st.rv, None),
                ListVersion::NotOlderThan(r) | ListVersion::Exact(r) if r > st.rv => {
                    return Err(ApiError::too_large_resource_version(r, st.rv));
                }
                ListVersion::NotOlderThan(_) => (st.rv, None),
                ListVersion::Exact(r) => (r, None),
            },
        };
        if snapshot_rv > st.rv {
            return Err(ApiError::bad_request(
                "continue key is not valid: resource version is in the future",
            ));
        }
        if snapshot_rv != st.rv && snapshot_rv < st.floor {
            return Err(if cont.is_some() {
                ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                )
            } else {
                ApiError::expired(format!(
                    "The resourceVersion for the provided list is too old. (requested {snapshot_rv}, oldest available {})",
                    st.floor
                ))
            });
        }
        let map: Cow<'_, BTreeMap<Key, Arc<Value>>> = if snapshot_rv == st.rv {
            Cow::Borrowed(&st.objects[id.0])
        } else {
            Cow::Owned(reconstruct(&st, id, snapshot_rv))
        };
        let limit = limit.filter(|l| *l > 0);
        let count_remaining = filter.fields.is_empty() && filter.labels.is_empty();
        let mut items = Vec::new();
        let mut encoded = Vec::new();
        let mut last: Option<&Key> = None;
        let mut more = false;
        let mut remaining = 0u64;
        for (k, v) in scan(&map, filter, after.as_ref()) {
            if !filter.matches(v) {
                continue;
            }
            if limit.is_none_or(|l| items.len() < l) {
                items.push(v.clone());
                encoded.push(st.encoded(id, k, v));
                last = Some(k);
            } else {
                more = true;
                remaining += 1;
                if !count_remaining {
                    break;
                }
            }
        }
        let continue_token = match (more, last) {
            (true, Some(k)) => Some(
                ContinueToken {
                    rv: snapshot_rv,
                    ns: k.0.clone(),
                    name: k.1.clone(),
                }
                .encode(),
            ),
            _ => None,
        };
        Ok(ListPage {
            items,
            encoded,
            rv: snapshot_rv,
            continue_token,
            remaining: (more && count_remaining).then_some(remaining),
        })
    }

    /// Registers a watcher.
    pub(crate) fn watch(
        self: &Arc<Self>,
        id: ResourceId,
        filter: Arc<ObjectFilter>,
        start: WatchStart,
    ) -> Result<Subscription, WatchStartError> {
        let bucket = Bucket::for_filter(&filter);
        let mut st = self.lock();
        let mut initial = VecDeque::new();
        let start_rv = match start {
            WatchStart::CurrentWithState => {
                for (k, v) in scan(&st.objects[id.0], &filter, None) {
                    if filter.matches(v) {
                        let json = st.encoded(id, k, v);
                        initial.push_back(InitialItem::Current(v.clone(), json));
                    }
                }
                st.rv
            }
            WatchStart::After(r) => {
                if r < st.floor {
                    return Err(WatchStartError::Expired {
                        requested: r,
                        oldest: st.floor,
                    });
                }
                if r > st.rv {
                    return Err(WatchStartError::TooLarge {
                        requested: r,
                        current: st.rv,
                    });
                }
                // Only the events the filter can match: a renewal of a per-object
                // watch walks that object's own events, not every recent change.
                let since = st.history.since(id, id.def().namespaced, &bucket, r);
                for e in since.events() {
                    if let Some(d) = e.delivery_for(&filter) {
                        initial.push_back(InitialItem::Replay(e.clone(), d));
                    }
                }
                r
            }
        };
        let (tx, rx) = mpsc::channel(self.watch_buffer);
        let wid = st.watchers.insert(id, &bucket, filter, tx);
        let registered_rv = st.rv;
        drop(st);
        Ok(Subscription {
            initial,
            start_rv,
            registered_rv,
            rx,
            _registration: Registration {
                store: self.clone(),
                resource: id,
                bucket,
                id: wid,
            },
        })
    }

    /// Drops the whole event history: every older resourceVersion now gets 410.
    pub(crate) fn compact(&self) -> u64 {
        let mut st = self.lock();
        st.history.clear();
        st.floor = st.rv;
        st.rv
    }

    /// The RBAC objects and the generation they belong to.
    pub(crate) fn rbac_objects(&self) -> RbacObjects {
        let st = self.lock();
        let take = |id: ResourceId| st.objects[id.0].values().cloned().collect::<Vec<_>>();
        RbacObjects {
            generation: self.rbac_generation(),
            roles: take(ROLES),
            role_bindings: take(ROLE_BINDINGS),
            cluster_roles: take(CLUSTER_ROLES),
            cluster_role_bindings: take(CLUSTER_ROLE_BINDINGS),
        }
    }
}

/// The objects of one resource as they were at `rv` (which must not be below the
/// history floor), by undoing later events.
fn reconstruct(st: &StoreState, id: ResourceId, rv: u64) -> BTreeMap<Key, Arc<Value>> {
    let mut map = st.objects[id.0].clone();
    let mut undone: std::collections::HashSet<Key> = std::collections::HashSet::new();
    for e in st.history.of_resource_since(id, rv).events() {
        let key = (e.namespace.clone(), e.name.clone());
        // Only the first change after `rv` tells the state at `rv`.
        if !undone.insert(key.clone()) {
            continue;
        }
        match (&e.change, &e.prev) {
            (ChangeKind::Added, _) => {
                map.remove(&key);
            }
            (_, Some(prev)) => {
                map.insert(key, prev.clone());
            }
            (_, None) => {
                map.remove(&key);
            }
        }
    }
    map
}

/// Iterates the part of `map` a filter can match (one object, one namespace or
/// everything), starting after `after`.
fn scan<'a>(
    map: &'a BTreeMap<Key, Arc<Value>>,
    filter: &ObjectFilter,
    after: Option<&Key>,
) -> Box<dyn Iterator<Item = (&'a Key, &'a Arc<Value>)> + 'a> {
    let ns = filter.exact_namespace().map(str::to_string);
    let name = filter.exact_name().map(str::to_string);
    if let (Some(ns), Some(name)) = (&ns, &name) {
        let key = (ns.clone(), name.clone());
        if after.is_some_and(|a| *a >= key) {
            return Box::new(std::iter::empty());
        }
        return Box::new(map.get_key_value(&key).into_iter());
    }
    match ns {
        Some(ns) => {
            let lower = match after {
                Some(a) if a.0 == ns => Bound::Excluded(a.clone()),
                Some(a) if a.0 > ns => return Box::new(std::iter::empty()),
                _ => Bound::Included((ns.clone(), String::new())),
            };
            Box::new(
                map.range((lower, Bound::Unbounded))
                    .take_while(move |(k, _)| k.0 == ns),
            )
        }
        None => {
            let lower = after.map_or(Bound::Unbounded, |a| Bound::Excluded(a.clone()));
            Box::new(map.range((lower, Bound::Unbounded)))
        }
    }
}
