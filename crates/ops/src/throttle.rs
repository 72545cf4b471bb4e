//! Failed-bind throttling, per bind DN and per client address.
//!
//! After `failed_bind_free` failures, each further failed bind is answered
//! after a delay that doubles from 250 ms up to `failed_bind_max_delay_ms`;
//! after `failed_bind_lockout` failures for a DN (or `failed_bind_lockout_ip`
//! from one address) binds are refused outright, right password or not, for
//! `failed_bind_lockout_seconds`. Records are forgotten that long after the
//! last failure; a successful bind clears its DN's record. Independent of
//! any password policy kept in entries.
//!
//! A DN is counted under a hash keyed with this process's random key: no
//! copy of the DN per attempt, and a client choosing DNs cannot make two
//! collide without knowing the key. Each step of an attempt takes each
//! table's lock once.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use pando_proto::ResultCode;

use crate::error::LdapError;
use pando_access::Session;
use pando_config::Limits;

/// Most records kept per table; beyond it, expired ones are purged and, if
/// that is not enough, the oldest half is dropped.
const MAX_RECORDS: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct Record {
    /// Failed binds recorded (their password was checked and wrong).
    failures: u32,
    /// Attempts let through whose password is still being checked.
    in_flight: u32,
    last: Instant,
}

/// What one bind attempt is counted against.
struct Key {
    /// [`dn_key`] of the normalised DN.
    dn: u64,
    ip: Option<IpAddr>,
}

impl Key {
    fn new(norm_dn: &str, session: &Session) -> Key {
        Key {
            dn: dn_key(norm_dn),
            ip: session.peer_ip,
        }
    }
}

/// A normalised DN's key in the DN table: a hash under this process's
/// random key (see the module header).
fn dn_key(norm_dn: &str) -> u64 {
    static HASHER: OnceLock<RandomState> = OnceLock::new();
    HASHER.get_or_init(RandomState::new).hash_one(norm_dn)
}

/// The `limits.failed_bind_*` settings; replaced by a configuration
/// change, while the failure counts stay.
#[derive(Clone, Copy)]
struct Params {
    free: u32,
    max_delay: Duration,
    lockout_dn: u32,
    lockout_ip: u32,
    lockout_for: Duration,
}

impl Params {
    fn of(l: &Limits) -> Params {
        Params {
            free: l.failed_bind_free,
            max_delay: Duration::from_millis(l.failed_bind_max_delay_ms),
            lockout_dn: l.failed_bind_lockout,
            lockout_ip: l.failed_bind_lockout_ip,
            lockout_for: Duration::from_secs(l.failed_bind_lockout_seconds),
        }
    }
}

pub struct BindThrottle {
    params: std::sync::RwLock<Params>,
    by_dn: Mutex<HashMap<u64, Record>>,
    by_ip: Mutex<HashMap<IpAddr, Record>>,
}

impl BindThrottle {
    pub fn new(l: &Limits) -> BindThrottle {
        BindThrottle {
            params: std::sync::RwLock::new(Params::of(l)),
            by_dn: Mutex::new(HashMap::new()),
            by_ip: Mutex::new(HashMap::new()),
        }
    }

    /// Take the `limits.failed_bind_*` settings of `l` (counts are kept).
    pub fn set_limits(&self, l: &Limits) {
        *self.params.write().unwrap_or_else(|p| p.into_inner()) = Params::of(l);
    }

    fn params(&self) -> Params {
        *self.params.read().unwrap_or_else(|p| p.into_inner())
    }

    /// (failures, attempts in flight) in `r` at `now`; failures are
    /// forgotten `lockout_for` after the last one.
    fn counts(r: Option<&Record>, now: Instant, lockout_for: Duration) -> (u32, u32) {
        match r {
            Some(r) if now.duration_since(r.last) < lockout_for => (r.failures, r.in_flight),
            Some(r) => (0, r.in_flight),
            None => (0, 0),
        }
    }

    /// Locked out at `limit` (0 = never): by recorded failures alone, or,
    /// once there is a failure, by failures and attempts in flight
    /// together. So a burst of parallel guesses meets the lockout while
    /// their hashes are still queued, while a pool of connections binding
    /// with the right password (no failure) is never locked out.
    fn locked(limit: u32, (failures, in_flight): (u32, u32)) -> bool {
        limit > 0
            && (failures >= limit || (failures > 0 && failures.saturating_add(in_flight) >= limit))
    }

    /// Refuse the attempt when the DN or the address is locked out;
    /// otherwise count it as in flight until [`failed`](Self::failed),
    /// [`succeeded`](Self::succeeded) or [`abandoned`](Self::abandoned).
    /// Both tables are held while looking and counting (the DN's first).
    async fn before_attempt(&self, key: &Key, norm_dn: &str) -> Result<(), LdapError> {
        let now = Instant::now();
        let p = self.params();
        let refused = {
            let (Ok(mut dns), Ok(mut ips)) = (self.by_dn.lock(), self.by_ip.lock()) else {
                return Ok(());
            };
            let dn = Self::counts(dns.get(&key.dn), now, p.lockout_for);
            let ip = key
                .ip
                .map_or((0, 0), |ip| Self::counts(ips.get(&ip), now, p.lockout_for));
            let refused = Self::locked(p.lockout_dn, dn) || Self::locked(p.lockout_ip, ip);
            if !refused {
                let enter = &mut |r: &mut Record| r.in_flight = r.in_flight.saturating_add(1);
                Self::update_in(&mut dns, &key.dn, now, p.lockout_for, enter);
                if let Some(ip) = key.ip {
                    Self::update_in(&mut ips, &ip, now, p.lockout_for, enter);
                }
            }
            refused
        };
        if refused {
            tracing::info!(
                dn = %norm_dn,
                ip = ?key.ip,
                "bind refused: too many failed binds; locked out for a while"
            );
            // Same answer as a wrong password, after the longest delay, so a
            // guesser learns nothing and gains nothing by hammering.
            tokio::time::sleep(p.max_delay).await;
            return Err(LdapError::new(ResultCode::INVALID_CREDENTIALS, ""));
        }
        Ok(())
    }

    /// Apply `f` to the DN's and the address's records (made if missing).
    fn each(&self, key: &Key, now: Instant, mut f: impl FnMut(&mut Record)) -> u32 {
        let lockout_for = self.params().lockout_for;
        let dn = Self::update(&self.by_dn, &key.dn, now, lockout_for, &mut f);
        let ip = key
            .ip
            .map(|ip| Self::update(&self.by_ip, &ip, now, lockout_for, &mut f))
            .unwrap_or(0);
        dn.max(ip)
    }

    /// Apply `f` to `k`'s record; its failures afterwards. Failures older
    /// than `keep` are forgotten first. The table stays bounded.
    fn update<K: std::hash::Hash + Eq + Clone>(
        map: &Mutex<HashMap<K, Record>>,
        k: &K,
        now: Instant,
        keep: Duration,
        f: &mut impl FnMut(&mut Record),
    ) -> u32 {
        let Ok(mut m) = map.lock() else { return 0 };
        Self::update_in(&mut m, k, now, keep, f)
    }

    /// [`update`](Self::update) on a table already locked.
    fn update_in<K: std::hash::Hash + Eq + Clone>(
        m: &mut HashMap<K, Record>,
        k: &K,
        now: Instant,
        keep: Duration,
        f: &mut impl FnMut(&mut Record),
    ) -> u32 {
        if m.len() >= MAX_RECORDS && !m.contains_key(k) {
            m.retain(|_, r| now.duration_since(r.last) < keep || r.in_flight > 0);
            if m.len() >= MAX_RECORDS {
                let mut ages: Vec<Instant> = m.values().map(|r| r.last).collect();
                ages.sort_unstable();
                let cut = ages[ages.len() / 2];
                m.retain(|_, r| r.last > cut);
            }
        }
        let r = m.entry(k.clone()).or_insert(Record {
            failures: 0,
            in_flight: 0,
            last: now,
        });
        if now.duration_since(r.last) >= keep {
            r.failures = 0;
        }
        f(r);
        let failures = r.failures;
        if r.failures == 0 && r.in_flight == 0 {
            m.remove(k);
        }
        failures
    }

    /// The attempt's password was wrong: record the failure and wait out
    /// its delay before the answer goes back.
    async fn failed(&self, key: &Key) {
        let now = Instant::now();
        let fails = self.each(key, now, |r| {
            r.in_flight = r.in_flight.saturating_sub(1);
            r.failures = r.failures.saturating_add(1);
            r.last = now;
        });
        let d = self.delay_for(fails);
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }

    /// The attempt succeeded: its DN's failures are cleared.
    fn succeeded(&self, key: &Key) {
        let now = Instant::now();
        let keep = self.params().lockout_for;
        Self::update(&self.by_dn, &key.dn, now, keep, &mut |r: &mut Record| {
            r.in_flight = r.in_flight.saturating_sub(1);
            r.failures = 0;
        });
        if let Some(ip) = key.ip {
            Self::update(&self.by_ip, &ip, now, keep, &mut |r: &mut Record| {
                r.in_flight = r.in_flight.saturating_sub(1);
            });
        }
    }

    /// [`before_attempt`](Self::before_attempt) as a guard: dropped without
    /// an outcome (an internal error, or the client went away mid-bind),
    /// the attempt is [`abandoned`](Self::abandoned), so in-flight counts
    /// never leak.
    pub async fn begin(&self, norm_dn: &str, session: &Session) -> Result<Attempt<'_>, LdapError> {
        let key = Key::new(norm_dn, session);
        self.before_attempt(&key, norm_dn).await?;
        Ok(Attempt {
            throttle: self,
            key: Some(key),
        })
    }

    /// The attempt ended without an answer on the password (an internal
    /// error): it is no longer in flight, and nothing is recorded.
    fn abandoned(&self, key: &Key) {
        self.each(key, Instant::now(), |r| {
            r.in_flight = r.in_flight.saturating_sub(1);
        });
    }

    /// Delay after the `n`th consecutive failure.
    fn delay_for(&self, n: u32) -> Duration {
        let p = self.params();
        if n <= p.free || p.max_delay.is_zero() {
            return Duration::ZERO;
        }
        let steps = (n - p.free - 1).min(16);
        (Duration::from_millis(250) * (1u32 << steps)).min(p.max_delay)
    }
}

/// One bind attempt in flight (see [`BindThrottle::begin`]).
pub struct Attempt<'t> {
    throttle: &'t BindThrottle,
    /// Taken when the outcome is recorded.
    key: Option<Key>,
}

impl Attempt<'_> {
    pub async fn failed(mut self) {
        if let Some(k) = self.key.take() {
            self.throttle.failed(&k).await;
        }
    }

    pub fn succeeded(mut self) {
        if let Some(k) = self.key.take() {
            self.throttle.succeeded(&k);
        }
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if let Some(k) = self.key.take() {
            self.throttle.abandoned(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl BindThrottle {
        /// (failures, attempts in flight) for `k` now.
        fn current<K: std::hash::Hash + Eq>(
            &self,
            map: &Mutex<HashMap<K, Record>>,
            k: &K,
            now: Instant,
        ) -> (u32, u32) {
            let m = map.lock().unwrap();
            Self::counts(m.get(k), now, self.params().lockout_for)
        }
    }

    fn throttle(free: u32, lockout: u32) -> BindThrottle {
        BindThrottle::new(&Limits {
            failed_bind_free: free,
            failed_bind_max_delay_ms: 1000,
            failed_bind_lockout: lockout,
            failed_bind_lockout_ip: 0,
            failed_bind_lockout_seconds: 60,
            ..Limits::default()
        })
    }

    #[test]
    fn delay_doubles_and_caps() {
        let t = throttle(2, 0);
        assert_eq!(t.delay_for(1), Duration::ZERO);
        assert_eq!(t.delay_for(2), Duration::ZERO);
        assert_eq!(t.delay_for(3), Duration::from_millis(250));
        assert_eq!(t.delay_for(4), Duration::from_millis(500));
        assert_eq!(t.delay_for(5), Duration::from_millis(1000));
        assert_eq!(t.delay_for(50), Duration::from_millis(1000));
    }

    #[tokio::test(start_paused = true)]
    async fn lockout_then_success_clears() {
        let t = throttle(0, 3);
        let key = Key::new("uid=a", &Session::default());
        for _ in 0..3 {
            assert!(t.before_attempt(&key, "uid=a").await.is_ok());
            t.failed(&key).await;
        }
        assert!(t.before_attempt(&key, "uid=a").await.is_err());
        // Another DN is unaffected (no address given).
        assert!(t
            .before_attempt(&Key::new("uid=b", &Session::default()), "uid=b")
            .await
            .is_ok());
        // The lockout ends with the window.
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(t.before_attempt(&key, "uid=a").await.is_ok());
        t.failed(&key).await;
        t.succeeded(&key);
        assert_eq!(t.current(&t.by_dn, &key.dn, Instant::now()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_in_flight_count_once_a_failure_is_recorded() {
        let t = throttle(0, 3);
        let key = Key::new("uid=a", &Session::default());
        // A pool binding with the right password: many in flight, no
        // failure, nobody locked out.
        for _ in 0..5 {
            assert!(t.before_attempt(&key, "uid=a").await.is_ok());
        }
        for _ in 0..5 {
            t.succeeded(&key);
        }
        assert!(t.by_dn.lock().unwrap().is_empty());
        // Guesses: once one has failed, those still being checked count.
        for _ in 0..3 {
            assert!(t.before_attempt(&key, "uid=a").await.is_ok());
        }
        t.failed(&key).await;
        assert_eq!(t.current(&t.by_dn, &key.dn, Instant::now()), (1, 2));
        assert!(
            t.before_attempt(&key, "uid=a").await.is_err(),
            "1 failure + 2 in flight"
        );
        // An internal error takes the attempt back without a failure.
        t.abandoned(&key);
        t.abandoned(&key);
        assert_eq!(t.current(&t.by_dn, &key.dn, Instant::now()), (1, 0));
        // A right password clears the DN's failures.
        assert!(t.before_attempt(&key, "uid=a").await.is_ok());
        t.succeeded(&key);
        assert!(t.by_dn.lock().unwrap().is_empty());
    }

    #[test]
    fn tables_stay_bounded() {
        let t = throttle(100, 0);
        let now = Instant::now();
        for i in 0..(MAX_RECORDS + 10) {
            BindThrottle::update(
                &t.by_dn,
                &dn_key(&format!("uid={i}")),
                now + Duration::from_micros(i as u64),
                t.params().lockout_for,
                &mut |r: &mut Record| r.failures += 1,
            );
        }
        assert!(t.by_dn.lock().unwrap().len() <= MAX_RECORDS);
    }
}
