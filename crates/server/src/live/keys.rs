//! Configurations compared key by key, as the TOML file names them
//! (`section.key`), and the keys only a start takes.

use std::collections::BTreeMap;

use pando_config::Config;

/// Configuration keys (as in the TOML file, `section.key`) whose new
/// values are only taken at the next start: what they size or open is
/// made once, when the server starts. A key names itself and everything
/// below it.
pub const AT_NEXT_START: &[&str] = &[
    "data_dir",
    "threads",
    "user",
    "group",
    "store.map_size_mb",
    "store.warm_start",
    "store.check_all_pages",
    "limits.persistent_search_backlog",
];

/// Keys each server keeps for itself when configurations are shared
/// (a consumer with `config = true`): where it listens and keeps its
/// files, its server ID, its own consumers and pushes, its tuning. A key
/// names itself and everything below it.
pub const LOCAL: &[&str] = &[
    "data_dir",
    "listen",
    "threads",
    "user",
    "group",
    "log_level",
    "schema_files",
    "tls",
    "logs",
    "metrics",
    "store",
    "replication.server_id",
    "replication.consumer",
    "replication.push",
];

/// Whether `key` is shared with the servers that follow this one's
/// configuration (not in [`LOCAL`]).
pub fn shared(key: &str) -> bool {
    !under(LOCAL, key)
}

fn under(list: &[&str], key: &str) -> bool {
    list.iter().any(|k| {
        key == *k
            || key
                .strip_prefix(k)
                .is_some_and(|rest| rest.starts_with('.'))
    })
}

/// Whether `key` is taken only at the next start.
pub fn at_next_start(key: &str) -> bool {
    under(AT_NEXT_START, key)
}

/// The configuration as `section.key → value` leaves (arrays are leaves).
pub fn leaves(cfg: &Config) -> BTreeMap<String, toml::Value> {
    fn walk(prefix: &str, v: &toml::Value, out: &mut BTreeMap<String, toml::Value>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), other.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    // Config holds only TOML-representable values.
    if let Ok(v) = toml::Value::try_from(cfg) {
        walk("", &v, &mut out);
    }
    out
}

/// Keys whose values differ between `a` and `b` (set in one, unset in the
/// other counts).
pub fn changed_keys(a: &Config, b: &Config) -> Vec<String> {
    let (la, lb) = (leaves(a), leaves(b));
    let mut keys: Vec<String> = la
        .iter()
        .filter(|(k, v)| lb.get(*k) != Some(v))
        .map(|(k, _)| k.clone())
        .chain(lb.keys().filter(|k| !la.contains_key(*k)).cloned())
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// `target` with the values of `keys` taken from `source` (a key unset in
/// `source` becomes unset).
pub fn with_keys_from(target: &Config, source: &Config, keys: &[String]) -> Config {
    fn table_at<'a>(root: &'a mut toml::Table, path: &[&str]) -> Option<&'a mut toml::Table> {
        let mut t = root;
        for p in path {
            t = t
                .entry(p.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()?;
        }
        Some(t)
    }
    let (Ok(toml::Value::Table(mut t)), src) = (toml::Value::try_from(target), leaves(source))
    else {
        return target.clone();
    };
    for key in keys {
        let parts: Vec<&str> = key.split('.').collect();
        let Some((last, path)) = parts.split_last() else {
            continue;
        };
        let Some(table) = table_at(&mut t, path) else {
            continue;
        };
        // The whole subtree of `key` in source (a leaf, or a table).
        let below: Vec<(&String, &toml::Value)> = src
            .iter()
            .filter(|(k, _)| *k == key || k.starts_with(&format!("{key}.")))
            .collect();
        table.remove(*last);
        for (k, v) in below {
            let rest: Vec<&str> = k[key.len()..]
                .split('.')
                .filter(|s| !s.is_empty())
                .collect();
            let mut full: Vec<&str> = vec![last];
            full.extend(rest);
            if let Some((leaf, inner)) = full.split_last() {
                if let Some(tt) = table_at(table, inner) {
                    tt.insert(leaf.to_string(), v.clone());
                }
            }
        }
    }
    let mut out: Config = toml::Value::Table(t)
        .try_into()
        .unwrap_or_else(|_| target.clone());
    // Set from the command line, never from TOML.
    out.tls.self_signed = target.tls.self_signed;
    out
}
