//! The certificate-date policy. A validation states a certificate's validity at the
//! time it was made (not yet valid, valid, expired: the date warnings), and a route's
//! status message says what the validation said; so a validation is trusted only while
//! the certificate's validity is still the same, and an admitted route is evaluated
//! again when it changes. Wall-clock times come in as data, like every other input of
//! the machine.

use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use crate::tls::{TlsRejection, ValidatedTls};

/// Where a certificate stands at one time, as its date warnings tell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Validity {
    /// Before `notBefore`.
    NotYetValid,
    /// Between `notBefore` and `notAfter`, both included.
    Valid,
    /// After `notAfter`.
    Expired,
}

impl Validity {
    /// The validity of `tls`'s server certificate at `at`.
    pub fn of(tls: &ValidatedTls, at: Timestamp) -> Self {
        if at < tls.not_before() {
            Self::NotYetValid
        } else if at > tls.not_after() {
            Self::Expired
        } else {
            Self::Valid
        }
    }
}

/// The longest wait before a route is evaluated again for its certificate's dates: a
/// certificate valid for years is looked at again after this, and waits again (timers
/// far in the future are clamped by tokio anyway).
pub const DATES_RECHECK_MAX: Duration = Duration::from_secs(30 * 24 * 3600);

/// Whether `validation`, made at `validated_at`, still says at `now` what a validation
/// made then would: a rejection always does (dates are no reason to reject), accepted
/// material while its certificate's [`Validity`] has not changed.
pub fn validation_holds(
    validation: &Result<Arc<ValidatedTls>, TlsRejection>,
    validated_at: Timestamp,
    now: Timestamp,
) -> bool {
    match validation {
        Ok(tls) => Validity::of(tls, validated_at) == Validity::of(tls, now),
        Err(_) => true,
    }
}

/// How long after `at` the validity of `tls` changes: until the certificate becomes
/// valid, or until it expires (a second past either, so that the change has happened
/// when the route is evaluated again), at most [`DATES_RECHECK_MAX`]; `None` once it
/// has expired, which is for good.
pub fn dates_change_in(tls: &ValidatedTls, at: Timestamp) -> Option<Duration> {
    let next = match Validity::of(tls, at) {
        Validity::NotYetValid => tls.not_before(),
        Validity::Valid => tls.not_after(),
        Validity::Expired => return None,
    };
    let delay = at.duration_until(next) + SignedDuration::from_secs(1);
    let delay = Duration::try_from(delay).ok()?;
    Some(delay.min(DATES_RECHECK_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{LeafSpec, Pki};
    use crate::tls::TlsValidator;

    /// Whole seconds, as certificate dates are.
    fn now() -> Timestamp {
        Timestamp::from_second(Timestamp::now().as_second()).expect("now")
    }

    fn validated(pki: &Pki, spec: &LeafSpec, at: Timestamp) -> Arc<ValidatedTls> {
        let secret = pki.issue(spec).secret("ns", "s");
        Arc::new(
            TlsValidator::default()
                .validate_secret(&secret, None, at)
                .expect("valid fixture"),
        )
    }

    #[test]
    fn a_route_is_looked_at_again_when_its_certificate_dates_pass() {
        let now = now();
        let pki = Pki::new(now);
        let spec = || LeafSpec::new("r.example", now);
        let tls = |spec: LeafSpec| validated(&pki, &spec, now);
        let seconds = |hours: u64| Duration::from_secs(hours * 3600 + 1);
        let in_an_hour = spec().valid(
            now - SignedDuration::from_hours(1),
            now + SignedDuration::from_hours(1),
        );
        assert_eq!(dates_change_in(&tls(in_an_hour), now), Some(seconds(1)));
        assert_eq!(
            dates_change_in(&tls(spec().not_yet_valid(now)), now),
            Some(seconds(24)),
            "becomes valid a day from now"
        );
        assert_eq!(dates_change_in(&tls(spec().expired(now)), now), None);
        let for_years = spec().valid(now, now + SignedDuration::from_hours(5 * 365 * 24));
        assert_eq!(
            dates_change_in(&tls(for_years), now),
            Some(DATES_RECHECK_MAX)
        );
    }

    #[test]
    fn a_validation_holds_until_the_certificate_becomes_valid_or_expires() {
        let now = now();
        let pki = Pki::new(now);
        let hour = SignedDuration::from_hours(1);
        let spec = LeafSpec::new("r.example", now).valid(now - hour, now + hour);
        let valid = Ok(validated(&pki, &spec, now));
        assert!(validation_holds(&valid, now, now + hour));
        assert!(!validation_holds(&valid, now, now + hour + hour), "expired");
        assert!(
            !validation_holds(&valid, now - hour - hour, now),
            "became valid"
        );
        let rejected = Err(TlsRejection::KeyEmpty);
        assert!(validation_holds(&rejected, now - hour * 100, now));
    }
}
