//! Failed password checks under a policy: recorded behind the answer
//! (one writer task per account, so a wrong password to an existing
//! account is answered as fast as one to a missing DN), forwarded to the
//! provider by a read-only consumer, and counted by the provider when a
//! consumer forwards them (docs/replication.md, "Password policy on
//! consumers").

use std::sync::Arc;

use pando_model::{Dn, Entry};
use pando_store::Lookup;

use super::policy::{precise_time, Policy, State, LOCKED_FOR_GOOD};
use super::{now_secs, update, Account, PasswordPolicy};
use pando_access::Identity;
use pando_ops::error::{LdapError, OpResult};
use pando_ops::state::Server;

/// An account's failures waiting to be written by its one writer task.
pub(super) struct Pending {
    /// Times (microseconds) of the failures not yet taken by the writer
    /// task: the newest `Policy::failures_kept` at most (older ones would
    /// be dropped by the write anyway).
    times: Vec<u64>,
    /// Woken when the account has no failure left to write.
    done: Arc<tokio::sync::Notify>,
}

/// Longest a right password waits for the account's pending failures.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
impl PasswordPolicy {
    /// Record a failed password check of `norm` behind the answer: queued
    /// for the account's writer task, started when none runs.
    pub(super) fn queue_failure(&self, server: &Arc<Server>, norm: &str, p: &Policy) {
        let now = pando_store::clock::now_micros();
        let Ok(mut m) = self.pending.lock() else {
            return;
        };
        if let Some(e) = m.get_mut(norm) {
            if e.times.len() >= p.failures_kept() {
                e.times.remove(0);
            }
            e.times.push(now);
            return;
        }
        m.insert(
            norm.to_string(),
            Pending {
                times: vec![now],
                done: Arc::default(),
            },
        );
        drop(m);
        let (server, norm, p) = (server.clone(), norm.to_string(), p.clone());
        let pending = self.pending.clone();
        tokio::spawn(async move {
            loop {
                let times = {
                    let Ok(mut m) = pending.lock() else { return };
                    let Some(e) = m.get_mut(&norm) else { return };
                    if e.times.is_empty() {
                        if let Some(e) = m.remove(&norm) {
                            e.done.notify_waiters();
                        }
                        return;
                    }
                    std::mem::take(&mut e.times)
                };
                match server.rt.replicas.holding(&norm) {
                    Some(r) if !server.multi_provider() => {
                        forward_failures(&server, &r, &norm, times.len()).await
                    }
                    _ => record_failures(&server, &norm, &p, times).await,
                }
            }
        });
    }

    /// Are failures of `norm` waiting to be written?
    pub fn has_pending(&self, norm: &str) -> bool {
        self.pending.lock().is_ok_and(|m| m.contains_key(norm))
    }

    /// Wait (at most [`SETTLE_WAIT`]) until no failure of `norm` is
    /// waiting to be written.
    pub async fn settled(&self, norm: &str) {
        let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
        loop {
            let done = match self.pending.lock() {
                Ok(m) => match m.get(norm) {
                    Some(e) => e.done.clone(),
                    None => return,
                },
                Err(_) => return,
            };
            let woken = done.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // The writer may have finished between the look and the
            // registration: look again, now that a wake-up cannot be lost.
            let same = self
                .pending
                .lock()
                .is_ok_and(|m| m.get(norm).is_some_and(|e| Arc::ptr_eq(&e.done, &done)));
            if !same {
                continue;
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                return;
            }
        }
    }

    /// The account `norm` and its policy, read now.
    pub fn account(&self, server: &Arc<Server>, norm: &str) -> OpResult<Option<Account>> {
        let rtxn = server.rt.store.read()?;
        let view = rtxn.view();
        let Ok(parsed) = Dn::parse(norm) else {
            return Ok(None);
        };
        let Ok(rdns) = view.normalize_rdns(&parsed) else {
            return Ok(None);
        };
        let entry = match view.lookup_norm(&rdns)? {
            Lookup::Found(id) => view.entry(id)?,
            Lookup::Missing { .. } => None,
        };
        let Some(entry) = entry else { return Ok(None) };
        let policy = self.policy_cached(&view, rtxn.generation(), &entry)?;
        Ok(Some(Account { entry, policy }))
    }

    /// A check of the password of `norm` made outside a bind (Password
    /// Modify's old password), `verified` or not: whether it counts as
    /// right. It is accounted as a bind's would be: a locked account (or
    /// one outside its password's use window) has no right password, so
    /// the answer does not tell whether the guess was right; a wrong one is
    /// recorded as a failure, and may lock the account.
    pub async fn on_password_check(
        &self,
        server: &Arc<Server>,
        norm: &str,
        verified: bool,
    ) -> OpResult<bool> {
        if verified && self.has_pending(norm) {
            self.settled(norm).await;
        }
        let Some(Account {
            entry,
            policy: Some(p),
        }) = self.account(server, norm)?
        else {
            return Ok(verified);
        };
        let now = now_secs();
        let state = State::of(&entry);
        if state.is_locked(&p, now) || !state.in_use_window(now) {
            return Ok(false);
        }
        if !verified && p.counts_failures() {
            self.queue_failure(server, norm, &p);
        }
        Ok(verified)
    }
}

/// Failures of `norm`, an account of the read-only replica `r`, sent to
/// its provider over a short connection made as the consumer's (its URL,
/// TLS and bind), as OpenLDAP's `ppolicy_forward_updates` sends the state
/// through the chain overlay. The provider counts them and locks the
/// account there; the lock comes back with replication. Not sent (logged)
/// when the provider is unreachable or refuses: the in-memory throttle
/// still holds here.
async fn forward_failures(
    server: &Arc<Server>,
    r: &pando_ops::replicas::Held,
    norm: &str,
    n: usize,
) {
    let endpoint = pando_client::Endpoint::from(&r.cfg);
    let sent = async {
        let max_pdu = server.cfg.config.limits.max_pdu_bytes;
        let mut client = pando_client::Client::connect(&endpoint, max_pdu).await?;
        client.bind(&endpoint).await?;
        let value = format!("{norm}\n{n}").into_bytes();
        let answer = client
            .extended(pando_ops::special::PWD_FAILURES_EXOP, value)
            .await;
        client.unbind().await;
        answer
    };
    let limit = std::time::Duration::from_secs(endpoint.timeout_secs.max(1));
    match tokio::time::timeout(limit, sent).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(
            account = norm,
            rid = r.rid,
            provider = %r.cfg.provider,
            "failed binds not forwarded to the provider: {}",
            e.0
        ),
        Err(_) => tracing::warn!(
            account = norm,
            rid = r.rid,
            provider = %r.cfg.provider,
            "failed binds not forwarded to the provider: no answer in time"
        ),
    }
}

/// A consumer's forwarded failures ([`pando_ops::special::PWD_FAILURES_EXOP`]):
/// `<account DN>\n<count>` (a count above the policy's kept failures
/// counts as that many). Recorded as failed binds made now (this
/// server's clock, not the consumer's), durably before the answer. The
/// requester needs `write` on the account's `pwdFailureTime` (or the
/// administrator role): counting failures can lock the account, which
/// nobody else may force. Accounts without a policy counting failures, or
/// already locked, take nothing.
pub async fn forwarded_failures(
    pp: &PasswordPolicy,
    server: &Arc<Server>,
    who: &Identity,
    dn: &str,
    count: usize,
) -> OpResult<()> {
    if who.is_anonymous() {
        return Err(LdapError::access(
            "forwarding failed binds needs an authenticated identity",
        ));
    }
    let parsed = pando_ops::parse_dn(dn)?;
    let norm = server
        .schema
        .normalize_dn(&parsed)
        .map_err(|e| LdapError::invalid_dn(format!("invalid DN: {e}")))?;
    let (entry, policy) = {
        let rtxn = server.rt.store.read()?;
        let view = rtxn.view();
        let id = pando_ops::resolve_for(server, &view, who, &parsed)?;
        let entry = pando_ops::stored_entry(&view, id)?;
        let at = server.schema.attribute("pwdFailureTime");
        pando_ops::require(
            server,
            &view,
            who,
            &norm,
            &entry,
            &[(at, pando_access::acl::WRITE)],
        )?;
        let policy = pp.policy_cached(&view, rtxn.generation(), &entry)?;
        (entry, policy)
    };
    let Some(p) = policy.filter(Policy::counts_failures) else {
        return Ok(());
    };
    if State::of(&entry).is_locked(&p, now_secs()) {
        return Ok(());
    }
    // Only the newest failures_kept are kept: a larger count adds nothing.
    let count = count.min(p.failures_kept());
    let now = pando_store::clock::now_micros();
    let times = (0..count as u64).map(|i| now + i).collect();
    tracing::info!(account = %norm, from = who.dn(), count, "failed binds forwarded by a replica");
    record_failures(server, &norm, &p, times).await;
    Ok(())
}

/// Record failed binds made at `times` (microseconds): failures older than
/// the count interval go, these are added (at most
/// `Policy::failures_kept` are kept), and the account is locked when they
/// reach the limit.
async fn record_failures(server: &Arc<Server>, norm: &str, p: &Policy, times: Vec<u64>) {
    let p = p.clone();
    update(server, norm, move |e: &mut Entry| {
        let now = now_secs();
        let mut kept: Vec<Vec<u8>> = e
            .values("pwdFailureTime")
            .iter()
            .filter(|v| {
                p.failure_count_interval == 0
                    || pando_model::generalized_time_seconds(v)
                        .is_some_and(|t| t + p.failure_count_interval as i64 > now)
            })
            .cloned()
            .collect();
        kept.extend(times.iter().map(|&t| precise_time(t).into_bytes()));
        kept.sort();
        kept.dedup();
        let max = p.failures_kept();
        if kept.len() > max {
            kept.drain(..kept.len() - max);
        }
        let count = kept.len();
        e.remove("pwdFailureTime");
        e.add_values("pwdFailureTime", kept);
        if p.lockout && count >= p.max_failure as usize && e.get("pwdAccountLockedTime").is_none() {
            let t = if p.lockout_duration == 0 {
                LOCKED_FOR_GOOD.to_string()
            } else {
                pando_store::clock::generalized_time(pando_store::clock::now_micros())
            };
            e.add_values("pwdAccountLockedTime", vec![t.into_bytes()]);
        }
    })
    .await;
}
