//! The overlay as the operations consult it (`ops::policy`).

use std::sync::Arc;

use pando_model::Entry;
use pando_store::View;

use super::{failures, Account, PasswordPolicy};
use pando_access::Identity;
use pando_ops::error::OpResult;
use pando_ops::seams::Running;
use pando_ops::seams::{self, BindVerdict};
use pando_ops::state::Server;

impl seams::PasswordPolicy for PasswordPolicy {
    fn has_pending(&self, norm: &str) -> bool {
        PasswordPolicy::has_pending(self, norm)
    }

    fn account(
        &self,
        view: &View<'_>,
        generation: Option<u64>,
        entry: Entry,
    ) -> OpResult<seams::Account> {
        let policy = self.policy_cached(view, generation, &entry)?;
        Ok(Box::new(Account { entry, policy }))
    }

    fn judge_bind<'a>(
        &'a self,
        server: &'a Arc<Server>,
        norm: &'a str,
        account: seams::Account,
        pending: bool,
        verified: bool,
        wants: bool,
    ) -> Running<'a, OpResult<BindVerdict>> {
        Box::pin(async move {
            let account = *account
                .downcast::<Account>()
                .expect("the account was read by this policy");
            // Failures are written behind their answers: a right password
            // waits for those of its account, and judges the state they
            // leave.
            let account = if verified && (pending || self.has_pending(norm)) {
                self.settled(norm).await;
                PasswordPolicy::account(self, server, norm)?.unwrap_or(account)
            } else {
                account
            };
            self.on_bind(server, norm, &account, verified, wants).await
        })
    }

    fn on_password_check<'a>(
        &'a self,
        server: &'a Arc<Server>,
        norm: &'a str,
        verified: bool,
    ) -> Running<'a, OpResult<bool>> {
        Box::pin(PasswordPolicy::on_password_check(
            self, server, norm, verified,
        ))
    }

    fn check_change<'a>(
        &'a self,
        server: &'a Arc<Server>,
        who: &'a Identity,
        target: &'a str,
        new: Option<&'a [u8]>,
        old_given: bool,
        wants: bool,
    ) -> Running<'a, OpResult<()>> {
        Box::pin(PasswordPolicy::check_change(
            self, server, who, target, new, old_given, wants,
        ))
    }

    fn check_add(
        &self,
        server: &Arc<Server>,
        who: &Identity,
        entry: &Entry,
        wants: bool,
    ) -> OpResult<()> {
        PasswordPolicy::check_add(self, server, who, entry, wants)
    }

    fn forwarded_failures<'a>(
        &'a self,
        server: &'a Arc<Server>,
        who: &'a Identity,
        dn: &'a str,
        count: usize,
    ) -> Running<'a, OpResult<()>> {
        Box::pin(failures::forwarded_failures(self, server, who, dn, count))
    }
}
