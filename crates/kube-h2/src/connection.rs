//! One HTTP/2 connection: the handshake, learning the server's stream limit, and the
//! task that drives the connection until it dies.

use std::{
    fmt,
    future::poll_fn,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use h2::{
    Ping, PingPong,
    client::{Connection, SendRequest},
};

use crate::transport::Io;

/// Receive window of one stream. A watch rarely has more than one event in flight;
/// 512 KiB holds a large Secret without waiting for a WINDOW_UPDATE round trip.
const STREAM_WINDOW: u32 = 512 * 1024;
/// Upper bound of the connection-level receive window (HTTP/2 maximum is 2^31 - 1).
const MAX_CONNECTION_WINDOW: u32 = 1 << 30;

/// The connection window is the sum of all stream windows, so that one watch whose
/// consumer stopped reading cannot use up the window every other watch on the same
/// connection needs.
fn connection_window(stream_cap: usize) -> u32 {
    u32::try_from(stream_cap)
        .unwrap_or(u32::MAX)
        .saturating_mul(STREAM_WINDOW)
        .clamp(STREAM_WINDOW, MAX_CONNECTION_WINDOW)
}

/// An HTTP/2 connection whose server SETTINGS are known.
pub(crate) struct Handshaken {
    /// Handle to open streams.
    pub(crate) send: SendRequest<Bytes>,
    /// The connection state machine; must be polled (by [`drive`]) for anything to move.
    pub(crate) conn: Connection<Io, Bytes>,
    /// PING handle for keep-alive.
    pub(crate) pings: PingPong,
    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS (`usize::MAX` if it sent none).
    pub(crate) server_limit: usize,
}

/// The HTTP/2 exchange failed before the server's SETTINGS were seen.
#[derive(Debug)]
pub(crate) struct HandshakeFailed {
    /// The h2 error, or `None` if the server closed the connection cleanly.
    pub(crate) source: Option<h2::Error>,
}

impl fmt::Display for HandshakeFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(e) => write!(f, "{e}"),
            None => f.write_str("the server closed the connection before sending HTTP/2 SETTINGS"),
        }
    }
}

/// Sends the client preface and waits until the server's SETTINGS have been applied.
///
/// A server's first frame must be SETTINGS, and h2 applies received SETTINGS before
/// it reads the next frame; so once the answer to our PING arrives, the server's
/// SETTINGS_MAX_CONCURRENT_STREAMS is known. Until then h2 would assume "unlimited",
/// which is why the pool never hands out a connection before this returns.
pub(crate) async fn handshake(io: Io, stream_cap: usize) -> Result<Handshaken, HandshakeFailed> {
    let failed = |e: h2::Error| HandshakeFailed { source: Some(e) };
    let (send, mut conn) = h2::client::Builder::new()
        .enable_push(false)
        .initial_max_send_streams(stream_cap)
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(connection_window(stream_cap))
        .handshake::<_, Bytes>(io)
        .await
        .map_err(failed)?;
    let Some(mut pings) = conn.ping_pong() else {
        // `ping_pong` only returns None when taken twice; this is the first take.
        return Err(HandshakeFailed { source: None });
    };
    {
        let pong = pings.ping(Ping::opaque());
        tokio::pin!(pong);
        tokio::select! {
            result = &mut pong => {
                result.map_err(failed)?;
            }
            result = &mut conn => {
                return Err(HandshakeFailed { source: result.err() });
            }
        }
    }
    let server_limit = conn.max_concurrent_send_streams();
    Ok(Handshaken {
        send,
        conn,
        pings,
        server_limit,
    })
}

/// Why a connection's driver stopped.
#[derive(Debug)]
pub(crate) enum CloseReason {
    /// The connection shut down cleanly (GOAWAY handled, or nobody needs it any more).
    Closed,
    /// The connection failed (I/O error, protocol error, GOAWAY with an error code).
    Failed(h2::Error),
    /// A keep-alive PING was not answered in time.
    KeepaliveTimeout(Duration),
    /// Sending a keep-alive PING failed.
    KeepaliveFailed(h2::Error),
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseReason::Closed => f.write_str("closed"),
            CloseReason::Failed(e) => write!(f, "failed: {e}"),
            CloseReason::KeepaliveTimeout(t) => write!(f, "keep-alive PING unanswered after {t:?}"),
            CloseReason::KeepaliveFailed(e) => write!(f, "keep-alive PING failed: {e}"),
        }
    }
}

/// What the driver reports to the pool that owns the connection.
pub(crate) trait ConnectionOwner: Send + 'static {
    /// Called after each poll that left the connection running, so the owner can notice
    /// a GOAWAY (or connection error) and stop placing streams on it.
    fn after_poll(&mut self, cx: &mut Context<'_>);
    /// Called once when the connection is gone.
    fn closed(self, reason: CloseReason);
}

/// Keep-alive timing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keepalive {
    /// Time between PINGs; `None` disables them.
    pub(crate) interval: Option<Duration>,
    /// Deadline for each PONG.
    pub(crate) timeout: Duration,
}

/// Drives the connection until it ends or stops answering PINGs, then tells the owner.
///
/// Dropping the h2 `Connection` (when keep-alive fails) fails every stream on it, so
/// watches see an error and reconnect instead of hanging on a dead peer.
pub(crate) async fn drive(
    handshaken: Handshaken,
    keepalive: Keepalive,
    mut owner: impl ConnectionOwner,
) {
    let Handshaken {
        send,
        mut conn,
        pings,
        ..
    } = handshaken;
    // The pool keeps its own handle; holding one here would keep the connection open
    // after the pool has let go of it.
    drop(send);
    let run = poll_fn(|cx| {
        let polled = Pin::new(&mut conn).poll(cx);
        if polled.is_pending() {
            owner.after_poll(cx);
        }
        polled
    });
    let reason = tokio::select! {
        result = run => match result {
            Ok(()) => CloseReason::Closed,
            Err(e) => CloseReason::Failed(e),
        },
        reason = keep_alive(pings, keepalive) => reason,
    };
    drop(conn);
    owner.closed(reason);
}

/// Sends a PING every interval; returns when one goes unanswered.
async fn keep_alive(mut pings: PingPong, keepalive: Keepalive) -> CloseReason {
    let Some(interval) = keepalive.interval else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(interval).await;
        match tokio::time::timeout(keepalive.timeout, pings.ping(Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            Ok(Err(e)) => return CloseReason::KeepaliveFailed(e),
            Err(_) => return CloseReason::KeepaliveTimeout(keepalive.timeout),
        }
    }
}

/// Whether the connection still accepts new streams: `false` once a GOAWAY arrived or
/// the connection failed (h2 then refuses `send_request`).
pub(crate) fn accepts_new_streams(send: &mut SendRequest<Bytes>, cx: &mut Context<'_>) -> bool {
    !matches!(send.poll_ready(cx), Poll::Ready(Err(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_window_covers_all_streams_within_bounds() {
        assert_eq!(connection_window(1), STREAM_WINDOW);
        assert_eq!(connection_window(100), 100 * STREAM_WINDOW);
        assert_eq!(connection_window(100_000), MAX_CONNECTION_WINDOW);
    }
}
