//! The Kubernetes client configuration, as kube-rs infers it.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Why no client configuration could be built.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The kubeconfig file could not be read or parsed.
    #[error("cannot read the kubeconfig {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: kube::config::KubeconfigError,
    },
    /// The kubeconfig does not describe a usable context.
    #[error("cannot use the kubeconfig{}: {source}", context.as_deref().map(|c| format!(" context {c:?}")).unwrap_or_default())]
    Kubeconfig {
        /// The context asked for.
        context: Option<String>,
        /// The cause.
        source: kube::config::KubeconfigError,
    },
    /// Neither a kubeconfig nor an in-cluster service account was found.
    #[error("no Kubernetes configuration found (no kubeconfig, not in a cluster): {0}")]
    Infer(#[from] kube::config::InferConfigError),
}

/// The configuration for `kubeconfig` (a file) and `context`, or, with neither, what
/// kube-rs infers: `$KUBECONFIG`, `~/.kube/config`, then the in-cluster service
/// account. Building it contacts no server.
pub async fn kube_config(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<kube::Config, ConnectError> {
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    let kubeconfig_error = |source| ConnectError::Kubeconfig {
        context: options.context.clone(),
        source,
    };
    match (kubeconfig, context) {
        (Some(path), _) => {
            let file = Kubeconfig::read_from(path).map_err(|source| ConnectError::Read {
                path: path.display().to_string(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(kubeconfig_error)
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(kubeconfig_error),
        (None, None) => Ok(kube::Config::infer().await?),
    }
}
