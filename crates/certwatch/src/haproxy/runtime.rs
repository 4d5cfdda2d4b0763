//! HAProxy's runtime API (the stats socket at `level admin`) over one persistent
//! connection, with commands pipelined.
//!
//! The connection is put in interactive mode (`prompt`), where HAProxy answers every
//! command, payload or not, and keeps the connection open: a batch of commands is
//! written in one go while their answers are read, in order. HAProxy ends each answer
//! with an empty line followed by its prompt (`\n> `), and an answer holds no empty
//! line followed by a prompt, so answers are told apart without knowing the commands;
//! a command with a payload is first answered with a `+ ` per line it took while the
//! payload was incomplete (HAProxy 2.6: one per line, the command line and each payload
//! line; 3.2.0: none for a payload that arrived whole).
//!
//! HAProxy 3.2.0 spins on a payload that arrived in pieces: while its end is still
//! to come, it prints `+ ` again and again instead of waiting, and when the rest waits
//! behind a full buffer it never reads it (a batch of 22 KiB of certificates written
//! in one go, against its 16 KiB buffer, was answered with `+ ` forever). On 3.2 and
//! later (`Version` of `show info`) a batch is therefore written in windows of at most
//! half of HAProxy's buffer, each once the previous one is answered: a window then
//! arrives whole in one of HAProxy's reads. A command longer than the window goes
//! alone.
//!
//! What HAProxy accepts in one request is bounded: the command line and its payload
//! must fit in one buffer (`tune.bufsize`, 16 KiB by default), and a longer request
//! makes HAProxy close the connection (losing every command pipelined behind it). The
//! buffer size is read when the connection opens (`show pools`), and a batch holding a
//! request that does not fit is refused before anything is sent
//! ([`RuntimeError::TooLarge`]), so one oversized certificate never costs the others
//! their commands. [`Connected::max_request`] tells callers the limit in advance.
//!
//! One task owns the connection. [`RuntimeClient`] handles (cheap to clone) queue
//! batches to it; queued batches are served in arrival order and several queued
//! batches go out in one write. A batch's [`BatchOutcome`] names the process that
//! answered it ([`Instance`]): knowledge of what HAProxy holds belongs to one process,
//! and a reload or restart starts another. When the connection breaks, the answers
//! read so far are returned with the error; the commands after them may or may not
//! have run, and the next batch opens a new connection.
//!
//! Payloads (certificates and keys) never appear in errors or logs: errors name the
//! command line only, and [`Reply`] texts that look like PEM are withheld by
//! [`Reply::summary`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::debug;

/// HAProxy's default `tune.bufsize`: the request limit assumed when `show pools` does
/// not say.
pub const DEFAULT_BUFSIZE: usize = 16_384;

/// Batches waiting for the connection task at most (senders wait beyond it).
const QUEUE: usize = 64;

/// Bytes of requests written in one go at most when several queued batches are joined.
const JOIN_LIMIT: usize = 4 * 1024 * 1024;

/// Bytes of HAProxy's buffer a request cannot use: the one `co_getline` keeps for the
/// terminating NUL (measured against HAProxy 2.6: a request of `tune.bufsize - 1` bytes
/// is answered, one of `tune.bufsize` is not).
const RESERVED: usize = 1;

/// The prompt HAProxy prints after each answer in interactive mode.
const PROMPT: &[u8] = b"\n> ";

/// A runtime API failure.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The socket could not be reached (HAProxy not running, wrong path, permissions).
    #[error("cannot connect to HAProxy's runtime API at {socket}: {source}")]
    Connect {
        /// The socket path.
        socket: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The connection failed while sending or reading.
    #[error("HAProxy runtime API at {socket}: {source} (after {answered} answers of the batch)")]
    Io {
        /// The socket path.
        socket: PathBuf,
        /// Answers read before the failure.
        answered: usize,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// HAProxy closed the connection before answering everything.
    #[error(
        "HAProxy runtime API at {socket}: the connection closed after {answered} answers of the batch (waiting for `{command}`)"
    )]
    Closed {
        /// The socket path.
        socket: PathBuf,
        /// Answers read before it closed.
        answered: usize,
        /// The first command left without an answer (its line, no payload).
        command: String,
    },
    /// No byte arrived for too long while answers were due.
    #[error("HAProxy runtime API at {socket}: no answer to `{command}` within {timeout:?}")]
    Timeout {
        /// The socket path.
        socket: PathBuf,
        /// The command waited for (its line, no payload).
        command: String,
        /// The limit.
        timeout: Duration,
    },
    /// HAProxy's answer could not be read.
    #[error("HAProxy runtime API at {socket}: {problem}")]
    Protocol {
        /// The socket path.
        socket: PathBuf,
        /// What was wrong.
        problem: String,
    },
    /// Another HAProxy process answered during a batch than the one that answered
    /// before it (a restart or a reload): nothing it said is about what was known.
    #[error("HAProxy runtime API at {socket}: HAProxy's process changed during a batch")]
    ProcessChanged {
        /// The socket path.
        socket: PathBuf,
    },
    /// A request longer than HAProxy's buffer; nothing of the batch was sent.
    #[error(
        "HAProxy runtime API: `{command}` needs {size} bytes, more than HAProxy's CLI takes in one request ({limit} bytes: tune.bufsize); nothing of its batch was sent"
    )]
    TooLarge {
        /// The command's line (no payload).
        command: String,
        /// Its size as a request.
        size: usize,
        /// The most HAProxy takes.
        limit: usize,
    },
    /// A command line that the CLI cannot carry.
    #[error("HAProxy runtime API: invalid command line `{command}`: {problem}")]
    Invalid {
        /// The line.
        command: String,
        /// Why.
        problem: &'static str,
    },
    /// The connection task is gone (the client is shutting down).
    #[error("HAProxy runtime API: the connection task stopped")]
    Stopped,
}

impl RuntimeError {
    /// The same error for another waiter (I/O causes keep their kind and message).
    fn duplicate(&self) -> Self {
        let io = |source: &std::io::Error| std::io::Error::new(source.kind(), source.to_string());
        match self {
            Self::Connect { socket, source } => Self::Connect {
                socket: socket.clone(),
                source: io(source),
            },
            Self::Io {
                socket,
                answered,
                source,
            } => Self::Io {
                socket: socket.clone(),
                answered: *answered,
                source: io(source),
            },
            Self::Closed {
                socket,
                answered,
                command,
            } => Self::Closed {
                socket: socket.clone(),
                answered: *answered,
                command: command.clone(),
            },
            Self::Timeout {
                socket,
                command,
                timeout,
            } => Self::Timeout {
                socket: socket.clone(),
                command: command.clone(),
                timeout: *timeout,
            },
            Self::Protocol { socket, problem } => Self::Protocol {
                socket: socket.clone(),
                problem: problem.clone(),
            },
            Self::ProcessChanged { socket } => Self::ProcessChanged {
                socket: socket.clone(),
            },
            Self::TooLarge {
                command,
                size,
                limit,
            } => Self::TooLarge {
                command: command.clone(),
                size: *size,
                limit: *limit,
            },
            Self::Invalid { command, problem } => Self::Invalid {
                command: command.clone(),
                problem,
            },
            Self::Stopped => Self::Stopped,
        }
    }
}

/// A command's payload: the lines after `<<`, ended by an empty line. Its `Debug`
/// shows its size only: payloads carry keys.
#[derive(Clone, PartialEq, Eq)]
pub struct Payload(String);

impl Payload {
    /// A payload of `text`. Empty lines are dropped when it is sent (an empty line
    /// would end it early); PEM has none that matter.
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    fn lines(&self) -> impl Iterator<Item = &str> {
        self.0.lines().filter(|line| !line.trim().is_empty())
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payload({} bytes)", self.0.len())
    }
}

/// One runtime API command: a line, and optionally a payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    line: String,
    payload: Option<Payload>,
}

impl Command {
    /// A command without payload. A `;` or `\` in it is escaped when sent (the CLI
    /// reads `;` as a command separator).
    pub fn new(line: impl Into<String>) -> Self {
        Self {
            line: line.into(),
            payload: None,
        }
    }

    /// A command with `payload` (sent after ` <<`).
    pub fn with_payload(line: impl Into<String>, payload: Payload) -> Self {
        Self {
            line: line.into(),
            payload: Some(payload),
        }
    }

    /// The command line (never the payload): what errors and logs show.
    pub fn line(&self) -> &str {
        &self.line
    }

    /// The payload's text (tests model HAProxy's answers to it).
    #[cfg(test)]
    pub(crate) fn payload_text(&self) -> Option<&str> {
        self.payload.as_ref().map(|payload| payload.0.as_str())
    }

    fn escaped_line(&self) -> String {
        let mut out = String::with_capacity(self.line.len() + 4);
        for c in self.line.chars() {
            if c == ';' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        if self.payload.is_some() {
            out.push_str(" <<");
        }
        out
    }

    /// How many bytes the command takes as a request (its line, its payload lines and
    /// the empty line ending them): compare with [`Connected::max_request`].
    pub fn request_size(&self) -> usize {
        let line = self.escaped_line().len() + 1;
        let payload = self.payload.as_ref().map_or(0, |payload| {
            payload.lines().map(|l| l.len() + 1).sum::<usize>() + 1
        });
        line + payload
    }

    /// `+ ` prompts HAProxy prints before the answer: one per line taken in.
    fn continuation_prompts(&self) -> usize {
        self.payload
            .as_ref()
            .map_or(0, |payload| 1 + payload.lines().count())
    }

    fn check(&self) -> Result<(), RuntimeError> {
        let problem = if self.line.contains(['\n', '\r']) {
            Some("it spans lines")
        } else if self.line.trim().is_empty() {
            Some("it is empty")
        } else if self.line.trim_end().ends_with("<<") {
            Some("it ends with the payload marker")
        } else {
            None
        };
        match problem {
            Some(problem) => Err(RuntimeError::Invalid {
                command: self.line.clone(),
                problem,
            }),
            None => Ok(()),
        }
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.escaped_line().as_bytes());
        out.push(b'\n');
        if let Some(payload) = &self.payload {
            for line in payload.lines() {
                out.extend_from_slice(line.as_bytes());
                out.push(b'\n');
            }
            out.push(b'\n');
        }
    }
}

/// HAProxy's answer to one command, without the prompts.
#[derive(Clone, PartialEq, Eq)]
pub struct Reply(String);

impl Reply {
    /// An answer of `text` (for tests of what reads answers).
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The answer's text (lines ending with `\n`; empty for commands that print
    /// nothing).
    pub fn text(&self) -> &str {
        &self.0
    }

    /// Whether the answer contains `marker`.
    pub fn contains(&self, marker: &str) -> bool {
        self.0.contains(marker)
    }

    /// The answer on one line for an error message: PEM-looking content withheld,
    /// at most 300 characters.
    pub fn summary(&self) -> String {
        summarize(&self.0)
    }
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reply({:?})", self.summary())
    }
}

/// An answer on one line: PEM-looking content withheld, at most 300 characters.
pub fn summarize(answer: &str) -> String {
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

/// HAProxy's process identity, to notice a restart or reload (its in-memory state is
/// then what its files were, not what was sent to the old process).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Instance {
    /// `Pid` of `show info`.
    pub pid: u32,
    /// `Start_time_sec` of `show info` (Unix seconds).
    pub started: i64,
}

/// The connection's process and limits, learnt when it opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connected {
    /// The process answering.
    pub instance: Instance,
    /// HAProxy's buffer size (`tune.bufsize`, from `show pools`).
    pub bufsize: usize,
    /// The largest [`Command::request_size`] HAProxy takes.
    pub max_request: usize,
}

/// What a batch got.
#[derive(Debug)]
pub struct BatchOutcome {
    /// The answers, in command order. Fewer than the commands when `error` is set:
    /// the commands after the last answer may or may not have run.
    pub replies: Vec<Reply>,
    /// Why the batch did not complete.
    pub error: Option<RuntimeError>,
    /// The process that answered (`None` when no connection could be opened).
    pub connected: Option<Connected>,
}

impl BatchOutcome {
    /// Whether every command was answered.
    pub fn complete(&self) -> bool {
        self.error.is_none()
    }
}

/// Settings of the runtime API client.
#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    /// The stats socket (`stats socket PATH level admin`).
    pub socket: PathBuf,
    /// How long the connection may stay silent while answers are due (also the
    /// deadline of opening it).
    pub timeout: Duration,
}

impl RuntimeOptions {
    /// Defaults for the socket at `socket`: 10 s without an answer is a failure.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            timeout: Duration::from_secs(10),
        }
    }
}

struct Job {
    commands: Vec<Command>,
    reply: oneshot::Sender<BatchOutcome>,
}

enum Control {
    Job(Job),
    /// Close the connection (the process behind it is not HAProxy's current one).
    Reconnect,
}

/// A handle on the connection task; cheap to clone. The task ends when the last
/// handle is dropped.
#[derive(Clone, Debug)]
pub struct RuntimeClient {
    jobs: mpsc::Sender<Control>,
    connected: watch::Receiver<Option<Connected>>,
    socket: PathBuf,
}

impl RuntimeClient {
    /// Starts the connection task. Nothing is connected until the first batch.
    pub fn spawn(options: RuntimeOptions) -> Self {
        let (jobs, receiver) = mpsc::channel(QUEUE);
        let (connected_tx, connected) = watch::channel(None);
        let socket = options.socket.clone();
        tokio::spawn(
            Task {
                options,
                connection: None,
                connected: connected_tx,
            }
            .run(receiver),
        );
        Self {
            jobs,
            connected,
            socket,
        }
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The open connection's process and limits, if one is open.
    pub fn connected(&self) -> Option<Connected> {
        *self.connected.borrow()
    }

    /// Runs `commands` in order over the connection (opening it if needed) and returns
    /// their answers. A batch is never split or interleaved with another.
    pub async fn execute(&self, commands: Vec<Command>) -> BatchOutcome {
        let (reply, answer) = oneshot::channel();
        if self
            .jobs
            .send(Control::Job(Job { commands, reply }))
            .await
            .is_err()
        {
            return stopped();
        }
        answer.await.unwrap_or_else(|_| stopped())
    }

    /// Runs one command; its answer, or the error.
    pub async fn execute_one(&self, command: Command) -> Result<(Reply, Connected), RuntimeError> {
        let mut outcome = self.execute(vec![command]).await;
        match (outcome.replies.pop(), outcome.error, outcome.connected) {
            (Some(reply), None, Some(connected)) => Ok((reply, connected)),
            (_, Some(error), _) => Err(error),
            _ => Err(RuntimeError::Stopped),
        }
    }

    /// Closes the connection after the batches queued before this call: the next batch
    /// opens a new one (after a reload, to reach the new process).
    pub async fn reconnect(&self) {
        let _ = self.jobs.send(Control::Reconnect).await;
    }
}

fn stopped() -> BatchOutcome {
    BatchOutcome {
        replies: Vec::new(),
        error: Some(RuntimeError::Stopped),
        connected: None,
    }
}

/// The identity of the process answering a fresh connection at `socket` (one
/// `show info`, connection closed after it): to tell whether a persistent connection
/// still reaches HAProxy's current process.
pub async fn current_instance(socket: &Path, timeout: Duration) -> Result<Instance, RuntimeError> {
    let answer = one_shot(socket, "show info", timeout).await?;
    parse_instance(&answer).ok_or_else(|| RuntimeError::Protocol {
        socket: socket.to_owned(),
        problem: "no Pid or Start_time_sec in the answer to show info".to_owned(),
    })
}

/// Sends one command on a connection of its own in non-interactive mode and reads the
/// answer until HAProxy closes the connection (after half-closing ours). For the master
/// CLI and for checks outside the persistent connection.
pub async fn one_shot(
    socket: &Path,
    line: &str,
    timeout: Duration,
) -> Result<String, RuntimeError> {
    let exchange = async {
        let mut stream =
            UnixStream::connect(socket)
                .await
                .map_err(|source| RuntimeError::Connect {
                    socket: socket.to_owned(),
                    source,
                })?;
        let io = |source| RuntimeError::Io {
            socket: socket.to_owned(),
            answered: 0,
            source,
        };
        stream
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(io)?;
        stream.shutdown().await.map_err(io)?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.map_err(io)?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or_else(|_| {
            Err(RuntimeError::Timeout {
                socket: socket.to_owned(),
                command: line.to_owned(),
                timeout,
            })
        })
}

/// HAProxy's major and minor version from a `show info` answer (`Version: 3.2.0-...`).
pub fn parse_version(answer: &str) -> Option<(u32, u32)> {
    major_minor(info_field(answer, "Version")?)
}

/// The major and minor of an HAProxy version string (`3.2.0-e134140d2`,
/// `2.6.12-1+deb12u2`).
pub fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// `Pid` and `Start_time_sec` of a `show info` answer.
pub fn parse_instance(answer: &str) -> Option<Instance> {
    Some(Instance {
        pid: info_field(answer, "Pid")?.parse().ok()?,
        started: info_field(answer, "Start_time_sec")?.parse().ok()?,
    })
}

/// The value of the `name: value` line `name` of a `show info` answer.
fn info_field<'a>(answer: &'a str, name: &str) -> Option<&'a str> {
    answer.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == name).then(|| value.trim())
    })
}

/// `tune.bufsize` from a `show pools` answer (the `buffer` pool's size).
pub fn parse_bufsize(answer: &str) -> Option<usize> {
    answer.lines().find_map(|line| {
        let rest = line.trim().strip_prefix("- Pool buffer (")?;
        rest.split_once(" bytes)")?.0.parse().ok()
    })
}

struct Connection {
    reader: OwnedReadHalf,
    writer: OwnedWriteHalf,
    /// Bytes read and not yet parsed into answers.
    pending: Vec<u8>,
    connected: Connected,
    /// Bytes of requests written in one go before their answers are read: a whole
    /// batch before HAProxy 3.2, half of HAProxy's buffer from 3.2 on (see the
    /// [module documentation](self)).
    window: usize,
}

struct Task {
    options: RuntimeOptions,
    connection: Option<Connection>,
    connected: watch::Sender<Option<Connected>>,
}

impl Task {
    async fn run(mut self, mut jobs: mpsc::Receiver<Control>) {
        while let Some(control) = jobs.recv().await {
            let first = match control {
                Control::Job(job) => job,
                Control::Reconnect => {
                    self.close();
                    continue;
                }
            };
            // Batches queued meanwhile go out in the same write, in order.
            let mut batch = vec![first];
            let mut size: usize = batch[0].commands.iter().map(Command::request_size).sum();
            let mut reconnect_after = false;
            while size < JOIN_LIMIT {
                match jobs.try_recv() {
                    Ok(Control::Job(job)) => {
                        size += job
                            .commands
                            .iter()
                            .map(Command::request_size)
                            .sum::<usize>();
                        batch.push(job);
                    }
                    Ok(Control::Reconnect) => {
                        reconnect_after = true;
                        break;
                    }
                    Err(_) => break,
                }
            }
            self.serve(batch).await;
            if reconnect_after {
                self.close();
            }
        }
        self.close();
    }

    fn close(&mut self) {
        if self.connection.take().is_some() {
            debug!(socket = %self.options.socket.display(), "closed the runtime API connection");
        }
        self.connected.send_replace(None);
    }

    async fn serve(&mut self, jobs: Vec<Job>) {
        // Refused before anything is sent: a job with an invalid or oversized command
        // (an oversized request makes HAProxy drop the connection, and every command
        // pipelined behind it).
        let mut runnable = Vec::with_capacity(jobs.len());
        for job in jobs {
            if let Some(error) = job
                .commands
                .iter()
                .find_map(|command| command.check().err())
            {
                let _ = job.reply.send(BatchOutcome {
                    replies: Vec::new(),
                    error: Some(error),
                    connected: self.connection.as_ref().map(|c| c.connected),
                });
                continue;
            }
            runnable.push(job);
        }
        if runnable.is_empty() {
            return;
        }
        if self.connection.is_none() {
            match Connection::open(&self.options).await {
                Ok(connection) => {
                    debug!(
                        socket = %self.options.socket.display(),
                        pid = connection.connected.instance.pid,
                        bufsize = connection.connected.bufsize,
                        "runtime API connection open"
                    );
                    self.connected.send_replace(Some(connection.connected));
                    self.connection = Some(connection);
                }
                Err(error) => {
                    for job in runnable {
                        let _ = job.reply.send(BatchOutcome {
                            replies: Vec::new(),
                            error: Some(error.duplicate()),
                            connected: None,
                        });
                    }
                    return;
                }
            }
        }
        let Some(connection) = self.connection.as_mut() else {
            return;
        };
        let connected = connection.connected;
        let mut sendable = Vec::with_capacity(runnable.len());
        for job in runnable {
            let oversized = job
                .commands
                .iter()
                .find(|command| command.request_size() > connected.max_request);
            if let Some(command) = oversized {
                let _ = job.reply.send(BatchOutcome {
                    replies: Vec::new(),
                    error: Some(RuntimeError::TooLarge {
                        command: command.line.clone(),
                        size: command.request_size(),
                        limit: connected.max_request,
                    }),
                    connected: Some(connected),
                });
                continue;
            }
            sendable.push(job);
        }
        if sendable.is_empty() {
            return;
        }
        let commands: Vec<&Command> = sendable.iter().flat_map(|job| &job.commands).collect();
        let (mut replies, error) = connection.exchange(&self.options, &commands).await;
        let broken = error.is_some();
        let mut error = error;
        for job in sendable {
            let wanted = job.commands.len();
            let taken: Vec<Reply> = replies.drain(..wanted.min(replies.len())).collect();
            let job_error = if taken.len() == wanted {
                None
            } else {
                // The first job left short gets the error; later ones learn that the
                // connection broke before their turn.
                Some(error.take().unwrap_or_else(|| {
                    RuntimeError::Closed {
                        socket: self.options.socket.clone(),
                        answered: taken.len(),
                        command: job
                            .commands
                            .get(taken.len())
                            .map(|command| command.line.clone())
                            .unwrap_or_default(),
                    }
                }))
            };
            let _ = job.reply.send(BatchOutcome {
                replies: taken,
                error: job_error,
                connected: Some(connected),
            });
        }
        if broken {
            self.close();
        }
    }
}

impl Connection {
    async fn open(options: &RuntimeOptions) -> Result<Self, RuntimeError> {
        let socket = &options.socket;
        let stream = tokio::time::timeout(options.timeout, UnixStream::connect(socket))
            .await
            .map_err(|_| RuntimeError::Timeout {
                socket: socket.clone(),
                command: "connect".to_owned(),
                timeout: options.timeout,
            })?
            .map_err(|source| RuntimeError::Connect {
                socket: socket.clone(),
                source,
            })?;
        let (reader, writer) = stream.into_split();
        let mut connection = Self {
            reader,
            writer,
            pending: Vec::new(),
            connected: Connected {
                instance: Instance { pid: 0, started: 0 },
                bufsize: DEFAULT_BUFSIZE,
                max_request: DEFAULT_BUFSIZE,
            },
            window: usize::MAX,
        };
        // `prompt` must come first on the connection; its own answer is an empty one.
        // The CLI's idle timeout (`stats timeout`, 10 s by default) would close a
        // connection that waits between batches.
        let opening = [
            Command::new("prompt"),
            Command::new("set timeout cli 1d"),
            Command::new("show info"),
            Command::new("show pools"),
        ];
        let commands: Vec<&Command> = opening.iter().collect();
        let (replies, error) = connection.exchange(options, &commands).await;
        if let Some(error) = error {
            return Err(error);
        }
        let protocol = |problem: String| RuntimeError::Protocol {
            socket: socket.clone(),
            problem,
        };
        let instance = replies
            .get(2)
            .and_then(|reply| parse_instance(reply.text()))
            .ok_or_else(|| {
                protocol(format!(
                    "no Pid in the answer to show info: {}",
                    replies.get(2).map(Reply::summary).unwrap_or_default()
                ))
            })?;
        if let Some(reply) = replies.get(1).filter(|reply| !reply.text().is_empty()) {
            return Err(protocol(format!(
                "set timeout cli refused (is the socket at level admin?): {}",
                reply.summary()
            )));
        }
        let bufsize = replies
            .get(3)
            .and_then(|reply| parse_bufsize(reply.text()))
            .unwrap_or(DEFAULT_BUFSIZE);
        connection.connected = Connected {
            instance,
            bufsize,
            max_request: bufsize.saturating_sub(RESERVED),
        };
        connection.window = match replies.get(2).and_then(|reply| parse_version(reply.text())) {
            Some(version) if version < (3, 2) => usize::MAX,
            _ => bufsize / 2,
        };
        Ok(connection)
    }

    /// Writes `commands` and reads their answers, window by window (see
    /// [`Connection::window`]).
    async fn exchange(
        &mut self,
        options: &RuntimeOptions,
        commands: &[&Command],
    ) -> (Vec<Reply>, Option<RuntimeError>) {
        let mut replies = Vec::with_capacity(commands.len());
        for window in windows(commands, self.window) {
            let (answered, error) = self.exchange_together(options, window).await;
            replies.extend(answered);
            if let Some(error) = error {
                return (replies, Some(error));
            }
        }
        (replies, None)
    }

    /// Writes `commands` in one go while reading their answers.
    async fn exchange_together(
        &mut self,
        options: &RuntimeOptions,
        commands: &[&Command],
    ) -> (Vec<Reply>, Option<RuntimeError>) {
        let mut request = Vec::with_capacity(commands.iter().map(|c| c.request_size()).sum());
        for command in commands {
            command.encode_into(&mut request);
        }
        let socket = options.socket.clone();
        let write = {
            let writer = &mut self.writer;
            let socket = socket.clone();
            async move {
                writer
                    .write_all(&request)
                    .await
                    .map_err(|source| RuntimeError::Io {
                        socket,
                        answered: 0,
                        source,
                    })
            }
        };
        let read = read_replies(
            &mut self.reader,
            &mut self.pending,
            commands,
            &socket,
            options.timeout,
        );
        tokio::pin!(write, read);
        let mut written = false;
        loop {
            tokio::select! {
                result = &mut write, if !written => {
                    written = true;
                    if let Err(error) = result {
                        // Answers to what got through may still come; the read tells
                        // how many. A write error with every answer read cannot be.
                        debug!(%error, "runtime API write failed");
                    }
                }
                (replies, error) = &mut read => return (replies, error),
            }
        }
    }
}

/// `commands` cut, in order, into runs of at most `window` request bytes; a command
/// longer than `window` is a run of its own.
fn windows<'a, 'c>(
    commands: &'a [&'c Command],
    window: usize,
) -> impl Iterator<Item = &'a [&'c Command]> {
    let mut rest = commands;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut size = 0usize;
        let taken = rest
            .iter()
            .take_while(|command| {
                size = size.saturating_add(command.request_size());
                size <= window
            })
            .count()
            .max(1);
        let (run, after) = rest.split_at(taken);
        rest = after;
        Some(run)
    })
}

/// Reads one answer per command (see the [module documentation](self)).
async fn read_replies(
    reader: &mut OwnedReadHalf,
    pending: &mut Vec<u8>,
    commands: &[&Command],
    socket: &Path,
    timeout: Duration,
) -> (Vec<Reply>, Option<RuntimeError>) {
    let mut replies = Vec::with_capacity(commands.len());
    let mut chunk = vec![0u8; 64 * 1024];
    for command in commands {
        let prompts = command.continuation_prompts();
        // Where the search for the answer's end resumes: a long answer (`show ssl
        // crt-list` of 10,000 lines) arrives in many reads, and is scanned once.
        let mut searched = 0;
        loop {
            match parse_reply_from(pending, prompts, searched) {
                Ok(Some((reply, used))) => {
                    pending.drain(..used);
                    replies.push(reply);
                    break;
                }
                Ok(None) => searched = pending.len(),
                Err(problem) => {
                    let error = RuntimeError::Protocol {
                        socket: socket.to_owned(),
                        problem: format!("{problem} (answering `{}`)", command.line),
                    };
                    return (replies, Some(error));
                }
            }
            match tokio::time::timeout(timeout, reader.read(&mut chunk)).await {
                Err(_) => {
                    let error = RuntimeError::Timeout {
                        socket: socket.to_owned(),
                        command: command.line.clone(),
                        timeout,
                    };
                    return (replies, Some(error));
                }
                Ok(Ok(0)) => {
                    let error = RuntimeError::Closed {
                        socket: socket.to_owned(),
                        answered: replies.len(),
                        command: command.line.clone(),
                    };
                    return (replies, Some(error));
                }
                Ok(Ok(read)) => pending.extend_from_slice(&chunk[..read]),
                Ok(Err(source)) => {
                    let error = RuntimeError::Io {
                        socket: socket.to_owned(),
                        answered: replies.len(),
                        source,
                    };
                    return (replies, Some(error));
                }
            }
        }
    }
    (replies, None)
}

/// One answer from the start of `buffer`, after `prompts` continuation prompts:
/// `Ok(None)` until it is complete; the answer and the bytes it took.
#[cfg(test)]
fn parse_reply(buffer: &[u8], prompts: usize) -> Result<Option<(Reply, usize)>, String> {
    parse_reply_from(buffer, prompts, 0)
}

/// [`parse_reply`], knowing that the first `searched` bytes of `buffer` hold no end of
/// the answer (they were looked at before more arrived).
fn parse_reply_from(
    buffer: &[u8],
    prompts: usize,
    searched: usize,
) -> Result<Option<(Reply, usize)>, String> {
    let mut start = 0;
    for _ in 0..prompts {
        let rest = &buffer[start..];
        if rest.len() < 2 && b"+ ".starts_with(rest) {
            // Too short to tell a prompt from the answer's start.
            return Ok(None);
        }
        if !rest.starts_with(b"+ ") {
            break;
        }
        start += 2;
    }
    if buffer[start..].starts_with(b"+ ") {
        return Err(format!(
            "more payload prompts than the {prompts} lines sent, then {:?}",
            summarize(&String::from_utf8_lossy(
                &buffer[start..buffer.len().min(start + 80)]
            ))
        ));
    }
    let body = &buffer[start..];
    // The answer ends at the first prompt that starts a line: at the very start (an
    // empty answer) or right after a line's end (an empty line, which answers never
    // contain, then the prompt). A prompt may straddle the bytes searched before, and
    // the byte before it matters: the search goes back a little.
    let mut from = searched.saturating_sub(start + PROMPT.len() + 1);
    while let Some(found) = find(&body[from..], PROMPT) {
        let at = from + found;
        if at == 0 || body[at - 1] == b'\n' {
            let text = String::from_utf8_lossy(&body[..at]).into_owned();
            return Ok(Some((Reply(text), start + at + PROMPT.len())));
        }
        from = at + 1;
    }
    Ok(None)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_split_at_their_prompts() {
        let stream = b"\n> \n> Name: HAProxy\nPid: 12\nStart_time_sec: 99\n\n> No ongoing transaction!\n\n> ";
        let (first, used) = parse_reply(stream, 0).unwrap().unwrap();
        assert_eq!(first.text(), "");
        let rest = &stream[used..];
        let (second, used2) = parse_reply(rest, 0).unwrap().unwrap();
        assert_eq!(second.text(), "");
        let rest = &rest[used2..];
        let (third, used3) = parse_reply(rest, 0).unwrap().unwrap();
        assert_eq!(
            parse_instance(third.text()),
            Some(Instance {
                pid: 12,
                started: 99
            })
        );
        let rest = &rest[used3..];
        let (fourth, used4) = parse_reply(rest, 0).unwrap().unwrap();
        assert_eq!(fourth.text(), "No ongoing transaction!\n");
        assert_eq!(used4, rest.len());
    }

    #[test]
    fn an_answer_is_incomplete_until_its_prompt() {
        assert!(parse_reply(b"Success!\n", 0).unwrap().is_none());
        assert!(parse_reply(b"Success!\n\n", 0).unwrap().is_none());
        assert!(parse_reply(b"+ + ", 3).unwrap().is_none());
        // A "> " inside a line is not a prompt.
        assert!(parse_reply(b"a\n> b\n", 0).unwrap().is_none());
    }

    #[test]
    fn a_resumed_search_finds_the_same_end() {
        // `searched` is the length of an earlier read that held no complete end.
        let stream = b"line one\nline two\n\n> next";
        for searched in 0..=20 {
            let (reply, used) = parse_reply_from(stream, 0, searched).unwrap().unwrap();
            assert_eq!(reply.text(), "line one\nline two\n", "{searched}");
            assert_eq!(used, stream.len() - 4);
        }
        let with_prompts = b"+ + Success!\n\n> ";
        for searched in 0..with_prompts.len() - 1 {
            let (reply, _) = parse_reply_from(with_prompts, 2, searched)
                .unwrap()
                .unwrap();
            assert_eq!(reply.text(), "Success!\n");
        }
    }

    #[test]
    fn payload_prompts_come_first() {
        let stream = b"+ + + Transaction created for certificate x!\n\n> ";
        let (reply, used) = parse_reply(stream, 3).unwrap().unwrap();
        assert_eq!(reply.text(), "Transaction created for certificate x!\n");
        assert_eq!(used, stream.len());
        // HAProxy 3.2 prints fewer when the payload arrived in fewer reads; never more.
        for stream in [&b"+ Done!\n\n> "[..], b"Done!\n\n> "] {
            let (reply, used) = parse_reply(stream, 3).unwrap().unwrap();
            assert_eq!((reply.text(), used), ("Done!\n", stream.len()));
        }
        assert!(parse_reply(b"+ + + Transaction", 2).is_err());
        assert!(parse_reply(b"+ Done!\n\n> ", 0).is_err());
        assert!(parse_reply(b"+ +", 3).unwrap().is_none());
    }

    /// What a [`serve_like_haproxy_3_2`] socket saw: the size of each read and the
    /// commands each completed.
    #[derive(Debug, Default)]
    struct Reads {
        bytes: Vec<usize>,
        commands: Vec<usize>,
    }

    /// A stats socket answering as HAProxy 3.2.0's CLI does (src/cli.c at v3.2.0, and
    /// measured against the real 3.2.0): it reads at most its buffer (16 KiB) at a
    /// time; in prompt mode every answer is followed by `\n> `, commands that arrived
    /// together included; a payload that arrived whole gets no `+ `, and one left
    /// incomplete by a read makes it spin, printing `+ ` over and over. Answers as 3.2
    /// words them. Returns what it read once the client leaves.
    async fn serve_like_haproxy_3_2(listener: tokio::net::UnixListener) -> Reads {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut input = Vec::new();
        let mut chunk = vec![0u8; DEFAULT_BUFSIZE];
        let mut prompt = false;
        let mut reads = Reads::default();
        loop {
            let read = stream.read(&mut chunk).await.unwrap();
            if read == 0 {
                return reads;
            }
            input.extend_from_slice(&chunk[..read]);
            let mut out = Vec::new();
            let mut completed = 0;
            // Every complete command (a payload ends at an empty line) in the input.
            while let Some(line_end) = input.iter().position(|&b| b == b'\n') {
                let line = String::from_utf8(input[..line_end].to_vec()).unwrap();
                let mut used = line_end + 1;
                if line.ends_with(" <<") {
                    match find(&input[used..], b"\n\n") {
                        Some(end) => used += end + 2,
                        None => {
                            out.extend_from_slice("+ ".repeat(1000).as_bytes());
                            break;
                        }
                    }
                }
                input.drain(..used);
                completed += 1;
                let name = line.split(' ').nth(3).unwrap_or_default().to_owned();
                let answer = match line.trim_end_matches(" <<") {
                    "prompt" => {
                        prompt = true;
                        String::new()
                    }
                    "set timeout cli 1d" => String::new(),
                    "show info" => {
                        "Name: HAProxy\nVersion: 3.2.0-test\nPid: 42\nStart_time_sec: 7\n"
                            .to_owned()
                    }
                    "show pools" => "  - Pool buffer (16384 bytes) : 3 allocated\n".to_owned(),
                    set if set.starts_with("set ssl cert ") => {
                        format!("Transaction created for certificate {name}!\n")
                    }
                    commit if commit.starts_with("commit ssl cert ") => {
                        format!("Committing {name}\nSuccess!\n")
                    }
                    _ => "Unknown command.\n".to_owned(),
                };
                out.extend_from_slice(answer.as_bytes());
                out.extend_from_slice(if prompt { b"\n> " } else { b"\n" });
            }
            reads.bytes.push(read);
            reads.commands.push(completed);
            stream.write_all(&out).await.unwrap();
        }
    }

    /// A runtime client of a [`serve_like_haproxy_3_2`] socket in a directory of its own
    /// (kept as long as the first element lives), and the socket's task.
    fn client_of_a_3_2_socket() -> (
        tempfile::TempDir,
        RuntimeClient,
        tokio::task::JoinHandle<Reads>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("stats.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let server = tokio::spawn(serve_like_haproxy_3_2(listener));
        let client = RuntimeClient::spawn(RuntimeOptions::new(&socket));
        (dir, client, server)
    }

    #[tokio::test]
    async fn a_haproxy_3_2_gets_a_batch_in_windows_of_half_its_buffer() {
        let (_dir, client, server) = client_of_a_3_2_socket();
        // 30 bundles of about 1.5 KiB: 45 KiB in all, about 5 certificates a window.
        let body = "A".repeat(64);
        let pem = Payload::new(format!(
            "-----BEGIN CERTIFICATE-----\n{}-----END CERTIFICATE-----\n",
            format!("{body}\n").repeat(22)
        ));
        let names: Vec<String> = (0..30).map(|n| format!("/certs/{n}.pem")).collect();
        let mut commands = Vec::new();
        for name in &names {
            commands.push(Command::with_payload(
                format!("set ssl cert {name}"),
                pem.clone(),
            ));
            commands.push(Command::new(format!("commit ssl cert {name}")));
        }
        let outcome = client.execute(commands).await;
        assert!(outcome.error.is_none(), "{:?}", outcome.error);
        let texts: Vec<&str> = outcome.replies.iter().map(Reply::text).collect();
        let expected: Vec<String> = names
            .iter()
            .flat_map(|name| {
                [
                    format!("Transaction created for certificate {name}!\n"),
                    format!("Committing {name}\nSuccess!\n"),
                ]
            })
            .collect();
        assert_eq!(texts, expected);
        assert_eq!(outcome.connected.map(|c| c.instance.pid), Some(42));
        drop(client);
        let reads = server.await.unwrap();
        // The opening commands in one read, then the batch in windows of at most half
        // the buffer, each read whole: several commands a read, never one cut.
        assert_eq!(reads.commands[0], 4, "{reads:?}");
        let batch_reads = &reads.bytes[1..];
        assert!(
            batch_reads
                .iter()
                .all(|&bytes| bytes <= DEFAULT_BUFSIZE / 2),
            "{reads:?}"
        );
        assert_eq!(reads.commands[1..].iter().sum::<usize>(), 60, "{reads:?}");
        assert!(batch_reads.len() < 20, "{reads:?}");
    }

    #[tokio::test]
    async fn a_command_longer_than_the_window_goes_alone() {
        let (_dir, client, server) = client_of_a_3_2_socket();
        // 12 KiB: more than half the buffer, less than all of it.
        let pem = Payload::new(format!("{}\n", "B".repeat(64)).repeat(190));
        let commands = vec![
            Command::new("commit ssl cert /before.pem"),
            Command::with_payload("set ssl cert /big.pem", pem),
            Command::new("commit ssl cert /big.pem"),
        ];
        let outcome = client.execute(commands).await;
        assert!(outcome.error.is_none(), "{:?}", outcome.error);
        assert_eq!(outcome.replies.len(), 3);
        assert_eq!(
            outcome.replies[1].text(),
            "Transaction created for certificate /big.pem!\n"
        );
        drop(client);
        let reads = server.await.unwrap();
        assert_eq!(reads.commands[1..], [1, 1, 1], "{reads:?}");
    }

    #[test]
    fn a_batch_is_cut_into_windows_in_order() {
        let commands: Vec<Command> = ["a", "bb", "ccc", "d"]
            .iter()
            .map(|line| Command::new(*line))
            .collect();
        let refs: Vec<&Command> = commands.iter().collect();
        let lines = |window: usize| -> Vec<Vec<&str>> {
            windows(&refs, window)
                .map(|run| run.iter().map(|command| command.line.as_str()).collect())
                .collect()
        };
        // Request sizes 2, 3, 4 and 2 bytes (each line and its newline).
        assert_eq!(lines(usize::MAX), [vec!["a", "bb", "ccc", "d"]]);
        assert_eq!(lines(5), [vec!["a", "bb"], vec!["ccc"], vec!["d"]]);
        assert_eq!(lines(6), [vec!["a", "bb"], vec!["ccc", "d"]]);
        assert_eq!(lines(1), [vec!["a"], vec!["bb"], vec!["ccc"], vec!["d"]]);
        assert_eq!(windows(&[], 10).count(), 0);
    }

    #[test]
    fn the_version_is_read_from_show_info() {
        let info = |version: &str| format!("Name: HAProxy\nVersion: {version}\nPid: 3\n");
        assert_eq!(parse_version(&info("2.6.12-1+deb12u4")), Some((2, 6)));
        assert_eq!(parse_version(&info("3.2.0-e134140d2")), Some((3, 2)));
        assert_eq!(parse_version(&info("3.10-dev1")), Some((3, 10)));
        assert_eq!(parse_version("Name: HAProxy\n"), None);
        assert!((2, 6) < (3, 2) && (3, 1) < (3, 2) && (3, 10) >= (3, 2));
    }

    #[test]
    fn requests_are_encoded_and_sized() {
        let command = Command::with_payload("set ssl cert /a;b", Payload::new("L1\n\nL2\n"));
        let mut out = Vec::new();
        command.encode_into(&mut out);
        assert_eq!(out, b"set ssl cert /a\\;b <<\nL1\nL2\n\n");
        assert_eq!(command.continuation_prompts(), 3);
        assert_eq!(command.request_size(), out.len());
        assert!(Command::new("a\nb").check().is_err());
        assert!(Command::new("x <<").check().is_err());
        assert_eq!(format!("{:?}", Payload::new("secret")), "Payload(6 bytes)");
    }

    #[test]
    fn the_buffer_size_is_read_from_the_pools() {
        let pools = "Dumping pools usage. Use SIGQUIT to flush them.\n  - Pool trash (16416 bytes) : 5 allocated\n  - Pool buffer (32768 bytes) : 4 allocated (65536 bytes)\n";
        assert_eq!(parse_bufsize(pools), Some(32_768));
        assert_eq!(parse_bufsize("nothing"), None);
    }

    #[test]
    fn pem_never_reaches_a_summary() {
        assert!(!summarize("bad -----BEGIN PRIVATE KEY----- abc").contains("abc"));
        assert_eq!(summarize("Can't delete!\n\n"), "Can't delete!");
    }
}
