//! The HTTP/1.1 path: hyper-util's pooling client on our connector, for origins that do
//! not speak HTTP/2 (and for [`Protocol::Http1Only`](crate::Protocol::Http1Only)).

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::{
    client::legacy::{
        Client,
        connect::{Connected, Connection},
    },
    rt::{TokioExecutor, TokioIo, TokioTimer},
};

use crate::{
    error::{ConnectError, Error},
    stats::Counters,
    transport::{Connector, Origin, Purpose},
};

/// hyper-util's HTTP/1.1 client on [`Http1Connector`].
pub(crate) type Http1Client = Client<Http1Connector, Full<Bytes>>;

/// Builds the HTTP/1.1 client. It keeps idle keep-alive connections as kube's default
/// client does; a streaming response (a watch) occupies its connection until it ends.
pub(crate) fn client(connector: Arc<Connector>, counters: Arc<Counters>) -> Http1Client {
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .build(Http1Connector {
            connector,
            counters,
        })
}

/// Opens HTTP/1.1 connections (TLS with ALPN `http/1.1` only) and counts them.
#[derive(Clone)]
pub(crate) struct Http1Connector {
    connector: Arc<Connector>,
    counters: Arc<Counters>,
}

impl tower::Service<http::Uri> for Http1Connector {
    type Response = CountedIo;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<CountedIo, ConnectError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let connector = self.connector.clone();
        let counters = self.counters.clone();
        Box::pin(async move {
            // The service only sends requests whose origin already parsed.
            let origin = Origin::from_uri(&uri).map_err(|e| ConnectError::BadOrigin {
                uri: uri.to_string(),
                reason: e.to_string(),
            })?;
            let connected = connector
                .connect(&origin, Purpose::Http1)
                .await
                .inspect_err(|_| Counters::inc(&counters.connect_failures))?;
            Counters::inc(&counters.http1_opened);
            Counters::inc(&counters.http1_open);
            Ok(CountedIo {
                io: TokioIo::new(connected.io),
                counters,
            })
        })
    }
}

/// A connection of the HTTP/1.1 client; counted as open until dropped.
pub(crate) struct CountedIo {
    io: TokioIo<crate::transport::Io>,
    counters: Arc<Counters>,
}

impl Drop for CountedIo {
    fn drop(&mut self) {
        self.counters.connection_closed(&self.counters.http1_open);
    }
}

impl Connection for CountedIo {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl Read for CountedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl Write for CountedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}

/// Maps a legacy-client error.
pub(crate) fn error(origin: &str, source: hyper_util::client::legacy::Error) -> Error {
    Error::Http1 {
        origin: origin.to_owned(),
        source,
    }
}
