//! How certwatch runs HAProxy on the routes' configuration: the one HAProxy process
//! type ([`crate::haproxy::process::HaproxyProcess`]: master-worker mode, under the
//! watchdog, stopped when certwatch ends, `SIGKILL` included), with the master CLI in
//! `run/master.sock` beside the configuration, the OpenSSL configuration the render
//! writes, HAProxy's warnings as its routine (proxies stopped by a reload, servers
//! leaving maintenance) and, with the access log, HAProxy's standard output as
//! certwatch's own. The routing task spawns it without waiting for a worker: it waits
//! for the configuration's digest through the runtime API itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::haproxy::process::ProcessOptions;

/// Where the master CLI of the HAProxy run on `config` listens (`run/master.sock` beside
/// it): the certificates' controller reloads HAProxy through it for what its runtime
/// API cannot carry.
pub fn master_socket(config: &Path) -> PathBuf {
    config.with_file_name("run").join("master.sock")
}

/// How to run `binary` on the routes' configuration `config`; with `access_log`,
/// HAProxy's standard output (where the configuration sends the access log) is
/// certwatch's own; `command_timeout` for each master CLI exchange.
pub fn process_options(
    binary: &Path,
    config: &Path,
    access_log: bool,
    command_timeout: Duration,
) -> ProcessOptions {
    let mut options = ProcessOptions::new(binary, config, master_socket(config));
    // Certificates load at certwatch's OpenSSL security level: the render writes the
    // configuration for it beside HAProxy's.
    options.openssl_conf_file = Some(config.with_file_name(super::render::OPENSSL_CONF_FILE));
    options.inherit_stdout = access_log;
    options.routine_warnings = true;
    options.command_timeout = command_timeout;
    options
}
