//! Failed-bind throttling, per bind DN and per client address.
//!
//! After `failed_bind_free` failures, each further failed bind is answered
//! after a delay that doubles from 250 ms up to `failed_bind_max_delay_ms`;
//! after `failed_bind_lockout` failures for a DN (or `failed_bind_lockout_ip`
//! from one address) binds are refused outright, right password or not, for
//! `failed_bind_lockout_seconds`. Records are forgotten that long after the
//! last failure; a successful bind clears its DN's record. Independent of
//! any password policy kept in entries.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use pando_proto::ResultCode;

use crate::config::Limits;
use crate::error::LdapError;
use crate::state::Session;

/// Most records kept per table; beyond it, expired ones are purged and, if
/// that is not enough, the oldest half is dropped.
const MAX_RECORDS: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct Record {
    failures: u32,
    last: Instant,
}

/// What one bind attempt is counted against.
pub struct Key {
    dn: String,
    ip: Option<IpAddr>,
}

impl Key {
    pub fn new(norm_dn: &str, session: &Session) -> Key {
        Key {
            dn: norm_dn.to_string(),
            ip: session.peer_ip,
        }
    }
}

pub struct BindThrottle {
    free: u32,
    max_delay: Duration,
    lockout_dn: u32,
    lockout_ip: u32,
    lockout_for: Duration,
    by_dn: Mutex<HashMap<String, Record>>,
    by_ip: Mutex<HashMap<IpAddr, Record>>,
}

impl BindThrottle {
    pub fn new(l: &Limits) -> BindThrottle {
        BindThrottle {
            free: l.failed_bind_free,
            max_delay: Duration::from_millis(l.failed_bind_max_delay_ms),
            lockout_dn: l.failed_bind_lockout,
            lockout_ip: l.failed_bind_lockout_ip,
            lockout_for: Duration::from_secs(l.failed_bind_lockout_seconds),
            by_dn: Mutex::new(HashMap::new()),
            by_ip: Mutex::new(HashMap::new()),
        }
    }

    fn current<K: std::hash::Hash + Eq>(
        &self,
        map: &Mutex<HashMap<K, Record>>,
        k: &K,
        now: Instant,
    ) -> u32 {
        let Ok(mut m) = map.lock() else { return 0 };
        match m.get(k) {
            Some(r) if now.duration_since(r.last) < self.lockout_for => r.failures,
            Some(_) => {
                m.remove(k);
                0
            }
            None => 0,
        }
    }

    /// Refuse the attempt when the DN or the address is locked out;
    /// otherwise count it as a failure in advance, before any password is
    /// checked: concurrent guesses are counted as they start, so a burst of
    /// them cannot all get a hash computed before the lockout sees the
    /// first failure. [`succeeded`](Self::succeeded) takes the count back.
    pub async fn before_attempt(&self, key: &Key) -> Result<(), LdapError> {
        let now = Instant::now();
        let dn_fails = self.current(&self.by_dn, &key.dn, now);
        let ip_fails = key
            .ip
            .map(|ip| self.current(&self.by_ip, &ip, now))
            .unwrap_or(0);
        let locked = (self.lockout_dn > 0 && dn_fails >= self.lockout_dn)
            || (self.lockout_ip > 0 && ip_fails >= self.lockout_ip);
        if locked {
            tracing::info!(
                dn = %key.dn,
                ip = ?key.ip,
                "bind refused: too many failed binds; locked out for a while"
            );
            // Same answer as a wrong password, after the longest delay, so a
            // guesser learns nothing and gains nothing by hammering.
            tokio::time::sleep(self.max_delay).await;
            return Err(LdapError::new(ResultCode::INVALID_CREDENTIALS, ""));
        }
        Self::bump(&self.by_dn, &key.dn, now, self.lockout_for);
        if let Some(ip) = key.ip {
            Self::bump(&self.by_ip, &ip, now, self.lockout_for);
        }
        Ok(())
    }

    fn bump<K: std::hash::Hash + Eq + Clone>(
        map: &Mutex<HashMap<K, Record>>,
        k: &K,
        now: Instant,
        keep: Duration,
    ) -> u32 {
        let Ok(mut m) = map.lock() else { return 0 };
        if m.len() >= MAX_RECORDS && !m.contains_key(k) {
            m.retain(|_, r| now.duration_since(r.last) < keep);
            if m.len() >= MAX_RECORDS {
                let mut ages: Vec<Instant> = m.values().map(|r| r.last).collect();
                ages.sort_unstable();
                let cut = ages[ages.len() / 2];
                m.retain(|_, r| r.last > cut);
            }
        }
        let r = m.entry(k.clone()).or_insert(Record {
            failures: 0,
            last: now,
        });
        if now.duration_since(r.last) >= keep {
            r.failures = 0;
        }
        r.failures = r.failures.saturating_add(1);
        r.last = now;
        r.failures
    }

    /// The attempt failed (it was counted when it began): wait out its
    /// delay before the answer goes back.
    pub async fn failed(&self, key: &Key) {
        let now = Instant::now();
        let dn_fails = self.current(&self.by_dn, &key.dn, now);
        let ip_fails = key
            .ip
            .map(|ip| self.current(&self.by_ip, &ip, now))
            .unwrap_or(0);
        let d = self.delay_for(dn_fails.max(ip_fails));
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }

    /// The attempt succeeded: its DN's record is cleared and the address
    /// gets back the failure counted in advance.
    pub fn succeeded(&self, key: &Key) {
        if let Ok(mut m) = self.by_dn.lock() {
            m.remove(&key.dn);
        }
        if let (Some(ip), Ok(mut m)) = (key.ip, self.by_ip.lock()) {
            if let Some(r) = m.get_mut(&ip) {
                r.failures = r.failures.saturating_sub(1);
                if r.failures == 0 {
                    m.remove(&ip);
                }
            }
        }
    }

    /// Delay after the `n`th consecutive failure.
    fn delay_for(&self, n: u32) -> Duration {
        if n <= self.free || self.max_delay.is_zero() {
            return Duration::ZERO;
        }
        let steps = (n - self.free - 1).min(16);
        (Duration::from_millis(250) * (1u32 << steps)).min(self.max_delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert!(t.before_attempt(&key).await.is_ok());
            t.failed(&key).await;
        }
        assert!(t.before_attempt(&key).await.is_err());
        // Another DN is unaffected (no address given).
        assert!(t
            .before_attempt(&Key::new("uid=b", &Session::default()))
            .await
            .is_ok());
        // The lockout ends with the window.
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(t.before_attempt(&key).await.is_ok());
        t.failed(&key).await;
        t.succeeded(&key);
        assert_eq!(t.current(&t.by_dn, &key.dn, Instant::now()), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_are_counted_before_the_password_is_checked() {
        let t = throttle(0, 3);
        let key = Key::new("uid=a", &Session::default());
        // Three guesses in flight at once (none has failed yet): a fourth
        // is refused without its password being looked at.
        for _ in 0..3 {
            assert!(t.before_attempt(&key).await.is_ok());
        }
        assert!(t.before_attempt(&key).await.is_err());
        // A right password clears the DN's record.
        t.succeeded(&key);
        assert!(t.before_attempt(&key).await.is_ok());
        // An address gets back only the one attempt that succeeded.
        let ip = Session {
            peer_ip: Some("192.0.2.1".parse().unwrap()),
            ..Session::default()
        };
        let t = BindThrottle::new(&Limits {
            failed_bind_lockout_ip: 10,
            ..Limits::default()
        });
        let (a, b) = (Key::new("uid=a", &ip), Key::new("uid=b", &ip));
        t.before_attempt(&a).await.unwrap();
        t.before_attempt(&b).await.unwrap();
        t.succeeded(&b);
        assert_eq!(t.current(&t.by_ip, &ip.peer_ip.unwrap(), Instant::now()), 1);
    }

    #[test]
    fn tables_stay_bounded() {
        let t = throttle(100, 0);
        let now = Instant::now();
        for i in 0..(MAX_RECORDS + 10) {
            BindThrottle::bump(
                &t.by_dn,
                &format!("uid={i}"),
                now + Duration::from_micros(i as u64),
                t.lockout_for,
            );
        }
        assert!(t.by_dn.lock().unwrap().len() <= MAX_RECORDS);
    }
}
