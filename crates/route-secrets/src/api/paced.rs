//! Requests sent under the process's adaptive limiter, each attempt marked as a first
//! attempt or a retry on the HTTP request itself, so that the transport's accounting
//! (and `/metrics`) counts the retries the limiter makes.
//!
//! kube's `Api` methods build their requests out of reach, so the few requests the
//! limiter re-queues are built here the way `Api` builds them (`kube::core::Request`)
//! and sent with `Client::request`.

use std::fmt::Debug;

use kube::Client;
use kube::Resource;
use kube::api::{ListParams, ObjectList, PostParams};
use kube_common::adaptive::{AdaptiveLimiter, Attempt};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Sends one request (`send` makes one attempt): under `limiter`, with every refusal
/// for load re-queued up to `max_refusals` times; without one, once.
pub(crate) async fn send<T, Fut>(
    limiter: Option<&AdaptiveLimiter>,
    max_refusals: u32,
    mut send: impl FnMut(Attempt) -> Fut,
) -> Result<T, kube::Error>
where
    Fut: Future<Output = Result<T, kube::Error>>,
{
    match limiter {
        Some(limiter) => limiter.send(max_refusals, send).await,
        None => send(Attempt::First).await,
    }
}

/// `POST` of `object` to its cluster-scoped collection (as `Api::all(..).create` does).
pub(crate) async fn create<K>(
    client: &Client,
    object: &K,
    attempt: Attempt,
) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + Debug,
{
    let request = kube::core::Request::new(K::url_path(&(), None))
        .create(&PostParams::default(), json_body(object)?)
        .map_err(kube::Error::BuildRequest)?;
    client.request(attempt.mark(request)).await
}

/// `PUT` of `object` to the `status` subresource of `namespace/name` (as
/// `Api::namespaced(..).replace_status` does).
pub(crate) async fn replace_status<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    object: &K,
    attempt: Attempt,
) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + Debug,
{
    let request = kube::core::Request::new(K::url_path(&(), Some(namespace)))
        .replace_subresource("status", name, &PostParams::default(), json_body(object)?)
        .map_err(kube::Error::BuildRequest)?;
    client.request(attempt.mark(request)).await
}

/// `GET` of the collection in `namespace` (as `Api::namespaced(..).list` does).
pub(crate) async fn list<K>(
    client: &Client,
    namespace: &str,
    params: &ListParams,
    attempt: Attempt,
) -> Result<ObjectList<K>, kube::Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug,
{
    let request = kube::core::Request::new(K::url_path(&(), Some(namespace)))
        .list(params)
        .map_err(kube::Error::BuildRequest)?;
    client.request(attempt.mark(request)).await
}

/// `object` as a JSON request body.
fn json_body(object: &impl Serialize) -> Result<Vec<u8>, kube::Error> {
    serde_json::to_vec(object).map_err(kube::Error::SerdeError)
}
