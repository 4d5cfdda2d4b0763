//! What can go wrong while starting, using or stopping a control plane.

use std::path::PathBuf;

/// A control plane could not be started, reached or used.
///
/// `Debug` prints the message (with its cause), as `Display` does: tests `unwrap` these,
/// and a log tail is meant to be read, not escaped.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum TestEnvError {
    /// Neither `CERTWATCH_TEST_CONTROL_PLANE` nor the shared tool directory holds the
    /// binaries. Tests fail (never skip) with this message.
    #[error(
        "no real control plane at {}{}: it needs bin/kube-apiserver(.xz), bin/etcd(.xz) and \
route.crd.yaml. The project keeps them in shared/tools/kube-apiserver beside the workspace \
(../shared/tools/kube-apiserver from the repository root, with the README that says how they \
were built); put that directory there, or set CERTWATCH_TEST_CONTROL_PLANE to a copy of it",
        dir.display(),
        if *from_env { " (from CERTWATCH_TEST_CONTROL_PLANE)" } else { "" }
    )]
    ControlPlaneNotFound {
        /// The directory looked in.
        dir: PathBuf,
        /// Whether it came from `CERTWATCH_TEST_CONTROL_PLANE`.
        from_env: bool,
    },
    /// Neither `CERTWATCH_TEST_OPENSHIFT_ROUTER` nor the shared tool directory holds the
    /// OpenShift router. Tests fail (never skip) with this message.
    #[error(
        "no OpenShift router at {}{}: it needs start, stop and rbac.yaml (the tool that runs \
openshift/router with its HAProxy template). The project keeps it in shared/tools/openshift-router \
beside the workspace (../shared/tools/openshift-router from the repository root, with the README \
that says how it was built); put that directory there, or set CERTWATCH_TEST_OPENSHIFT_ROUTER to a \
copy of it",
        dir.display(),
        if *from_env { " (from CERTWATCH_TEST_OPENSHIFT_ROUTER)" } else { "" }
    )]
    RouterNotFound {
        /// The directory looked in.
        dir: PathBuf,
        /// Whether it came from `CERTWATCH_TEST_OPENSHIFT_ROUTER`.
        from_env: bool,
    },
    /// The OpenShift router runs HAProxy, which is not on `PATH`.
    #[error(
        "haproxy is not on PATH, and the OpenShift router needs it (its reload script runs it): \
install it (apt-get install -y haproxy: HAProxy 2.6 on Debian 12; scripts/test does so as root)"
    )]
    HaproxyNotFound,
    /// The tool's `start` failed.
    #[error(
        "the OpenShift router did not start: {reason}\n--- last lines of its log ---\n{log_tail}"
    )]
    RouterNotStarted {
        /// What `start` said.
        reason: String,
        /// The end of the router's log.
        log_tail: String,
    },
    /// A binary could not be unpacked.
    #[error("cannot unpack {}: {reason}", archive.display())]
    Unpack {
        /// The `.xz` archive.
        archive: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A certificate or key for the control plane could not be made.
    #[error("cannot make the control plane's {what}: {reason}")]
    Pki {
        /// Which certificate or key.
        what: &'static str,
        /// What rcgen said.
        reason: String,
    },
    /// etcd or kube-apiserver exited, or never became ready.
    #[error("{process} did not start: {reason}\n--- last lines of {} ---\n{log_tail}", log.display())]
    NotStarted {
        /// `etcd` or `kube-apiserver`.
        process: &'static str,
        /// What was observed.
        reason: String,
        /// Its log file.
        log: PathBuf,
        /// The end of that log.
        log_tail: String,
    },
    /// A request to the control plane failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// A configuration, manifest or answer could not be encoded or decoded.
    #[error("{what}: {reason}")]
    Format {
        /// What was being read or written.
        what: String,
        /// The decoder's or encoder's message.
        reason: String,
    },
}

impl TestEnvError {
    /// Wraps a kube error with what was being done.
    pub(crate) fn kube(what: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            what: what.into(),
            source: Box::new(source),
        }
    }

    /// A decoding or encoding failure.
    pub(crate) fn format(what: impl Into<String>, reason: impl ToString) -> Self {
        Self::Format {
            what: what.into(),
            reason: reason.to_string(),
        }
    }
}

impl std::fmt::Debug for TestEnvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")?;
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            write!(f, "\ncaused by: {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}
