//! The server's password work: hashing clear-text values that clients write
//! (add, modify, Password Modify) under the configured [`HashPolicy`], and
//! verifying simple binds.
//!
//! Slow hashes (argon2, PBKDF2, bcrypt, crypt) run on the blocking pool, at
//! most `concurrent` at once, whoever asks: without that bound a few
//! pipelined requests carrying many passwords, or a crowd of wrong-password
//! binds, hold every core and every blocking thread. Callers settle access
//! before they get here; this only bounds what is left.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pando_proto::ResultCode;
use tokio::sync::Semaphore;

use crate::error::{LdapError, OpResult};
use pando_password::HashPolicy;

pub struct PasswordWork {
    policy: HashPolicy,
    /// One permit per slow hash allowed to run.
    slots: Arc<Semaphore>,
    /// A hash of a random password under `policy`. A bind naming a missing
    /// entry (or one without a password it may use) is checked against it,
    /// so it takes as long as a wrong password and does not reveal which
    /// DNs exist.
    decoy: Vec<u8>,
    stats: Arc<WorkStats>,
}

/// Counters for cn=Monitor and /metrics.
#[derive(Default)]
pub struct WorkStats {
    /// Slow hashes running now.
    pub running: AtomicU64,
    /// Most slow hashes ever running at once (never above the bound).
    pub peak: AtomicU64,
    /// Slow hashes computed (hashing and verification).
    pub total: AtomicU64,
    /// Stored values upgraded to the configured scheme at bind
    /// (`ops::rehash`).
    pub upgraded: AtomicU64,
}

impl PasswordWork {
    /// `concurrent`: slow hashes at once; 0 = one per CPU.
    pub fn new(policy: HashPolicy, concurrent: usize) -> PasswordWork {
        let n = if concurrent == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            concurrent
        };
        PasswordWork {
            policy,
            slots: Arc::new(Semaphore::new(n)),
            decoy: policy
                .hash(pando_password::generate_password().as_bytes())
                .into_bytes(),
            stats: Arc::new(WorkStats::default()),
        }
    }

    /// Work under a new policy and bound, counted with this one's figures
    /// (operations already waiting keep the old bound).
    pub fn with_policy(&self, policy: HashPolicy, concurrent: usize) -> PasswordWork {
        PasswordWork {
            stats: self.stats.clone(),
            ..PasswordWork::new(policy, concurrent)
        }
    }

    pub fn policy(&self) -> HashPolicy {
        self.policy
    }

    pub fn stats(&self) -> &WorkStats {
        &self.stats
    }

    /// The values as stored: clear-text ones hashed, hashed ones kept.
    pub async fn hash_all(&self, values: Vec<Vec<u8>>) -> OpResult<Vec<Vec<u8>>> {
        if values.iter().all(|v| pando_password::is_hashed(v)) {
            return Ok(values);
        }
        let policy = self.policy;
        self.hashing(move || {
            values
                .into_iter()
                .map(|v| {
                    if pando_password::is_hashed(&v) {
                        v
                    } else {
                        policy.hash(pando_password::clear_text_of(&v)).into_bytes()
                    }
                })
                .collect()
        })
        .await
    }

    /// `clear` hashed under the policy, whatever it looks like (Password
    /// Modify's new password is always clear text).
    pub async fn hash_one(&self, clear: Vec<u8>) -> OpResult<String> {
        let policy = self.policy;
        self.hashing(move || policy.hash(&clear)).await
    }

    /// Run hashing work `f`: inline when the policy's scheme is cheap,
    /// otherwise through the bounded queue.
    async fn hashing<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> OpResult<T> {
        if !self.policy.is_slow() {
            return Ok(f());
        }
        self.slow(f)
            .await
            .ok_or_else(|| LdapError::new(ResultCode::OTHER, "password hashing failed"))
    }

    /// Whether `clear` matches one of `stored`. With nothing stored, the
    /// decoy is checked instead (and the answer is no), at the same cost.
    pub async fn verify(&self, clear: Vec<u8>, stored: Vec<Vec<u8>>) -> bool {
        let (stored, real) = if stored.is_empty() {
            (vec![self.decoy.clone()], false)
        } else {
            (stored, true)
        };
        let cheap = stored.iter().all(|s| pando_password::is_cheap_to_verify(s));
        let check = move || {
            stored
                .iter()
                .any(|s| pando_password::verify_password(&clear, s))
        };
        if cheap {
            return check() && real;
        }
        self.slow(check).await.unwrap_or(false) && real
    }

    /// Run `f` on the blocking pool once a slot is free; None if it panicked.
    async fn slow<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let permit = self.slots.clone().acquire_owned().await.ok()?;
        let stats = self.stats.clone();
        // Counted inside the blocking task, which runs to the end even when
        // the operation waiting for it is dropped.
        tokio::task::spawn_blocking(move || {
            let now = stats.running.fetch_add(1, Ordering::Relaxed) + 1;
            stats.peak.fetch_max(now, Ordering::Relaxed);
            stats.total.fetch_add(1, Ordering::Relaxed);
            let out = f();
            stats.running.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
            out
        })
        .await
        .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pando_password::Argon2Params;

    /// Cheap argon2 parameters: the tests are about the bound, not the cost.
    fn small() -> HashPolicy {
        HashPolicy::Argon2(Argon2Params {
            m_cost_kib: 64,
            t_cost: 1,
            p_cost: 1,
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_hashes_never_exceed_the_bound() {
        let work = Arc::new(PasswordWork::new(small(), 2));
        let stored = work.policy().hash(b"secret").into_bytes();
        let mut tasks = Vec::new();
        for i in 0..24 {
            let (work, stored) = (work.clone(), stored.clone());
            tasks.push(tokio::spawn(async move {
                let pw = if i % 2 == 0 { "secret" } else { "wrong" };
                work.verify(pw.into(), vec![stored]).await
            }));
        }
        let mut right = 0;
        for t in tasks {
            right += usize::from(t.await.unwrap());
        }
        assert_eq!(right, 12);
        assert_eq!(work.stats().total.load(Ordering::Relaxed), 24);
        assert!(work.stats().peak.load(Ordering::Relaxed) <= 2);
        assert_eq!(work.stats().running.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn nothing_stored_costs_a_hash_and_never_matches() {
        let work = PasswordWork::new(small(), 1);
        // Not even the decoy's own password could match: it is random.
        assert!(!work.verify(b"anything".to_vec(), Vec::new()).await);
        assert_eq!(work.stats().total.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn clear_values_are_hashed_under_the_policy() {
        for policy in [
            small(),
            HashPolicy::Pbkdf2Sha512 { iterations: 1000 },
            HashPolicy::Ssha512,
            HashPolicy::Ssha,
        ] {
            let work = PasswordWork::new(policy, 1);
            let out = work
                .hash_all(vec![b"new".to_vec(), b"{SSHA}kept".to_vec()])
                .await
                .unwrap();
            assert_eq!(out[1], b"{SSHA}kept");
            let prefix = match policy {
                HashPolicy::Argon2(_) => "{ARGON2}",
                HashPolicy::Pbkdf2Sha512 { .. } => "{PBKDF2-SHA512}",
                HashPolicy::Ssha512 => "{SSHA512}",
                HashPolicy::Ssha => "{SSHA}",
            };
            assert!(out[0].starts_with(prefix.as_bytes()), "{policy:?}");
            assert!(
                pando_password::verify_password(b"new", &out[0]),
                "{policy:?}"
            );
            assert!(
                !pando_password::verify_password(b"old", &out[0]),
                "{policy:?}"
            );
        }
    }
}
