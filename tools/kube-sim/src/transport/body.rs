//! The response body type: counts bytes sent, holds the request's in-flight slot until
//! the body is complete (or dropped), and a watch's long-running mark for its life.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures::Stream;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};

use crate::control::admission::Admission;
use crate::control::metrics::LongRunning;
use crate::control::stats::Stats;

pin_project_lite::pin_project! {
    /// Every response the simulator sends.
    pub struct SimBody {
        #[pin]
        inner: UnsyncBoxBody<Bytes, Infallible>,
        stats: Option<Arc<Stats>>,
        permit: Option<Admission>,
        long_running: Option<LongRunning>,
    }
}

impl SimBody {
    /// A complete body.
    pub(crate) fn full(bytes: impl Into<Bytes>) -> SimBody {
        SimBody {
            inner: Full::new(bytes.into()).boxed_unsync(),
            stats: None,
            permit: None,
            long_running: None,
        }
    }

    /// A streamed body.
    pub(crate) fn stream<S>(stream: S) -> SimBody
    where
        S: Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + 'static,
    {
        SimBody {
            inner: StreamBody::new(stream).boxed_unsync(),
            stats: None,
            permit: None,
            long_running: None,
        }
    }

    /// Counts the bytes of this body in `stats`.
    pub(crate) fn counted(mut self, stats: Arc<Stats>) -> SimBody {
        self.stats = Some(stats);
        self
    }

    /// Keeps a watch in `apiserver_longrunning_requests` for as long as its body lives
    /// (it ends, or the client goes away).
    pub(crate) fn long_running(mut self, open: LongRunning) -> SimBody {
        self.long_running = Some(open);
        self
    }

    /// Whether the body counts as a long-running request (an open watch).
    pub(crate) fn is_long_running(&self) -> bool {
        self.long_running.is_some()
    }

    /// Keeps the request in flight until the body is complete.
    pub(crate) fn holding(mut self, permit: Option<Admission>) -> SimBody {
        self.permit = permit;
        self
    }
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.project();
        match ready!(this.inner.poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let (Some(stats), Some(data)) = (this.stats.as_ref(), frame.data_ref()) {
                    stats.add_bytes(data.len());
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(never)) => match never {},
            None => {
                this.permit.take();
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
