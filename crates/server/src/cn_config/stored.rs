//! The configuration kept in the store, and how it meets the file.
//!
//! Two `meta` records, written in the transaction that makes a change:
//!
//! | key           | value                                              |
//! |---------------|----------------------------------------------------|
//! | `config`      | the configuration as changed over LDAP (TOML)      |
//! | `config.file` | the configuration file (with command-line options) |
//! |               | as it read when last taken (TOML)                  |
//! | `config.csns` | per shared key, the CSN of its last change, made   |
//! |               | here or copied (`key csn` lines)                   |
//!
//! The stamps let servers share a configuration (`repl::config_sync`):
//! a follower takes each shared key stamped later on the server it
//! follows than here. A key is stamped when it changes on a server that
//! already had a configuration (over LDAP, SIGHUP, the file edited
//! before a start), never by a first start, so servers started from
//! different files do not overwrite each other until someone changes a
//! key.
//!
//! At start the file is compared with `config.file`: a key whose value in
//! the file changed since then was edited by the operator, and the file's
//! value is taken; every other key keeps the stored value (which may have
//! been changed over LDAP). So a new data directory starts from the file,
//! edits to the file still apply, and changes made under cn=config survive
//! restarts. `data_dir` always comes from the file or command line.

use std::path::Path;

use pando_config::Config;

pub const META_CONFIG: &str = "config";
pub const META_CONFIG_FILE: &str = "config.file";
pub const META_CONFIG_CSNS: &str = "config.csns";

/// Per shared key, the CSN of its last change.
pub type Stamps = std::collections::BTreeMap<String, String>;

/// The stamps `text` holds (`key csn` lines; what does not read is
/// skipped).
pub fn parse_stamps(text: &str) -> Stamps {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(k, c)| !k.is_empty() && pando_proto::sync::csn_sid(c).is_some())
        .map(|(k, c)| (k.to_string(), c.to_string()))
        .collect()
}

/// `stamps` as stored.
pub fn stamps_text(stamps: &Stamps) -> String {
    stamps.iter().map(|(k, c)| format!("{k} {c}\n")).collect()
}

/// The stamps the store holds.
pub fn stamps(view: &pando_store::View<'_>) -> Result<Stamps, pando_store::StoreError> {
    Ok(view
        .meta_get(META_CONFIG_CSNS)?
        .map(|v| parse_stamps(&String::from_utf8_lossy(&v)))
        .unwrap_or_default())
}

/// What the store holds.
pub struct Stored {
    pub config: Config,
    pub file: Config,
}

/// A configuration as TOML text (the form the records hold).
pub fn to_text(cfg: &Config) -> Result<String, String> {
    toml::to_string(cfg).map_err(|e| format!("the configuration cannot be written as TOML: {e}"))
}

fn from_text(text: &[u8], what: &str, store: &Path) -> Result<Config, String> {
    let text = std::str::from_utf8(text)
        .map_err(|_| format!("the {what} stored in {} is not UTF-8", store.display()))?;
    Config::from_toml(text, &store.join(format!("meta:{what}"))).map_err(|e| {
        format!(
            "the {what} stored in {} does not read: {e}",
            store.display()
        )
    })
}

/// The configuration records of the store in `data_dir`, if any. A store
/// that cannot be read counts as holding none: opening it next refuses it,
/// with the advice that goes with its problem.
pub fn read(data_dir: &Path) -> Result<Option<Stored>, String> {
    let dir = crate::store_dir(data_dir);
    let Ok(Some(records)) = pando_store::Store::peek_meta(&dir, &[META_CONFIG, META_CONFIG_FILE])
    else {
        return Ok(None);
    };
    let [Some(config), Some(file)] = <[Option<Vec<u8>>; 2]>::try_from(records).unwrap_or_default()
    else {
        return Ok(None);
    };
    Ok(Some(Stored {
        config: from_text(&config, META_CONFIG, &dir)?,
        file: from_text(&file, META_CONFIG_FILE, &dir)?,
    }))
}

/// The configuration to run with, from the stored one and the file.
pub struct Merged {
    pub config: Config,
    /// Keys taken from the file because it changed since last read.
    pub from_file: Vec<String>,
    /// Keys whose stored value differs from the file's (changed over LDAP).
    pub from_store: Vec<String>,
}

pub fn merge(stored: &Stored, file: &Config) -> Merged {
    let edited = crate::live::changed_keys(&stored.file, file);
    let mut config = crate::live::with_keys_from(&stored.config, file, &edited);
    // Where the store is, and what only the command line sets.
    config.data_dir = file.data_dir.clone();
    config.tls.self_signed = file.tls.self_signed;
    let from_store = crate::live::changed_keys(file, &config)
        .into_iter()
        .filter(|k| k != "data_dir")
        .collect();
    Merged {
        config,
        from_file: edited,
        from_store,
    }
}

/// The configuration to run with for the file configuration `file`: the
/// stored one merged with it when the data directory has one.
pub fn effective(stored: Option<&Stored>, file: Config) -> Merged {
    match stored {
        Some(stored) => merge(stored, &file),
        None => Merged {
            config: file,
            from_file: Vec::new(),
            from_store: Vec::new(),
        },
    }
}

/// Why the configuration records were not written (nothing was).
#[derive(Debug)]
pub enum SaveError {
    Text(String),
    Store(pando_store::StoreError),
}

impl std::fmt::Display for SaveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SaveError::Text(e) => f.write_str(e),
            SaveError::Store(e) => write!(f, "cannot store the configuration: {e}"),
        }
    }
}

/// Store `config`, and `file` (the configuration file as read) when
/// given, in one transaction, which also makes the store's schema and
/// index change `catalog` (see [`pando_store::WriteTxn::change_catalog`])
/// and turns change numbers on or off as `config`'s overlays need
/// ([`crate::numbers_changes`]); `stamps` are laid over the stored ones.
pub async fn save(
    store: &pando_store::Store,
    config: &Config,
    file: Option<&Config>,
    catalog: pando_store::CatalogChange,
    stamps: Stamps,
) -> Result<(), SaveError> {
    let numbers = crate::numbers_changes(config);
    let config = to_text(config).map_err(SaveError::Text)?;
    let file = file.map(to_text).transpose().map_err(SaveError::Text)?;
    store
        .write(move |w| {
            put(w, &config, file.as_deref())?;
            if !stamps.is_empty() {
                let mut all = self::stamps(&w.view())?;
                all.extend(stamps);
                w.meta_put(META_CONFIG_CSNS, stamps_text(&all).as_bytes())?;
            }
            w.number_changes(numbers)?;
            w.change_catalog(catalog)
        })
        .await
        .map_err(SaveError::Store)
}

/// At a start: the shared keys in which `config` differs from the
/// configuration the store held (the file edited while the server was
/// down), stamped with `csn`. None for a store that held none (a first
/// start stamps nothing).
pub fn start_stamps(store: &pando_store::Store, config: &Config, csn: &str) -> Stamps {
    let before = store
        .read()
        .ok()
        .and_then(|r| r.view().meta_get(META_CONFIG).ok().flatten())
        .and_then(|t| from_text(&t, META_CONFIG, store.path()).ok());
    match before {
        Some(before) => crate::live::changed_keys(&before, config)
            .into_iter()
            .filter(|k| crate::live::shared(k))
            .map(|k| (k, csn.to_string()))
            .collect(),
        None => Stamps::new(),
    }
}

/// The configuration file as last read, from an open store.
pub fn last_file(store: &pando_store::Store) -> Option<Config> {
    let text = store
        .read()
        .ok()?
        .view()
        .meta_get(META_CONFIG_FILE)
        .ok()??;
    from_text(&text, META_CONFIG_FILE, store.path()).ok()
}

/// Write both records in the writer's transaction `w`.
fn put(
    w: &mut pando_store::WriteTxn<'_>,
    config: &str,
    file: Option<&str>,
) -> Result<(), pando_store::StoreError> {
    w.meta_put(META_CONFIG, config.as_bytes())?;
    if let Some(f) = file {
        w.meta_put(META_CONFIG_FILE, f.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::from_toml(text, Path::new("t.toml")).unwrap()
    }

    #[test]
    fn edits_to_the_file_win_and_ldap_changes_stay() {
        let file_then = cfg("[limits]\nsize_limit = 10\ntime_limit = 20\n");
        // Changed over LDAP since: the size limit and the access rules.
        let stored = Stored {
            config: cfg("[limits]\nsize_limit = 99\ntime_limit = 20\n[[access]]\nby = [{ who = \"*\", rights = \"read\" }]\n"),
            file: file_then.clone(),
        };
        // The operator edits the time limit in the file.
        let file_now = cfg("[limits]\nsize_limit = 10\ntime_limit = 30\n");
        let m = merge(&stored, &file_now);
        assert_eq!(m.config.limits.size_limit, 99);
        assert_eq!(m.config.limits.time_limit, 30);
        assert_eq!(m.config.access.len(), 1);
        assert_eq!(m.from_file, vec!["limits.time_limit".to_string()]);
        assert_eq!(
            m.from_store,
            vec!["access".to_string(), "limits.size_limit".to_string()]
        );
        // Unchanged file: the stored configuration whole.
        let m = merge(&stored, &file_then);
        assert_eq!(m.config, stored.config);
    }

    #[test]
    fn every_configuration_writes_and_reads_back() {
        let c = cfg("root_dn = \"\"\nlisten = [\"ldapi://\"]\n[[access]]\ndn = \"dc=x\"\nby = [{ who = [\"users\", \"tls\"], rights = [\"read\", \"write\"] }]\n[[replication.consumer]]\nrid = 1\nprovider = \"ldap://127.0.0.1:1\"\nsearch_base = \"dc=example,dc=com\"\n");
        let text = to_text(&c).unwrap();
        assert_eq!(Config::from_toml(&text, Path::new("x")).unwrap(), c);
        let d = Config::default();
        assert_eq!(
            Config::from_toml(&to_text(&d).unwrap(), Path::new("x")).unwrap(),
            d
        );
    }
}
