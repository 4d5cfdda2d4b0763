//! A test host: a network namespace of this process's own, joined to the machine by a
//! veth pair, where tests and the demo run their backends.
//!
//! Backends cannot listen on loopback (kube-apiserver, and kube-sim like it, refuses
//! loopback addresses in EndpointSlices), and traffic must never go to the machine's own
//! interface address. So the backends live on a host this process makes: a namespace
//! with one end of a veth pair (`198.18.x.2/30`, in the range RFC 2544 sets aside for
//! testing), the other end in the machine's namespace (`198.18.x.1/30`), so that an
//! HAProxy started normally reaches them through a route of the pair's own.
//!
//! ```no_run
//! # fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let host = testenv::netns::TestHost::shared()?;
//! let listener = host.listen_std(0)?; // a socket inside the namespace
//! println!("backend on {}", listener.local_addr()?);
//! # Ok(()) }
//! ```
//!
//! - **Lifetime.** The namespace is named only while it is being set up: once this
//!   process holds it open, its name is removed, so that nothing outlives the process,
//!   SIGKILL included. The kernel destroys the namespace, and with it both ends of the
//!   pair, when this process's handle and the last socket in it are closed.
//! - **Isolation.** Each process has its own pair and `/30`; the pair's name
//!   (`cwt<index>h`) is the lock that picks the index, so processes started together
//!   never share one.
//! - **Needs** root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and `ip` from iproute2;
//!   [`TestHost::shared`] says so when either is missing.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::OnceLock;

/// Why the test host could not be made or used.
#[derive(Debug, thiserror::Error)]
pub enum TestHostError {
    /// An `ip` command failed.
    #[error("`ip {args}` failed: {detail} (the test host needs root and iproute2's `ip`)")]
    Ip {
        /// The command's arguments.
        args: String,
        /// What it printed, or why it could not run.
        detail: String,
    },
    /// Every index was taken.
    #[error("no free veth pair name for a test host (cwt0h..cwt{0}h all exist)")]
    NoFreeIndex(u32),
    /// Opening or entering the namespace failed.
    #[error("cannot use the test host's network namespace {name}: {source}")]
    Namespace {
        /// The namespace's name while it was named.
        name: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Binding a socket inside the namespace failed.
    #[error("cannot listen on {addr} in the test host: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The thread that enters the namespace died.
    #[error("the thread entering the test host's namespace panicked")]
    Thread,
    /// An earlier attempt in this process failed.
    #[error("the test host could not be made: {0}")]
    Earlier(String),
}

/// How many `/30`s `198.18.0.0/15` holds.
const INDICES: u32 = 1 << 15;

/// The process's test host.
#[derive(Debug)]
pub struct TestHost {
    /// The namespace, held open: it lives while this handle (or a socket in it) does.
    namespace: File,
    /// The namespace side of the pair.
    ip: Ipv4Addr,
    /// The machine side of the pair.
    gateway: Ipv4Addr,
}

static SHARED: OnceLock<Result<TestHost, String>> = OnceLock::new();

impl TestHost {
    /// This process's test host, made on first use.
    pub fn shared() -> Result<&'static TestHost, TestHostError> {
        SHARED
            .get_or_init(|| Self::create().map_err(|error| error.to_string()))
            .as_ref()
            .map_err(|error| TestHostError::Earlier(error.clone()))
    }

    /// The host's address (where its backends listen).
    pub fn ip(&self) -> IpAddr {
        IpAddr::V4(self.ip)
    }

    /// The machine's address on the pair (where connections from the machine come from).
    pub fn gateway(&self) -> IpAddr {
        IpAddr::V4(self.gateway)
    }

    /// A listening socket on `port` (0: any) at the host's address, made inside the
    /// namespace. It stays there whichever thread later uses it.
    pub fn listen_std(&self, port: u16) -> Result<TcpListener, TestHostError> {
        let addr = SocketAddr::new(self.ip(), port);
        let namespace = self
            .namespace
            .try_clone()
            .map_err(|source| TestHostError::Namespace {
                name: "(held)".to_owned(),
                source,
            })?;
        // setns moves only the calling thread: a thread of its own enters the namespace,
        // makes the socket and ends, so no other thread of the process ever changes
        // namespace.
        std::thread::spawn(move || {
            rustix::thread::move_into_link_name_space(
                namespace.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .map_err(|error| TestHostError::Namespace {
                name: "(held)".to_owned(),
                source: error.into(),
            })?;
            let listener =
                TcpListener::bind(addr).map_err(|source| TestHostError::Bind { addr, source })?;
            listener
                .set_nonblocking(true)
                .map_err(|source| TestHostError::Bind { addr, source })?;
            Ok(listener)
        })
        .join()
        .map_err(|_| TestHostError::Thread)?
    }

    /// [`Self::listen_std`] as a tokio listener (call from within a runtime).
    pub fn listen(&self, port: u16) -> Result<tokio::net::TcpListener, TestHostError> {
        let listener = self.listen_std(port)?;
        let addr = SocketAddr::new(self.ip(), port);
        tokio::net::TcpListener::from_std(listener)
            .map_err(|source| TestHostError::Bind { addr, source })
    }

    fn create() -> Result<Self, TestHostError> {
        let pid = std::process::id();
        let name = format!("certwatch-test-{pid}");
        // A leftover of a process with the same pid would be an orphan: remove it.
        let _ = ip(&["netns", "del", &name]);
        ip(&["netns", "add", &name])?;
        let result = Self::join(&name, pid);
        // The name is only needed to set the namespace up: once held open (or on
        // failure) it goes, and the kernel ends the namespace with the process.
        let _ = ip(&["netns", "del", &name]);
        result
    }

    fn join(name: &str, pid: u32) -> Result<Self, TestHostError> {
        let index = Self::claim_pair(name, pid)?;
        let outside = format!("cwt{index}h");
        let inside = format!("cwt{index}n");
        let base = u32::from(Ipv4Addr::new(198, 18, 0, 0)) + index * 4;
        let gateway = Ipv4Addr::from(base + 1);
        let host = Ipv4Addr::from(base + 2);
        ip(&["addr", "add", &format!("{gateway}/30"), "dev", &outside])?;
        ip(&["link", "set", &outside, "up"])?;
        ip(&[
            "-n",
            name,
            "addr",
            "add",
            &format!("{host}/30"),
            "dev",
            &inside,
        ])?;
        ip(&["-n", name, "link", "set", &inside, "up"])?;
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        let path = format!("/run/netns/{name}");
        let namespace = File::open(&path).map_err(|source| TestHostError::Namespace {
            name: name.to_owned(),
            source,
        })?;
        Ok(Self {
            namespace,
            ip: host,
            gateway,
        })
    }

    /// Creates the veth pair, its inner end in the namespace, under the first free
    /// index from one derived from the pid; the pair's name is the claim.
    fn claim_pair(name: &str, pid: u32) -> Result<u32, TestHostError> {
        let start = pid % INDICES;
        let mut last = None;
        for offset in 0..256 {
            let index = (start + offset) % INDICES;
            let outside = format!("cwt{index}h");
            let inside = format!("cwt{index}n");
            match ip(&[
                "link", "add", &outside, "type", "veth", "peer", "name", &inside, "netns", name,
            ]) {
                Ok(()) => return Ok(index),
                Err(TestHostError::Ip { detail, .. }) if detail.contains("File exists") => {
                    last = Some(index);
                }
                Err(error) => return Err(error),
            }
        }
        Err(TestHostError::NoFreeIndex(last.unwrap_or(start)))
    }
}

/// Runs `ip ARGS`.
fn ip(args: &[&str]) -> Result<(), TestHostError> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|error| TestHostError::Ip {
            args: args.join(" "),
            detail: error.to_string(),
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(TestHostError::Ip {
            args: args.join(" "),
            detail: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A backend in the test host answers a client on the machine, at the host's
    /// address, which is neither loopback nor one of the machine's own.
    #[test]
    fn a_listener_in_the_host_is_reached_from_the_machine() {
        let host = TestHost::shared().unwrap();
        assert!(!host.ip().is_loopback());
        let listener = host.listen_std(0).unwrap();
        listener.set_nonblocking(false).unwrap();
        let addr = listener.local_addr().unwrap();
        assert_eq!(addr.ip(), host.ip());
        let server = std::thread::spawn(move || {
            let (mut stream, peer) = listener.accept().unwrap();
            stream.write_all(b"hello").unwrap();
            peer.ip()
        });
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).unwrap();
        assert_eq!(answer, "hello");
        // The connection came over the pair, from the machine's end of it.
        assert_eq!(server.join().unwrap(), host.gateway());
        // The address is not the machine's: binding it outside the namespace fails.
        assert!(TcpListener::bind(SocketAddr::new(host.ip(), 0)).is_err());
    }
}
