//! Opening connections: TCP, TLS with ALPN, and the origin key of the pool.

use std::{
    fmt, io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
};
use tokio_rustls::{TlsConnector, client::TlsStream};

use crate::{
    error::{ConnectError, Error},
    options::Protocol,
};

/// ALPN protocol id of HTTP/2.
const ALPN_H2: &[u8] = b"h2";
/// ALPN protocol id of HTTP/1.1.
const ALPN_HTTP1: &[u8] = b"http/1.1";

/// `scheme://host:port`: connections are pooled per origin.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Origin {
    /// `true` for `https`.
    pub(crate) tls: bool,
    /// Host as written in the URI, without IPv6 brackets.
    pub(crate) host: String,
    /// Explicit or default port.
    pub(crate) port: u16,
}

impl Origin {
    /// The origin a request URI goes to.
    pub(crate) fn from_uri(uri: &http::Uri) -> Result<Self, Error> {
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => {
                return Err(Error::UnsupportedScheme {
                    url: uri.to_string(),
                });
            }
        };
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| Error::MissingHost {
                url: uri.to_string(),
            })?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
            .to_owned();
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        Ok(Self { tls, host, port })
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)
        }
    }
}

/// Which ALPN offer a TLS connection makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// A connection for the HTTP/2 pool: offers `h2` (and `http/1.1` in Auto mode so the
    /// server can tell us it does not speak HTTP/2).
    Http2Pool,
    /// A connection for the HTTP/1.1 client: offers `http/1.1` only.
    Http1,
}

/// A connected byte stream, plain or TLS.
pub(crate) enum Io {
    /// Plain TCP (`http://`).
    Plain(TcpStream),
    /// TLS over TCP (`https://`).
    Tls(Box<TlsStream<TcpStream>>),
}

/// A freshly opened connection and what ALPN said about it.
pub(crate) struct Connected {
    /// The byte stream.
    pub(crate) io: Io,
    /// For TLS: whether the server chose `h2`. For plain TCP: `None` (only the HTTP/2
    /// preface exchange can tell).
    pub(crate) alpn_h2: Option<bool>,
}

/// Opens TCP and TLS connections to origins.
pub(crate) struct Connector {
    /// TLS config with the ALPN offer for pool connections; `None` for a plain-HTTP
    /// cluster.
    tls_http2_pool: Option<Arc<ClientConfig>>,
    /// TLS config offering only `http/1.1`; `None` for a plain-HTTP cluster.
    tls_http1: Option<Arc<ClientConfig>>,
    /// `tls_server_name` from the kube config: verify the certificate against this name
    /// instead of the URL host.
    server_name_override: Option<ServerName<'static>>,
    /// Deadline for TCP connect + TLS handshake (+ HTTP/2 SETTINGS, applied by the pool).
    pub(crate) connect_timeout: Option<Duration>,
}

impl Connector {
    /// Builds a connector from kube's rustls config (if the cluster is `https`).
    pub(crate) fn new(
        tls: Option<ClientConfig>,
        protocol: Protocol,
        server_name_override: Option<&str>,
        connect_timeout: Option<Duration>,
    ) -> Result<Self, Error> {
        let server_name_override = server_name_override
            .map(|name| {
                parse_server_name(name).ok_or_else(|| Error::InvalidServerName {
                    name: name.to_owned(),
                })
            })
            .transpose()?;
        let (tls_http2_pool, tls_http1) = match tls {
            None => (None, None),
            Some(base) => {
                let mut pool = base.clone();
                pool.alpn_protocols = match protocol {
                    Protocol::Auto => vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()],
                    Protocol::Http2Only => vec![ALPN_H2.to_vec()],
                    Protocol::Http1Only => vec![ALPN_HTTP1.to_vec()],
                };
                let mut http1 = base;
                http1.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
                (Some(Arc::new(pool)), Some(Arc::new(http1)))
            }
        };
        Ok(Self {
            tls_http2_pool,
            tls_http1,
            server_name_override,
            connect_timeout,
        })
    }

    /// Opens a TCP (and for `https`, TLS) connection, under the connect timeout.
    pub(crate) async fn connect(
        &self,
        origin: &Origin,
        purpose: Purpose,
    ) -> Result<Connected, ConnectError> {
        with_timeout(self.connect_timeout, self.connect_untimed(origin, purpose)).await
    }

    pub(crate) async fn connect_untimed(
        &self,
        origin: &Origin,
        purpose: Purpose,
    ) -> Result<Connected, ConnectError> {
        let tcp = TcpStream::connect((origin.host.as_str(), origin.port))
            .await
            .map_err(ConnectError::Tcp)?;
        // Small frames (HEADERS, WINDOW_UPDATE, PING) must not wait for Nagle.
        tcp.set_nodelay(true).map_err(ConnectError::Tcp)?;
        if !origin.tls {
            return Ok(Connected {
                io: Io::Plain(tcp),
                alpn_h2: None,
            });
        }
        let config = match purpose {
            Purpose::Http2Pool => self.tls_http2_pool.clone(),
            Purpose::Http1 => self.tls_http1.clone(),
        }
        .ok_or(ConnectError::TlsNotConfigured)?;
        let server_name = match &self.server_name_override {
            Some(name) => name.clone(),
            None => {
                parse_server_name(&origin.host).ok_or_else(|| ConnectError::InvalidServerName {
                    name: origin.host.clone(),
                })?
            }
        };
        let tls = TlsConnector::from(config)
            .connect(server_name, tcp)
            .await
            .map_err(ConnectError::Tls)?;
        let alpn_h2 = tls.get_ref().1.alpn_protocol() == Some(ALPN_H2);
        Ok(Connected {
            io: Io::Tls(Box::new(tls)),
            alpn_h2: Some(alpn_h2),
        })
    }
}

/// Runs `fut` under an optional deadline.
pub(crate) async fn with_timeout<T>(
    timeout: Option<Duration>,
    fut: impl Future<Output = Result<T, ConnectError>>,
) -> Result<T, ConnectError> {
    match timeout {
        Some(limit) => tokio::time::timeout(limit, fut)
            .await
            .map_err(|_| ConnectError::Timeout(limit))?,
        None => fut.await,
    }
}

/// A DNS name or IP address usable for SNI and certificate verification.
fn parse_server_name(name: &str) -> Option<ServerName<'static>> {
    let bare = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name);
    ServerName::try_from(bare.to_owned()).ok()
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_defaults_ports_and_strips_ipv6_brackets() {
        let o = Origin::from_uri(&"https://[::1]/api".parse().unwrap()).unwrap();
        assert_eq!((o.tls, o.host.as_str(), o.port), (true, "::1", 443));
        assert_eq!(o.to_string(), "https://[::1]:443");
        let o = Origin::from_uri(&"http://kube:8080".parse().unwrap()).unwrap();
        assert_eq!((o.tls, o.host.as_str(), o.port), (false, "kube", 8080));
        assert!(matches!(
            Origin::from_uri(&"ftp://x".parse().unwrap()),
            Err(Error::UnsupportedScheme { .. })
        ));
        assert!(matches!(
            Origin::from_uri(&"/relative".parse().unwrap()),
            Err(Error::UnsupportedScheme { .. })
        ));
    }

    #[test]
    fn server_names_accept_dns_and_ip() {
        assert!(parse_server_name("kubernetes.default.svc").is_some());
        assert!(parse_server_name("127.0.0.1").is_some());
        assert!(parse_server_name("[::1]").is_some());
        assert!(parse_server_name("bad name!").is_none());
    }
}
