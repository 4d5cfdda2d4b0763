//! A small async client for HAProxy's runtime API (the stats socket, a UNIX socket at
//! `level admin`).
//!
//! Each command opens a connection, sends one line (and, for `set ssl cert` and `add
//! ssl crt-list`, a payload ended by an empty line), and reads the answer until HAProxy
//! closes the connection (non-interactive mode). The CLI has no status codes: each
//! command's success is recognised by the message HAProxy prints for it (checked
//! against HAProxy 2.6).
//!
//! Payloads (certificates and keys) never appear in errors or logs: errors name the
//! command and the certificate only, and HAProxy's answer is dropped if it looks like
//! PEM.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use route_secrets::tls::SecretPem;

/// Largest answer read (a `show ssl crt-list` of 10,000 entries is well below).
const MAX_RESPONSE: u64 = 64 * 1024 * 1024;

/// A runtime API failure.
#[derive(Debug, thiserror::Error)]
pub enum HaproxyError {
    /// The socket could not be reached (HAProxy not running, wrong path, permissions).
    #[error("cannot connect to HAProxy's runtime API at {socket}: {source}")]
    Connect {
        /// The socket path.
        socket: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The connection failed while sending or reading.
    #[error("HAProxy runtime API: {command}: {source}")]
    Io {
        /// The command (without payload).
        command: String,
        /// The cause.
        source: std::io::Error,
    },
    /// No complete answer in time.
    #[error("HAProxy runtime API: {command}: no answer within {timeout:?}")]
    Timeout {
        /// The command (without payload).
        command: String,
        /// The limit.
        timeout: Duration,
    },
    /// HAProxy answered with an error.
    #[error("HAProxy runtime API: {command}: {message}")]
    Refused {
        /// The command (without payload).
        command: String,
        /// HAProxy's answer.
        message: String,
    },
    /// A payload that the line-based protocol cannot carry.
    #[error("HAProxy runtime API: {command}: {problem}")]
    BadPayload {
        /// The command.
        command: String,
        /// Why.
        problem: &'static str,
    },
}

/// HAProxy's process identity, to notice a restart or reload (its in-memory state is
/// then what its files were, not what was sent to the old process).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Instance {
    /// `Pid` of `show info`.
    pub pid: u32,
    /// Start time in Unix seconds, from `Uptime_sec` (±1 s).
    pub started: i64,
}

impl Instance {
    /// Whether `other` is the same process as `self` (start times within 2 s).
    pub fn same_as(&self, other: &Instance) -> bool {
        self.pid == other.pid && (self.started - other.started).abs() <= 2
    }
}

/// A crt-list line as `show ssl crt-list -n` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrtListLine {
    /// The certificate's name.
    pub name: String,
    /// Its line number (for `del ssl crt-list <list> <name>:<line>`).
    pub line: u32,
    /// Options and SNI filters, as written (empty when none).
    pub rest: String,
}

/// The runtime API at a UNIX socket.
#[derive(Clone, Debug)]
pub struct RuntimeApi {
    socket: PathBuf,
    timeout: Duration,
}

impl RuntimeApi {
    /// A client of the socket at `socket`; each command must complete within `timeout`.
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            socket: socket.into(),
            timeout,
        }
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Sends `command` (one line) with an optional payload and returns the answer.
    /// `label` names the command in errors (no payload, ever).
    async fn execute(
        &self,
        label: &str,
        command: &str,
        payload: Option<&str>,
    ) -> Result<String, HaproxyError> {
        let mut request = String::with_capacity(command.len() + payload.map_or(0, str::len) + 8);
        request.push_str(command);
        if let Some(payload) = payload {
            request.push_str(" <<\n");
            for line in payload.lines() {
                // An empty line ends a payload; PEM needs none.
                if !line.trim().is_empty() {
                    request.push_str(line);
                    request.push('\n');
                }
            }
        }
        request.push('\n');
        let exchange = async {
            let mut stream = UnixStream::connect(&self.socket).await.map_err(|source| {
                HaproxyError::Connect {
                    socket: self.socket.clone(),
                    source,
                }
            })?;
            let io = |source| HaproxyError::Io {
                command: label.to_owned(),
                source,
            };
            stream.write_all(request.as_bytes()).await.map_err(io)?;
            let mut answer = Vec::new();
            (&mut stream)
                .take(MAX_RESPONSE)
                .read_to_end(&mut answer)
                .await
                .map_err(io)?;
            Ok(String::from_utf8_lossy(&answer).into_owned())
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(HaproxyError::Timeout {
                command: label.to_owned(),
                timeout: self.timeout,
            }),
        }
    }

    /// Runs a command whose answer must contain one of `success` markers.
    async fn expect(
        &self,
        label: &str,
        command: &str,
        payload: Option<&str>,
        success: &[&str],
    ) -> Result<String, HaproxyError> {
        let answer = self.execute(label, command, payload).await?;
        if success.iter().any(|marker| answer.contains(marker)) {
            Ok(answer)
        } else {
            Err(HaproxyError::Refused {
                command: label.to_owned(),
                message: sanitize(&answer),
            })
        }
    }

    /// Runs a `show` command; an answer that reads as an error is refused.
    async fn show(&self, command: &str) -> Result<String, HaproxyError> {
        let answer = self.execute(command, command, None).await?;
        let first = answer.lines().next().unwrap_or("");
        let failed = [
            "Can't",
            "didn't find",
            "Unknown command",
            "Permission denied",
        ]
        .iter()
        .any(|marker| first.contains(marker));
        if failed {
            Err(HaproxyError::Refused {
                command: command.to_owned(),
                message: sanitize(&answer),
            })
        } else {
            Ok(answer)
        }
    }

    /// `show info`: the process identity.
    pub async fn instance(&self) -> Result<Instance, HaproxyError> {
        let answer = self.show("show info").await?;
        let field = |name: &str| {
            answer.lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key.trim() == name).then(|| value.trim().to_owned())
            })
        };
        let parsed = field("Pid")
            .and_then(|pid| pid.parse::<u32>().ok())
            .zip(field("Uptime_sec").and_then(|uptime| uptime.parse::<i64>().ok()));
        match parsed {
            Some((pid, uptime)) => Ok(Instance {
                pid,
                started: jiff::Timestamp::now().as_second() - uptime,
            }),
            None => Err(HaproxyError::Refused {
                command: "show info".to_owned(),
                message: "no Pid or Uptime_sec in the answer".to_owned(),
            }),
        }
    }

    /// `show ssl cert`: committed certificate names, and names with a transaction in
    /// progress.
    pub async fn certificates(&self) -> Result<(Vec<String>, Vec<String>), HaproxyError> {
        let answer = self.show("show ssl cert").await?;
        let mut committed = Vec::new();
        let mut transactions = Vec::new();
        for line in answer.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match line.strip_prefix('*') {
                Some(name) => transactions.push(name.to_owned()),
                None => committed.push(line.to_owned()),
            }
        }
        Ok((committed, transactions))
    }

    /// The SHA-1 fingerprint of the (server) certificate stored under `name`, from
    /// `show ssl cert <name>`; `None` for an empty store.
    pub async fn certificate_sha1(&self, name: &str) -> Result<Option<[u8; 20]>, HaproxyError> {
        let answer = self.show(&format!("show ssl cert {name}")).await?;
        Ok(answer.lines().find_map(|line| {
            let hex = line.trim().strip_prefix("SHA1 FingerPrint:")?.trim();
            parse_hex20(hex)
        }))
    }

    /// `show ssl crt-list -n <list>`: the list's lines.
    pub async fn crt_list(&self, list: &str) -> Result<Vec<CrtListLine>, HaproxyError> {
        let answer = self.show(&format!("show ssl crt-list -n {list}")).await?;
        Ok(answer
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .filter_map(|line| {
                let (head, rest) = line.split_once(' ').unwrap_or((line, ""));
                let (name, number) = head.rsplit_once(':')?;
                Some(CrtListLine {
                    name: name.to_owned(),
                    line: number.parse().ok()?,
                    rest: rest.trim().to_owned(),
                })
            })
            .collect())
    }

    /// `new ssl cert <name>`: an empty certificate store.
    pub async fn new_certificate(&self, name: &str) -> Result<(), HaproxyError> {
        self.expect(
            &format!("new ssl cert {name}"),
            &format!("new ssl cert {name}"),
            None,
            &["New empty certificate store"],
        )
        .await
        .map(drop)
    }

    /// `set ssl cert <name>` with `pem` (chain and key) as payload: opens or updates
    /// the certificate's transaction.
    pub async fn set_certificate(&self, name: &str, pem: &SecretPem) -> Result<(), HaproxyError> {
        let label = format!("set ssl cert {name}");
        self.expect(
            &label,
            &label,
            Some(pem.expose_secret()),
            &["Transaction created", "Transaction updated"],
        )
        .await
        .map(drop)
    }

    /// `commit ssl cert <name>`.
    pub async fn commit_certificate(&self, name: &str) -> Result<(), HaproxyError> {
        let command = format!("commit ssl cert {name}");
        self.expect(&command, &command, None, &["Success!"])
            .await
            .map(drop)
    }

    /// `abort ssl cert <name>`.
    pub async fn abort_certificate(&self, name: &str) -> Result<(), HaproxyError> {
        let command = format!("abort ssl cert {name}");
        self.expect(&command, &command, None, &["Transaction aborted"])
            .await
            .map(drop)
    }

    /// `add ssl crt-list <list>` with `line` as payload.
    pub async fn add_crt_list_line(&self, list: &str, line: &str) -> Result<(), HaproxyError> {
        let command = format!("add ssl crt-list {list}");
        let label = format!("{command} ({line})");
        self.expect(&label, &command, Some(line), &["Success!"])
            .await
            .map(drop)
    }

    /// `del ssl crt-list <list> <name>[:<line>]`.
    pub async fn delete_crt_list_entry(
        &self,
        list: &str,
        name: &str,
        line: Option<u32>,
    ) -> Result<(), HaproxyError> {
        let target = match line {
            Some(line) => format!("{name}:{line}"),
            None => name.to_owned(),
        };
        let command = format!("del ssl crt-list {list} {target}");
        self.expect(&command, &command, None, &["deleted in crtlist"])
            .await
            .map(drop)
    }

    /// `del ssl cert <name>` (it must be in no crt-list any more).
    pub async fn delete_certificate(&self, name: &str) -> Result<(), HaproxyError> {
        let command = format!("del ssl cert {name}");
        self.expect(&command, &command, None, &["deleted!"])
            .await
            .map(drop)
    }

    /// Runs payload-free commands (`set server ...`) on one connection, separated by
    /// `;` as the CLI reads them. Those commands answer nothing, or a line saying what
    /// changed, on success; any answer naming a problem fails the batch (the commands
    /// before it have run).
    pub async fn run_commands(&self, commands: &[String]) -> Result<(), HaproxyError> {
        // One request per 100 commands keeps each within HAProxy's line buffer.
        for batch in commands.chunks(100) {
            let line = batch.join("; ");
            let label = format!("{} ({} commands)", batch[0], batch.len());
            let answer = self.execute(&label, &line, None).await?;
            let failed = answer.lines().find(|line| {
                [
                    "No such",
                    "Require",
                    "Invalid",
                    "Unknown",
                    "Can't",
                    "cannot",
                    "not allowed",
                    "Permission denied",
                    "expects",
                ]
                .iter()
                .any(|marker| line.contains(marker))
            });
            if let Some(failed) = failed {
                return Err(HaproxyError::Refused {
                    command: label,
                    message: sanitize(failed),
                });
            }
        }
        Ok(())
    }
}

/// HAProxy's answer for an error message: one line, PEM-looking content dropped.
fn sanitize(answer: &str) -> String {
    if answer.contains("-----BEGIN") || answer.contains("PRIVATE KEY") {
        return "<answer withheld: it contained PEM material>".to_owned();
    }
    let text: Vec<&str> = answer
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    let text = text.join(" ");
    if text.is_empty() {
        "empty answer".to_owned()
    } else {
        text.chars().take(300).collect()
    }
}

fn parse_hex20(hex: &str) -> Option<[u8; 20]> {
    if hex.len() != 40 {
        return None;
    }
    let mut out = [0; 20];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_fingerprints_parse() {
        let parsed = parse_hex20("13689085248A2C3ED52E16F44FBCADD61D93D7A9").unwrap();
        assert_eq!(parsed[0], 0x13);
        assert_eq!(parsed[19], 0xA9);
        assert!(parse_hex20("1368").is_none());
    }

    #[test]
    fn pem_never_reaches_an_error() {
        assert!(!sanitize("bad -----BEGIN PRIVATE KEY----- abc").contains("abc"));
        assert_eq!(sanitize("Can't delete!\n\n"), "Can't delete!");
    }
}
