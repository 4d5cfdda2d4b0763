//! How every HAProxy certwatch starts is run, so that none outlives the certwatch that
//! started it, `SIGKILL` included, and none is left from an earlier run.
//!
//! HAProxy runs under a small `sh` (the watchdog) whose stdin is a pipe that only
//! certwatch holds the other end of (the write end is close-on-exec, so no other child
//! inherits it). When that pipe reaches end-of-file (certwatch ended, however: a
//! `SIGKILL` runs no destructor, but the kernel closes its descriptors), the watchdog
//! stops HAProxy softly (`SIGUSR1`: its workers finish their connections) and for good
//! (`SIGKILL` to the master, whose workers follow it) after 10 s, since a soft stop
//! waits for connections that may never close. When HAProxy exits on its own, the
//! watchdog exits with HAProxy's status, so certwatch sees the exit as its child's.
//!
//! `PR_SET_PDEATHSIG` would need `unsafe` (`pre_exec`), and fires when the *thread*
//! that forked exits, which tokio's blocking pool does when idle: the pipe has neither
//! problem.
//!
//! [`stop_leftovers`] ends an HAProxy found running on the same configuration before
//! certwatch starts its own (one whose watchdog was killed with certwatch, say, or one
//! started by hand): two HAProxy processes bound to the same port would share its
//! connections, the older one serving stale certificates.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, ChildStdin, Command};
use tracing::warn;

/// The watchdog: runs `$0 "$@"` (HAProxy and its arguments) in the background, and a
/// guard that waits for end-of-file on the watchdog's stdin (kept on descriptor 3 for
/// it: a background list's stdin is `/dev/null` otherwise), then stops HAProxy softly,
/// and for good after 10 s. The watchdog waits for HAProxy and exits with its status,
/// ending the guard. `INT` and `HUP` (a terminal's, sent to the whole process group)
/// are left to certwatch, which stops HAProxy itself.
const WATCHDOG: &str = r#"trap '' INT HUP
exec 3<&0
"$0" "$@" </dev/null 3<&- &
child=$!
{
  while read -r _; do :; done
  kill -USR1 "$child" 2>/dev/null
  i=0
  while kill -0 "$child" 2>/dev/null && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  kill -KILL "$child" 2>/dev/null
} <&3 3<&- >/dev/null 2>&1 &
guard=$!
exec 3<&- </dev/null
wait "$child"
status=$?
kill "$guard" 2>/dev/null
exit "$status""#;

/// HAProxy started under the watchdog.
#[derive(Debug)]
pub struct Watched {
    /// The watchdog shell; HAProxy's master is its only child and the shell exits with
    /// HAProxy's status.
    pub child: Child,
    /// The watchdog's stdin: HAProxy is stopped when this is closed (dropped), or when
    /// certwatch ends.
    pub lifeline: Option<ChildStdin>,
}

/// Starts `binary` with `args` under the watchdog, `env` added to its environment;
/// stderr is piped (HAProxy's), stdout too unless `inherit_stdout` (where HAProxy's
/// configuration sends the access log: certwatch's own standard output, line for
/// line), stdin is the lifeline.
pub fn spawn(
    binary: &Path,
    args: &[&OsStr],
    env: &[(&str, &OsStr)],
    inherit_stdout: bool,
) -> std::io::Result<Watched> {
    let mut command = Command::new("sh");
    command.arg("-c").arg(WATCHDOG).arg(binary).args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(if inherit_stdout {
            Stdio::inherit()
        } else {
            Stdio::piped()
        })
        .stderr(Stdio::piped())
        // The watchdog stops HAProxy when its stdin closes, the drop included.
        .kill_on_drop(false)
        .spawn()?;
    let lifeline = child.stdin.take();
    Ok(Watched { child, lifeline })
}

/// A process of this user running HAProxy on `config`: `-f <config>` among its
/// arguments, and not a shell (the watchdog carries the same arguments).
fn running_on(config: &Path) -> Vec<rustix::process::Pid> {
    let config = config.as_os_str().as_encoded_bytes();
    let own = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            if pid == own {
                return None;
            }
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|byte| *byte == 0).collect();
            let program = args.first()?;
            let name = program.rsplit(|byte| *byte == b'/').next()?;
            if name.ends_with(b"sh") {
                return None;
            }
            let on_config = args
                .windows(2)
                .any(|pair| pair[0] == b"-f" && pair[1] == config);
            on_config
                .then(|| rustix::process::Pid::from_raw(i32::try_from(pid).ok()?))
                .flatten()
        })
        .collect()
}

/// The HAProxy master the watchdog `watchdog` runs on `config`: its child running
/// HAProxy on `config` (its other child, the guard, is a shell).
pub fn master_of(watchdog: u32, config: &Path) -> Option<rustix::process::Pid> {
    running_on(config).into_iter().find(|pid| {
        std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero()))
            .ok()
            .and_then(|stat| {
                // `pid (comm) state ppid ...`: the parent after the command's name.
                let (_, rest) = stat.rsplit_once(')')?;
                rest.split_whitespace().nth(1)?.parse::<u32>().ok()
            })
            == Some(watchdog)
    })
}

/// Ends every HAProxy running on `config` (left by an earlier certwatch, or started by
/// others on the same configuration): `SIGTERM`, then `SIGKILL` to what is still there
/// after `patience`. Returns how many processes were found.
pub async fn stop_leftovers(config: &Path, patience: Duration) -> usize {
    let found = running_on(config);
    if found.is_empty() {
        return 0;
    }
    warn!(
        config = %config.display(),
        pids = ?found.iter().map(|pid| pid.as_raw_nonzero()).collect::<Vec<_>>(),
        "HAProxy processes of an earlier run are still running on this configuration; \
         stopping them before starting HAProxy"
    );
    for pid in &found {
        let _ = rustix::process::kill_process(*pid, rustix::process::Signal::TERM);
    }
    let deadline = tokio::time::Instant::now() + patience;
    while !running_on(config).is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for pid in running_on(config) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
    while !running_on(config).is_empty() && tokio::time::Instant::now() < deadline + patience {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    found.len()
}
