//! The configuration as entries under `cn=config`, and modifications of
//! those entries turned back into a configuration.
//!
//! The typed [`Config`] stays the one model: every configuration key (as
//! in the TOML file) is one attribute of one of two entries, found in
//! [`KEYS`]. Keys with an OpenLDAP equivalent of the same meaning carry its
//! `olc*` name (`olcAccess`, `olcSuffix`, `olcDbIndex`, `olcSizeLimit`…);
//! every other key's attribute is `pando` followed by the key in camel
//! case (`store.durability` is `pandoStoreDurability`).
//!
//! ```text
//! cn=config                          olcGlobal: server-wide settings
//! olcDatabase={1}mdb,cn=config       olcMdbConfig: suffixes, root DN,
//!                                    indexes, access rules, store
//!   olcOverlay={n}<type>,…           an overlay each ([`overlay_tree`])
//! cn=schema,cn=config                schema added while serving
//!                                    ([`schema_tree`])
//! ```
//!
//! A modification is applied to the entry's attribute values as text,
//! then the values of every key are parsed back into a configuration,
//! which the caller validates and installs as a whole.

pub mod overlay_tree;
pub mod rule_text;
pub mod schema_tree;
pub mod serve;
pub mod shared;
pub mod stored;

use std::collections::BTreeMap;

use pando_model::{Dn, Entry};
use pando_proto::{Change, ModOp, ResultCode};

use crate::error::LdapError;
use pando_config::{AccessRule, Config};

pub use crate::ops::config_tree::{CONFIG_DN, CONFIG_NORM};
pub const DATABASE_DN: &str = "olcDatabase={1}mdb,cn=config";
pub const DATABASE_NORM: &str = "olcdatabase={1}mdb,cn=config";
/// OID arc of the configuration schema: attribute types `.1.N`, object
/// classes `.2.N` (numbers in [`KEYS`] never change once published).
pub const OID_ARC: &str = "2.25.15972167931155808496075090497880241257.3";

/// Which entry holds a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Global,
    Database,
    /// Entries of their own below cn=schema,cn=config ([`schema_tree`]).
    Schema,
    /// Entries of their own below the database entry ([`overlay_tree`]).
    Overlays,
}

/// How a key's value is written as attribute values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    Text,
    Integer,
    Boolean,
    /// A list of strings: one value each.
    List,
    /// Access rules: ordered values `{n}to … by …` ([`rule_text`]).
    Rules,
    /// A list of tables: ordered values `{n}{ key = value, … }` (TOML).
    Tables,
    /// `indexes`: one value per attribute, `uid eq,sub`.
    Indexes,
    /// `[[schema]]`, `[[overlay]]`: an entry each ([`schema_tree`],
    /// [`overlay_tree`]).
    Documents,
}

/// A configuration key under cn=config.
#[derive(Debug)]
pub struct Key {
    /// Attribute type number (OID `OID_ARC.1.<n>`).
    pub n: u32,
    /// The key as in the TOML file.
    pub key: &'static str,
    /// The OpenLDAP name, or "" for `pando` + the key in camel case.
    pub olc: &'static str,
    pub place: Place,
    pub form: Form,
    /// Shown, never changed over LDAP (where the data directory is).
    pub read_only: bool,
}

const fn k(n: u32, key: &'static str, olc: &'static str, place: Place, form: Form) -> Key {
    Key {
        n,
        key,
        olc,
        place,
        form,
        read_only: false,
    }
}

use Form::*;
use Place::*;

/// Every key. Numbers are the attribute types' OIDs: append, never reuse.
pub const KEYS: &[Key] = &[
    Key {
        read_only: true,
        ..k(1, "data_dir", "olcDbDirectory", Database, Text)
    },
    k(2, "listen", "", Global, List),
    k(3, "suffixes", "olcSuffix", Database, List),
    k(4, "root_dn", "olcRootDN", Database, Text),
    k(5, "root_password_hash", "olcRootPW", Database, Text),
    k(6, "log_level", "olcLogLevel", Global, Text),
    k(7, "threads", "olcThreads", Global, Integer),
    k(8, "user", "", Global, Text),
    k(9, "group", "", Global, Text),
    k(10, "schema_files", "", Global, List),
    k(11, "indexes", "olcDbIndex", Database, Indexes),
    k(12, "access", "olcAccess", Database, Rules),
    k(13, "schema", "", Schema, Documents),
    k(14, "overlay", "", Overlays, Documents),
    k(
        20,
        "limits.max_pdu_bytes",
        "olcSockbufMaxIncomingAuth",
        Global,
        Integer,
    ),
    k(21, "limits.size_limit", "olcSizeLimit", Global, Integer),
    k(22, "limits.time_limit", "olcTimeLimit", Global, Integer),
    k(23, "limits.max_filter_depth", "", Global, Integer),
    k(24, "limits.max_filter_terms", "", Global, Integer),
    k(25, "limits.unindexed_search_limit", "", Global, Integer),
    k(26, "limits.max_connections", "", Global, Integer),
    k(27, "limits.max_values_per_operation", "", Global, Integer),
    k(28, "limits.max_tree_delete", "", Global, Integer),
    k(29, "limits.max_sort_entries", "", Global, Integer),
    k(30, "limits.max_persistent_searches", "", Global, Integer),
    k(150, "limits.max_sort_keys", "", Global, Integer),
    k(151, "limits.max_sort_memory_mb", "", Global, Integer),
    k(152, "limits.persistent_search_reserve", "", Global, Integer),
    k(
        153,
        "limits.max_persistent_searches_per_connection",
        "",
        Global,
        Integer,
    ),
    k(
        154,
        "limits.max_persistent_searches_per_identity",
        "",
        Global,
        Integer,
    ),
    k(31, "limits.persistent_search_backlog", "", Global, Integer),
    k(
        32,
        "limits.max_ops_per_connection",
        "olcConnMaxPendingAuth",
        Global,
        Integer,
    ),
    k(33, "limits.max_search_threads", "", Global, Integer),
    k(34, "limits.idle_timeout", "olcIdleTimeout", Global, Integer),
    k(
        35,
        "limits.write_timeout",
        "olcWriteTimeout",
        Global,
        Integer,
    ),
    k(36, "limits.min_write_rate", "", Global, Integer),
    k(37, "limits.max_connections_per_ip", "", Global, Integer),
    k(38, "limits.failed_bind_free", "", Global, Integer),
    k(39, "limits.failed_bind_max_delay_ms", "", Global, Integer),
    k(40, "limits.failed_bind_lockout", "", Global, Integer),
    k(41, "limits.failed_bind_lockout_ip", "", Global, Integer),
    k(
        42,
        "limits.failed_bind_lockout_seconds",
        "",
        Global,
        Integer,
    ),
    k(
        43,
        "limits.anonymous.max_pdu_bytes",
        "olcSockbufMaxIncoming",
        Global,
        Integer,
    ),
    k(
        44,
        "limits.anonymous.max_ops",
        "olcConnMaxPending",
        Global,
        Integer,
    ),
    k(45, "limits.anonymous.size_limit", "", Global, Integer),
    k(46, "limits.anonymous.time_limit", "", Global, Integer),
    k(47, "limits.anonymous.idle_timeout", "", Global, Integer),
    k(48, "limits.by", "", Database, Tables),
    k(50, "store.map_size_mb", "", Database, Integer),
    k(51, "store.max_write_batch", "", Database, Integer),
    k(52, "store.durability", "", Database, Text),
    k(53, "store.batched_max_writes", "", Database, Integer),
    k(54, "store.batched_max_ms", "", Database, Integer),
    k(55, "store.warm_start", "", Database, Boolean),
    k(56, "store.check_all_pages", "", Database, Boolean),
    k(57, "store.compression", "", Database, Text),
    k(58, "store.compression_level", "", Database, Integer),
    k(59, "store.keep_tombstones_days", "", Database, Integer),
    k(70, "auth.require_secure_binds", "", Global, Boolean),
    k(71, "auth.admins", "", Global, List),
    k(72, "auth.break_glass", "", Global, Text),
    k(73, "auth.external_map", "", Global, Tables),
    k(80, "passwords.scheme", "", Global, Text),
    k(81, "passwords.argon2_memory_kib", "", Global, Integer),
    k(82, "passwords.argon2_time", "", Global, Integer),
    k(83, "passwords.argon2_parallelism", "", Global, Integer),
    k(84, "passwords.pbkdf2_iterations", "", Global, Integer),
    k(85, "passwords.max_concurrent_hashes", "", Global, Integer),
    k(86, "passwords.max_clear_values", "", Global, Integer),
    k(87, "passwords.upgrade_on_bind", "", Global, Boolean),
    k(90, "tls.cert_file", "olcTLSCertificateFile", Global, Text),
    k(91, "tls.key_file", "olcTLSCertificateKeyFile", Global, Text),
    k(92, "tls.ca_file", "olcTLSCACertificateFile", Global, Text),
    k(93, "tls.client_certs", "", Global, Text),
    k(94, "tls.min_version", "", Global, Text),
    k(100, "logs.access", "", Global, Text),
    k(101, "logs.access_format", "", Global, Text),
    k(102, "logs.access_buffer", "", Global, Integer),
    k(103, "logs.on_full", "", Global, Text),
    k(104, "logs.audit", "", Global, Text),
    k(105, "logs.max_size_mb", "", Global, Integer),
    k(106, "logs.rotate_daily", "", Global, Boolean),
    k(107, "logs.file_mode", "", Global, Text),
    k(110, "metrics.listen", "", Global, Text),
    k(111, "metrics.dashboard", "", Global, Boolean),
    k(120, "replication.server_id", "olcServerID", Global, Integer),
    k(121, "replication.changelog_days", "", Global, Integer),
    k(
        122,
        "replication.changelog_max_changes",
        "",
        Global,
        Integer,
    ),
    k(123, "replication.refresh_required", "", Global, Boolean),
    k(129, "replication.max_changes_counted", "", Global, Integer),
    k(124, "replication.consumer", "", Database, Tables),
    k(127, "replication.push", "", Database, Tables),
    k(
        125,
        "replication.multi_provider",
        "olcMultiProvider",
        Database,
        Boolean,
    ),
    k(126, "posix_schema", "", Global, Text),
];

/// Attribute type numbers of attributes that are not keys.
pub const AT_NEXT_START_N: u32 = 200;
/// `olcOverlay`'s attribute type number.
pub const OLC_OVERLAY_N: u32 = AT_NEXT_START_N + 2;

impl Key {
    /// The attribute's name.
    pub fn attr(&self) -> String {
        if !self.olc.is_empty() {
            return self.olc.to_string();
        }
        let mut s = String::from("pando");
        for word in self.key.split(['.', '_']) {
            let mut c = word.chars();
            if let Some(f) = c.next() {
                s.extend(f.to_uppercase());
                s.push_str(c.as_str());
            }
        }
        s
    }

    fn ordered(&self) -> bool {
        matches!(self.form, Rules | Tables)
    }

    fn single(&self) -> bool {
        matches!(self.form, Text | Integer | Boolean)
    }
}

/// The key whose attribute is `name` (any case).
pub fn key_for_attr(name: &str) -> Option<&'static Key> {
    KEYS.iter()
        .filter(|k| k.form != Documents)
        .find(|k| k.attr().eq_ignore_ascii_case(name))
}

/// The key `key` (as in the TOML file).
pub fn key_named(key: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.key == key)
}

/// The attribute name of a TOML key, or the key itself (diagnostics).
pub fn attr_of(key: &str) -> String {
    // `access[3].by` and `indexes.uid` name their list's key.
    let base = key.split('[').next().unwrap_or(key);
    let base = if base.starts_with("indexes.") {
        "indexes"
    } else {
        base
    };
    match key_named(base) {
        Some(k) => format!("{} ({key})", k.attr()),
        None => key.to_string(),
    }
}

/// The configuration as reads show it (cn=config, `pando config export`,
/// the audit log): no credential in it ([`hide_credentials`]).
///
/// [`hide_credentials`]: pando_config::consumer::hide_credentials
pub fn shown(cfg: &Config) -> std::borrow::Cow<'_, Config> {
    let r = &cfg.replication;
    if r.consumer.iter().all(|c| c.credentials.is_none())
        && r.push.iter().all(|p| p.credentials.is_none())
    {
        return std::borrow::Cow::Borrowed(cfg);
    }
    let mut out = cfg.clone();
    pando_config::consumer::hide_credentials(&mut out.replication.consumer);
    pando_config::consumer::hide_credentials(&mut out.replication.push);
    std::borrow::Cow::Owned(out)
}

/// A configuration's keys as attribute values, per attribute name, as
/// reads show them ([`shown`]).
fn values_of(cfg: &Config) -> BTreeMap<&'static str, Vec<String>> {
    let shown = shown(cfg);
    let cfg = &*shown;
    let leaves = crate::live::leaves(cfg);
    let mut out: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for key in KEYS {
        let vals: Vec<String> = match key.form {
            Indexes => cfg
                .indexes
                .iter()
                .map(|(attr, kinds)| format!("{attr} {}", kinds.join(",")))
                .collect(),
            // No rules configured means the built-in ones: shown as such,
            // so the entry says which rules are in force.
            Rules if cfg.access.is_empty() => pando_access::acl::default_rules()
                .iter()
                .map(rule_text::format)
                .collect(),
            Rules => cfg.access.iter().map(rule_text::format).collect(),
            Documents => Vec::new(),
            _ => match leaves.get(key.key) {
                None => Vec::new(),
                Some(toml::Value::Array(a)) => a.iter().map(scalar_text).collect(),
                Some(v) => vec![scalar_text(v)],
            },
        };
        let vals = if key.ordered() {
            vals.into_iter()
                .enumerate()
                .map(|(i, v)| format!("{{{i}}}{v}"))
                .collect()
        } else {
            vals
        };
        if !vals.is_empty() {
            out.insert(key.key, vals);
        }
    }
    out
}

fn scalar_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Boolean(true) => "TRUE".into(),
        toml::Value::Boolean(false) => "FALSE".into(),
        // Tables (list elements) inline, as a TOML value.
        other => other.to_string(),
    }
}

/// The two entries for the configuration `desired` (as stored), each with
/// `pandoAtNextStart` naming the attributes whose stored values the
/// running server (`running`) takes only at its next start.
pub fn entries(desired: &Config, running: &Config) -> Vec<(String, Entry)> {
    let values = values_of(desired);
    let pending: Vec<&'static Key> = crate::live::changed_keys(running, desired)
        .iter()
        .filter_map(|changed| {
            KEYS.iter()
                .find(|k| changed == k.key || changed.starts_with(&format!("{}.", k.key)))
        })
        .collect();
    let mut out = Vec::new();
    for (dn, place, classes, rdn) in [
        (CONFIG_DN, Global, &["olcGlobal"][..], ("cn", "config")),
        (
            DATABASE_DN,
            Database,
            &["olcDatabaseConfig", "olcMdbConfig"][..],
            ("olcDatabase", "{1}mdb"),
        ),
    ] {
        let Ok(parsed) = Dn::parse(dn) else { continue };
        let mut e = Entry::new(parsed);
        let mut oc = vec![b"top".to_vec()];
        oc.extend(classes.iter().map(|c| c.as_bytes().to_vec()));
        e.add_values("objectClass", oc);
        e.add_values(rdn.0, vec![rdn.1.as_bytes().to_vec()]);
        for key in KEYS.iter().filter(|k| k.place == place) {
            if let Some(v) = values.get(key.key) {
                e.add_values(
                    &key.attr(),
                    v.iter().map(|s| s.as_bytes().to_vec()).collect(),
                );
            }
        }
        let mut later: Vec<Vec<u8>> = pending
            .iter()
            .filter(|k| k.place == place)
            .map(|k| k.attr().into_bytes())
            .collect();
        later.dedup();
        if !later.is_empty() {
            e.add_values("pandoAtNextStart", later);
        }
        out.push((dn.to_string(), e));
    }
    out.extend(overlay_tree::entries(&desired.overlay));
    out.extend(schema_tree::entries(&desired.schema));
    out
}

fn constraint(msg: String) -> LdapError {
    LdapError::new(ResultCode::CONSTRAINT_VIOLATION, msg)
}

/// The position and name an entry added directly below `parent_norm`
/// gives in its RDN, `<attr>={n}name` as written (`{n}` optional); refused
/// with `how` when `norm` is not such an entry.
pub(crate) fn added_name(
    dn: &Dn,
    norm: &str,
    parent_norm: &str,
    attr: &str,
    how: String,
) -> Result<(Option<usize>, String), LdapError> {
    let direct = norm
        .strip_suffix(&format!(",{parent_norm}"))
        .and_then(|r| r.strip_prefix(&format!("{attr}=")))
        .is_some_and(|r| !r.contains(','));
    if !direct {
        return Err(LdapError::unwilling(how));
    }
    // As written: the normalised value is lower-case.
    let written = dn
        .rdns
        .first()
        .and_then(|r| r.avas.first())
        .map(|a| String::from_utf8_lossy(&a.value).into_owned())
        .unwrap_or_default();
    let (at, name) = split_ordinal(&written);
    Ok((at, name.to_string()))
}

/// `{n}rest` → (Some(n), rest); anything else → (None, value).
pub(crate) fn split_ordinal(v: &str) -> (Option<usize>, &str) {
    if let Some(rest) = v.strip_prefix('{') {
        if let Some((n, tail)) = rest.split_once('}') {
            if let Ok(n) = n.parse::<usize>() {
                return (Some(n), tail);
            }
        }
    }
    (None, v)
}

/// Apply `changes` to the entry `norm` of the configuration `desired`;
/// the configuration it describes afterwards (not yet validated).
pub fn apply(desired: &Config, norm: &str, changes: &[Change]) -> Result<Config, LdapError> {
    let place = match norm {
        CONFIG_NORM => Global,
        DATABASE_NORM => Database,
        _ => {
            return Err(LdapError::unwilling(
                "only cn=config and olcDatabase={1}mdb,cn=config can be modified",
            ))
        }
    };
    let mut values = values_of(desired);
    let mut touched: Vec<&'static str> = Vec::new();
    for ch in changes {
        let name = ch.attr.name.as_str();
        let Some(key) = key_for_attr(name) else {
            if ["objectClass", "cn", "olcDatabase", "pandoAtNextStart"]
                .iter()
                .any(|n| n.eq_ignore_ascii_case(name))
            {
                return Err(constraint(format!("{name} cannot be changed")));
            }
            return Err(LdapError::new(
                ResultCode::UNDEFINED_ATTRIBUTE_TYPE,
                format!("{name}: not a configuration attribute of this server"),
            ));
        };
        let attr = key.attr();
        if key.place != place {
            let other = if key.place == Global {
                CONFIG_DN
            } else {
                DATABASE_DN
            };
            return Err(LdapError::new(
                ResultCode::OBJECT_CLASS_VIOLATION,
                format!("{attr} belongs to {other}"),
            ));
        }
        if key.read_only {
            return Err(constraint(format!(
                "{attr} cannot be changed while serving (it is the data directory)"
            )));
        }
        let given: Vec<String> = ch
            .attr
            .values
            .iter()
            .map(|v| {
                String::from_utf8(v.clone())
                    .map_err(|_| LdapError::invalid_syntax(format!("{attr}: a value is not UTF-8")))
            })
            .collect::<Result<_, _>>()?;
        let current = values.entry(key.key).or_default();
        *current = change_values(&attr, key.ordered(), key.single(), current, ch.op, &given)?;
        touched.push(key.key);
    }
    let mut cfg = from_values(desired, &values)?;
    // Values were read with passwords hidden: the placeholder given back
    // keeps what is stored.
    pando_config::consumer::keep_hidden_credentials(
        &mut cfg.replication.consumer,
        &desired.replication.consumer,
    );
    pando_config::consumer::keep_hidden_credentials(
        &mut cfg.replication.push,
        &desired.replication.push,
    );
    // No rules configured shows the built-in ones; unless changed, they
    // stay built in rather than becoming configured copies.
    if !touched.contains(&"access") {
        cfg.access = desired.access.clone();
    }
    Ok(cfg)
}

/// The values of `attr` after the modification `op` with `given`, as
/// text: ordered values are kept as `{n}value` (positions are the order;
/// `add` with `{n}` inserts there, `delete` with `{n}` removes that one);
/// others as given (a value present twice is refused).
pub fn change_values(
    attr: &str,
    ordered: bool,
    single: bool,
    current: &[String],
    op: ModOp,
    given: &[String],
) -> Result<Vec<String>, LdapError> {
    // Work on the values without their {n}: positions are the order.
    let strip = |v: &String| {
        if ordered {
            split_ordinal(v).1.to_string()
        } else {
            v.clone()
        }
    };
    let mut list: Vec<String> = current.iter().map(strip).collect();
    match op {
        ModOp::Add => {
            if single && !list.is_empty() {
                return Err(LdapError::new(
                    ResultCode::ATTRIBUTE_OR_VALUE_EXISTS,
                    format!("{attr} has a value already (replace it)"),
                ));
            }
            for v in given {
                if ordered {
                    let (at, text) = split_ordinal(v);
                    let at = at.unwrap_or(list.len()).min(list.len());
                    list.insert(at, text.to_string());
                } else if list.iter().any(|x| x == v) {
                    return Err(LdapError::new(
                        ResultCode::ATTRIBUTE_OR_VALUE_EXISTS,
                        format!("{attr}: '{v}' is there already"),
                    ));
                } else {
                    list.push(v.clone());
                }
            }
        }
        ModOp::Delete if given.is_empty() => list.clear(),
        ModOp::Delete => {
            // By position ({n}, with or without the text) or by text;
            // positions are those before this modification.
            let mut drop: Vec<usize> = Vec::new();
            for v in given {
                let (at, text) = split_ordinal(v);
                let found = match at {
                    Some(n) if ordered && n < list.len() => Some(n),
                    _ => list.iter().position(|x| x == text || x == v),
                };
                match found {
                    Some(i) => drop.push(i),
                    None => {
                        return Err(LdapError::new(
                            ResultCode::NO_SUCH_ATTRIBUTE,
                            format!("{attr}: no value '{v}'"),
                        ))
                    }
                }
            }
            drop.sort_unstable();
            drop.dedup();
            for i in drop.into_iter().rev() {
                list.remove(i);
            }
        }
        ModOp::Replace => list = given.iter().map(strip).collect(),
        ModOp::Increment => {
            return Err(constraint(format!("{attr} cannot be incremented")));
        }
    }
    if single && list.len() > 1 {
        return Err(constraint(format!("{attr} takes one value")));
    }
    Ok(if ordered {
        list.into_iter()
            .enumerate()
            .map(|(i, v)| format!("{{{i}}}{v}"))
            .collect()
    } else {
        list
    })
}

/// The configuration the attribute values describe.
fn from_values(
    base: &Config,
    values: &BTreeMap<&'static str, Vec<String>>,
) -> Result<Config, LdapError> {
    let mut root = toml::Table::new();
    for key in KEYS {
        let Some(vals) = values.get(key.key) else {
            continue;
        };
        if vals.is_empty() {
            continue;
        }
        let attr = key.attr();
        let bad =
            |v: &str, what: &str| LdapError::invalid_syntax(format!("{attr}: '{v}' is not {what}"));
        let value = match key.form {
            Text => toml::Value::String(vals[0].clone()),
            Integer => toml::Value::Integer(
                vals[0]
                    .trim()
                    .parse::<i64>()
                    .map_err(|_| bad(&vals[0], "an integer"))?,
            ),
            Boolean => match vals[0].to_ascii_uppercase().as_str() {
                "TRUE" => toml::Value::Boolean(true),
                "FALSE" => toml::Value::Boolean(false),
                _ => return Err(bad(&vals[0], "TRUE or FALSE")),
            },
            List => toml::Value::Array(vals.iter().cloned().map(toml::Value::String).collect()),
            Rules => rule_values(&attr, vals)?,
            Tables => table_values(&attr, vals)?,
            Documents => continue,
            Indexes => index_table(vals, &bad)?,
        };
        insert_at(&mut root, key.key, value);
    }
    // Every key is an attribute, so a configuration without an index
    // says so (an absent `indexes` table would mean the defaults).
    if !root.contains_key("indexes") {
        root.insert("indexes".into(), toml::Value::Table(toml::Table::new()));
    }
    let mut cfg: Config = toml::Value::Table(root)
        .try_into()
        .map_err(|e: toml::de::Error| {
            LdapError::invalid_syntax(format!(
                "the configuration does not read back: {}",
                e.message()
            ))
        })?;
    cfg.tls.self_signed = base.tls.self_signed;
    cfg.schema = base.schema.clone();
    cfg.overlay = base.overlay.clone();
    Ok(cfg)
}

/// `olcAccess`-style values (`{i}rule`) as TOML access rules.
fn rule_values(attr: &str, vals: &[String]) -> Result<toml::Value, LdapError> {
    let mut rules = Vec::new();
    for (i, v) in vals.iter().enumerate() {
        let rule: AccessRule = rule_text::parse(split_ordinal(v).1)
            .map_err(|e| LdapError::invalid_syntax(format!("{attr}: value {{{i}}}: {e}")))?;
        rules.push(
            toml::Value::try_from(rule)
                .map_err(|e| LdapError::invalid_syntax(format!("{attr}: value {{{i}}}: {e}")))?,
        );
    }
    Ok(toml::Value::Array(rules))
}

/// Values holding TOML inline tables (`{i}{ key = value, … }`).
fn table_values(attr: &str, vals: &[String]) -> Result<toml::Value, LdapError> {
    let not_table = |i: usize, why: String| {
        LdapError::invalid_syntax(format!(
            "{attr}: value {{{i}}} is not a TOML inline table {{ key = value, … }}{why}"
        ))
    };
    let mut items = Vec::new();
    for (i, v) in vals.iter().enumerate() {
        let text = split_ordinal(v).1;
        let t: toml::Table = toml::from_str(&format!("v = {text}"))
            .map_err(|e| not_table(i, format!(": {}", e.message())))?;
        match t.get("v") {
            Some(v @ toml::Value::Table(_)) => items.push(v.clone()),
            _ => return Err(not_table(i, String::new())),
        }
    }
    Ok(toml::Value::Array(items))
}

/// Index values (`uid,cn eq,sub`) as the `[indexes]` table.
fn index_table(
    vals: &[String],
    bad: &dyn Fn(&str, &str) -> LdapError,
) -> Result<toml::Value, LdapError> {
    let mut t = toml::Table::new();
    for v in vals {
        let mut parts = v.split_whitespace();
        let (Some(attrs), Some(kinds), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad(v, "an index like 'uid eq,sub'"));
        };
        for a in attrs.split(',').filter(|a| !a.is_empty()) {
            let entry = t
                .entry(a.to_string())
                .or_insert_with(|| toml::Value::Array(Vec::new()));
            if let toml::Value::Array(list) = entry {
                for kind in kinds.split(',').filter(|k| !k.is_empty()) {
                    let kind = toml::Value::String(kind.to_string());
                    if !list.contains(&kind) {
                        list.push(kind);
                    }
                }
            }
        }
    }
    Ok(toml::Value::Table(t))
}

fn insert_at(root: &mut toml::Table, key: &str, value: toml::Value) {
    let parts: Vec<&str> = key.split('.').collect();
    let Some((last, path)) = parts.split_last() else {
        return;
    };
    let mut t = root;
    for p in path {
        let next = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(inner) = next else {
            return;
        };
        t = inner;
    }
    t.insert(last.to_string(), value);
}

/// The configuration schema (attribute types and object classes of the
/// two entries), in schema file form: `crates/model/schema/config.schema`
/// is this text, checked by a test.
pub fn schema_text() -> String {
    let mut s = String::from(
        "# The configuration schema: the attributes of cn=config and\n\
         # olcDatabase={1}mdb,cn=config. Made from the table of keys in\n\
         # crates/server/src/cn_config/mod.rs (a test checks they agree).\n\n",
    );
    for key in KEYS.iter().filter(|k| k.form != Documents) {
        let (syntax, eq) = match key.form {
            Integer => ("1.3.6.1.4.1.1466.115.121.1.27", "integerMatch"),
            Boolean => ("1.3.6.1.4.1.1466.115.121.1.7", "booleanMatch"),
            _ => ("1.3.6.1.4.1.1466.115.121.1.15", "caseExactMatch"),
        };
        let mut def = format!(
            "attributetype ( {OID_ARC}.1.{} NAME '{}'\n\tDESC 'configuration key {}'\n\tEQUALITY {eq}\n\tSYNTAX {syntax}",
            key.n,
            key.attr(),
            key.key
        );
        if key.single() {
            def.push_str(" SINGLE-VALUE");
        }
        if key.ordered() {
            def.push_str("\n\tX-ORDERED 'VALUES'");
        }
        def.push_str(" )\n\n");
        s.push_str(&def);
    }
    s.push_str(&format!(
        "attributetype ( {OID_ARC}.1.{AT_NEXT_START_N} NAME 'pandoAtNextStart'\n\tDESC 'attributes whose stored values the server takes at its next start'\n\tEQUALITY caseIgnoreMatch\n\tSYNTAX 1.3.6.1.4.1.1466.115.121.1.15 )\n\n"
    ));
    s.push_str(&format!(
        "attributetype ( {OID_ARC}.1.{} NAME 'olcDatabase'\n\tDESC 'the database an entry configures'\n\tEQUALITY caseIgnoreMatch\n\tSYNTAX 1.3.6.1.4.1.1466.115.121.1.15 SINGLE-VALUE )\n\n",
        AT_NEXT_START_N + 1
    ));
    // OpenLDAP's name and number: clients look for it in the root DSE.
    s.push_str(
        "attributetype ( 1.3.6.1.4.1.4203.1.12.2.1 NAME 'configContext'\n\tDESC 'where the configuration entries are'\n\tEQUALITY distinguishedNameMatch\n\tSYNTAX 1.3.6.1.4.1.1466.115.121.1.12 SINGLE-VALUE\n\tNO-USER-MODIFICATION USAGE dSAOperation )\n\n",
    );
    let may = |place: Place| -> String {
        KEYS.iter()
            .filter(|k| k.place == place)
            .map(|k| k.attr())
            .collect::<Vec<_>>()
            .join(" $ ")
    };
    s.push_str(&format!(
        "objectclass ( {OID_ARC}.2.1 NAME 'olcConfig'\n\tDESC 'configuration entry'\n\tSUP top ABSTRACT )\n\n"
    ));
    s.push_str(&format!(
        "objectclass ( {OID_ARC}.2.2 NAME 'olcGlobal'\n\tDESC 'server-wide configuration'\n\tSUP olcConfig STRUCTURAL\n\tMAY ( cn $ pandoAtNextStart $ {} ) )\n\n",
        may(Global)
    ));
    s.push_str(&format!(
        "objectclass ( {OID_ARC}.2.3 NAME 'olcDatabaseConfig'\n\tDESC 'configuration of a database'\n\tSUP olcConfig STRUCTURAL\n\tMUST olcDatabase\n\tMAY ( pandoAtNextStart $ {} ) )\n\n",
        may(Database)
    ));
    s.push_str(&format!(
        "objectclass ( {OID_ARC}.2.4 NAME 'olcMdbConfig'\n\tDESC 'configuration of the LMDB store'\n\tSUP olcDatabaseConfig STRUCTURAL )\n\n"
    ));
    s.push_str(&overlay_tree::schema_text(OID_ARC, OLC_OVERLAY_N));
    for (i, (name, what)) in schema_tree::ATTRS.iter().enumerate() {
        s.push_str(&format!(
            "attributetype ( {OID_ARC}.1.{} NAME '{name}'\n\tDESC '{what}'\n\tEQUALITY caseIgnoreMatch\n\tSYNTAX 1.3.6.1.4.1.1466.115.121.1.15\n\tX-ORDERED 'VALUES' )\n\n",
            AT_NEXT_START_N + 10 + i as u32
        ));
    }
    s.push_str(&format!(
        "objectclass ( {OID_ARC}.2.5 NAME 'olcSchemaConfig'\n\tDESC 'schema added while serving'\n\tSUP olcConfig STRUCTURAL\n\tMAY ( cn $ {} ) )\n",
        schema_tree::ATTRS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(" $ ")
    ));
    s
}

#[cfg(test)]
mod tests;
