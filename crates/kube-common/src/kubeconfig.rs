//! Kubeconfig files that hold credentials.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use kube::config::Kubeconfig;

/// Why a kubeconfig could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KubeconfigWriteError {
    /// The kubeconfig could not be rendered as YAML.
    #[error("cannot render the kubeconfig for {path}: {message}")]
    Render {
        /// Where it was to be written.
        path: PathBuf,
        /// What the YAML encoder said.
        message: String,
    },
    /// The file or its directory could not be written.
    #[error("cannot write the kubeconfig {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Writes `config` to `path`, creating its directory, readable and writable by the
/// owner only (mode 0600): a kubeconfig holds tokens. It is written as JSON, which is
/// YAML too and which kubectl, client-go and kube read as any kubeconfig: no YAML
/// library (serde_yaml is deprecated) comes into the daemon's dependency tree for it.
pub fn write(config: &Kubeconfig, path: &Path) -> Result<(), KubeconfigWriteError> {
    let mut text =
        serde_json::to_string_pretty(config).map_err(|error| KubeconfigWriteError::Render {
            path: path.to_path_buf(),
            message: error.to_string(),
        })?;
    text.push('\n');
    let io = |source| KubeconfigWriteError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(io)?;
    file.write_all(text.as_bytes()).map_err(io)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_private_file_kube_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/config");
        let config: Kubeconfig = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }))
        .unwrap();
        write(&config, &path).unwrap();
        let back = Kubeconfig::read_from(&path).unwrap();
        assert_eq!(back.current_context.as_deref(), Some("x"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
