//! A password policy as a `pwdPolicy` entry holds it, and the state of
//! one account as its operational attributes hold it.

use pando_model::{generalized_time_seconds, Entry};

/// `pwdAccountLockedTime` of an account locked until an administrator
/// unlocks it (the value OpenLDAP uses).
pub const LOCKED_FOR_GOOD: &str = "000001010000Z";

/// The settings of one `pwdPolicy` entry (absent attributes take the
/// draft's defaults).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    pub min_age: u64,
    pub max_age: u64,
    pub in_history: u32,
    pub check_quality: u8,
    pub min_length: u32,
    pub max_length: u32,
    pub expire_warning: u64,
    pub grace_authn_limit: u32,
    pub grace_expiry: u64,
    pub lockout: bool,
    pub lockout_duration: u64,
    pub max_failure: u32,
    /// Failure times kept at most (pwdMaxRecordedFailure; at least
    /// pwdMaxFailure).
    pub max_recorded_failure: u32,
    pub failure_count_interval: u64,
    pub must_change: bool,
    pub allow_user_change: bool,
    pub safe_modify: bool,
}

fn text<'e>(e: &'e Entry, attr: &str) -> Option<&'e str> {
    e.values(attr)
        .first()
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(str::trim)
}

fn number(e: &Entry, attr: &str) -> Result<u64, String> {
    match text(e, attr) {
        None => Ok(0),
        Some(t) => t
            .parse::<u64>()
            .map_err(|_| format!("{attr}: '{t}' is not a whole number of 0 or more")),
    }
}

fn flag(e: &Entry, attr: &str, default: bool) -> Result<bool, String> {
    match text(e, attr).map(str::to_ascii_uppercase).as_deref() {
        None => Ok(default),
        Some("TRUE") => Ok(true),
        Some("FALSE") => Ok(false),
        Some(other) => Err(format!("{attr}: '{other}' is not TRUE or FALSE")),
    }
}

impl Policy {
    /// The policy an entry of class pwdPolicy sets; a value out of range
    /// is refused, naming it.
    pub fn from_entry(e: &Entry) -> Result<Policy, String> {
        let small = |attr: &str| -> Result<u32, String> {
            u32::try_from(number(e, attr)?).map_err(|_| format!("{attr}: too large"))
        };
        if let Some(a) = text(e, "pwdAttribute") {
            if !(a.eq_ignore_ascii_case("userPassword") || a == "2.5.4.35") {
                return Err(format!(
                    "pwdAttribute: '{a}': only userPassword (2.5.4.35) can be governed"
                ));
            }
        }
        let p = Policy {
            min_age: number(e, "pwdMinAge")?,
            max_age: number(e, "pwdMaxAge")?,
            in_history: small("pwdInHistory")?,
            check_quality: match number(e, "pwdCheckQuality")? {
                q @ 0..=2 => q as u8,
                q => return Err(format!("pwdCheckQuality: {q} is not 0, 1 or 2")),
            },
            min_length: small("pwdMinLength")?,
            max_length: small("pwdMaxLength")?,
            expire_warning: number(e, "pwdExpireWarning")?,
            grace_authn_limit: small("pwdGraceAuthNLimit")?,
            grace_expiry: number(e, "pwdGraceExpiry")?,
            lockout: flag(e, "pwdLockout", false)?,
            lockout_duration: number(e, "pwdLockoutDuration")?,
            max_failure: small("pwdMaxFailure")?,
            max_recorded_failure: small("pwdMaxRecordedFailure")?,
            failure_count_interval: number(e, "pwdFailureCountInterval")?,
            must_change: flag(e, "pwdMustChange", false)?,
            allow_user_change: flag(e, "pwdAllowUserChange", true)?,
            safe_modify: flag(e, "pwdSafeModify", false)?,
        };
        if p.max_length > 0 && p.max_length < p.min_length {
            return Err(format!(
                "pwdMaxLength: {} is less than pwdMinLength {}",
                p.max_length, p.min_length
            ));
        }
        Ok(p)
    }

    /// Whether failed binds are recorded.
    pub fn counts_failures(&self) -> bool {
        self.lockout && self.max_failure > 0
    }

    /// How many failure times an account keeps.
    pub fn failures_kept(&self) -> usize {
        self.max_recorded_failure.max(self.max_failure).max(1) as usize
    }
}

/// Whether an entry is a password policy.
pub fn is_policy(e: &Entry) -> bool {
    e.values("objectClass")
        .iter()
        .any(|v| v.eq_ignore_ascii_case(b"pwdPolicy"))
}

/// An account's password state.
#[derive(Clone, Debug, Default)]
pub struct State {
    pub changed: Option<i64>,
    /// Locked since (None: not locked); `for_good`: until unlocked.
    pub locked: Option<i64>,
    pub locked_for_good: bool,
    pub failures: Vec<i64>,
    pub grace_uses: usize,
    pub reset: bool,
    /// The password may be used from (pwdStartTime) and until
    /// (pwdEndTime).
    pub usable_from: Option<i64>,
    pub usable_until: Option<i64>,
}

fn times(e: &Entry, attr: &str) -> Vec<i64> {
    e.values(attr)
        .iter()
        .filter_map(|v| generalized_time_seconds(v))
        .collect()
}

impl State {
    pub fn of(e: &Entry) -> State {
        let lock = e.values("pwdAccountLockedTime").first();
        State {
            changed: times(e, "pwdChangedTime").first().copied(),
            locked: lock.and_then(|v| generalized_time_seconds(v)),
            locked_for_good: lock.is_some_and(|v| v.as_slice() == LOCKED_FOR_GOOD.as_bytes()),
            failures: times(e, "pwdFailureTime"),
            grace_uses: e.values("pwdGraceUseTime").len(),
            reset: text(e, "pwdReset").is_some_and(|t| t.eq_ignore_ascii_case("TRUE")),
            usable_from: times(e, "pwdStartTime").first().copied(),
            usable_until: times(e, "pwdEndTime").first().copied(),
        }
    }

    /// Whether the password may be used at `now` (pwdStartTime, pwdEndTime).
    pub fn in_use_window(&self, now: i64) -> bool {
        self.usable_from.is_none_or(|s| now >= s) && self.usable_until.is_none_or(|e| now < e)
    }

    /// Whether the account is locked at `now` under `p`.
    pub fn is_locked(&self, p: &Policy, now: i64) -> bool {
        let Some(since) = self.locked else {
            return false;
        };
        if self.locked_for_good || p.lockout_duration == 0 {
            return true;
        }
        now < since + p.lockout_duration as i64
    }

    /// When the password expires under `p` (None: never).
    pub fn expires(&self, p: &Policy) -> Option<i64> {
        (p.max_age > 0)
            .then_some(self.changed)
            .flatten()
            .map(|c| c + p.max_age as i64)
    }
}

/// GeneralizedTime with microseconds, `YYYYMMDDHHMMSS.ffffffZ`: failure
/// and grace times are multi-valued and must differ within a second.
pub fn precise_time(micros: u64) -> String {
    let secs = pando_store::clock::generalized_time(micros);
    format!("{}.{:06}Z", secs.trim_end_matches('Z'), micros % 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pando_model::Dn;

    fn entry(attrs: &[(&str, &str)]) -> Entry {
        let mut e = Entry::new(Dn::parse("cn=p").unwrap());
        for (a, v) in attrs {
            e.add_values(a, vec![v.as_bytes().to_vec()]);
        }
        e
    }

    #[test]
    fn policies_read_with_the_draft_defaults_and_refuse_bad_values() {
        let p = Policy::from_entry(&entry(&[("pwdAttribute", "userPassword")])).unwrap();
        assert!(p.allow_user_change && !p.lockout && p.max_age == 0);
        let p = Policy::from_entry(&entry(&[
            ("pwdAttribute", "userPassword"),
            ("pwdLockout", "TRUE"),
            ("pwdMaxFailure", "3"),
            ("pwdMaxAge", "600"),
        ]))
        .unwrap();
        assert!(p.counts_failures() && p.max_age == 600);
        for (a, v) in [
            ("pwdCheckQuality", "3"),
            ("pwdMinAge", "-1"),
            ("pwdLockout", "maybe"),
            ("pwdAttribute", "description"),
        ] {
            let e = Policy::from_entry(&entry(&[(a, v)])).unwrap_err();
            assert!(e.contains(a), "{e}");
        }
        let e = Policy::from_entry(&entry(&[("pwdMinLength", "9"), ("pwdMaxLength", "8")]))
            .unwrap_err();
        assert!(e.contains("pwdMaxLength"), "{e}");
    }

    #[test]
    fn lock_and_expiry_follow_the_policy() {
        let p = Policy {
            lockout: true,
            lockout_duration: 60,
            max_age: 100,
            ..Policy::default()
        };
        let s = State::of(&entry(&[
            ("pwdAccountLockedTime", "19700101000100Z"),
            ("pwdChangedTime", "19700101000000Z"),
        ]));
        assert!(s.is_locked(&p, 61) && !s.is_locked(&p, 120));
        assert_eq!(s.expires(&p), Some(100));
        let s = State::of(&entry(&[("pwdAccountLockedTime", LOCKED_FOR_GOOD)]));
        assert!(s.is_locked(&p, i64::MAX / 2));
        let s = State::of(&entry(&[
            ("pwdStartTime", "19700101000100Z"),
            ("pwdEndTime", "19700101000200Z"),
        ]));
        assert!(!s.in_use_window(59) && s.in_use_window(60) && !s.in_use_window(120));
        let p = Policy {
            max_failure: 3,
            max_recorded_failure: 10,
            ..Policy::default()
        };
        assert_eq!(p.failures_kept(), 10);
        assert!(precise_time(1_000_000 * 86400 + 7).ends_with(".000007Z"));
    }
}
