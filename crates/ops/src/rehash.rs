//! Upgrade on bind: a simple bind whose password matched a value stored in
//! a weaker scheme than the configured one (clear text, `{MD5}`, `{SSHA}`,
//! md5-crypt… see [`pando_password::Strength`]) stores the same password again
//! under the configured scheme, before the bind is answered. Sites that
//! migrate from a store full of legacy hashes get them replaced as their
//! users log in, with no password reset. `[passwords] upgrade_on_bind =
//! false` turns it off.
//!
//! The new value replaces exactly the value that matched, through the
//! write pipeline (stamped, in the change log, replicated) as the identity
//! [`MODIFIERS_NAME`]. It is not a password change: the password policy
//! leaves pwdChangedTime, pwdReset and pwdHistory as they were. On a
//! read-only replica the pipeline refers the write to the provider, and
//! nothing is upgraded there (the provider upgrades at the user's next
//! bind on it). A failure to upgrade never fails the bind.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use pando_proto::ResultCode;
use pando_store::View;

use super::write::{Change, WriteCtx, WriteOp};
use crate::error::{LdapError, OpResult};
use crate::state::Server;
use pando_access::Identity;

/// The identity that writes upgraded values (modifiersName).
pub const MODIFIERS_NAME: &str = "cn=Password Upgrade";

/// Whether writes by `who` are upgrades (the password policy skips them).
pub fn is_upgrade(who: &Identity) -> bool {
    who.norm().eq_ignore_ascii_case(MODIFIERS_NAME)
}

/// Of a bind's stored values, those in a weaker scheme than the configured
/// one (none when upgrade on bind is off). Almost always empty, which
/// allocates nothing.
pub fn weak_values(server: &Server, stored: &[Vec<u8>]) -> Vec<Vec<u8>> {
    if !server.cfg.config.passwords.upgrade_on_bind {
        return Vec::new();
    }
    let target = server.passwords.policy().strength();
    stored
        .iter()
        .filter(|v| pando_password::strength(v) < target)
        .cloned()
        .collect()
}

/// After a successful bind of `norm` with `clear`: of `weak` (its stored
/// values in a scheme weaker than the configured one), upgrade the one the
/// password matches.
pub async fn after_bind(server: &Arc<Server>, norm: &str, clear: &[u8], weak: &[Vec<u8>]) {
    let mut old = None;
    for v in weak {
        if server
            .passwords
            .verify(clear.to_vec(), vec![v.clone()])
            .await
        {
            old = Some(v.clone());
            break;
        }
    }
    let Some(old) = old else { return };
    let new = match server.passwords.hash_one(clear.to_vec()).await {
        Ok(h) => h.into_bytes(),
        Err(_) => return,
    };
    let who = Identity::authenticated(
        MODIFIERS_NAME.to_string(),
        MODIFIERS_NAME.to_ascii_lowercase(),
        Arc::default(),
    );
    let ctx = WriteCtx::new(server, &who, Default::default());
    let op = Upgrade {
        norm: norm.to_string(),
        old,
        new,
    };
    match super::write::run(ctx, Arc::new(op)).await {
        Ok(_) => {
            server
                .passwords
                .stats()
                .upgraded
                .fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                account = norm,
                "password hash upgraded to the configured scheme"
            );
        }
        // A replica refers writes to its provider; the value may also have
        // changed since the bind read it (then there is nothing to do).
        Err(e) if e.code == ResultCode::REFERRAL || e.code == ResultCode::NO_SUCH_ATTRIBUTE => {}
        Err(e) => tracing::warn!(account = norm, "password hash not upgraded: {}", e.message),
    }
}

/// Replace the userPassword value `old` of the entry `norm` by `new`.
struct Upgrade {
    norm: String,
    old: Vec<u8>,
    new: Vec<u8>,
}

impl WriteOp for Upgrade {
    fn plan(&self, _ctx: &WriteCtx, view: &View<'_>) -> OpResult<Vec<Change>> {
        let change = Change::edit(view, &self.norm, |after| {
            let slot = after
                .attrs
                .iter_mut()
                .filter(|a| pando_model::desc::is_password(&a.desc))
                .flat_map(|a| a.values.iter_mut())
                .find(|v| **v == self.old)
                .ok_or_else(|| {
                    LdapError::new(
                        ResultCode::NO_SUCH_ATTRIBUTE,
                        "the value changed since the bind",
                    )
                })?;
            *slot = self.new.clone();
            Ok(())
        })?;
        Ok(vec![change])
    }

    fn audit(&self, _ctx: &WriteCtx, _changes: &[Change]) {}
}
