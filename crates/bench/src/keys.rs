//! Which key (user number) each request uses: uniform, hot-set or sequential.
//!
//! The random generator is our own (SplitMix64): seeded per connection, it
//! gives the same key sequence for the same `--seed` whatever crate versions
//! are in use, and costs a few nanoseconds.

use std::sync::atomic::{AtomicU64, Ordering};

/// SplitMix64 (Steele, Lea, Flood 2014): 64-bit state, passes BigCrush.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A seed for stream `n` derived from a run seed, so that connections
    /// draw independent-looking sequences.
    pub fn for_stream(seed: u64, n: u64) -> Rng {
        let mut r = Rng(seed ^ n.wrapping_add(1).wrapping_mul(0xbf58_476d_1ce4_e5b9));
        r.next_u64();
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n > 0), by multiply-shift (Lemire): no division, and
    /// a bias below 2^-32 for any n up to 2^32.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// How keys are drawn from the range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Dist {
    Uniform,
    /// `hot_share` of the requests (a fraction of 2^64) go to the first
    /// `hot_keys` keys of the range, the rest to the others.
    Hot {
        hot_keys: u64,
        hot_share: u64,
    },
    /// lo, lo+1, ... shared by all connections, wrapping at the end.
    Sequential,
}

/// A key range `lo..=hi` and a distribution over it.
#[derive(Debug, Clone)]
pub struct KeySpace {
    pub lo: u64,
    /// Number of keys (hi - lo + 1), at least 1.
    pub n: u64,
    pub dist: Dist,
}

impl KeySpace {
    /// `hot` is (percent of requests, percent of keys), e.g. (80, 20).
    pub fn new(
        lo: u64,
        hi: u64,
        sequential: bool,
        hot: Option<(u32, u32)>,
    ) -> Result<KeySpace, String> {
        if hi < lo {
            return Err(format!("--range {lo}-{hi}: the end is below the start"));
        }
        let n = hi - lo + 1;
        let dist = match (sequential, hot) {
            (true, Some(_)) => return Err("--sequential and --hot exclude each other".into()),
            (true, None) => Dist::Sequential,
            (false, None) => Dist::Uniform,
            (false, Some((req, keys))) => {
                if !(1..=99).contains(&req) || !(1..=99).contains(&keys) {
                    return Err(format!(
                        "--hot {req}:{keys}: both numbers must be percentages from 1 to 99"
                    ));
                }
                let hot_keys = (u128::from(n) * u128::from(keys) / 100) as u64;
                if hot_keys == 0 || hot_keys >= n {
                    return Err(format!(
                        "--hot {req}:{keys}: a range of {n} keys is too small for a hot set of {keys}%"
                    ));
                }
                let hot_share = ((u128::from(req) << 64) / 100) as u64;
                Dist::Hot {
                    hot_keys,
                    hot_share,
                }
            }
        };
        Ok(KeySpace { lo, n, dist })
    }

    /// The next key. `seq` is the run-wide counter of [`Dist::Sequential`].
    pub fn sample(&self, rng: &mut Rng, seq: &AtomicU64) -> u64 {
        match self.dist {
            Dist::Uniform => self.lo + rng.below(self.n),
            Dist::Hot {
                hot_keys,
                hot_share,
            } => {
                if rng.next_u64() < hot_share {
                    self.lo + rng.below(hot_keys)
                } else {
                    self.lo + hot_keys + rng.below(self.n - hot_keys)
                }
            }
            Dist::Sequential => self.lo + seq.fetch_add(1, Ordering::Relaxed) % self.n,
        }
    }

    /// For add and delete, which visit each key once: the next unused key,
    /// or None when the range is used up.
    pub fn claim_once(&self, seq: &AtomicU64) -> Option<u64> {
        let i = seq.fetch_add(1, Ordering::Relaxed);
        (i < self.n).then(|| self.lo + i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_stays_in_range_and_covers_it() {
        let ks = KeySpace::new(10, 19, false, None).unwrap();
        let mut rng = Rng::for_stream(1, 0);
        let seq = AtomicU64::new(0);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            let k = ks.sample(&mut rng, &seq);
            assert!((10..=19).contains(&k));
            seen[(k - 10) as usize] += 1;
        }
        // Each of the 10 keys ~1000 times.
        assert!(seen.iter().all(|&c| (850..1150).contains(&c)), "{seen:?}");
    }

    #[test]
    fn hot_set_gets_its_share() {
        // 80% of the requests to 20% of the keys.
        let ks = KeySpace::new(0, 99_999, false, Some((80, 20))).unwrap();
        assert_eq!(
            ks.dist,
            Dist::Hot {
                hot_keys: 20_000,
                hot_share: ((80u128 << 64) / 100) as u64
            }
        );
        let mut rng = Rng::for_stream(7, 3);
        let seq = AtomicU64::new(0);
        let n = 200_000;
        let mut hot = 0;
        let mut cold_top_half = 0;
        for _ in 0..n {
            let k = ks.sample(&mut rng, &seq);
            assert!(k <= 99_999);
            if k < 20_000 {
                hot += 1;
            } else if k >= 60_000 {
                cold_top_half += 1;
            }
        }
        let hot_frac = hot as f64 / n as f64;
        assert!((0.79..0.81).contains(&hot_frac), "hot fraction {hot_frac}");
        // The cold 20% of requests spread evenly over the other 80,000 keys.
        let cold_frac = cold_top_half as f64 / n as f64;
        assert!(
            (0.095..0.105).contains(&cold_frac),
            "upper cold fraction {cold_frac}"
        );
    }

    #[test]
    fn hot_set_validation() {
        assert!(KeySpace::new(0, 9, false, Some((80, 0))).is_err());
        assert!(KeySpace::new(0, 9, false, Some((100, 20))).is_err());
        // 5% of 10 keys rounds to none.
        let e = KeySpace::new(0, 9, false, Some((80, 5))).unwrap_err();
        assert!(e.contains("too small"), "{e}");
        let e = KeySpace::new(0, 9, true, Some((80, 20))).unwrap_err();
        assert!(e.contains("exclude"), "{e}");
        let e = KeySpace::new(9, 0, false, None).unwrap_err();
        assert!(e.contains("below the start"), "{e}");
    }

    #[test]
    fn sequential_wraps_and_claim_once_stops() {
        let ks = KeySpace::new(5, 7, true, None).unwrap();
        let mut rng = Rng::new(0);
        let seq = AtomicU64::new(0);
        let got: Vec<u64> = (0..7).map(|_| ks.sample(&mut rng, &seq)).collect();
        assert_eq!(got, [5, 6, 7, 5, 6, 7, 5]);
        let seq = AtomicU64::new(0);
        let got: Vec<Option<u64>> = (0..4).map(|_| ks.claim_once(&seq)).collect();
        assert_eq!(got, [Some(5), Some(6), Some(7), None]);
    }

    #[test]
    fn rng_is_deterministic_and_below_is_bounded() {
        let a: Vec<u64> = {
            let mut r = Rng::for_stream(42, 1);
            (0..5).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::for_stream(42, 1);
            (0..5).map(|_| r.next_u64()).collect()
        };
        let c: Vec<u64> = {
            let mut r = Rng::for_stream(42, 2);
            (0..5).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut r = Rng::new(3);
        assert!((0..1000).all(|_| r.below(3) < 3));
        assert!((0..1000).all(|_| r.below(1) == 0));
    }
}
