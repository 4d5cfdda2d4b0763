//! The parent's side of a client child process (`certwatch-lab bench-client`): one
//! strategy run in a process of its own, so that its memory and CPU figures are the
//! client's alone.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::BenchError;
use super::protocol::{ClientMessage, ClientSpec, MEASURE};

/// How long a child may take to exit once told to.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// A running client child.
pub struct ClientProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
}

impl ClientProcess {
    /// Starts `exe bench-client --spec <json>`, under `wrapper` (a command and its
    /// arguments, e.g. a profiler) when given.
    pub fn spawn(exe: &Path, spec: &ClientSpec, wrapper: &[String]) -> Result<Self, BenchError> {
        let spec = serde_json::to_string(spec).map_err(|e| BenchError::Client {
            message: format!("cannot encode the client's spec: {e}"),
        })?;
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(exe);
                command
            }
            None => Command::new(exe),
        };
        let mut child = command
            .arg("bench-client")
            .args(["--spec", &spec])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| BenchError::Io {
                what: format!("starting the client {}", exe.display()),
                source,
            })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or_else(|| BenchError::Client {
            message: "its standard output is not available".to_owned(),
        })?;
        Ok(Self {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// The child's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The child's next message, waiting at most `timeout`. Lines that are not JSON
    /// (a profiler wrapping the child may print some) are passed on to standard error.
    pub async fn next_message(&mut self, timeout: Duration) -> Result<ClientMessage, BenchError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.next_line())
                .await
                .map_err(|_| BenchError::Client {
                    message: format!("no answer within {timeout:?}"),
                })?
                .map_err(|source| BenchError::Io {
                    what: "reading the client's output".to_owned(),
                    source,
                })?;
            let Some(line) = line else {
                let status = self.child.wait().await.ok();
                return Err(BenchError::Client {
                    message: format!("it exited without an answer ({status:?})"),
                });
            };
            if !line.starts_with('{') {
                eprintln!("bench-client: {line}");
                continue;
            }
            return serde_json::from_str(&line).map_err(|e| BenchError::Client {
                message: format!("unexpected line {line:?}: {e}"),
            });
        }
    }

    /// Asks the child for its figures.
    pub async fn request_measurement(&mut self) -> Result<(), BenchError> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(BenchError::Client {
                message: "its standard input is closed".to_owned(),
            });
        };
        let line = format!("{MEASURE}\n");
        stdin
            .write_all(line.as_bytes())
            .await
            .and(stdin.flush().await)
            .map_err(|source| BenchError::Io {
                what: "writing to the client".to_owned(),
                source,
            })
    }

    /// Tells the child to exit (closes its input) and waits; kills it if it lingers.
    pub async fn finish(mut self) {
        drop(self.stdin.take());
        if tokio::time::timeout(EXIT_TIMEOUT, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}
