//! Password policy (draft-behera-ldap-password-policy-10, as OpenLDAP's
//! ppolicy overlay implements it): policies are `pwdPolicy` entries, an
//! account's is its `pwdPolicySubentry` or the configured default.
//!
//! - Binds ([`PasswordPolicy::on_bind`]): a locked account is refused;
//!   failed binds (and Password Modify's wrong old passwords) are recorded
//!   (`pwdFailureTime`, behind the answer; by the provider on a read-only
//!   consumer: [`failures`]) and lock the account after `pwdMaxFailure`; an expired password is refused or allowed a
//!   grace bind; warnings and errors go in the password policy response
//!   control. A successful bind writes only when there is state to clear
//!   (earlier failures, an expired lock) or a grace bind to count.
//! - Password changes, before the new password is hashed
//!   ([`PasswordPolicy::check_change`]): who may change it, the old
//!   password, minimum age, quality, history. Administrators setting
//!   another account's password skip these (slapd: its root DN).
//! - In the writer ([`Hook::related`]): `pwdChangedTime`, `pwdHistory`,
//!   `pwdReset` kept, failures, grace uses and locks cleared.
//! - A bind answered changeAfterReset restricts the connection to
//!   changing that password ([`restricted`]).

mod failures;
pub mod policy;
pub mod quality;
mod seam;

use std::sync::Arc;

use pando_model::{Dn, Entry, Schema};
use pando_proto::control_values::{PolicyError, PolicyWarning};
use pando_proto::ResultCode;
use pando_store::{Lookup, View};

use self::policy::{is_policy, precise_time, Policy, State};
use self::quality::Quality;
use pando_access::Identity;
use pando_config::overlay::PpolicyConfig;
use pando_ops::error::{LdapError, OpResult};
pub use pando_ops::policy::{refusal, response};
pub use pando_ops::seams::BindVerdict;
use pando_ops::seams::WriteHook;
use pando_ops::state::Server;
use pando_ops::write::{Change, WriteCtx, WriteOp};

/// The DN state changes made by the overlay are stamped with (as
/// slapd's refint names its own changes).
pub const MODIFIERS_NAME: &str = "cn=Password Policy";

pub struct PasswordPolicy {
    /// Normalised DN of the default policy.
    default: Option<String>,
    use_lockout: bool,
    quality: Quality,
    /// Policies read, by DN as named, with the store generation they were
    /// read at: valid while no commit has happened since (binds of
    /// accounts in good standing then read no policy entry).
    cache: std::sync::Mutex<std::collections::HashMap<String, (u64, Option<Policy>)>>,
    /// Failed password checks answered but not yet written, by account.
    /// A failure is answered at once and written behind the answer, so a
    /// wrong password to an existing account takes the time a missing DN
    /// takes (nothing to write); a right password to an account with
    /// failures pending waits for them ([`PasswordPolicy::settled`]) so
    /// the lockout they may set is seen.
    pending: Arc<std::sync::Mutex<std::collections::HashMap<String, failures::Pending>>>,
}

/// Policies remembered at most (a few are usual).
const POLICY_CACHE: usize = 64;

/// An account being bound: its password policy state (the userPassword
/// and pwd* attributes, at least) and its policy, read in one snapshot.
pub struct Account {
    pub entry: Entry,
    pub policy: Option<Policy>,
}

fn now_secs() -> i64 {
    (pando_store::clock::now_micros() / 1_000_000) as i64
}

impl PasswordPolicy {
    pub fn new(cfg: &PpolicyConfig, schema: &Schema) -> Result<PasswordPolicy, String> {
        let default = match &cfg.default_policy {
            Some(d) => {
                Some(schema.normalize_dn(&Dn::parse(d).map_err(|e| format!("'{d}': {e}"))?)?)
            }
            None => None,
        };
        Ok(PasswordPolicy {
            default,
            use_lockout: cfg.use_lockout,
            quality: Quality::load(cfg.min_classes, cfg.banned_file.as_deref())?,
            cache: Default::default(),
            pending: Default::default(),
        })
    }

    /// [`PasswordPolicy::policy_for`], remembered while the store does not
    /// change (`generation`: the snapshot's, None: not remembered).
    pub fn policy_cached(
        &self,
        view: &View<'_>,
        generation: Option<u64>,
        entry: &Entry,
    ) -> OpResult<Option<Policy>> {
        let named = entry
            .values("pwdPolicySubentry")
            .first()
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .or_else(|| self.default.clone());
        let (Some(gen), Some(key)) = (generation, named) else {
            return self.policy_for(view, entry);
        };
        if let Some((g, p)) = self.cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
            if g == gen {
                return Ok(p);
            }
        }
        let p = self.policy_for(view, entry)?;
        if let Ok(mut c) = self.cache.lock() {
            if c.len() >= POLICY_CACHE {
                c.clear();
            }
            c.insert(key, (gen, p.clone()));
        }
        Ok(p)
    }

    /// The policy that applies to `entry`: its `pwdPolicySubentry`, else
    /// the default. A policy entry that is missing or not a pwdPolicy
    /// means no policy (logged: it is a configuration mistake).
    pub fn policy_for(&self, view: &View<'_>, entry: &Entry) -> OpResult<Option<Policy>> {
        let named = entry
            .values("pwdPolicySubentry")
            .first()
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_string);
        let Some(dn) = named.or_else(|| self.default.clone()) else {
            return Ok(None);
        };
        let Ok(parsed) = Dn::parse(&dn) else {
            return Ok(None);
        };
        let Ok(rdns) = view.normalize_rdns(&parsed) else {
            return Ok(None);
        };
        let found = match view.lookup_norm(&rdns)? {
            Lookup::Found(id) => view.entry(id)?,
            Lookup::Missing { .. } => None,
        };
        match found {
            Some(p) if is_policy(&p) => match Policy::from_entry(&p) {
                Ok(policy) => Ok(Some(policy)),
                Err(e) => {
                    tracing::warn!(policy = %dn, "password policy entry is invalid, not applied: {e}");
                    Ok(None)
                }
            },
            _ => {
                tracing::warn!(policy = %dn, account = %entry.dn, "password policy entry not found (or not a pwdPolicy): no policy applies");
                Ok(None)
            }
        }
    }

    /// A bind to the account `norm` whose password was `verified` or not.
    pub async fn on_bind(
        &self,
        server: &Arc<Server>,
        norm: &str,
        account: &Account,
        verified: bool,
        wants: bool,
    ) -> OpResult<BindVerdict> {
        let (entry, policy) = (&account.entry, account.policy.clone());
        let invalid = |error: Option<PolicyError>| {
            let e = LdapError::new(ResultCode::INVALID_CREDENTIALS, "");
            if wants {
                e.with_control(response(None, error))
            } else {
                e
            }
        };
        let control = |w: Option<PolicyWarning>, e: Option<PolicyError>| {
            if wants {
                vec![response(w, e)]
            } else {
                Vec::new()
            }
        };
        let Some(p) = policy else {
            return Ok(if verified {
                BindVerdict::Allow {
                    controls: Vec::new(),
                    restricted: false,
                }
            } else {
                BindVerdict::Refuse(LdapError::new(ResultCode::INVALID_CREDENTIALS, ""))
            });
        };
        let now = now_secs();
        let state = State::of(entry);
        if state.is_locked(&p, now) {
            return Ok(BindVerdict::Refuse(invalid(
                self.use_lockout.then_some(PolicyError::AccountLocked),
            )));
        }
        // Outside pwdStartTime..pwdEndTime the password does not work.
        if !state.in_use_window(now) {
            return Ok(BindVerdict::Refuse(invalid(None)));
        }
        if !verified {
            if p.counts_failures() {
                self.queue_failure(server, norm, &p);
            }
            return Ok(BindVerdict::Refuse(invalid(None)));
        }
        let mut warning = None;
        let mut grace_used = false;
        if let Some(expires) = state.expires(&p) {
            if now >= expires {
                let within = p.grace_expiry == 0 || now < expires + p.grace_expiry as i64;
                if (state.grace_uses as u32) < p.grace_authn_limit && within {
                    grace_used = true;
                    warning = Some(PolicyWarning::GraceAuthNsRemaining(
                        p.grace_authn_limit - state.grace_uses as u32 - 1,
                    ));
                } else {
                    return Ok(BindVerdict::Refuse(invalid(Some(
                        PolicyError::PasswordExpired,
                    ))));
                }
            } else if p.expire_warning > 0 && expires - now <= p.expire_warning as i64 {
                warning = Some(PolicyWarning::TimeBeforeExpiration((expires - now) as u32));
            }
        }
        let clear = !state.failures.is_empty() || state.locked.is_some();
        if clear || grace_used {
            update(server, norm, move |e: &mut Entry| {
                if clear {
                    e.remove("pwdFailureTime");
                    e.remove("pwdAccountLockedTime");
                }
                if grace_used {
                    let t = precise_time(pando_store::clock::now_micros());
                    e.add_values("pwdGraceUseTime", vec![t.into_bytes()]);
                }
            })
            .await;
        }
        let restricted = state.reset && p.must_change;
        let error = restricted.then_some(PolicyError::ChangeAfterReset);
        Ok(BindVerdict::Allow {
            controls: if warning.is_some() || error.is_some() || wants {
                control(warning, error)
            } else {
                Vec::new()
            },
            restricted,
        })
    }

    /// The account `target` and its policy, read now; None when it does
    /// not exist or no policy governs it.
    fn governed(&self, server: &Arc<Server>, target: &str) -> OpResult<Option<(Entry, Policy)>> {
        Ok(self
            .account(server, target)?
            .and_then(|a| a.policy.map(|p| (a.entry, p))))
    }

    /// Checks of a password change of the account `target` to `new` (clear
    /// text, or None when the client sent it hashed), made before it is
    /// hashed; `old_given`: the change names the old password.
    pub async fn check_change(
        &self,
        server: &Arc<Server>,
        who: &Identity,
        target: &str,
        new: Option<&[u8]>,
        old_given: bool,
        wants: bool,
    ) -> OpResult<()> {
        if who.is_admin() && who.norm() != target {
            return Ok(());
        }
        let Some((entry, p)) = self.governed(server, target)? else {
            return Ok(());
        };
        let own = who.norm() == target;
        if own && !p.allow_user_change {
            return Err(refusal(
                ResultCode::INSUFFICIENT_ACCESS_RIGHTS,
                "the password policy does not let users change their own password".into(),
                PolicyError::PasswordModNotAllowed,
                wants,
            ));
        }
        if p.safe_modify && !old_given {
            return Err(refusal(
                ResultCode::INSUFFICIENT_ACCESS_RIGHTS,
                "the password policy needs the old password with the new one".into(),
                PolicyError::MustSupplyOldPassword,
                wants,
            ));
        }
        let state = State::of(&entry);
        if p.min_age > 0 && !state.reset {
            if let Some(changed) = state.changed {
                if now_secs() < changed + p.min_age as i64 {
                    return Err(refusal(
                        ResultCode::CONSTRAINT_VIOLATION,
                        format!(
                            "the password was changed less than {} seconds ago (pwdMinAge)",
                            p.min_age
                        ),
                        PolicyError::PasswordTooYoung,
                        wants,
                    ));
                }
            }
        }
        match new {
            Some(clear) if p.check_quality > 0 => {
                if let Err((why, msg)) = self.quality.check(&p, Some(&entry), clear) {
                    return Err(refusal(ResultCode::CONSTRAINT_VIOLATION, msg, why, wants));
                }
            }
            None if p.check_quality == 2 => {
                return Err(refusal(
                    ResultCode::CONSTRAINT_VIOLATION,
                    "the password policy checks quality, which a hashed password does not allow: send it in clear".into(),
                    PolicyError::InsufficientPasswordQuality,
                    wants,
                ));
            }
            _ => {}
        }
        if let (Some(clear), true) = (new, p.in_history > 0) {
            let mut former = pando_ops::password_values(&entry.attrs);
            former.extend(
                entry
                    .values("pwdHistory")
                    .iter()
                    .filter_map(|h| history_value(h).map(<[u8]>::to_vec)),
            );
            if !former.is_empty() && server.passwords.verify(clear.to_vec(), former).await {
                return Err(refusal(
                    ResultCode::CONSTRAINT_VIOLATION,
                    format!(
                        "the password is the current one or one of the last {} (pwdInHistory)",
                        p.in_history
                    ),
                    PolicyError::PasswordInHistory,
                    wants,
                ));
            }
        }
        Ok(())
    }
}

impl PasswordPolicy {
    /// Checks of a new entry's password, before it is hashed (quality;
    /// one value only). Administrators skip them.
    pub fn check_add(
        &self,
        server: &Arc<Server>,
        who: &Identity,
        entry: &Entry,
        wants: bool,
    ) -> OpResult<()> {
        let values = pando_ops::password_values(&entry.attrs);
        if values.is_empty() || who.is_admin() {
            return Ok(());
        }
        let policy = {
            let rtxn = server.rt.store.read()?;
            self.policy_for(&rtxn.view(), entry)?
        };
        let Some(p) = policy else { return Ok(()) };
        if values.len() > 1 {
            return Err(LdapError::new(
                ResultCode::CONSTRAINT_VIOLATION,
                "the password policy allows one password value",
            ));
        }
        let clear = !pando_password::is_hashed(&values[0]);
        match (clear, p.check_quality) {
            (true, q) if q > 0 => self
                .quality
                .check(&p, Some(entry), &values[0])
                .map_err(|(why, msg)| refusal(ResultCode::CONSTRAINT_VIOLATION, msg, why, wants)),
            (false, 2) => Err(refusal(
                ResultCode::CONSTRAINT_VIOLATION,
                "the password policy checks quality, which a hashed password does not allow: send it in clear".into(),
                PolicyError::InsufficientPasswordQuality,
                wants,
            )),
            _ => Ok(()),
        }
    }
}

/// The password in a `pwdHistory` value, `time#syntax#length#value`.
fn history_value(h: &[u8]) -> Option<&[u8]> {
    let mut rest = h;
    for _ in 0..3 {
        let at = rest.iter().position(|b| *b == b'#')?;
        rest = &rest[at + 1..];
    }
    Some(rest)
}

/// Change the state attributes of the account `norm` with `edit`, in the
/// writer (so concurrent binds count every failure). A replica's
/// accounts are not written (their provider keeps the state).
async fn update(
    server: &Arc<Server>,
    norm: &str,
    edit: impl Fn(&mut Entry) + Send + Sync + 'static,
) {
    let who = Identity::authenticated(
        MODIFIERS_NAME.to_string(),
        MODIFIERS_NAME.to_ascii_lowercase(),
        Arc::default(),
    );
    let ctx = WriteCtx::new(server, &who, Default::default());
    let op = StateUpdate {
        norm: norm.to_string(),
        edit: Box::new(edit),
    };
    if let Err(e) = pando_ops::write::run(ctx, Arc::new(op)).await {
        if e.code != ResultCode::REFERRAL {
            tracing::warn!(
                account = norm,
                "password policy state not written: {}",
                e.message
            );
        }
    }
}

/// A change of an account's password policy state.
struct StateUpdate {
    norm: String,
    edit: Box<dyn Fn(&mut Entry) + Send + Sync>,
}

impl WriteOp for StateUpdate {
    fn plan(&self, _ctx: &WriteCtx, view: &View<'_>) -> OpResult<Vec<Change>> {
        let change = Change::edit(view, &self.norm, |e| {
            (self.edit)(e);
            Ok(())
        })?;
        Ok(vec![change])
    }

    fn audit(&self, _ctx: &WriteCtx, _changes: &[Change]) {}
}

impl WriteHook for PasswordPolicy {
    /// pwdPolicy entries must hold a valid policy.
    fn check(&self, _ctx: &WriteCtx, _view: &View<'_>, changes: &[Change]) -> OpResult<()> {
        for c in changes {
            let Some(after) = c.after.as_ref().filter(|a| is_policy(a)) else {
                continue;
            };
            if let Err(e) = Policy::from_entry(after) {
                return Err(LdapError::new(
                    ResultCode::CONSTRAINT_VIOLATION,
                    format!("password policy {}: {e}", after.dn),
                ));
            }
        }
        Ok(())
    }

    /// Keep the state attributes of accounts whose password the operation
    /// changes.
    fn related(&self, ctx: &WriteCtx, view: &View<'_>, changes: &mut Vec<Change>) -> OpResult<()> {
        // An upgrade on bind stores the same password in another scheme:
        // not a change of password.
        if pando_ops::rehash::is_upgrade(&ctx.who) {
            return Ok(());
        }
        for c in changes.iter_mut() {
            let Some(after) = c.after.as_ref() else {
                continue;
            };
            let before_pw = c
                .before
                .as_ref()
                .map(|b| pando_ops::password_values(&b.entry.attrs))
                .unwrap_or_default();
            let after_pw = pando_ops::password_values(&after.attrs);
            if before_pw == after_pw {
                continue;
            }
            let Some(p) = self.policy_for(view, after)? else {
                continue;
            };
            let own = ctx.who.norm() == c.norm();
            let micros = pando_store::clock::now_micros();
            let reset_asked = after.get("pwdReset").map(|a| &a.values)
                != c.before
                    .as_ref()
                    .and_then(|b| b.entry.get("pwdReset"))
                    .map(|a| &a.values);
            let Some(after) = c.after.as_mut() else {
                continue;
            };
            after.remove("pwdChangedTime");
            if !after_pw.is_empty() {
                after.add_values(
                    "pwdChangedTime",
                    vec![pando_store::clock::generalized_time(micros).into_bytes()],
                );
            }
            for a in ["pwdFailureTime", "pwdGraceUseTime", "pwdAccountLockedTime"] {
                after.remove(a);
            }
            if !reset_asked {
                after.remove("pwdReset");
                if !own && p.must_change && !after_pw.is_empty() {
                    after.add_values("pwdReset", vec![b"TRUE".to_vec()]);
                }
            }
            if p.in_history > 0 && !before_pw.is_empty() {
                let stamp = pando_store::clock::generalized_time(micros);
                let mut history: Vec<Vec<u8>> = after.values("pwdHistory").to_vec();
                for old in &before_pw {
                    let mut v = format!("{stamp}#1.3.6.1.4.1.1466.115.121.1.40#{}#", old.len())
                        .into_bytes();
                    v.extend_from_slice(old);
                    history.push(v);
                }
                // Oldest first (the time leads each value); keep the newest.
                history.sort();
                history.dedup();
                let keep = p.in_history as usize;
                if history.len() > keep {
                    history.drain(..history.len() - keep);
                }
                after.remove("pwdHistory");
                after.add_values("pwdHistory", history);
            }
            if own && !ctx.controls.no_op {
                ctx.who.lift_restriction();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn history_values_give_back_the_password() {
        assert_eq!(
            super::history_value(b"20240101000000Z#1.3.6.1.4.1.1466.115.121.1.40#9#{SSHA}a#b"),
            Some(&b"{SSHA}a#b"[..])
        );
        assert_eq!(super::history_value(b"no hashes"), None);
    }
}
