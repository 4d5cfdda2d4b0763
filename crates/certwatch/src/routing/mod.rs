//! Routing real traffic: HAProxy's whole configuration for the served routes, with the
//! OpenShift router's semantics, their servers from the services' EndpointSlices.
//!
//! - [`endpoints`]: services' endpoints from their EndpointSlices (pure).
//! - [`model`]: served routes, and each route's backend: servers and weights (pure).
//! - [`render`]: `haproxy.cfg` and its maps from both (pure), checked by `haproxy -c`.
//! - [`write_config`]: the rendered files on disk, each replaced atomically.
//! - [`dynamic`]: endpoint changes as runtime API commands on server slots and on
//!   servers added and deleted at run time (pure).
//! - [`supervisor`]: how the HAProxy process certwatch runs on the routes' configuration
//!   is started ([`crate::haproxy::process::HaproxyProcess`], the one process type).
//! - [`task`]: the task that ties them: the EndpointSlice and Service watches, the
//!   served routes, loads and reloads at a bounded rate, endpoint changes without a
//!   reload.
//! - `changes`: [`RouteChange`], what the outputs tell the task, coalesced per route.

mod changes;
pub mod dynamic;
pub mod endpoints;
pub mod model;
pub mod render;
pub mod supervisor;
pub mod task;

use std::io;
use std::path::{Path, PathBuf};

pub use self::changes::RouteChange;
pub use self::render::{
    CustomErrorPages, ErrorPage, ErrorPageError, RenderOptions, RenderedConfig, render,
};
pub use self::task::{Routing, RoutingOptions};

/// The configuration file's name in the configuration directory.
pub const CONFIG_FILE: &str = "haproxy.cfg";

/// Writes `path` through a temporary file in the same directory, renamed into place,
/// so that a reader sees the old content or the new, never a part.
fn replace(path: &Path, content: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut file = tempfile::NamedTempFile::new_in(dir)?;
    io::Write::write_all(&mut file, content)?;
    file.persist(path).map_err(|error| error.error)?;
    Ok(())
}

/// Writes a rendered configuration into its directory: the error pages, the destination
/// CA and allow list files, the maps, the Lua file HAProxy's Lua states load, HAProxy's
/// OpenSSL configuration, then `haproxy.cfg` (last, so that a configuration on disk
/// never names a file that is not there yet: whoever starts HAProxy once `haproxy.cfg`
/// exists finds every file it needs). Returns the configuration file's path.
pub fn write_config(rendered: &RenderedConfig, options: &RenderOptions) -> io::Result<PathBuf> {
    let dir = &options.config_dir;
    std::fs::create_dir_all(dir.join("run"))?;
    std::fs::create_dir_all(dir.join("cacerts"))?;
    std::fs::create_dir_all(dir.join(render::ALLOWLIST_DIR))?;
    for (name, page) in options.error_pages.files() {
        let path = dir.join(name);
        if std::fs::read(&path).ok().as_deref() != Some(page) {
            replace(&path, page)?;
        }
    }
    let wanted: std::collections::HashSet<&Path> = rendered
        .ca_files
        .iter()
        .chain(&rendered.allowlist_files)
        .map(|(path, _)| path.as_path())
        .collect();
    for (path, pem) in rendered.ca_files.iter().chain(&rendered.allowlist_files) {
        if std::fs::read(path).ok().as_deref() != Some(pem.as_bytes()) {
            replace(path, pem.as_bytes())?;
        }
    }
    for (name, text) in &rendered.maps {
        replace(&dir.join(name), text.as_bytes())?;
    }
    let lua_init = options.lua_init();
    if std::fs::read(&lua_init).ok().as_deref() != Some(render::LUA_INIT.as_bytes()) {
        replace(&lua_init, render::LUA_INIT.as_bytes())?;
    }
    let openssl_conf = options.openssl_conf();
    if std::fs::read(&openssl_conf).ok().as_deref() != Some(rendered.openssl_conf.as_bytes()) {
        replace(&openssl_conf, rendered.openssl_conf.as_bytes())?;
    }
    let config = dir.join(CONFIG_FILE);
    replace(&config, rendered.config.as_bytes())?;
    // CA and allow list files of routes no longer rendered go once the configuration
    // names them no more.
    for sub in ["cacerts", render::ALLOWLIST_DIR] {
        for entry in std::fs::read_dir(dir.join(sub))? {
            let path = entry?.path();
            if !wanted.contains(path.as_path()) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    Ok(config)
}
