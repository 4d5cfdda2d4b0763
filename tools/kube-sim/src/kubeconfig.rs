//! The kubeconfig the simulator hands out: one cluster, two users, two contexts
//! (`router`, current, and `admin`).

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use kube::config::Kubeconfig;
use serde_json::json;

use crate::error::SimError;
use crate::generator::generate::ROUTER_NAMESPACE;

/// Name of the cluster entry.
pub const CLUSTER_NAME: &str = "kube-sim";
/// The router identity's context (the current context).
pub const ROUTER_CONTEXT: &str = "router";
/// The cluster admin's context.
pub const ADMIN_CONTEXT: &str = "admin";

pub(crate) fn build(
    url: &str,
    ca_pem: Option<&str>,
    router_token: &str,
    admin_token: &str,
) -> Result<Kubeconfig, SimError> {
    let mut cluster = json!({ "server": url });
    if let Some(ca) = ca_pem {
        cluster["certificate-authority-data"] = json!(B64.encode(ca.as_bytes()));
    }
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": CLUSTER_NAME, "cluster": cluster }],
        "users": [
            { "name": ROUTER_CONTEXT, "user": { "token": router_token } },
            { "name": ADMIN_CONTEXT, "user": { "token": admin_token } },
        ],
        "contexts": [
            { "name": ROUTER_CONTEXT, "context": { "cluster": CLUSTER_NAME, "user": ROUTER_CONTEXT, "namespace": ROUTER_NAMESPACE } },
            { "name": ADMIN_CONTEXT, "context": { "cluster": CLUSTER_NAME, "user": ADMIN_CONTEXT, "namespace": "default" } },
        ],
        "current-context": ROUTER_CONTEXT,
    });
    serde_json::from_value(doc).map_err(|e| SimError::Kubeconfig(e.to_string()))
}

/// Writes a kubeconfig as YAML, readable only by the owner (it holds tokens).
pub(crate) fn write(config: &Kubeconfig, path: &Path) -> Result<(), SimError> {
    kube_common::kubeconfig::write(config, path).map_err(|error| match error {
        kube_common::kubeconfig::KubeconfigWriteError::Io { path, source } => {
            SimError::Write { path, source }
        }
        other => SimError::Kubeconfig(other.to_string()),
    })
}
