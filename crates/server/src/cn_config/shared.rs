//! The configuration servers share: a consumer with `config = true`
//! follows its provider's shared keys (all but `live::LOCAL`: server ID,
//! listeners, files, its own consumers and pushes). Each shared key
//! carries the CSN of its last change (`stored`'s stamps); a follower
//! takes every key stamped later there than here, with that stamp, so a
//! ring of servers following each other ends with one configuration
//! whatever order changes were made and copied in (the last change of
//! each key wins, by CSN).
//!
//! `CONFIG_STATE_EXOP`'s answer is [`state_text`]: a line `stamps N`, N
//! lines `key csn`, then the shared keys as TOML.

use pando_config::Config;

use super::stored::{parse_stamps, stamps_text, to_text, Stamps};
use crate::live::{leaves, shared, with_keys_from};

/// `cfg`'s shared keys and their stamps, as the answer carries them.
pub fn state_text(cfg: &Config, stamps: &Stamps) -> Result<String, String> {
    let stamps: Stamps = stamps
        .iter()
        .filter(|(k, _)| shared(k))
        .map(|(k, c)| (k.clone(), c.clone()))
        .collect();
    Ok(format!(
        "stamps {}\n{}{}",
        stamps.len(),
        stamps_text(&stamps),
        to_text(&shared_part(cfg))?
    ))
}

/// `cfg` with every local key at its default: what is shared of it.
fn shared_part(cfg: &Config) -> Config {
    let base = Config::default();
    let mut keys: Vec<String> = leaves(&base).into_keys().collect();
    keys.extend(leaves(cfg).into_keys());
    keys.retain(|k| shared(k));
    keys.sort();
    keys.dedup();
    with_keys_from(&base, cfg, &keys)
}

/// What [`state_text`] wrote: the shared keys (in a configuration whose
/// local keys are defaults) and their stamps.
pub fn parse_state(text: &str) -> Result<(Config, Stamps), String> {
    let bad = || "the configuration state does not begin with a stamp count".to_string();
    let (first, rest) = text.split_once('\n').ok_or_else(bad)?;
    let n: usize = first
        .strip_prefix("stamps ")
        .and_then(|n| n.parse().ok())
        .ok_or_else(bad)?;
    let mut lines = rest.splitn(n + 1, '\n');
    let stamp_lines: Vec<&str> = lines.by_ref().take(n).collect();
    let toml = lines.next().unwrap_or("");
    let stamps = parse_stamps(&stamp_lines.join("\n"));
    if stamps.len() != n {
        return Err(format!(
            "the configuration state names {n} stamps, {} read",
            stamps.len()
        ));
    }
    let cfg = Config::from_toml(toml, std::path::Path::new("the provider's configuration"))
        .map_err(|e| e.to_string())?;
    Ok((cfg, stamps))
}

/// The shared keys stamped later in `there` than in `here` (a key never
/// stamped there — as its server started — never wins).
pub fn newer(here: &Stamps, there: &Stamps) -> Vec<String> {
    there
        .iter()
        .filter(|(k, c)| shared(k) && here.get(*k).is_none_or(|h| *c > h))
        .map(|(k, _)| k.clone())
        .collect()
}

/// `here` with `keys` taken from `there`, and the stamps they come with.
pub fn taken(here: &Config, there: &Config, stamps: &Stamps, keys: &[String]) -> (Config, Stamps) {
    let copied = keys
        .iter()
        .filter_map(|k| Some((k.clone(), stamps.get(k)?.clone())))
        .collect();
    (with_keys_from(here, there, keys), copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::from_toml(text, std::path::Path::new("t.toml")).unwrap()
    }

    fn stamps(pairs: &[(&str, &str)]) -> Stamps {
        pairs
            .iter()
            .map(|(k, c)| {
                (
                    k.to_string(),
                    format!("20261129000000.{c}Z#000000#001#000000"),
                )
            })
            .collect()
    }

    #[test]
    fn the_state_carries_shared_keys_only_and_reads_back() {
        let a = cfg("listen = [\"ldap://0.0.0.0:1389\"]\nthreads = 3\n[limits]\nsize_limit = 77\n[indexes]\ndescription = [\"eq\"]\n[replication]\nserver_id = 5\nchangelog_days = 3\n");
        let s = stamps(&[
            ("limits.size_limit", "000002"),
            ("replication.server_id", "000003"),
        ]);
        let text = state_text(&a, &s).unwrap();
        assert!(
            !text.contains("1389") && !text.contains("server_id = 5"),
            "{text}"
        );
        let (b, read) = parse_state(&text).unwrap();
        assert_eq!(read.keys().collect::<Vec<_>>(), ["limits.size_limit"]);
        assert_eq!(b.limits.size_limit, 77);
        assert_eq!(b.replication.changelog_days, 3);
        assert_eq!(b.indexes.get("description"), Some(&vec!["eq".to_string()]));
        assert_eq!(b.replication.server_id, 0);
        assert_eq!(b.threads, Config::default().threads);
        for bad in ["", "stamps x\n", "stamps 2\nlimits.size_limit 2026\n"] {
            assert!(parse_state(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_later_stamp_wins_key_by_key_and_local_keys_never_move() {
        let here = cfg("[limits]\nsize_limit = 1\ntime_limit = 1\n[replication]\nserver_id = 1\n");
        let there = cfg("[limits]\nsize_limit = 2\ntime_limit = 2\n[replication]\nserver_id = 2\n");
        let h = stamps(&[
            ("limits.size_limit", "000005"),
            ("limits.time_limit", "000005"),
        ]);
        let t = stamps(&[
            ("limits.size_limit", "000009"),
            ("limits.time_limit", "000001"),
            ("replication.server_id", "000009"),
        ]);
        let keys = newer(&h, &t);
        assert_eq!(keys, ["limits.size_limit"]);
        let (merged, copied) = taken(&here, &there, &t, &keys);
        assert_eq!((merged.limits.size_limit, merged.limits.time_limit), (2, 1));
        assert_eq!(merged.replication.server_id, 1);
        assert_eq!(copied, stamps(&[("limits.size_limit", "000009")]));
        // Unstamped here: any stamp there wins; equal stamps do not.
        assert_eq!(newer(&Stamps::new(), &h).len(), 2);
        assert!(newer(&h, &h).is_empty());
        // A key removed there (stamped, absent) is removed here.
        let with_index = cfg("[indexes]\ndescription = [\"eq\"]\n");
        assert!(with_index.indexes.contains_key("description"));
        let key = "indexes.description".to_string();
        let (merged, _) = taken(&with_index, &Config::default(), &t, &[key]);
        assert!(!merged.indexes.contains_key("description"));
    }
}
