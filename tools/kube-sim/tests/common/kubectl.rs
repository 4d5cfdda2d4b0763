//! Finding and running kubectl. The tests use `kubectl` from `PATH` and, where a
//! Google Cloud SDK style installation sits next to it, each versioned binary
//! (`kubectl.1.27` ... `kubectl.1.33`) in the same directory. No kubectl at all is a
//! failure that says how to get one, never a skipped test.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use kube_sim::Simulator;
use tokio::process::Command;

/// One kubectl binary.
#[derive(Debug, Clone)]
pub struct Binary {
    /// Short name for messages (`kubectl`, `kubectl.1.27`).
    pub name: String,
    /// Where it is.
    pub path: PathBuf,
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// `kubectl` from `PATH`, resolved through symlinks (a dispatcher such as the Cloud
/// SDK's links into the directory that also holds the versioned binaries).
pub fn default_binary() -> Binary {
    let path = on_path("kubectl").unwrap_or_else(|| {
        panic!(
            "kubectl is not on PATH: install it (for example `apt-get install kubectl`, or \
             the Kubernetes release binary from https://dl.k8s.io/release/v1.33.0/bin/linux/amd64/kubectl) \
             and run the tests again"
        )
    });
    Binary {
        name: "kubectl".to_string(),
        path: std::fs::canonicalize(&path).unwrap_or(path),
    }
}

/// Every versioned kubectl (`kubectl.1.N`) next to the one on `PATH`, oldest first.
/// Empty where only one kubectl is installed.
pub fn versioned_binaries() -> Vec<Binary> {
    let default = default_binary();
    let Some(dir) = default.path.parent() else {
        return Vec::new();
    };
    let mut found: Vec<(u32, Binary)> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let minor = name.strip_prefix("kubectl.1.")?.parse::<u32>().ok()?;
                    Some((
                        minor,
                        Binary {
                            name,
                            path: entry.path(),
                        },
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort_by_key(|(minor, _)| *minor);
    found.into_iter().map(|(_, binary)| binary).collect()
}

/// The binaries to run a scenario with: every versioned one where installed, else
/// the one on `PATH`.
pub fn all_binaries() -> Vec<Binary> {
    let versioned = versioned_binaries();
    if versioned.is_empty() {
        vec![default_binary()]
    } else {
        versioned
    }
}

/// kubectl configured for one simulator, with its own cache directory.
pub struct Kubectl {
    /// The binary.
    pub binary: Binary,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

/// What a kubectl run printed.
pub struct Outcome {
    /// Whether it exited with 0.
    pub ok: bool,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Kubectl {
    /// Writes the simulator's kubeconfig under `dir` for `binary`.
    pub fn new(binary: Binary, dir: &Path, sim: &Simulator) -> Kubectl {
        let kubeconfig = dir.join(format!("{}.kubeconfig", binary.name));
        sim.write_kubeconfig(&kubeconfig).unwrap();
        Kubectl::with_kubeconfig(binary, dir, kubeconfig)
    }

    /// kubectl for an existing kubeconfig (a real control plane's, say).
    pub fn with_kubeconfig(binary: Binary, dir: &Path, kubeconfig: PathBuf) -> Kubectl {
        let cache = dir.join(format!("{}-cache", binary.name));
        Kubectl {
            binary,
            kubeconfig,
            cache,
        }
    }

    /// A command with the kubeconfig and cache set; the caller adds arguments.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.binary.path);
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .env("KUBECACHEDIR", &self.cache)
            .env("HOME", self.cache.parent().unwrap_or(Path::new("/tmp")))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    /// Runs to completion.
    pub async fn run(&self, args: &[&str]) -> Outcome {
        let out = self.command(args).output().await.unwrap();
        Outcome {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs, asserting success; returns standard output.
    pub async fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args).await;
        assert!(
            o.ok,
            "{} {args:?} failed:\n{}\n{}",
            self.binary.name, o.stdout, o.stderr
        );
        o.stdout
    }
}
