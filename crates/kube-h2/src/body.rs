//! The response body handed to kube: the server's bytes plus the stream slot they hold.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::{error::Error, pool::StreamSlot};

/// A response body from the pooled transport.
///
/// It holds the request's stream slot: the slot is given back when the body reaches its
/// end, fails, or is dropped, whichever comes first. For a watch that is when the
/// watch ends.
pub(crate) struct ResponseBody {
    kind: Kind,
    /// `None` once given back.
    slot: Option<StreamSlot>,
    /// The origin, for errors.
    origin: Arc<str>,
}

enum Kind {
    Http2 {
        recv: h2::RecvStream,
        connection: u64,
        /// Set once the DATA frames are done and only trailers may follow.
        data_done: bool,
    },
    Http1(hyper::body::Incoming),
    /// Nothing more to read.
    Done,
}

impl ResponseBody {
    pub(crate) fn http2(
        recv: h2::RecvStream,
        connection: u64,
        slot: StreamSlot,
        origin: Arc<str>,
    ) -> Self {
        Self {
            kind: Kind::Http2 {
                recv,
                connection,
                data_done: false,
            },
            slot: Some(slot),
            origin,
        }
    }

    pub(crate) fn http1(body: hyper::body::Incoming, slot: StreamSlot, origin: Arc<str>) -> Self {
        Self {
            kind: Kind::Http1(body),
            slot: Some(slot),
            origin,
        }
    }

    /// Ends the body: drops the stream handle (resetting an unfinished h2 stream) and
    /// gives the slot back.
    fn finish(&mut self) {
        self.kind = Kind::Done;
        self.slot = None;
    }
}

/// The final item of a body.
enum Last {
    /// The body ended.
    End,
    /// The last frame (trailers).
    Frame(Frame<Bytes>),
    /// The body failed.
    Failed(Error),
}

/// Maps an h2 error on a stream to a connection-level or stream-level error.
pub(crate) fn h2_error(origin: &str, connection: u64, source: h2::Error) -> Error {
    let origin = origin.to_owned();
    if source.is_io() || source.is_go_away() {
        Error::ConnectionLost {
            origin,
            connection,
            source,
        }
    } else {
        Error::Stream {
            origin,
            connection,
            source,
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        let last = match &mut this.kind {
            Kind::Done => return Poll::Ready(None),
            Kind::Http2 {
                recv,
                connection,
                data_done,
            } => {
                let connection = *connection;
                let data_failed = if *data_done {
                    None
                } else {
                    match ready!(recv.poll_data(cx)) {
                        Some(Ok(data)) => {
                            // The bytes now belong to the caller: let the server send more.
                            // An error here means the stream is already gone, which the
                            // next poll reports.
                            let _ = recv.flow_control().release_capacity(data.len());
                            return Poll::Ready(Some(Ok(Frame::data(data))));
                        }
                        Some(Err(e)) => Some(h2_error(&this.origin, connection, e)),
                        None => {
                            *data_done = true;
                            None
                        }
                    }
                };
                match data_failed {
                    Some(error) => Last::Failed(error),
                    None => match ready!(recv.poll_trailers(cx)) {
                        Ok(Some(trailers)) => Last::Frame(Frame::trailers(trailers)),
                        Ok(None) => Last::End,
                        Err(e) => Last::Failed(h2_error(&this.origin, connection, e)),
                    },
                }
            }
            Kind::Http1(body) => match ready!(Pin::new(body).poll_frame(cx)) {
                Some(Ok(frame)) => return Poll::Ready(Some(Ok(frame))),
                Some(Err(source)) => Last::Failed(Error::Http1Body {
                    origin: this.origin.to_string(),
                    source,
                }),
                None => Last::End,
            },
        };
        // Whatever comes last gives the slot back.
        if let (Last::Failed(Error::ConnectionLost { .. }), Some(slot)) = (&last, &this.slot) {
            slot.connection_failed();
        }
        this.finish();
        Poll::Ready(match last {
            Last::End => None,
            Last::Frame(frame) => Some(Ok(frame)),
            Last::Failed(error) => Some(Err(error)),
        })
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Done => true,
            Kind::Http2 { recv, .. } => recv.is_end_stream(),
            Kind::Http1(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Done => SizeHint::with_exact(0),
            Kind::Http2 { .. } => SizeHint::default(),
            Kind::Http1(body) => body.size_hint(),
        }
    }
}

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Http2 { .. } => "http2",
            Kind::Http1(_) => "http1",
            Kind::Done => "done",
        };
        f.debug_struct("ResponseBody")
            .field("kind", &kind)
            .field("origin", &self.origin)
            .finish()
    }
}
