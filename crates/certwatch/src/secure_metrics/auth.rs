//! Delegated authentication and authorization of scrapers, as kube-rbac-proxy and
//! OpenShift's components do it: the bearer token is reviewed by the API server
//! (`TokenReview`), then the user it names is checked for `get` on the non-resource
//! URL `/metrics` (`SubjectAccessReview`). Both answers are cached briefly, by the
//! token's digest and by the user, so that a scraper costs two API requests per cache
//! period, not two per scrape.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use kube_common::sync;
use tokio::sync::Semaphore;

/// The non-resource URL whose `get` a scraper must be allowed.
pub const METRICS_PATH: &str = "/metrics";

/// Answers kept at most; beyond, expired ones are dropped, then all (a flood of
/// distinct tokens must not grow the cache without bound).
const CACHE_CAPACITY: usize = 4096;
/// Reviews in flight at once: a flood of distinct tokens waits here instead of
/// loading the API server.
const REVIEWS_IN_FLIGHT: usize = 16;

/// Why a request is not served.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// No `Authorization: Bearer` header.
    #[error("a bearer token is required (Authorization: Bearer <token>)")]
    NoToken,
    /// The API server did not accept the token.
    #[error("the bearer token was not accepted by the API server")]
    NotAuthenticated,
    /// The token's user may not `get` `/metrics`.
    #[error(
        "user {user:?} may not get {METRICS_PATH} (grant it get on the non-resource URL {METRICS_PATH}, as the prometheus-k8s cluster role does)"
    )]
    Forbidden {
        /// The token's user.
        user: String,
    },
    /// A review could not be made (the API server is unreachable, or refused
    /// certwatch the review itself). Not cached.
    #[error("cannot {what}: {}", describe(source))]
    ReviewFailed {
        /// `review the token` or `check the authorization`.
        what: &'static str,
        /// The API error.
        source: kube::Error,
    },
}

/// Who a token belongs to, as the API server's `TokenReview` said.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct User {
    name: String,
    uid: Option<String>,
    groups: Vec<String>,
    extra: BTreeMap<String, Vec<String>>,
}

impl User {
    fn from_info(info: UserInfo) -> Option<Self> {
        Some(Self {
            name: info.username?,
            uid: info.uid,
            groups: info.groups.unwrap_or_default(),
            extra: info.extra.unwrap_or_default(),
        })
    }
}

/// A cache of answers that expire `ttl` after they were given.
#[derive(Debug)]
struct Answers<K, V> {
    entries: HashMap<K, (V, Instant)>,
}

impl<K: std::hash::Hash + Eq, V: Clone> Answers<K, V> {
    fn new() -> Self {
        Self {
            entries: HashMap::new(),
        }
    }

    fn get(&self, key: &K, now: Instant) -> Option<V> {
        self.entries
            .get(key)
            .filter(|(_, until)| *until > now)
            .map(|(value, _)| value.clone())
    }

    fn put(&mut self, key: K, value: V, until: Instant, now: Instant) {
        if self.entries.len() >= CACHE_CAPACITY {
            self.entries.retain(|_, (_, until)| *until > now);
            if self.entries.len() >= CACHE_CAPACITY {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (value, until));
    }
}

/// Review counters, for tests and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuthStats {
    /// TokenReviews sent.
    pub token_reviews: u64,
    /// SubjectAccessReviews sent.
    pub access_reviews: u64,
}

#[derive(Debug, Default)]
struct State {
    /// By SHA-256 of the token: the user, or `None` for a token not accepted.
    tokens: Option<Answers<[u8; 32], Option<User>>>,
    /// By user: allowed or not.
    access: Option<Answers<User, bool>>,
    stats: AuthStats,
}

/// Checks scrapers' bearer tokens against the API server.
#[derive(Clone)]
pub struct DelegatedAuth {
    client: kube::Client,
    ttl: Duration,
    /// Guards the cached answers and the counters. Held only to read or update them,
    /// never across a review.
    state: Arc<Mutex<State>>,
    reviews: Arc<Semaphore>,
}

impl std::fmt::Debug for DelegatedAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelegatedAuth")
            .field("ttl", &self.ttl)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl DelegatedAuth {
    /// Reviews through `client` (certwatch's own identity, which needs `create` on
    /// `tokenreviews` and `subjectaccessreviews`: the `system:auth-delegator` cluster
    /// role), caching answers for `ttl`.
    pub fn new(client: kube::Client, ttl: Duration) -> Self {
        Self {
            client,
            ttl,
            state: Arc::new(Mutex::new(State::default())),
            reviews: Arc::new(Semaphore::new(REVIEWS_IN_FLIGHT)),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        sync::lock(&self.state)
    }

    /// The reviews sent so far.
    pub fn stats(&self) -> AuthStats {
        self.state().stats
    }

    /// Whether the request with this `Authorization` header may read the metrics.
    pub async fn check(&self, authorization: Option<&str>) -> Result<(), Refusal> {
        let token = authorization
            .and_then(bearer_token)
            .ok_or(Refusal::NoToken)?;
        let user = self.authenticate(token).await?;
        if self.authorize(&user).await? {
            Ok(())
        } else {
            Err(Refusal::Forbidden { user: user.name })
        }
    }

    async fn authenticate(&self, token: &str) -> Result<User, Refusal> {
        let digest: [u8; 32] = {
            let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
            let mut out = [0; 32];
            out.copy_from_slice(digest.as_ref());
            out
        };
        let cached = |auth: &Self| {
            let state = auth.state();
            state
                .tokens
                .as_ref()
                .and_then(|tokens| tokens.get(&digest, Instant::now()))
        };
        if let Some(user) = cached(self) {
            return user.ok_or(Refusal::NotAuthenticated);
        }
        let _permit = self.reviews.acquire().await;
        // Another request with the same token may have asked meanwhile.
        if let Some(user) = cached(self) {
            return user.ok_or(Refusal::NotAuthenticated);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: None,
            },
            ..TokenReview::default()
        };
        self.state().stats.token_reviews += 1;
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|source| Refusal::ReviewFailed {
                what: "review the token",
                source,
            })?;
        let user = answer
            .status
            .filter(|status| status.authenticated == Some(true))
            .and_then(|status| status.user)
            .and_then(User::from_info);
        let now = Instant::now();
        self.state().tokens.get_or_insert_with(Answers::new).put(
            digest,
            user.clone(),
            now + self.ttl,
            now,
        );
        user.ok_or(Refusal::NotAuthenticated)
    }

    async fn authorize(&self, user: &User) -> Result<bool, Refusal> {
        let cached = |auth: &Self| {
            let state = auth.state();
            state
                .access
                .as_ref()
                .and_then(|access| access.get(user, Instant::now()))
        };
        if let Some(allowed) = cached(self) {
            return Ok(allowed);
        }
        let _permit = self.reviews.acquire().await;
        if let Some(allowed) = cached(self) {
            return Ok(allowed);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: user.uid.clone(),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(METRICS_PATH.to_owned()),
                    verb: Some("get".to_owned()),
                }),
                resource_attributes: None,
            },
            ..SubjectAccessReview::default()
        };
        self.state().stats.access_reviews += 1;
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|source| Refusal::ReviewFailed {
                what: "check the authorization",
                source,
            })?;
        let allowed = answer.status.is_some_and(|status| status.allowed);
        let now = Instant::now();
        self.state().access.get_or_insert_with(Answers::new).put(
            user.clone(),
            allowed,
            now + self.ttl,
            now,
        );
        Ok(allowed)
    }
}

/// A kube error in one line: the API server's answer, or the transport's failure.
fn describe(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!(
            "the API server answered {} {}: {}",
            status.code, status.reason, status.message
        ),
        other => other.to_string(),
    }
}

/// The token of an `Authorization: Bearer <token>` header value (the scheme is
/// case-insensitive, as RFC 6750 says).
fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_from_the_header() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer"), None);
    }

    #[test]
    fn answers_expire_and_stay_bounded() {
        let now = Instant::now();
        let mut answers = Answers::new();
        answers.put(1, true, now + Duration::from_secs(10), now);
        assert_eq!(answers.get(&1, now), Some(true));
        assert_eq!(answers.get(&1, now + Duration::from_secs(11)), None);
        for key in 0..(CACHE_CAPACITY as u32 * 2) {
            answers.put(key, false, now + Duration::from_secs(10), now);
        }
        assert!(answers.entries.len() <= CACHE_CAPACITY);
    }
}
