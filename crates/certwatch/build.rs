//! Records the commit certwatch is built from, for `certwatch_build_info` and
//! `certwatch --version`: `CERTWATCH_COMMIT` when set (the container build passes it,
//! as its context has no `.git`), else what git says of the source tree, else
//! `unknown` (a source archive without git, or git not installed).

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

fn is_commit(text: &str) -> bool {
    (7..=64).contains(&text.len()) && text.bytes().all(|byte| byte.is_ascii_hexdigit())
}

/// Asks for a new run when `path` changes; a path that does not exist is left out
/// (Cargo would run the script again at every build).
fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CERTWATCH_COMMIT");
    let from_env = std::env::var("CERTWATCH_COMMIT")
        .ok()
        .map(|commit| commit.trim().to_ascii_lowercase())
        .filter(|commit| is_commit(commit));
    let commit = from_env.or_else(|| {
        let commit = git(&["rev-parse", "HEAD"]).filter(|commit| is_commit(commit))?;
        // Built again when HEAD moves: HEAD itself, the branch it names, and the
        // packed refs (in a worktree, branches live in the common directory).
        if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
            watch(&Path::new(&dir).join("HEAD"));
        }
        if let Some(common) = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]) {
            let common = Path::new(&common);
            watch(&common.join("packed-refs"));
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                watch(&common.join(branch));
            }
        }
        Some(commit)
    });
    let commit = commit.unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=CERTWATCH_COMMIT={commit}");
}
