//! Does the router identity have `get`, `list` and `watch` on a secret?
//!
//! The reference router asks three SubjectAccessReviews per route. Routes sharing a
//! secret ask the same questions, and a router with thousands of routes asks them all at
//! start-up, so answers are cached for a while and concurrent askers of one question
//! share one request. For the client's own identity one `SelfSubjectRulesReview` per
//! namespace answers every secret of that namespace at once.
//!
//! # What each policy proves, and where it can be wrong
//!
//! * [`AccessPolicy::SelfRules`]: the rules the API server's authorizers report for the
//!   client in that namespace. Authorizers that cannot enumerate rules (webhooks) mark
//!   the answer `incomplete`; a denial from an incomplete answer is then re-asked with a
//!   `SelfSubjectAccessReview` for that verb, so an incomplete list never rejects a
//!   route on its own. The answer is as old as the cache TTL: a revoked grant is noticed
//!   by the secret's watch (it fails with 403) before the TTL ends.
//! * [`AccessPolicy::SelfReviews`]: one `SelfSubjectAccessReview` per secret and verb;
//!   exact, at three requests per distinct secret.
//! * [`AccessPolicy::Subject`]: one `SubjectAccessReview` per secret and verb for a
//!   named identity, when certwatch runs with other credentials than the router it
//!   serves. Needs `create` on `subjectaccessreviews`.
//!
//! A denial is trusted for a shorter time than an approval (`denied_ttl`, 30 s by
//! default), and every [`AccessDecision`] that denies says when its answers stop being
//! trusted ([`AccessDecision::recheck_after`]), so that a caller can check again exactly
//! when a grant can first show. Failed requests are never cached, and an
//! [`AccessError`] names the secret of the caller that gets it, even when the failed
//! request (a rules review) was shared with callers asking about other secrets.
//!
//! In every mode the per-secret watch itself is authorized by the API server for
//! `list`/`watch` on that name, so a stale "allowed" cannot make the router read a
//! secret it may not read.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, ResourceRule, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    SelfSubjectRulesReview, SelfSubjectRulesReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use kube::Client;

use super::paced;
use kube_common::Verb;
use kube_common::adaptive::AdaptiveLimiter;
use kube_common::hash::{NameMap, NameSet};
use tokio::time::Instant;

/// How long a cached denial is trusted by default.
pub const DEFAULT_DENIED_TTL: Duration = Duration::from_secs(30);

/// How long a cached answer is trusted by default.
pub const DEFAULT_TTL: Duration = Duration::from_secs(600);

/// The verbs a router needs on its route's secret, in the order they are reported.
pub const REQUIRED_VERBS: [Verb; 3] = [Verb::Get, Verb::List, Verb::Watch];

/// Whose access is checked, and with which API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccessPolicy {
    /// The client's own identity; one `SelfSubjectRulesReview` per namespace.
    SelfRules,
    /// The client's own identity; one `SelfSubjectAccessReview` per secret and verb.
    SelfReviews,
    /// A named identity; one `SubjectAccessReview` per secret and verb.
    Subject {
        /// User name, e.g. `system:serviceaccount:openshift-ingress:router`.
        user: String,
        /// Groups of that user.
        groups: Vec<String>,
    },
}

/// How an [`AccessChecker`] asks and how long it trusts answers. Set once, when the
/// checker is built: a checker is shared by cloning, so nothing about it can change
/// afterwards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessOptions {
    /// Whose access is checked, and with which API.
    pub policy: AccessPolicy,
    /// How long an answer that allows access is trusted.
    pub ttl: Duration,
    /// How long an answer that denies access is trusted (capped at `ttl`): a grant made
    /// after a denial is noticed once the denial is this old.
    pub denied_ttl: Duration,
}

impl Default for AccessOptions {
    fn default() -> Self {
        Self {
            policy: AccessPolicy::SelfRules,
            ttl: DEFAULT_TTL,
            denied_ttl: DEFAULT_DENIED_TTL,
        }
    }
}

/// The outcome of a check: which required verbs are denied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessDecision {
    /// Required verbs the identity may not use on the secret, in [`REQUIRED_VERBS`] order.
    pub denied: Vec<Verb>,
    /// Who was checked, for messages (e.g. `the router identity`, or a user name).
    pub subject: String,
    /// For a denial: how much longer the answers behind it are trusted. A check made
    /// after that asks the API server again, so it is the earliest moment at which a
    /// grant can be noticed. Zero when access is allowed.
    pub recheck_after: Duration,
}

impl AccessDecision {
    /// Whether every required verb is allowed.
    pub fn allowed(&self) -> bool {
        self.denied.is_empty()
    }
}

/// The kind of review request a check sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReviewKind {
    /// `SelfSubjectRulesReview`: every rule of the client in a namespace.
    Rules,
    /// `SelfSubjectAccessReview`: one verb on one secret, for the client.
    SelfAccess,
    /// `SubjectAccessReview`: one verb on one secret, for a named identity.
    SubjectAccess,
}

impl fmt::Display for ReviewKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Rules => "rules review",
            Self::SelfAccess => "self subject access review",
            Self::SubjectAccess => "subject access review",
        })
    }
}

/// A review request that got no usable answer. Shared by everyone who waited for that
/// request, so it names no secret: a rules review answers a whole namespace, and its
/// failure must not name one caller's secret to another.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ReviewFailure {
    review: ReviewKind,
    code: Option<u16>,
    message: String,
}

/// A check that could not be answered. One pointer wide; the context is boxed.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot check access to secret {}/{} ({}): {}",
    .0.namespace, .0.secret, .0.failure.review, .0.failure.message
)]
pub struct AccessError(Box<AccessErrorContext>);

#[derive(Clone, Debug, PartialEq, Eq)]
struct AccessErrorContext {
    namespace: String,
    secret: String,
    failure: ReviewFailure,
}

impl AccessError {
    fn new(namespace: &str, secret: &str, failure: ReviewFailure) -> Self {
        Self(Box::new(AccessErrorContext {
            namespace: namespace.to_owned(),
            secret: secret.to_owned(),
            failure,
        }))
    }

    /// Namespace of the secret the caller asked about.
    pub fn namespace(&self) -> &str {
        &self.0.namespace
    }

    /// Name of the secret the caller asked about.
    pub fn secret(&self) -> &str {
        &self.0.secret
    }

    /// The review that failed.
    pub fn review(&self) -> ReviewKind {
        self.0.failure.review
    }

    /// HTTP status code, when the API server answered.
    pub fn code(&self) -> Option<u16> {
        self.0.failure.code
    }

    /// What went wrong (the API server's message, or the transport error).
    pub fn message(&self) -> &str {
        &self.0.failure.message
    }
}

impl fmt::Debug for AccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessError")
            .field("namespace", &self.0.namespace)
            .field("secret", &self.0.secret)
            .field("review", &self.0.failure.review)
            .field("code", &self.0.failure.code)
            .field("message", &self.0.failure.message)
            .finish()
    }
}

/// Request and cache counters, for tests and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessStats {
    /// Review requests sent to the API server.
    pub requests: u64,
    /// Questions answered from the cache or by joining a request in flight.
    pub shared: u64,
}

/// Answers access questions, caching answers for a TTL and sharing requests in flight.
/// Cheap to clone; clones share the cache.
#[derive(Clone)]
pub struct AccessChecker {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    policy: AccessPolicy,
    ttl: Duration,
    /// Denials are trusted for this long only, so that a grant made after an answer
    /// was cached is noticed soon (as Kubernetes' webhook authorizer caches denials
    /// for less time than approvals).
    denied_ttl: Duration,
    /// Guards the answer cache: one slot per question, holding the (possibly still
    /// running) request. Never held across an `.await`: callers clone the shared future
    /// out and await it after unlocking.
    cache: Mutex<HashMap<Question, Slot>>,
    next_slot: AtomicU64,
    requests: AtomicU64,
    shared: AtomicU64,
    /// Paces review requests by what the API server accepts, shared with the process's
    /// other bursts (first syncs); `None`: every review is sent at once.
    limiter: Option<AdaptiveLimiter>,
    /// Under [`AccessPolicy::SelfRules`]: the namespaces whose rules review a prefetch
    /// task is waiting for, each with the secrets prefetched meanwhile. Never held
    /// across an `.await`.
    prefetching: Mutex<NameMap<String, Vec<String>>>,
}

/// How many times a review refused for load (429, 5xx) is re-queued before the refusal
/// fails the check (client-go retries a 429 up to 10 times as well).
const MAX_REFUSALS: u32 = 10;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Question {
    Rules {
        namespace: String,
    },
    Review {
        namespace: String,
        secret: String,
        verb: Verb,
    },
}

#[derive(Clone, Debug)]
enum Answer {
    Rules {
        grants: Arc<SecretGrants>,
        incomplete: bool,
    },
    Allowed(bool),
}

/// What a rules review grants on the secrets of its namespace, indexed once per answer:
/// per verb, whether every secret is granted, and otherwise the names granted. Every
/// route of the namespace is checked against the same answer, so a check is one set
/// lookup per verb instead of a scan of every rule and its names per verb.
#[derive(Debug, Default)]
struct SecretGrants {
    /// In [`Verb::ALL`] order.
    verbs: [VerbGrant; Verb::ALL.len()],
}

/// Whether a rule's list of groups or resources (`None`: an empty list) holds `wanted`
/// or the wildcard `*`.
fn lists(values: &Option<Vec<String>>, wanted: &str) -> bool {
    values
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|v| v == "*" || v == wanted)
}

/// What the rules grant for one verb on secrets.
#[derive(Debug, Default)]
struct VerbGrant {
    /// A rule grants the verb on every secret (no `resourceNames`).
    every_name: bool,
    /// The secrets the rules name for the verb.
    names: NameSet<String>,
}

impl SecretGrants {
    /// The grants of `rules` (from a rules review of one namespace): a rule counts for
    /// a verb when it names the verb or `*`, the core group (`""`) or `*`, and
    /// `secrets` or `*`; without resource names (or with an empty list) it grants every
    /// secret, otherwise the secrets it names.
    fn of(rules: &[ResourceRule]) -> Self {
        let mut grants = Self::default();
        for rule in rules {
            if !(lists(&rule.api_groups, "") && lists(&rule.resources, "secrets")) {
                continue;
            }
            for (verb, grant) in Verb::ALL.iter().zip(&mut grants.verbs) {
                if !rule.verbs.iter().any(|v| v == "*" || v == verb.as_str()) {
                    continue;
                }
                match rule.resource_names.as_deref() {
                    None | Some([]) => grant.every_name = true,
                    Some(names) if !grant.every_name => grant.names.extend(names.iter().cloned()),
                    Some(_) => {}
                }
            }
        }
        // Once every secret is granted, the names add nothing.
        for grant in &mut grants.verbs {
            if grant.every_name {
                grant.names = NameSet::default();
            }
        }
        grants
    }

    /// Whether the rules allow `verb` on the secret called `name`.
    fn allows(&self, verb: Verb, name: &str) -> bool {
        Verb::ALL
            .iter()
            .zip(&self.verbs)
            .find(|(v, _)| **v == verb)
            .is_some_and(|(_, grant)| grant.every_name || grant.names.contains(name))
    }
}

/// An answer, with how long ago it was asked.
struct AgedAnswer {
    answer: Answer,
    age: Duration,
}

type PendingAnswer = Shared<BoxFuture<'static, Result<Answer, ReviewFailure>>>;

struct Slot {
    id: u64,
    asked_at: Instant,
    answer: PendingAnswer,
}

impl fmt::Debug for AccessChecker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessChecker")
            .field("policy", &self.inner.policy)
            .field("ttl", &self.inner.ttl)
            .field("denied_ttl", &self.inner.denied_ttl)
            .finish_non_exhaustive()
    }
}

impl AccessChecker {
    /// A checker asking the API server through `client`, caching answers for `ttl` and
    /// denials for the smaller of `ttl` and [`DEFAULT_DENIED_TTL`].
    pub fn new(client: Client, policy: AccessPolicy, ttl: Duration) -> Self {
        Self::with_options(
            client,
            AccessOptions {
                policy,
                ttl,
                denied_ttl: DEFAULT_DENIED_TTL,
            },
        )
    }

    /// A checker asking the API server through `client` as `options` say.
    pub fn with_options(client: Client, options: AccessOptions) -> Self {
        Self::build(client, options, None)
    }

    /// The same, with every review request sent under `limiter`: no more at once than
    /// its window, and a review the server refuses for load (429, 5xx) re-queued in its
    /// place (up to 10 times) instead of failing the check, so that a busy API server
    /// delays a route's admission rather than rejecting it.
    pub fn with_limiter(client: Client, options: AccessOptions, limiter: AdaptiveLimiter) -> Self {
        Self::build(client, options, Some(limiter))
    }

    fn build(client: Client, options: AccessOptions, limiter: Option<AdaptiveLimiter>) -> Self {
        let AccessOptions {
            policy,
            ttl,
            denied_ttl,
        } = options;
        Self {
            inner: Arc::new(Inner {
                client,
                policy,
                ttl,
                denied_ttl: denied_ttl.min(ttl),
                cache: Mutex::new(HashMap::new()),
                next_slot: AtomicU64::new(1),
                requests: AtomicU64::new(0),
                shared: AtomicU64::new(0),
                limiter,
                prefetching: Mutex::new(NameMap::default()),
            }),
        }
    }

    /// The policy in use.
    pub fn policy(&self) -> &AccessPolicy {
        &self.inner.policy
    }

    /// How long a denial is trusted: the longest a grant made after a denial can go
    /// unnoticed by a check.
    pub fn denied_ttl(&self) -> Duration {
        self.inner.denied_ttl
    }

    /// Request and cache counters.
    pub fn stats(&self) -> AccessStats {
        AccessStats {
            requests: self.inner.requests.load(Ordering::Relaxed),
            shared: self.inner.shared.load(Ordering::Relaxed),
        }
    }

    /// Starts answering the questions for `secret` in the background, so that a later
    /// [`check`](Self::check) finds the answer ready.
    ///
    /// Under [`AccessPolicy::SelfRules`] one task per namespace waits for its rules
    /// review, and the secrets of that namespace prefetched meanwhile join it: a start-up
    /// prefetches every route's secret at once, and one answer settles the whole
    /// namespace. Only the secrets that answer does not grant outright (an incomplete
    /// answer, a denial) are then checked further, on that task, all at once.
    pub fn prefetch(&self, namespace: &str, secret: &str) {
        if self.inner.policy == AccessPolicy::SelfRules {
            self.prefetch_rules(namespace, secret);
            return;
        }
        let this = self.clone();
        let (namespace, secret) = (namespace.to_owned(), secret.to_owned());
        tokio::spawn(async move {
            // The answer lands in the cache; an error is reported to the real caller.
            let _ = this.check(&namespace, &secret).await;
        });
    }

    /// [`prefetch`](Self::prefetch) under [`AccessPolicy::SelfRules`].
    fn prefetch_rules(&self, namespace: &str, secret: &str) {
        {
            let mut prefetching = kube_common::sync::lock(&self.inner.prefetching);
            if let Some(secrets) = prefetching.get_mut(namespace) {
                secrets.push(secret.to_owned());
                return;
            }
            if self.granted_by_cached_rules(namespace, secret) {
                return;
            }
            prefetching.insert(namespace.to_owned(), vec![secret.to_owned()]);
        }
        let this = self.clone();
        let namespace = namespace.to_owned();
        tokio::spawn(async move {
            let question = Question::Rules {
                namespace: namespace.clone(),
            };
            // A failure is reported to the real callers, which ask again.
            let answered = this.ask(question, this.inner.ttl).await.is_ok();
            let secrets = kube_common::sync::lock(&this.inner.prefetching)
                .remove(&namespace)
                .unwrap_or_default();
            if !answered {
                return;
            }
            let checks = secrets
                .iter()
                .filter(|secret| !this.granted_by_cached_rules(&namespace, secret))
                .map(|secret| this.check(&namespace, secret));
            // The answers land in the cache; errors are reported to the real callers.
            let _ = futures::future::join_all(checks).await;
        });
    }

    /// Whether a cached, complete rules review of `namespace` (within the TTL) grants
    /// every required verb on `secret`: then a check is answered from the cache alone.
    fn granted_by_cached_rules(&self, namespace: &str, secret: &str) -> bool {
        let question = Question::Rules {
            namespace: namespace.to_owned(),
        };
        let now = Instant::now();
        let cache = kube_common::sync::lock(&self.inner.cache);
        let Some(slot) = cache
            .get(&question)
            .filter(|slot| now.saturating_duration_since(slot.asked_at) < self.inner.ttl)
        else {
            return false;
        };
        matches!(
            slot.answer.peek(),
            Some(Ok(Answer::Rules { grants, incomplete: false }))
                if REQUIRED_VERBS.iter().all(|verb| grants.allows(*verb, secret))
        )
    }

    /// Which of get, list and watch the identity may not use on `namespace/secret`.
    pub async fn check(
        &self,
        namespace: &str,
        secret: &str,
    ) -> Result<AccessDecision, AccessError> {
        self.decide(namespace, secret)
            .await
            .map_err(|failure| AccessError::new(namespace, secret, failure))
    }

    async fn decide(&self, namespace: &str, secret: &str) -> Result<AccessDecision, ReviewFailure> {
        let subject = match &self.inner.policy {
            AccessPolicy::Subject { user, .. } => format!("user {user:?}"),
            AccessPolicy::SelfRules | AccessPolicy::SelfReviews => "the router identity".to_owned(),
        };
        let mut denials = Vec::new();
        match self.inner.policy {
            AccessPolicy::SelfRules => {
                let question = Question::Rules {
                    namespace: namespace.to_owned(),
                };
                denials = self
                    .rules_denials(&question, namespace, secret, self.inner.ttl)
                    .await?;
                if !denials.is_empty() {
                    // Only a recent answer may reject a route.
                    denials = self
                        .rules_denials(&question, namespace, secret, self.inner.denied_ttl)
                        .await?;
                }
            }
            AccessPolicy::SelfReviews | AccessPolicy::Subject { .. } => {
                let answers =
                    futures::future::join_all(REQUIRED_VERBS.map(|verb| async move {
                        (verb, self.review(namespace, secret, verb).await)
                    }))
                    .await;
                for (verb, verdict) in answers {
                    if let Verdict::Denied { age } = verdict? {
                        denials.push((verb, age));
                    }
                }
            }
        }
        // A grant (one Role for all three verbs, typically) shows only once every answer
        // behind the denial has been asked again: when the newest of them expires.
        let newest = denials.iter().map(|(_, age)| *age).min();
        Ok(AccessDecision {
            denied: denials.into_iter().map(|(verb, _)| verb).collect(),
            subject,
            recheck_after: newest.map_or(Duration::ZERO, |age| {
                self.inner.denied_ttl.saturating_sub(age)
            }),
        })
    }

    /// The required verbs that a rules review of `namespace` (at most `max_age` old)
    /// does not grant on `secret`, each with the age of the answer that denies it.
    async fn rules_denials(
        &self,
        question: &Question,
        namespace: &str,
        secret: &str,
        max_age: Duration,
    ) -> Result<Vec<(Verb, Duration)>, ReviewFailure> {
        let AgedAnswer { answer, age } = self.ask(question.clone(), max_age).await?;
        let Answer::Rules { grants, incomplete } = answer else {
            return Err(unexpected_answer(ReviewKind::Rules));
        };
        let mut denied = Vec::new();
        for verb in REQUIRED_VERBS {
            if grants.allows(verb, secret) {
                continue;
            }
            // An incomplete rule list cannot prove a denial: ask precisely.
            if incomplete {
                match self.review(namespace, secret, verb).await? {
                    Verdict::Allowed => continue,
                    Verdict::Denied { age } => denied.push((verb, age)),
                }
            } else {
                denied.push((verb, age));
            }
        }
        Ok(denied)
    }

    async fn review(
        &self,
        namespace: &str,
        secret: &str,
        verb: Verb,
    ) -> Result<Verdict, ReviewFailure> {
        let question = Question::Review {
            namespace: namespace.to_owned(),
            secret: secret.to_owned(),
            verb,
        };
        let mut max_age = self.inner.ttl;
        loop {
            let AgedAnswer { answer, age } = self.ask(question.clone(), max_age).await?;
            match answer {
                Answer::Allowed(true) => return Ok(Verdict::Allowed),
                // Only a recent answer may reject a route.
                Answer::Allowed(false) if max_age > self.inner.denied_ttl => {
                    max_age = self.inner.denied_ttl
                }
                Answer::Allowed(false) => return Ok(Verdict::Denied { age }),
                Answer::Rules { .. } => return Err(unexpected_answer(self.review_kind())),
            }
        }
    }

    /// The review kind that answers a per-verb question under the current policy.
    fn review_kind(&self) -> ReviewKind {
        match self.inner.policy {
            AccessPolicy::Subject { .. } => ReviewKind::SubjectAccess,
            AccessPolicy::SelfRules | AccessPolicy::SelfReviews => ReviewKind::SelfAccess,
        }
    }

    /// Answers `question` from the cache (an answer at most `max_age` old), by joining a
    /// request in flight, or by sending one. Failed answers are not cached.
    async fn ask(
        &self,
        question: Question,
        max_age: Duration,
    ) -> Result<AgedAnswer, ReviewFailure> {
        let now = Instant::now();
        let (id, asked_at, answer) = {
            let mut cache = kube_common::sync::lock(&self.inner.cache);
            let fresh = cache
                .get(&question)
                .filter(|slot| now.saturating_duration_since(slot.asked_at) < max_age);
            match fresh {
                Some(slot) => {
                    self.inner.shared.fetch_add(1, Ordering::Relaxed);
                    (slot.id, slot.asked_at, slot.answer.clone())
                }
                None => {
                    // Expired answers are otherwise only replaced when asked again; sweep
                    // them now and then so that forgotten secrets do not accumulate.
                    if cache.len() >= 1024 && cache.len().is_power_of_two() {
                        let ttl = self.inner.ttl;
                        cache.retain(|_, slot| now.saturating_duration_since(slot.asked_at) < ttl);
                    }
                    let id = self.inner.next_slot.fetch_add(1, Ordering::Relaxed);
                    let answer = self.request(question.clone()).boxed().shared();
                    cache.insert(
                        question.clone(),
                        Slot {
                            id,
                            asked_at: now,
                            answer: answer.clone(),
                        },
                    );
                    (id, now, answer)
                }
            }
        };
        let result = answer.await;
        if result.is_err() {
            let mut cache = kube_common::sync::lock(&self.inner.cache);
            if cache.get(&question).is_some_and(|slot| slot.id == id) {
                cache.remove(&question);
            }
        }
        result.map(|answer| AgedAnswer {
            answer,
            age: Instant::now().saturating_duration_since(asked_at),
        })
    }

    /// Creates `review` (one attempt at a time, under the limiter if any), counting
    /// every attempt.
    async fn send_review<K>(&self, review: &K) -> Result<K, kube::Error>
    where
        K: kube::Resource<DynamicType = ()>
            + serde::Serialize
            + serde::de::DeserializeOwned
            + Clone
            + fmt::Debug,
    {
        paced::send(self.inner.limiter.as_ref(), MAX_REFUSALS, |attempt| {
            self.inner.requests.fetch_add(1, Ordering::Relaxed);
            paced::create(&self.inner.client, review, attempt)
        })
        .await
    }

    /// Sends the review that answers `question`.
    fn request(
        &self,
        question: Question,
    ) -> impl Future<Output = Result<Answer, ReviewFailure>> + Send + 'static {
        let this = self.clone();
        async move {
            match question {
                Question::Rules { namespace } => {
                    let review = SelfSubjectRulesReview {
                        spec: SelfSubjectRulesReviewSpec {
                            namespace: Some(namespace.clone()),
                        },
                        ..SelfSubjectRulesReview::default()
                    };
                    let answered = this
                        .send_review(&review)
                        .await
                        .map_err(|err| api_failure(ReviewKind::Rules, &err))?;
                    let status = answered.status.unwrap_or_default();
                    if let Some(error) = status.evaluation_error.filter(|e| !e.is_empty()) {
                        tracing::debug!(%namespace, %error, "rules review reported an evaluation error");
                    }
                    Ok(Answer::Rules {
                        grants: Arc::new(SecretGrants::of(&status.resource_rules)),
                        incomplete: status.incomplete,
                    })
                }
                Question::Review {
                    namespace,
                    secret,
                    verb,
                } => {
                    let attributes = ResourceAttributes {
                        namespace: Some(namespace),
                        verb: Some(verb.as_str().to_owned()),
                        resource: Some("secrets".to_owned()),
                        group: Some(String::new()),
                        name: Some(secret),
                        ..ResourceAttributes::default()
                    };
                    let allowed = match &this.inner.policy {
                        AccessPolicy::Subject { user, groups } => {
                            let review = SubjectAccessReview {
                                spec: SubjectAccessReviewSpec {
                                    user: Some(user.clone()),
                                    groups: Some(groups.clone()),
                                    resource_attributes: Some(attributes),
                                    ..SubjectAccessReviewSpec::default()
                                },
                                ..SubjectAccessReview::default()
                            };
                            this.send_review(&review)
                                .await
                                .map_err(|err| api_failure(ReviewKind::SubjectAccess, &err))?
                                .status
                                .is_some_and(|status| status.allowed)
                        }
                        AccessPolicy::SelfRules | AccessPolicy::SelfReviews => {
                            let review = SelfSubjectAccessReview {
                                spec: SelfSubjectAccessReviewSpec {
                                    resource_attributes: Some(attributes),
                                    ..SelfSubjectAccessReviewSpec::default()
                                },
                                ..SelfSubjectAccessReview::default()
                            };
                            this.send_review(&review)
                                .await
                                .map_err(|err| api_failure(ReviewKind::SelfAccess, &err))?
                                .status
                                .is_some_and(|status| status.allowed)
                        }
                    };
                    Ok(Answer::Allowed(allowed))
                }
            }
        }
    }
}

/// What a per-verb review said, with the age of a denial.
enum Verdict {
    Allowed,
    Denied { age: Duration },
}

fn api_failure(review: ReviewKind, err: &kube::Error) -> ReviewFailure {
    match err {
        kube::Error::Api(status) => ReviewFailure {
            review,
            code: Some(status.code),
            message: status.message.clone(),
        },
        other => ReviewFailure {
            review,
            code: None,
            message: other.to_string(),
        },
    }
}

fn unexpected_answer(review: ReviewKind) -> ReviewFailure {
    ReviewFailure {
        review,
        code: None,
        message: "unexpected answer".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `rules` allow `verb` on the secret called `name`, through the index.
    fn rules_allow(rules: &[ResourceRule], verb: Verb, name: &str) -> bool {
        SecretGrants::of(rules).allows(verb, name)
    }

    /// The plain reading of the rules, rule by rule: whether `rules` (from a rules review of the secret's namespace) allow `verb` on the
    /// secret called `name`.
    fn rules_allow_scan(rules: &[ResourceRule], verb: Verb, name: &str) -> bool {
        rules.iter().any(|rule| {
            rule.verbs.iter().any(|v| v == "*" || v == verb.as_str())
                && lists(&rule.api_groups, "")
                && lists(&rule.resources, "secrets")
                && rule
                    .resource_names
                    .as_deref()
                    .is_none_or(|names| names.is_empty() || names.iter().any(|n| n == name))
        })
    }

    fn rule(verbs: &[&str], groups: &[&str], resources: &[&str], names: &[&str]) -> ResourceRule {
        let strings = |v: &[&str]| Some(v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        ResourceRule {
            verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
            api_groups: strings(groups),
            resources: strings(resources),
            resource_names: if names.is_empty() {
                None
            } else {
                strings(names)
            },
        }
    }

    #[test]
    fn resource_names_restrict_rules() {
        let rules = vec![rule(
            &["get", "list", "watch"],
            &[""],
            &["secrets"],
            &["a", "b"],
        )];
        for verb in REQUIRED_VERBS {
            assert!(rules_allow(&rules, verb, "a"));
            assert!(!rules_allow(&rules, verb, "c"));
        }
        assert!(!rules_allow(&rules, Verb::Delete, "a"));
    }

    #[test]
    fn wildcards_and_other_groups() {
        assert!(rules_allow(
            &[rule(&["*"], &["*"], &["*"], &[])],
            Verb::Watch,
            "x"
        ));
        assert!(!rules_allow(
            &[rule(&["get"], &["apps"], &["secrets"], &[])],
            Verb::Get,
            "x"
        ));
        assert!(!rules_allow(
            &[rule(&["get"], &[""], &["configmaps"], &[])],
            Verb::Get,
            "x"
        ));
        // Each verb may come from a different rule.
        let split = vec![
            rule(&["get"], &[""], &["secrets"], &["x"]),
            rule(&["list", "watch"], &[""], &["secrets"], &["x"]),
        ];
        assert!(
            REQUIRED_VERBS
                .iter()
                .all(|verb| rules_allow(&split, *verb, "x"))
        );
    }

    #[test]
    fn the_index_of_a_rules_answer_allows_what_the_rules_allow() {
        // Rules of every shape (verbs, groups, resources, names, wildcards), combined by
        // a fixed pseudo-random sequence into answers of one to four rules: for every verb
        // and name the index says what reading the rules one by one says.
        let verbs: &[&[&str]] = &[
            &["get"],
            &["list", "watch"],
            &["*"],
            &["delete"],
            &[],
            &["get", "list", "watch"],
        ];
        let groups: &[&[&str]] = &[&[""], &["apps"], &["*"], &["apps", ""], &[]];
        let resources: &[&[&str]] = &[
            &["secrets"],
            &["configmaps"],
            &["*"],
            &["configmaps", "secrets"],
            &[],
        ];
        let names: &[&[&str]] = &[&[], &["a"], &["a", "b"], &["c"], &["*"]];
        let mut shapes = Vec::new();
        for v in verbs {
            for g in groups {
                for r in resources {
                    for n in names {
                        shapes.push(rule(v, g, r, n));
                    }
                }
            }
        }
        // Unset groups and resources, and an empty list of names, read as none / every.
        let mut unset = rule(&["get"], &[], &[], &[]);
        unset.api_groups = None;
        unset.resources = None;
        shapes.push(unset);
        let mut empty_names = rule(&["get", "watch"], &[""], &["secrets"], &[]);
        empty_names.resource_names = Some(Vec::new());
        shapes.push(empty_names);

        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |bound: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            usize::try_from(state % bound as u64).unwrap_or_default()
        };
        let mut allowed = 0;
        for case in 0..4_000 {
            let count = 1 + case % 4;
            let rules: Vec<ResourceRule> = (0..count)
                .map(|_| shapes[next(shapes.len())].clone())
                .collect();
            let grants = SecretGrants::of(&rules);
            for verb in Verb::ALL {
                for name in ["a", "b", "c", "d", "*", ""] {
                    let expected = rules_allow_scan(&rules, verb, name);
                    assert_eq!(
                        grants.allows(verb, name),
                        expected,
                        "{verb} {name:?} {rules:?}"
                    );
                    allowed += usize::from(expected);
                }
            }
        }
        // Both answers were met often.
        let asked = 4_000 * Verb::ALL.len() * 6;
        assert!(
            allowed > asked / 20 && allowed < asked - asked / 20,
            "{allowed} of {asked}"
        );
    }
}
