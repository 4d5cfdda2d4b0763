//! Bearer tokens from a file (a kubeconfig's `tokenFile`, the in-cluster service
//! account's projected token), read as client-go reads them.
//!
//! kube 5 sends the file's content as it is, so a token file ending in a newline (what
//! `echo`, editors and most secret mounts produce) is refused on every request with
//! "failed to parse header value", naming neither the file nor the newline. client-go
//! trims surrounding whitespace, and so does this layer. Like client-go and kube, it
//! re-reads the file at most once a minute, so a rotated projected token is picked up,
//! and keeps the last good token when a re-read fails (a file removed after start-up).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{HeaderValue, Request, header::AUTHORIZATION};
use tower::{Layer, Service};

use crate::error::Error;

/// How long a token read from the file is used before the file is read again.
const REREAD_AFTER: Duration = Duration::from_secs(60);

/// The token file of `config`, when kube would authenticate with it: no user name and
/// password, no inline token (both take precedence in kube and client-go).
pub(crate) fn token_file_of(config: &kube::Config) -> Option<&str> {
    let auth = &config.auth_info;
    let basic = auth.username.is_some() && auth.password.is_some();
    if basic || auth.token.is_some() {
        return None;
    }
    auth.token_file.as_deref()
}

/// Adds `Authorization: Bearer <token>` from a token file to every request.
#[derive(Clone, Debug)]
pub(crate) struct TokenFileLayer {
    source: Arc<TokenSource>,
}

impl TokenFileLayer {
    /// Reads `path` now: a file that cannot be read, or holds no usable token, is an
    /// error naming it.
    pub(crate) fn new(path: &Path) -> Result<Self, Error> {
        let header = read_header(path)?;
        Ok(Self {
            source: Arc::new(TokenSource {
                path: path.to_owned(),
                cached: Mutex::new(Cached {
                    header,
                    read_at: Instant::now(),
                }),
            }),
        })
    }
}

impl<S> Layer<S> for TokenFileLayer {
    type Service = TokenFileService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TokenFileService {
            inner,
            source: Arc::clone(&self.source),
        }
    }
}

#[derive(Debug)]
struct TokenSource {
    path: PathBuf,
    /// Guards the header last read from the file and when it was read. Held only to
    /// copy the header out or to replace it; the file is read without it.
    cached: Mutex<Cached>,
}

#[derive(Debug)]
struct Cached {
    header: HeaderValue,
    read_at: Instant,
}

impl TokenSource {
    /// The header to send now, re-reading the file when the cached token is a minute
    /// old. The file is small and in memory (a projected volume): reading it inline
    /// once a minute is what client-go does too.
    fn header(&self) -> HeaderValue {
        let stale = {
            let cached = kube_common::sync::lock(&self.cached);
            if cached.read_at.elapsed() < REREAD_AFTER {
                return cached.header.clone();
            }
            cached.header.clone()
        };
        let fresh = match read_header(&self.path) {
            Ok(header) => header,
            Err(error) => {
                tracing::warn!(%error, "keeping the last token read");
                stale
            }
        };
        let mut cached = kube_common::sync::lock(&self.cached);
        cached.header = fresh.clone();
        cached.read_at = Instant::now();
        fresh
    }
}

/// Reads `path` and builds the header from its trimmed content.
fn read_header(path: &Path) -> Result<HeaderValue, Error> {
    let problem = |problem: String| Error::TokenFile {
        path: path.to_owned(),
        problem,
    };
    let text = std::fs::read_to_string(path)
        .map_err(|error| problem(format!("cannot read it: {error}")))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(problem("it is empty".to_owned()));
    }
    let mut header = HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| {
        // Never the token itself in an error.
        problem("the token holds characters an HTTP header cannot carry".to_owned())
    })?;
    header.set_sensitive(true);
    Ok(header)
}

/// The service of [`TokenFileLayer`].
#[derive(Clone, Debug)]
pub(crate) struct TokenFileService<S> {
    inner: S,
    source: Arc<TokenSource>,
}

impl<S, B> Service<Request<B>> for TokenFileService<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        request
            .headers_mut()
            .insert(AUTHORIZATION, self.source.header());
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_trailing_newline_is_trimmed_and_a_bad_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "abc.def\n").unwrap();
        assert_eq!(read_header(&path).unwrap(), "Bearer abc.def");
        std::fs::write(&path, "\n").unwrap();
        let error = read_header(&path).unwrap_err().to_string();
        assert!(error.contains(&path.display().to_string()), "{error}");
        assert!(error.contains("empty"), "{error}");
        std::fs::write(&path, "abc\u{7}def").unwrap();
        let error = read_header(&path).unwrap_err().to_string();
        assert!(!error.contains("abc"), "{error}");
    }

    #[test]
    fn a_rotated_token_is_read_after_a_minute_and_a_vanished_file_keeps_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").unwrap();
        let layer = TokenFileLayer::new(&path).unwrap();
        std::fs::write(&path, "second\n").unwrap();
        assert_eq!(layer.source.header(), "Bearer first");
        let age = |source: &TokenSource| {
            source
                .cached
                .lock()
                .unwrap()
                .read_at
                .checked_sub(REREAD_AFTER)
                .unwrap()
        };
        let aged = age(&layer.source);
        layer.source.cached.lock().unwrap().read_at = aged;
        assert_eq!(layer.source.header(), "Bearer second");
        std::fs::remove_file(&path).unwrap();
        let aged = age(&layer.source);
        layer.source.cached.lock().unwrap().read_at = aged;
        assert_eq!(layer.source.header(), "Bearer second");
    }
}
