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
//! In every mode the per-secret watch itself is authorized by the API server for
//! `list`/`watch` on that name, so a stale "allowed" cannot make the router read a
//! secret it may not read.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, ResourceRule, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    SelfSubjectRulesReview, SelfSubjectRulesReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::time::Instant;

/// How long a cached denial is trusted by default.
const DEFAULT_DENIED_TTL: Duration = Duration::from_secs(30);

/// The verbs a router needs on its route's secret, in the order they are reported.
pub const REQUIRED_VERBS: [&str; 3] = ["get", "list", "watch"];

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

/// The outcome of a check: which required verbs are denied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessDecision {
    /// Required verbs the identity may not use on the secret, in [`REQUIRED_VERBS`] order.
    pub denied: Vec<&'static str>,
    /// Who was checked, for messages (e.g. `this client`, or a user name).
    pub subject: String,
}

impl AccessDecision {
    /// Whether every required verb is allowed.
    pub fn allowed(&self) -> bool {
        self.denied.is_empty()
    }
}

/// A check that could not be answered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot check access to secret {namespace}/{secret} ({review}): {message}")]
pub struct AccessError {
    /// Namespace of the secret.
    pub namespace: String,
    /// Name of the secret.
    pub secret: String,
    /// The review kind that failed.
    pub review: &'static str,
    /// HTTP status code, when the API server answered.
    pub code: Option<u16>,
    /// What went wrong.
    pub message: String,
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
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Question {
    Rules {
        namespace: String,
    },
    Review {
        namespace: String,
        secret: String,
        verb: &'static str,
    },
}

#[derive(Clone, Debug)]
enum Answer {
    Rules {
        rules: Arc<Vec<ResourceRule>>,
        incomplete: bool,
    },
    Allowed(bool),
}

type PendingAnswer = Shared<BoxFuture<'static, Result<Answer, AccessError>>>;

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
            .finish_non_exhaustive()
    }
}

impl AccessChecker {
    /// A checker asking the API server through `client`, caching answers for `ttl`.
    pub fn new(client: Client, policy: AccessPolicy, ttl: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                policy,
                ttl,
                denied_ttl: ttl.min(DEFAULT_DENIED_TTL),
                cache: Mutex::new(HashMap::new()),
                next_slot: AtomicU64::new(1),
                requests: AtomicU64::new(0),
                shared: AtomicU64::new(0),
            }),
        }
    }

    /// Trusts a cached denial for `denied_ttl` only (default: the smaller of the TTL
    /// and 30 s); an older denial is asked again before it rejects a route.
    pub fn with_denied_ttl(mut self, denied_ttl: Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.denied_ttl = denied_ttl;
        }
        self
    }

    /// The policy in use.
    pub fn policy(&self) -> &AccessPolicy {
        &self.inner.policy
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
    pub fn prefetch(&self, namespace: &str, secret: &str) {
        let this = self.clone();
        let (namespace, secret) = (namespace.to_owned(), secret.to_owned());
        tokio::spawn(async move {
            // The answer lands in the cache; an error is reported to the real caller.
            let _ = this.check(&namespace, &secret).await;
        });
    }

    /// Which of get, list and watch the identity may not use on `namespace/secret`.
    pub async fn check(
        &self,
        namespace: &str,
        secret: &str,
    ) -> Result<AccessDecision, AccessError> {
        let subject = match &self.inner.policy {
            AccessPolicy::Subject { user, .. } => format!("user {user:?}"),
            AccessPolicy::SelfRules | AccessPolicy::SelfReviews => "the router identity".to_owned(),
        };
        let mut denied = Vec::new();
        match self.inner.policy {
            AccessPolicy::SelfRules => {
                let question = Question::Rules {
                    namespace: namespace.to_owned(),
                };
                denied = self
                    .rules_denials(&question, namespace, secret, self.inner.ttl)
                    .await?;
                if !denied.is_empty() {
                    // Only a recent answer may reject a route.
                    denied = self
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
                for (verb, allowed) in answers {
                    if !allowed? {
                        denied.push(verb);
                    }
                }
            }
        }
        Ok(AccessDecision { denied, subject })
    }

    /// The required verbs that a rules review of `namespace` (at most `max_age` old)
    /// does not grant on `secret`.
    async fn rules_denials(
        &self,
        question: &Question,
        namespace: &str,
        secret: &str,
        max_age: Duration,
    ) -> Result<Vec<&'static str>, AccessError> {
        let Answer::Rules { rules, incomplete } =
            self.ask(question.clone(), secret, max_age).await?
        else {
            return Err(self.error(namespace, secret, "rules review", None, "unexpected answer"));
        };
        let mut denied = Vec::new();
        for verb in REQUIRED_VERBS {
            if rules_allow(&rules, verb, secret) {
                continue;
            }
            // An incomplete rule list cannot prove a denial: ask precisely.
            if incomplete && self.review(namespace, secret, verb).await? {
                continue;
            }
            denied.push(verb);
        }
        Ok(denied)
    }

    async fn review(
        &self,
        namespace: &str,
        secret: &str,
        verb: &'static str,
    ) -> Result<bool, AccessError> {
        let question = Question::Review {
            namespace: namespace.to_owned(),
            secret: secret.to_owned(),
            verb,
        };
        let mut max_age = self.inner.ttl;
        loop {
            match self.ask(question.clone(), secret, max_age).await? {
                Answer::Allowed(true) => return Ok(true),
                // Only a recent answer may reject a route.
                Answer::Allowed(false) if max_age > self.inner.denied_ttl => {
                    max_age = self.inner.denied_ttl
                }
                Answer::Allowed(false) => return Ok(false),
                Answer::Rules { .. } => {
                    return Err(self.error(
                        namespace,
                        secret,
                        "access review",
                        None,
                        "unexpected answer",
                    ));
                }
            }
        }
    }

    /// Answers `question` from the cache (an answer at most `max_age` old), by joining a
    /// request in flight, or by sending one. Failed answers are not cached.
    async fn ask(
        &self,
        question: Question,
        secret: &str,
        max_age: Duration,
    ) -> Result<Answer, AccessError> {
        let now = Instant::now();
        let (id, answer) = {
            let mut cache = self
                .inner
                .cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let fresh = cache
                .get(&question)
                .filter(|slot| now.saturating_duration_since(slot.asked_at) < max_age);
            match fresh {
                Some(slot) => {
                    self.inner.shared.fetch_add(1, Ordering::Relaxed);
                    (slot.id, slot.answer.clone())
                }
                None => {
                    // Expired answers are otherwise only replaced when asked again; sweep
                    // them now and then so that forgotten secrets do not accumulate.
                    if cache.len() >= 1024 && cache.len().is_power_of_two() {
                        let ttl = self.inner.ttl;
                        cache.retain(|_, slot| now.saturating_duration_since(slot.asked_at) < ttl);
                    }
                    let id = self.inner.next_slot.fetch_add(1, Ordering::Relaxed);
                    let answer = self
                        .request(question.clone(), secret.to_owned())
                        .boxed()
                        .shared();
                    cache.insert(
                        question.clone(),
                        Slot {
                            id,
                            asked_at: now,
                            answer: answer.clone(),
                        },
                    );
                    (id, answer)
                }
            }
        };
        let result = answer.await;
        if result.is_err() {
            let mut cache = self
                .inner
                .cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if cache.get(&question).is_some_and(|slot| slot.id == id) {
                cache.remove(&question);
            }
        }
        result
    }

    /// Sends the review that answers `question`.
    fn request(
        &self,
        question: Question,
        secret: String,
    ) -> impl Future<Output = Result<Answer, AccessError>> + Send + 'static {
        let this = self.clone();
        async move {
            this.inner.requests.fetch_add(1, Ordering::Relaxed);
            let client = this.inner.client.clone();
            let params = PostParams::default();
            match question {
                Question::Rules { namespace } => {
                    let review = SelfSubjectRulesReview {
                        spec: SelfSubjectRulesReviewSpec {
                            namespace: Some(namespace.clone()),
                        },
                        ..SelfSubjectRulesReview::default()
                    };
                    let api: Api<SelfSubjectRulesReview> = Api::all(client);
                    let answered = api
                        .create(&params, &review)
                        .await
                        .map_err(|err| this.api_error(&namespace, &secret, "rules review", &err))?;
                    let status = answered.status.unwrap_or_default();
                    if let Some(error) = status.evaluation_error.filter(|e| !e.is_empty()) {
                        tracing::debug!(%namespace, %error, "rules review reported an evaluation error");
                    }
                    Ok(Answer::Rules {
                        rules: Arc::new(status.resource_rules),
                        incomplete: status.incomplete,
                    })
                }
                Question::Review {
                    namespace,
                    secret,
                    verb,
                } => {
                    let attributes = ResourceAttributes {
                        namespace: Some(namespace.clone()),
                        verb: Some(verb.to_owned()),
                        resource: Some("secrets".to_owned()),
                        group: Some(String::new()),
                        name: Some(secret.clone()),
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
                            let api: Api<SubjectAccessReview> = Api::all(client);
                            api.create(&params, &review)
                                .await
                                .map_err(|err| {
                                    this.api_error(
                                        &namespace,
                                        &secret,
                                        "subject access review",
                                        &err,
                                    )
                                })?
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
                            let api: Api<SelfSubjectAccessReview> = Api::all(client);
                            api.create(&params, &review)
                                .await
                                .map_err(|err| {
                                    this.api_error(
                                        &namespace,
                                        &secret,
                                        "self subject access review",
                                        &err,
                                    )
                                })?
                                .status
                                .is_some_and(|status| status.allowed)
                        }
                    };
                    Ok(Answer::Allowed(allowed))
                }
            }
        }
    }

    fn api_error(
        &self,
        namespace: &str,
        secret: &str,
        review: &'static str,
        err: &kube::Error,
    ) -> AccessError {
        match err {
            kube::Error::Api(status) => self.error(
                namespace,
                secret,
                review,
                Some(status.code),
                &status.message,
            ),
            other => self.error(namespace, secret, review, None, &other.to_string()),
        }
    }

    fn error(
        &self,
        namespace: &str,
        secret: &str,
        review: &'static str,
        code: Option<u16>,
        message: &str,
    ) -> AccessError {
        AccessError {
            namespace: namespace.to_owned(),
            secret: secret.to_owned(),
            review,
            code,
            message: message.to_owned(),
        }
    }
}

/// Whether `rules` (from a rules review of the secret's namespace) allow `verb` on the
/// secret called `name`.
fn rules_allow(rules: &[ResourceRule], verb: &str, name: &str) -> bool {
    let any = |values: &Option<Vec<String>>, wanted: &str| {
        values
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|v| v == "*" || v == wanted)
    };
    rules.iter().any(|rule| {
        rule.verbs.iter().any(|v| v == "*" || v == verb)
            && any(&rule.api_groups, "")
            && any(&rule.resources, "secrets")
            && rule
                .resource_names
                .as_deref()
                .is_none_or(|names| names.is_empty() || names.iter().any(|n| n == name))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(!rules_allow(&rules, "delete", "a"));
    }

    #[test]
    fn wildcards_and_other_groups() {
        assert!(rules_allow(
            &[rule(&["*"], &["*"], &["*"], &[])],
            "watch",
            "x"
        ));
        assert!(!rules_allow(
            &[rule(&["get"], &["apps"], &["secrets"], &[])],
            "get",
            "x"
        ));
        assert!(!rules_allow(
            &[rule(&["get"], &[""], &["configmaps"], &[])],
            "get",
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
                .all(|verb| rules_allow(&split, verb, "x"))
        );
    }
}
