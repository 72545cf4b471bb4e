//! The configuration (the crate `pando-config`): a typed model read from
//! TOML and shown under cn=config.
//!
//! Every field has a default, so `pando serve` runs with no file at all. The
//! model is plain data with one `validate_values` step that names the
//! offending key in every error. This crate sits below everything that runs
//! a request: it must not name sessions, access rules compiled, operations,
//! overlays' code, replication's code or the network. The rule languages
//! those layers compile are checked by them (`pando_server::settings`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use pando_model::{Dn, Schema};
use pando_store::{Durability, IndexKind, IndexSpec};
use serde::{Deserialize, Serialize};

pub mod consumer;
pub mod overlay;
pub mod push;
pub mod schema_files;

pub use overlay::OverlayConfig;

pub const DEFAULT_SUFFIX: &str = "dc=example,dc=com";
pub const DEFAULT_LDAP_URL: &str = "ldap://127.0.0.1:3389";

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where the store, the ldapi socket and generated secrets live.
    pub data_dir: PathBuf,
    /// Listener URLs: `ldap://host:port`, `ldaps://host:port` (needs
    /// `[tls]`), `ldapi://` (socket in the data directory) or
    /// `ldapi:///absolute/path`.
    pub listen: Vec<String>,
    /// Naming contexts served.
    pub suffixes: Vec<String>,
    /// The administrator DN; it need not exist as an entry. `""` runs with
    /// no root DN at all (administer over ldapi, see `[auth]`).
    pub root_dn: Option<String>,
    /// `{ARGON2}`/`{SSHA}`… hash of the administrator password. When unset,
    /// a random password is generated on first start (see README).
    pub root_password_hash: Option<String>,
    /// `error`, `warn`, `info`, `debug` or `trace`.
    pub log_level: String,
    /// Threads serving connections; 0 (default) = one per CPU. Read at
    /// start only.
    pub threads: usize,
    /// Started as root: the user (name or ID) to switch to once the
    /// listeners are bound. Unset: keep running as the starting user.
    pub user: Option<String>,
    /// The group to switch to (default: the user's primary group).
    pub group: Option<String>,
    /// Schema files added to the built-in schema at start, in order:
    /// OpenLDAP `.schema` text or `cn=schema` LDIF (see `schema_files.rs`).
    pub schema_files: Vec<PathBuf>,
    /// The NIS schema built in: `rfc2307` (default: posixGroup structural,
    /// members by `memberUid`) or `rfc2307bis` (posixGroup auxiliary beside
    /// groupOfNames or groupOfMembers, members by DN; automount maps).
    pub posix_schema: String,
    /// `[[schema]]`: schema added after the files, in order; each is an
    /// entry below cn=schema,cn=config, and changes while serving.
    pub schema: Vec<SchemaDoc>,
    /// Attribute → index kinds (`eq`, `pres`, `sub`, `approx`, `ord`).
    pub indexes: BTreeMap<String, Vec<String>>,
    pub limits: Limits,
    pub store: StoreConfig,
    pub auth: AuthConfig,
    /// `[passwords]`: how clear-text passwords are stored, and how much
    /// hashing may run at once.
    pub passwords: PasswordsConfig,
    /// Access rules (`[[access]]`), in order; none configured = the
    /// built-in defaults (see docs/access-control.md).
    pub access: Vec<AccessRule>,
    pub tls: TlsConfig,
    /// `[logs]`: access and audit log files.
    pub logs: LogsConfig,
    /// `[metrics]`: the Prometheus endpoint.
    pub metrics: MetricsConfig,
    /// `[replication]`: this server's ID, the change log, the provider.
    pub replication: ReplicationConfig,
    /// `[[overlay]]`: overlays, in the order they run (docs/overlays.md).
    pub overlay: Vec<OverlayConfig>,
}

/// One `[[schema]]` document: definitions in RFC 4512 form, as the
/// values of a `cn=schema` LDIF entry (OpenLDAP's `olcAttributeTypes`…).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SchemaDoc {
    /// Its name: `cn={n}<name>,cn=schema,cn=config`.
    pub name: String,
    /// `name oid` macros (`olcObjectIdentifier`).
    #[serde(default)]
    pub object_identifiers: Vec<String>,
    /// Syntax descriptions (`olcLdapSyntaxes`).
    #[serde(default)]
    pub ldap_syntaxes: Vec<String>,
    /// Attribute type descriptions (`olcAttributeTypes`).
    #[serde(default)]
    pub attribute_types: Vec<String>,
    /// Object class descriptions (`olcObjectClasses`).
    #[serde(default)]
    pub object_classes: Vec<String>,
}

/// `[replication]`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicationConfig {
    /// This server's ID in CSNs (0-4095, three hex digits in the CSN).
    /// Every provider of a replicated directory needs its own; 0 is for a
    /// directory with one provider.
    pub server_id: u16,
    /// Days the change log keeps a change (0: none kept). Consumers away
    /// longer get a present phase instead of a delete phase.
    pub changelog_days: u64,
    /// At most this many change log records are kept (the oldest go).
    pub changelog_max_changes: u64,
    /// Provider: a consumer whose cookie the change log no longer covers,
    /// and which did not ask for a reload, is answered
    /// e-syncRefreshRequired (4096) instead of a present phase (as
    /// OpenLDAP's `syncprov-reloadhint TRUE`).
    pub refresh_required: bool,
    /// Most logged operations one count of changes behind (Pando's
    /// changes-behind extended operation) looks at; past them the counts
    /// are answered as lower bounds (`changes>=n`). A count starts at the
    /// oldest CSN it is asked about, so a consumer nearly in step costs
    /// little; this bounds what any authenticated caller can make the
    /// server read per call.
    pub max_changes_counted: u64,
    /// Clients may write to the subtrees consumers keep (OpenLDAP's
    /// `olcMultiProvider`): every provider takes writes, and a received
    /// change is merged with the entry held attribute by attribute
    /// (`ops::write::merge`). Needs a `server_id`.
    pub multi_provider: bool,
    /// `[[replication.consumer]]`: subtrees kept in step with providers.
    pub consumer: Vec<consumer::ConsumerConfig>,
    /// `[[replication.push]]`: subtrees written to servers that cannot
    /// pull them.
    pub push: Vec<push::PushConfig>,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        ReplicationConfig {
            server_id: 0,
            changelog_days: 7,
            changelog_max_changes: 1_000_000,
            refresh_required: false,
            max_changes_counted: 100_000,
            multi_provider: false,
            consumer: Vec::new(),
            push: Vec::new(),
        }
    }
}

/// `[logs]`. Nothing is logged to files unless a path is set.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogsConfig {
    /// Access log file: one line per operation result and per connection
    /// open/close. Unset = off.
    pub access: Option<PathBuf>,
    /// `text` (OpenLDAP-like) or `json` (one object per line).
    pub access_format: String,
    /// Lines buffered between request handling and the writer thread.
    pub access_buffer: usize,
    /// When the buffer is full: `drop` (count the line as dropped, never
    /// stall requests) or `block` (wait for the writer).
    pub on_full: String,
    /// Audit log file: every successful change as LDIF. Unset = off.
    pub audit: Option<PathBuf>,
    /// Rotate a log when it reaches this size (MiB); 0 = never by size.
    pub max_size_mb: u64,
    /// Rotate the logs when the UTC date changes.
    pub rotate_daily: bool,
    /// Permission bits (octal) of log files created, e.g. "0640".
    pub file_mode: String,
}

impl Default for LogsConfig {
    fn default() -> Self {
        LogsConfig {
            access: None,
            access_format: "text".into(),
            access_buffer: 65536,
            on_full: "drop".into(),
            audit: None,
            max_size_mb: 0,
            rotate_daily: false,
            file_mode: "0600".into(),
        }
    }
}

/// How access-log lines are written (`[logs] format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// What a log file does when its writer falls behind (`[logs] on_full`):
/// drop lines (counted) or make the operation wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnFull {
    Drop,
    Block,
}

impl LogsConfig {
    pub fn format(&self) -> Result<LogFormat, ConfigError> {
        match self.access_format.as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            o => Err(err(
                "logs.access_format",
                format!("'{o}' is not one of text, json"),
            )),
        }
    }

    pub fn on_full(&self) -> Result<OnFull, ConfigError> {
        match self.on_full.as_str() {
            "drop" => Ok(OnFull::Drop),
            "block" => Ok(OnFull::Block),
            o => Err(err(
                "logs.on_full",
                format!("'{o}' is not one of drop, block"),
            )),
        }
    }

    pub fn mode(&self) -> Result<u32, ConfigError> {
        match u32::from_str_radix(self.file_mode.trim_start_matches("0o"), 8) {
            Ok(m) if m <= 0o777 && m & 0o600 == 0o600 => Ok(m),
            Ok(_) => Err(err(
                "logs.file_mode",
                format!(
                    "'{}' must be at most 0777 and let the owner read and write",
                    self.file_mode
                ),
            )),
            Err(_) => Err(err(
                "logs.file_mode",
                format!("'{}' is not an octal mode like 0600", self.file_mode),
            )),
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.format()?;
        self.on_full()?;
        self.mode()?;
        if self.access_buffer == 0 {
            return Err(err("logs.access_buffer", "must be at least 1"));
        }
        if self.access.is_some() && self.access == self.audit {
            return Err(err(
                "logs.audit",
                "must be a different file from logs.access",
            ));
        }
        Ok(())
    }
}

/// `[metrics]`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `host:port` (or a bare port, meaning 127.0.0.1) of the Prometheus
    /// endpoint (`GET /metrics`); unset = off. Keep it on loopback unless
    /// deliberately exposing it: the figures are not access-controlled.
    pub listen: Option<String>,
    /// Serve the live dashboard (`GET /dashboard`) there too. On a
    /// non-loopback address the endpoint speaks TLS (the server's
    /// certificate) and the dashboard asks for the root DN's password.
    pub dashboard: bool,
}

impl MetricsConfig {
    pub fn addr(&self) -> Result<Option<std::net::SocketAddr>, ConfigError> {
        match &self.listen {
            None => Ok(None),
            Some(a) if a.parse::<u16>().is_ok() => Ok(Some(std::net::SocketAddr::from((
                std::net::Ipv4Addr::LOCALHOST,
                a.parse::<u16>().unwrap_or(0),
            )))),
            Some(a) => a.parse().map(Some).map_err(|_| {
                err(
                    "metrics.listen",
                    format!("'{a}' is not an address like 127.0.0.1:9389"),
                )
            }),
        }
    }
}

/// One access rule: what it covers, then who gets which rights.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AccessRule {
    /// Base DN of the entries covered (default: every entry).
    pub dn: Option<String>,
    /// `base`, `one`, `sub` (default) or `children`, relative to `dn`.
    pub scope: Option<String>,
    /// Instead of `dn`/`scope`: a regular expression over the normalised
    /// DN (lower-case types and values, no spaces), anchored at both ends.
    pub dn_regex: Option<String>,
    /// Only entries matching this filter.
    pub filter: Option<String>,
    /// Only these attribute types (`entry` stands for the entry itself);
    /// default: every attribute and the entry.
    pub attrs: Option<Vec<String>>,
    /// Who gets which rights; the first clause whose subject matches decides.
    pub by: Vec<AccessBy>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AccessBy {
    /// A subject, or a list of subjects that must all hold.
    pub who: OneOrMany,
    /// A level (`none`, `auth`, `compare`, `search`, `read`, `write`, `all`)
    /// or a list of single rights (`auth`, `compare`, `search`, `read`,
    /// `write`, `add`, `delete`).
    pub rights: OneOrMany,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn items(&self) -> Vec<&str> {
        match self {
            OneOrMany::One(s) => vec![s.as_str()],
            OneOrMany::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// `[tls]`: the server certificate for ldaps:// listeners and StartTLS, and
/// how client certificates are asked for.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain, the server's own certificate first.
    pub cert_file: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of the certificate.
    pub key_file: Option<PathBuf>,
    /// PEM CA certificates that client certificates must chain to.
    pub ca_file: Option<PathBuf>,
    /// `none` (never asked for), `request` (asked for, optional) or
    /// `require` (the handshake fails without a valid one).
    pub client_certs: String,
    /// Oldest TLS version accepted: `1.2` or `1.3`.
    pub min_version: String,
    /// Use (creating it on first start) a self-signed certificate in
    /// `<data_dir>/tls/` when `cert_file` is unset. Set by
    /// `pando serve --tls-self-signed`, never read from the file, so a
    /// certificate is never generated without being asked for.
    #[serde(skip)]
    pub self_signed: bool,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert_file: None,
            key_file: None,
            ca_file: None,
            client_certs: "none".into(),
            min_version: "1.2".into(),
            self_signed: false,
        }
    }
}

/// Whether and how the server asks for client certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCerts {
    None,
    Request,
    Require,
}

/// Oldest TLS protocol version accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersion {
    V1_2,
    V1_3,
}

/// `[tls]`, validated: TLS is configured when this exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub ca_file: Option<PathBuf>,
    pub client_certs: ClientCerts,
    pub min_version: TlsVersion,
    /// The files are the generated self-signed pair in `<data_dir>/tls/`.
    pub self_signed: bool,
}

/// Directory of the generated self-signed certificate (`--tls-self-signed`).
pub fn self_signed_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("tls")
}

impl TlsConfig {
    /// None when no certificate is configured (and none is to be generated).
    fn resolve(&self, data_dir: &Path) -> Result<Option<TlsSettings>, ConfigError> {
        let client_certs = match self.client_certs.as_str() {
            "none" => ClientCerts::None,
            "request" => ClientCerts::Request,
            "require" => ClientCerts::Require,
            other => {
                return Err(err(
                    "tls.client_certs",
                    format!("'{other}' is not one of none, request, require"),
                ))
            }
        };
        let min_version = match self.min_version.as_str() {
            "1.2" => TlsVersion::V1_2,
            "1.3" => TlsVersion::V1_3,
            other => {
                return Err(err(
                    "tls.min_version",
                    format!("'{other}' is not one of \"1.2\", \"1.3\""),
                ))
            }
        };
        for (key, p) in [
            ("tls.cert_file", &self.cert_file),
            ("tls.key_file", &self.key_file),
            ("tls.ca_file", &self.ca_file),
        ] {
            if p.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                return Err(err(key, "must not be empty"));
            }
        }
        let (cert_file, key_file, self_signed) = match (&self.cert_file, &self.key_file) {
            (Some(c), Some(k)) => (c.clone(), k.clone(), false),
            (Some(_), None) => {
                return Err(err(
                    "tls.key_file",
                    "is needed with tls.cert_file (the certificate's private key)",
                ))
            }
            (None, Some(_)) => return Err(err("tls.cert_file", "is needed with tls.key_file")),
            (None, None) if self.self_signed => {
                let dir = self_signed_dir(data_dir);
                (dir.join("cert.pem"), dir.join("key.pem"), true)
            }
            (None, None) => {
                if client_certs != ClientCerts::None || self.ca_file.is_some() {
                    return Err(err(
                        "tls.cert_file",
                        "is needed for client certificates (tls.client_certs, tls.ca_file)",
                    ));
                }
                return Ok(None);
            }
        };
        match (client_certs, &self.ca_file) {
            (ClientCerts::None, Some(_)) => {
                return Err(err(
                    "tls.ca_file",
                    "is set but tls.client_certs is \"none\": set it to \"request\" or \"require\", or remove ca_file",
                ))
            }
            (ClientCerts::Request | ClientCerts::Require, None) => {
                return Err(err(
                    "tls.ca_file",
                    format!(
                        "is needed with tls.client_certs = \"{}\" (the CAs client certificates are checked against)",
                        self.client_certs
                    ),
                ))
            }
            _ => {}
        }
        Ok(Some(TlsSettings {
            cert_file,
            key_file,
            ca_file: self.ca_file.clone(),
            client_certs,
            min_version,
            self_signed,
        }))
    }
}

/// How clients authenticate and which identities hold the administrator role.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Refuse simple binds carrying a password over connections that are
    /// neither TLS nor ldapi (confidentialityRequired).
    pub require_secure_binds: bool,
    /// Authorization identities given the administrator role besides the
    /// root DN: DNs (after `external_map`), or `ldapi-owner` for any ldapi
    /// client running as the server's own Unix user or as root.
    pub admins: Vec<String>,
    /// One identity (a DN or `ldapi-owner`) for which access rules are not
    /// applied, honoured only over ldapi. Unset by default.
    pub break_glass: Option<String>,
    /// Rules mapping SASL EXTERNAL identities (peer credentials, certificate
    /// subjects) to directory entries; the first whose pattern matches wins.
    pub external_map: Vec<ExternalMap>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            require_secure_binds: false,
            admins: vec![LDAPI_OWNER.to_string()],
            break_glass: None,
            external_map: Vec::new(),
        }
    }
}

/// `[passwords]`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PasswordsConfig {
    /// Scheme for clear-text passwords written by clients: `argon2`
    /// (argon2id, default), `pbkdf2-sha512`, `ssha512` or `ssha` (salted
    /// SHA-1, as OpenLDAP writes by default: weak). Values already
    /// hashed (`{SCHEME}…`) are stored as given.
    pub scheme: String,
    /// argon2id memory cost in KiB (default 19456, OWASP's minimum).
    pub argon2_memory_kib: u32,
    /// argon2id passes (default 2).
    pub argon2_time: u32,
    /// argon2id lanes (default 1).
    pub argon2_parallelism: u32,
    /// PBKDF2-HMAC-SHA512 iterations (default 210000, OWASP 2023).
    pub pbkdf2_iterations: u32,
    /// Slow hashes (hashing and bind verification alike) running at once;
    /// 0 = one per CPU. Further ones wait their turn.
    pub max_concurrent_hashes: usize,
    /// Clear-text userPassword values one add or modify may carry (each is
    /// one slow hash); more are refused before any is hashed.
    pub max_clear_values: usize,
    /// After a successful simple bind against a value stored in a weaker
    /// scheme than `scheme` (clear text, `{MD5}`, `{SSHA}`, md5-crypt…),
    /// store the password again under `scheme` (default on).
    pub upgrade_on_bind: bool,
}

impl Default for PasswordsConfig {
    fn default() -> Self {
        PasswordsConfig {
            scheme: "argon2".into(),
            argon2_memory_kib: 19_456,
            argon2_time: 2,
            argon2_parallelism: 1,
            pbkdf2_iterations: 210_000,
            max_concurrent_hashes: 0,
            max_clear_values: 4,
            upgrade_on_bind: true,
        }
    }
}

impl PasswordsConfig {
    pub fn policy(&self) -> Result<pando_password::HashPolicy, ConfigError> {
        use pando_password::{Argon2Params, HashPolicy};
        match self.scheme.to_ascii_lowercase().as_str() {
            "argon2" | "argon2id" => {
                // Bounds keep one hash under a second and a gigabyte.
                if !(8..=1 << 20).contains(&self.argon2_memory_kib) {
                    return Err(err(
                        "passwords.argon2_memory_kib",
                        "must be between 8 and 1048576",
                    ));
                }
                if !(1..=64).contains(&self.argon2_time) {
                    return Err(err("passwords.argon2_time", "must be between 1 and 64"));
                }
                if !(1..=16).contains(&self.argon2_parallelism) {
                    return Err(err(
                        "passwords.argon2_parallelism",
                        "must be between 1 and 16",
                    ));
                }
                if self.argon2_memory_kib < 8 * self.argon2_parallelism {
                    return Err(err(
                        "passwords.argon2_memory_kib",
                        "must be at least 8 KiB per lane (argon2_parallelism)",
                    ));
                }
                Ok(HashPolicy::Argon2(Argon2Params {
                    m_cost_kib: self.argon2_memory_kib,
                    t_cost: self.argon2_time,
                    p_cost: self.argon2_parallelism,
                }))
            }
            "pbkdf2-sha512" => {
                if !(1000..=10_000_000).contains(&self.pbkdf2_iterations) {
                    return Err(err(
                        "passwords.pbkdf2_iterations",
                        "must be between 1000 and 10000000",
                    ));
                }
                Ok(HashPolicy::Pbkdf2Sha512 {
                    iterations: self.pbkdf2_iterations,
                })
            }
            "ssha512" => Ok(HashPolicy::Ssha512),
            "ssha" => Ok(HashPolicy::Ssha),
            other => Err(err(
                "passwords.scheme",
                format!("'{other}' is not one of argon2, pbkdf2-sha512, ssha512, ssha"),
            )),
        }
    }
}

/// `ldapi-owner`: an ldapi peer running as the server's Unix user, or root.
pub const LDAPI_OWNER: &str = "ldapi-owner";

/// Map an EXTERNAL authorization DN matching `pattern` (a regular expression
/// over the normalised DN, anchored) to `dn` (with `$1`… from the pattern's
/// groups), or to the one entry under `base` matching `filter` (also with `$1`…).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExternalMap {
    pub pattern: String,
    pub dn: Option<String>,
    pub base: Option<String>,
    pub filter: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest LDAP message accepted, in bytes (checked from the header).
    pub max_pdu_bytes: usize,
    /// Entries returned per search for non-administrators (0 = unlimited).
    pub size_limit: u32,
    /// Seconds a search may run for non-administrators (0 = unlimited).
    pub time_limit: u32,
    /// Deepest filter nesting accepted.
    pub max_filter_depth: usize,
    /// Most filter terms accepted.
    pub max_filter_terms: usize,
    /// Unindexed searches scanning more entries than this are refused with
    /// adminLimitExceeded, except for administrators.
    pub unindexed_search_limit: u64,
    /// Simultaneous client connections.
    pub max_connections: usize,
    /// Attribute values one add or modify may carry, except from
    /// administrators (0 = no limit). Each value is normalised, checked
    /// and indexed; the message size limit alone allows ~100,000 tiny ones.
    pub max_values_per_operation: usize,
    /// Entries one tree delete (control 1.2.840.113556.1.4.805) may remove,
    /// for everyone (0 = no limit): the whole subtree goes in one
    /// transaction on the single writer, which every other write waits for.
    pub max_tree_delete: u64,
    /// Matches one sorted search (server-side sort, virtual list view) may
    /// sort, for everyone (0 = no limit): each is held in memory with its
    /// sort keys until the sort is done.
    pub max_sort_entries: u64,
    /// Keys one sort request may list, for everyone: every match holds
    /// one value per key, so keys multiply what `max_sort_entries` bounds.
    pub max_sort_keys: usize,
    /// MiB of sort keys (with their bookkeeping) one sorted search may
    /// hold, for everyone (0 = no limit): `max_sort_entries` bounds rows,
    /// this bounds rows × key size.
    pub max_sort_memory_mb: u64,
    /// Persistent searches open at once, server-wide (0 = none allowed):
    /// every committed change is matched against each of them.
    pub max_persistent_searches: usize,
    /// Of those, the places only administrators and replication identities
    /// (`[[limits.by]]` with `replication = true`) may take, so a consumer
    /// is served however many ordinary clients follow changes (as large
    /// as the total or larger: only they hold any).
    pub persistent_search_reserve: usize,
    /// Persistent searches one connection may hold open, except
    /// administrators' and replication identities' (0 = no limit).
    pub max_persistent_searches_per_connection: usize,
    /// Persistent searches one identity may hold open over all its
    /// connections, except administrators and replication identities
    /// (0 = no limit).
    pub max_persistent_searches_per_identity: usize,
    /// Committed write operations a persistent search may fall behind
    /// (its client not taking the entries) before it is ended with
    /// adminLimitExceeded; the change feed keeps at most this many
    /// (rounded up to a power of two).
    pub persistent_search_backlog: usize,
    /// Operations outstanding on one connection before reading pauses.
    pub max_ops_per_connection: usize,
    /// Large searches (more than a handful of candidates) running at once
    /// on their own threads, server-wide; others wait. 0 = four per CPU
    /// (at least 8, at most 256).
    pub max_search_threads: usize,
    /// Close connections idle this many seconds (0 = never).
    pub idle_timeout: u64,
    /// Seconds of a write window: while responses wait for a client, it
    /// must take at least `min_write_rate` bytes a second over each window
    /// or be disconnected (a client that reads nothing goes after one).
    pub write_timeout: u64,
    /// Bytes a second a client waiting on responses must take (0: any
    /// progress at all is enough).
    pub min_write_rate: u64,
    /// Simultaneous connections from one IP address (0 = no limit).
    pub max_connections_per_ip: usize,
    /// Failed binds (per DN or address) answered without delay.
    pub failed_bind_free: u32,
    /// Longest delay before answering a failed bind; the delay doubles
    /// from 250 ms with each further failure (0 = no delay).
    pub failed_bind_max_delay_ms: u64,
    /// Failed binds for one DN that lock it out (0 = never).
    pub failed_bind_lockout: u32,
    /// Failed binds from one address that lock it out (0 = never).
    pub failed_bind_lockout_ip: u32,
    /// How long a lockout lasts; failure counts are forgotten this long
    /// after the last failure.
    pub failed_bind_lockout_seconds: u64,
    /// Smaller limits for connections that have not authenticated
    /// (`[limits.anonymous]`).
    pub anonymous: AnonymousLimits,
    /// Search limits for particular requesters (`[[limits.by]]`); the first
    /// whose `who` matches applies, fields it leaves out keep the general
    /// values (administrators: unlimited).
    pub by: Vec<LimitsFor>,
}

/// Most threads large searches may hold (`limits.max_search_threads`).
pub const MAX_SEARCH_THREADS: usize = 256;

/// `[limits.anonymous]`: what a connection may do before it binds. Each
/// applies on top of the general limit of the same name (the smaller one
/// wins). The defaults leave room for everything anonymous clients legitimately do
/// (bind, read the root DSE and schema, small lookups where access rules
/// allow) and nothing that costs the server much.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AnonymousLimits {
    /// Largest message accepted before a bind, in bytes.
    pub max_pdu_bytes: usize,
    /// Operations outstanding at once before a bind.
    pub max_ops: usize,
    /// Entries one anonymous search returns (0 = unlimited).
    pub size_limit: u32,
    /// Seconds one anonymous search may run (0 = unlimited).
    pub time_limit: u32,
    /// Close an anonymous connection idle this many seconds (0 = never).
    pub idle_timeout: u64,
}

impl Default for AnonymousLimits {
    fn default() -> Self {
        AnonymousLimits {
            max_pdu_bytes: 64 * 1024,
            max_ops: 8,
            size_limit: 100,
            time_limit: 60,
            idle_timeout: 300,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LimitsFor {
    /// Subjects as in access rules (all must hold), e.g. `group:cn=apps,…`.
    pub who: OneOrMany,
    pub size_limit: Option<u32>,
    pub time_limit: Option<u32>,
    pub unindexed_search_limit: Option<u64>,
    /// A replication identity: may take the persistent-search places kept
    /// in reserve and is not held to the per-connection and per-identity
    /// persistent-search limits (administrators always are).
    pub replication: Option<bool>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_pdu_bytes: 1 << 20,
            size_limit: 500,
            time_limit: 3600,
            max_filter_depth: 64,
            max_filter_terms: 10_000,
            unindexed_search_limit: 100_000,
            max_connections: 4096,
            max_values_per_operation: 10_000,
            max_tree_delete: 10_000,
            max_sort_entries: 250_000,
            max_sort_keys: 8,
            max_sort_memory_mb: 64,
            max_persistent_searches: 100,
            persistent_search_reserve: 10,
            max_persistent_searches_per_connection: 4,
            max_persistent_searches_per_identity: 16,
            persistent_search_backlog: 1024,
            max_ops_per_connection: 64,
            max_search_threads: 0,
            idle_timeout: 0,
            write_timeout: 60,
            min_write_rate: 1024,
            max_connections_per_ip: 256,
            failed_bind_free: 5,
            failed_bind_max_delay_ms: 4000,
            failed_bind_lockout: 50,
            failed_bind_lockout_ip: 500,
            failed_bind_lockout_seconds: 300,
            anonymous: AnonymousLimits::default(),
            by: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Upper bound of the database file, in MiB; 0 = no practical bound
    /// (1 TiB of address space; the file grows only as data is written).
    pub map_size_mb: u64,
    /// Most write operations committed together (group commit).
    pub max_write_batch: usize,
    /// `durable` (acknowledge after fsync), `batched` (acknowledge before
    /// the fsync, at most `batched_max_writes` writes or `batched_max_ms`
    /// at risk) or `none` (the OS flushes). Changeable with SIGHUP.
    pub durability: String,
    pub batched_max_writes: u64,
    pub batched_max_ms: u64,
    /// Read the database file into the page cache in the background on start.
    pub warm_start: bool,
    /// Check every page of the store before serving it (false: only the
    /// paths read at start; for very large stores whose start must be fast).
    pub check_all_pages: bool,
    /// `zstd` (entries compressed, with a dictionary trained by `pando
    /// import`) or `off`. Entries already stored stay readable either way.
    pub compression: String,
    /// zstd level, 1 (fastest) to 19.
    pub compression_level: i32,
    /// The earlier name of `replication.changelog_days`; when set, it is
    /// used instead (and a warning says so).
    pub keep_tombstones_days: Option<u64>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            map_size_mb: 0,
            max_write_batch: 256,
            durability: "durable".into(),
            batched_max_writes: 1000,
            batched_max_ms: 1000,
            warm_start: true,
            check_all_pages: true,
            compression: "zstd".into(),
            compression_level: pando_store::DEFAULT_COMPRESSION_LEVEL,
            keep_tombstones_days: None,
        }
    }
}

impl StoreConfig {
    /// The zstd level for new entries, None when compression is off.
    pub fn compression(&self) -> Result<Option<i32>, ConfigError> {
        match self.compression.as_str() {
            "off" => Ok(None),
            "zstd" if (1..=19).contains(&self.compression_level) => {
                Ok(Some(self.compression_level))
            }
            "zstd" => Err(err(
                "store.compression_level",
                format!("{} is outside 1..=19", self.compression_level),
            )),
            other => Err(err(
                "store.compression",
                format!("'{other}' is not one of zstd, off"),
            )),
        }
    }

    pub fn durability(&self) -> Result<Durability, ConfigError> {
        match self.durability.as_str() {
            "durable" => Ok(Durability::Durable),
            "batched" => {
                if self.batched_max_writes == 0 {
                    return Err(err("store.batched_max_writes", "must be at least 1"));
                }
                if self.batched_max_ms == 0 {
                    return Err(err("store.batched_max_ms", "must be at least 1"));
                }
                Ok(Durability::Batched {
                    max_writes: self.batched_max_writes,
                    max_ms: self.batched_max_ms,
                })
            }
            "none" => Ok(Durability::None),
            other => Err(err(
                "store.durability",
                format!("'{other}' is not one of durable, batched, none"),
            )),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        let mut indexes = BTreeMap::new();
        let mut idx = |a: &str, k: &[&str]| {
            indexes.insert(a.to_string(), k.iter().map(|s| s.to_string()).collect());
        };
        idx("objectClass", &["eq"]);
        for a in ["uid", "mail", "cn", "sn", "givenName"] {
            idx(a, &["eq", "sub"]);
        }
        for a in ["member", "uniqueMember", "memberUid", "entryUUID"] {
            idx(a, &["eq"]);
        }
        Config {
            data_dir: PathBuf::from("pando-data"),
            listen: vec![DEFAULT_LDAP_URL.to_string(), "ldapi://".to_string()],
            suffixes: vec![DEFAULT_SUFFIX.to_string()],
            root_dn: None,
            root_password_hash: None,
            log_level: "info".to_string(),
            threads: 0,
            user: None,
            group: None,
            schema_files: Vec::new(),
            posix_schema: "rfc2307".to_string(),
            schema: Vec::new(),
            indexes,
            limits: Limits::default(),
            store: StoreConfig::default(),
            auth: AuthConfig::default(),
            passwords: PasswordsConfig::default(),
            access: Vec::new(),
            tls: TlsConfig::default(),
            logs: LogsConfig::default(),
            metrics: MetricsConfig::default(),
            replication: ReplicationConfig::default(),
            overlay: Vec::new(),
        }
    }
}

/// A configuration problem, naming the key.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub key: String,
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}", self.problem)
        } else {
            write!(f, "config key '{}': {}", self.key, self.problem)
        }
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// The error for configuration key `key` (dotted, `""` for the file).
    pub fn new(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
        ConfigError {
            key: key.into(),
            problem: problem.into(),
        }
    }
}

fn err(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::new(key, problem)
}

/// A listener, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listener {
    Tcp(std::net::SocketAddr),
    /// TLS from the first byte (ldaps://).
    Ldaps(std::net::SocketAddr),
    Ldapi(PathBuf),
}

impl Listener {
    pub fn url(&self) -> String {
        match self {
            Listener::Tcp(a) => format!("ldap://{a}"),
            Listener::Ldaps(a) => format!("ldaps://{a}"),
            Listener::Ldapi(p) => format!("ldapi://{}", percent_encode_path(&p.to_string_lossy())),
        }
    }
}

fn percent_encode_path(p: &str) -> String {
    let mut out = String::new();
    for b in p.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Indexes kept whatever the configuration says: replication finds
/// entries by entryUUID. (Changed entries are found through the change
/// log: an entryCSN ordering index cost about a third of durable modify
/// throughput, every modify moving a key; see docs/performance.md.)
pub const REQUIRED_INDEXES: [(&str, IndexKind); 1] = [("entryUUID", IndexKind::Eq)];

/// The validated configuration the server runs with.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub config: Config,
    pub listeners: Vec<Listener>,
    pub suffixes: Vec<Dn>,
    /// None when the configuration has `root_dn = ""`.
    pub root_dn: Option<Dn>,
    pub indexes: Vec<IndexSpec>,
    /// `[tls]` resolved; None when TLS is not configured.
    pub tls: Option<TlsSettings>,
}

impl Config {
    /// Parse TOML text; `origin` names the file in errors.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let problem = e.message().to_string();
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].lines().count().max(1));
            match line {
                Some(l) => err("", format!("{}:{l}: {problem}", origin.display())),
                None => err("", format!("{}: {problem}", origin.display())),
            }
        })
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            err(
                "",
                format!("cannot read config file {}: {e}", path.display()),
            )
        })?;
        Config::from_toml(&text, path)
    }

    /// Check every value this crate can judge against the schema, and
    /// resolve listeners and DNs. The rule languages (access rules, the
    /// `who` of `limits.by`, external maps, overlay rules) and the service
    /// account are judged by the layers that compile them: callers use
    /// `pando_server::settings::Validate`, which runs this first.
    pub fn validate_values(mut self, schema: &Schema) -> Result<Resolved, ConfigError> {
        self.check_process()?;
        let listeners = self.resolve_listeners()?;
        let tls = self.tls.resolve(&self.data_dir)?;
        self.logs.validate()?;
        if let (Some(a), true) = (self.metrics.addr()?, self.metrics.dashboard) {
            if !a.ip().is_loopback() && tls.is_none() {
                return Err(err(
                    "metrics.dashboard",
                    format!("on {a}, not a loopback address, the dashboard is served over TLS only: set tls.cert_file and tls.key_file (or listen on 127.0.0.1)"),
                ));
            }
        }
        if tls.is_none() {
            if let Some(i) = listeners
                .iter()
                .position(|l| matches!(l, Listener::Ldaps(_)))
            {
                return Err(err(
                    "tls.cert_file",
                    format!(
                        "listen[{i}] '{}' needs a certificate: set tls.cert_file and tls.key_file (or serve with --tls-self-signed)",
                        self.listen[i]
                    ),
                ));
            }
        }
        let suffixes = self.resolve_suffixes(schema)?;
        let root_dn = self.resolve_root(schema)?;
        let indexes = self.resolve_indexes(schema)?;
        self.limits.validate()?;
        if let Some(days) = self.store.keep_tombstones_days {
            if days > 36_500 {
                return Err(err(
                    "store.keep_tombstones_days",
                    "must be at most 36500 (100 years)",
                ));
            }
            self.replication.changelog_days = days;
        }
        self.replication.validate(schema, &self.suffixes)?;
        self.check_store_and_passwords()?;
        overlay::validate(&self.overlay, schema, &self.indexes)?;
        Ok(Resolved {
            config: self,
            listeners,
            suffixes,
            root_dn,
            indexes,
            tls,
        })
    }

    /// The process: data directory, threads, log level, service account.
    fn check_process(&self) -> Result<(), ConfigError> {
        if self.data_dir.as_os_str().is_empty() {
            return Err(err("data_dir", "must not be empty"));
        }
        if self.threads > 1024 {
            return Err(err("threads", "at most 1024 (0 = one per CPU)"));
        }
        if !matches!(
            self.log_level.as_str(),
            "error" | "warn" | "info" | "debug" | "trace"
        ) {
            return Err(err(
                "log_level",
                format!(
                    "'{}' is not one of error, warn, info, debug, trace",
                    self.log_level
                ),
            ));
        }
        if self.group.is_some() && self.user.is_none() {
            return Err(err("group", "needs user to be set too"));
        }
        Ok(())
    }

    /// `listen`, each URL resolved to a listener, none twice.
    fn resolve_listeners(&self) -> Result<Vec<Listener>, ConfigError> {
        if self.listen.is_empty() {
            return Err(err("listen", "at least one listener is needed"));
        }
        let mut listeners = Vec::new();
        for (i, url) in self.listen.iter().enumerate() {
            let key = format!("listen[{i}]");
            let l = if let Some(rest) = url.strip_prefix("ldap://") {
                Listener::Tcp(
                    socket_addr(rest, 389)
                        .map_err(|_| err(&key, format!("'{url}' is not host:port")))?,
                )
            } else if let Some(rest) = url.strip_prefix("ldaps://") {
                Listener::Ldaps(
                    socket_addr(rest, 636)
                        .map_err(|_| err(&key, format!("'{url}' is not host:port")))?,
                )
            } else if let Some(rest) = url.strip_prefix("ldapi://") {
                if rest.is_empty() || rest == "/" {
                    // Clients need an absolute path in the URL.
                    let dir = if self.data_dir.is_absolute() {
                        self.data_dir.clone()
                    } else {
                        std::env::current_dir()
                            .map(|c| c.join(&self.data_dir))
                            .unwrap_or_else(|_| self.data_dir.clone())
                    };
                    Listener::Ldapi(dir.join("ldapi"))
                } else {
                    let p = pando_proto::url::percent_decode_str(rest)
                        .ok()
                        .ok_or_else(|| err(&key, "bad %-escape in socket path"))?;
                    Listener::Ldapi(PathBuf::from(p))
                }
            } else {
                return Err(err(
                    &key,
                    format!("'{url}' must start with ldap://, ldaps:// or ldapi://"),
                ));
            };
            if let Some(j) = listeners.iter().position(|x| *x == l) {
                return Err(err(
                    &key,
                    format!("'{url}' is the same listener as listen[{j}]"),
                ));
            }
            listeners.push(l);
        }
        Ok(listeners)
    }

    /// `suffixes`, parsed, normalisable, none inside another.
    fn resolve_suffixes(&self, schema: &Schema) -> Result<Vec<Dn>, ConfigError> {
        if self.suffixes.is_empty() {
            return Err(err("suffixes", "at least one suffix is needed"));
        }
        let mut suffixes: Vec<Dn> = Vec::new();
        let mut norms: Vec<String> = Vec::new();
        for (i, s) in self.suffixes.iter().enumerate() {
            let key = format!("suffixes[{i}]");
            let dn = Dn::parse(s).map_err(|e| err(&key, format!("'{s}' is not a DN: {e}")))?;
            if dn.is_root() {
                return Err(err(&key, "the empty DN cannot be a suffix"));
            }
            let n = schema.normalize_dn(&dn).map_err(|e| err(&key, e))?;
            for other in &norms {
                if n == *other
                    || n.ends_with(&format!(",{other}"))
                    || other.ends_with(&format!(",{n}"))
                {
                    return Err(err(&key, format!("'{s}' overlaps another suffix")));
                }
            }
            norms.push(n);
            suffixes.push(dn);
        }
        Ok(suffixes)
    }

    /// The root DN (None for `root_dn = ""`), its password hash, and the
    /// administrators and break-glass identity of `[auth]`.
    fn resolve_root(&self, schema: &Schema) -> Result<Option<Dn>, ConfigError> {
        let root_dn_text = match &self.root_dn {
            Some(d) => d.clone(),
            None => format!("cn=admin,{}", self.suffixes[0]),
        };
        let root_dn = if root_dn_text.is_empty() {
            None
        } else {
            let dn = Dn::parse(&root_dn_text)
                .map_err(|e| err("root_dn", format!("'{root_dn_text}': {e}")))?;
            schema.normalize_dn(&dn).map_err(|e| err("root_dn", e))?;
            Some(dn)
        };
        if root_dn.is_none() && self.root_password_hash.is_some() {
            return Err(err(
                "root_password_hash",
                "is set but root_dn is \"\" (no root DN)",
            ));
        }
        for (i, a) in self.auth.admins.iter().enumerate() {
            if a != LDAPI_OWNER {
                let dn = Dn::parse(a).map_err(|e| {
                    err(
                        format!("auth.admins[{i}]"),
                        format!("'{a}' is not a DN or {LDAPI_OWNER}: {e}"),
                    )
                })?;
                schema
                    .normalize_dn(&dn)
                    .map_err(|e| err(format!("auth.admins[{i}]"), e))?;
            }
        }
        if let Some(b) = &self.auth.break_glass {
            if b != LDAPI_OWNER {
                let dn = Dn::parse(b).map_err(|e| {
                    err(
                        "auth.break_glass",
                        format!("'{b}' is not a DN or {LDAPI_OWNER}: {e}"),
                    )
                })?;
                schema
                    .normalize_dn(&dn)
                    .map_err(|e| err("auth.break_glass", e))?;
            }
        }
        if let Some(h) = &self.root_password_hash {
            if !pando_password::is_hashed(h.as_bytes()) {
                return Err(err(
                    "root_password_hash",
                    "must be a hash such as {ARGON2}… (make one with `pando passwd`), not a clear password",
                ));
            }
        }
        Ok(root_dn)
    }

    /// `[indexes]`, each kind one the attribute's matching rules allow,
    /// with the indexes replication needs added.
    fn resolve_indexes(&self, schema: &Schema) -> Result<Vec<IndexSpec>, ConfigError> {
        let mut indexes = Vec::new();
        for (attr, kinds) in &self.indexes {
            let key = format!("indexes.{attr}");
            let at = schema
                .attribute(attr)
                .ok_or_else(|| err(&key, format!("unknown attribute type '{attr}'")))?;
            let mut ks = Vec::new();
            for k in kinds {
                let kind: IndexKind = k.parse().map_err(|e: String| err(&key, e))?;
                let ok = match kind {
                    IndexKind::Eq | IndexKind::Sub | IndexKind::Approx => at.equality.is_some(),
                    IndexKind::Ord => at.ordering.is_some(),
                    IndexKind::Pres => true,
                };
                if !ok {
                    return Err(err(
                        &key,
                        format!("'{attr}' has no matching rule for a '{kind}' index"),
                    ));
                }
                if !ks.contains(&kind) {
                    ks.push(kind);
                }
            }
            indexes.push(IndexSpec {
                attr: at.name().to_string(),
                kinds: ks,
            });
        }
        // Replication finds entries by UUID and changes by CSN, whatever
        // else is indexed.
        for (attr, kind) in REQUIRED_INDEXES {
            match indexes
                .iter_mut()
                .find(|s| s.attr.eq_ignore_ascii_case(attr))
            {
                Some(spec) if !spec.kinds.contains(&kind) => spec.kinds.push(kind),
                Some(_) => {}
                None => indexes.push(IndexSpec {
                    attr: attr.to_string(),
                    kinds: vec![kind],
                }),
            }
        }
        Ok(indexes)
    }

    /// `[store]` and `[passwords]`.
    fn check_store_and_passwords(&self) -> Result<(), ConfigError> {
        if self.store.map_size_mb != 0 && self.store.map_size_mb < 16 {
            return Err(err(
                "store.map_size_mb",
                "must be 0 (unbounded) or at least 16",
            ));
        }
        self.store.durability()?;
        self.passwords.policy()?;
        if self.passwords.max_concurrent_hashes > 1024 {
            return Err(err(
                "passwords.max_concurrent_hashes",
                "must be at most 1024",
            ));
        }
        if self.passwords.max_clear_values == 0 {
            return Err(err("passwords.max_clear_values", "must be at least 1"));
        }
        self.store.compression()?;
        if self.store.max_write_batch == 0 {
            return Err(err("store.max_write_batch", "must be at least 1"));
        }
        Ok(())
    }
}

impl Limits {
    /// Every bound of `[limits]` within what the server can honour.
    fn validate(&self) -> Result<(), ConfigError> {
        let l = self;
        if l.max_pdu_bytes < 1024 || l.max_pdu_bytes > 1 << 30 {
            return Err(err(
                "limits.max_pdu_bytes",
                "must be between 1024 and 1073741824",
            ));
        }
        if l.max_filter_depth == 0 || l.max_filter_depth > 1000 {
            return Err(err("limits.max_filter_depth", "must be between 1 and 1000"));
        }
        if l.max_filter_terms == 0 {
            return Err(err("limits.max_filter_terms", "must be at least 1"));
        }
        // Each connection costs a file descriptor and a task; a million is
        // beyond any file descriptor limit a server runs with.
        if l.max_connections == 0 || l.max_connections > 1_000_000 {
            return Err(err(
                "limits.max_connections",
                "must be between 1 and 1000000",
            ));
        }
        // Each is a blocking thread (tokio keeps 512) and an LMDB reader
        // (1024 in all): at most half the threads, leaving the rest to
        // binds, writes and compares.
        if l.max_search_threads > MAX_SEARCH_THREADS {
            return Err(err(
                "limits.max_search_threads",
                format!("must be at most {MAX_SEARCH_THREADS}"),
            ));
        }
        if l.max_ops_per_connection > 65_536 {
            return Err(err(
                "limits.max_ops_per_connection",
                "must be at most 65536",
            ));
        }
        if l.write_timeout == 0 || l.write_timeout > 3600 {
            return Err(err("limits.write_timeout", "must be between 1 and 3600"));
        }
        if l.max_ops_per_connection == 0 {
            return Err(err("limits.max_ops_per_connection", "must be at least 1"));
        }
        if l.max_persistent_searches > 100_000 {
            return Err(err(
                "limits.max_persistent_searches",
                "must be at most 100000",
            ));
        }
        // A reserve as large as the total (say with the total lowered to
        // 0 or 1) leaves places to privileged requesters only: allowed.
        for (key, v) in [
            (
                "limits.persistent_search_reserve",
                l.persistent_search_reserve,
            ),
            (
                "limits.max_persistent_searches_per_connection",
                l.max_persistent_searches_per_connection,
            ),
            (
                "limits.max_persistent_searches_per_identity",
                l.max_persistent_searches_per_identity,
            ),
        ] {
            if v > 100_000 {
                return Err(err(key, "must be at most 100000"));
            }
        }
        if !(1..=1024).contains(&l.max_sort_keys) {
            return Err(err("limits.max_sort_keys", "must be between 1 and 1024"));
        }
        if l.max_sort_memory_mb > 1 << 20 {
            return Err(err(
                "limits.max_sort_memory_mb",
                "must be at most 1048576 (1 TiB)",
            ));
        }
        // The change feed's ring is allocated whole.
        if !(1..=1 << 20).contains(&l.persistent_search_backlog) {
            return Err(err(
                "limits.persistent_search_backlog",
                "must be between 1 and 1048576",
            ));
        }
        let a = &l.anonymous;
        if a.max_pdu_bytes < 1024 {
            return Err(err(
                "limits.anonymous.max_pdu_bytes",
                "must be at least 1024",
            ));
        }
        if a.max_ops == 0 {
            return Err(err("limits.anonymous.max_ops", "must be at least 1"));
        }
        Ok(())
    }
}

impl ReplicationConfig {
    /// `[replication]` and each consumer, whose base must lie within one
    /// of `suffixes`.
    fn validate(&self, schema: &Schema, suffixes: &[String]) -> Result<(), ConfigError> {
        let r = self;
        if r.server_id > 4095 {
            return Err(err("replication.server_id", "must be between 0 and 4095"));
        }
        if r.multi_provider && r.server_id == 0 {
            return Err(err(
                "replication.multi_provider",
                "needs replication.server_id (1-4095, unique among the providers)",
            ));
        }
        if !(1..=100_000_000).contains(&r.max_changes_counted) {
            return Err(err(
                "replication.max_changes_counted",
                "must be between 1 and 100000000",
            ));
        }
        if r.changelog_days > 36_500 {
            return Err(err(
                "replication.changelog_days",
                "must be at most 36500 (100 years)",
            ));
        }
        for (i, c) in r.consumer.iter().enumerate() {
            let key = |k: &str| format!("replication.consumer[{i}].{k}");
            c.check().map_err(|(k, p)| err(key(&k), p))?;
            within_suffix(schema, suffixes, &c.search_base)
                .map_err(|p| err(key("search_base"), p))?;
            if r.multi_provider && c.delta() {
                return Err(err(
                    key("syncdata"),
                    "delta-sync (accesslog) consumers are not built for multi-provider yet: use syncdata = \"default\" with multi_provider",
                ));
            }
            if r.consumer[..i].iter().any(|o| o.rid == c.rid) {
                return Err(err(key("rid"), format!("rid {} is used twice", c.rid)));
            }
        }
        for (i, p) in r.push.iter().enumerate() {
            let key = |k: &str| format!("replication.push[{i}].{k}");
            p.check().map_err(|(k, why)| err(key(&k), why))?;
            within_suffix(schema, suffixes, &p.search_base)
                .map_err(|why| err(key("search_base"), why))?;
            if r.push[..i].iter().any(|o| o.rid == p.rid) {
                return Err(err(key("rid"), format!("push rid {} is used twice", p.rid)));
            }
        }
        Ok(())
    }
}

/// Whether the subtree `base` lies within one of `suffixes`; the problem
/// when not.
fn within_suffix(schema: &Schema, suffixes: &[String], base: &str) -> Result<(), String> {
    let dn = Dn::parse(base).map_err(|e| format!("'{base}': {e}"))?;
    let norm = schema
        .normalize_dn(&dn)
        .map_err(|e| format!("'{base}': {e}"))?;
    let inside = suffixes.iter().any(|s| {
        Dn::parse(s)
            .ok()
            .and_then(|d| schema.normalize_dn(&d).ok())
            .is_some_and(|s| norm == s || norm.ends_with(&format!(",{s}")))
    });
    match inside {
        true => Ok(()),
        false => Err(format!("'{base}' is not within a suffix this server holds")),
    }
}

/// `host:port` (or `host`, taking `default_port`) of a listener URL.
fn socket_addr(rest: &str, default_port: u16) -> Result<std::net::SocketAddr, ()> {
    let hostport = rest.trim_end_matches('/');
    // `[::1]` is an IPv6 address without a port.
    let has_port = match hostport.strip_prefix('[') {
        Some(v6) => v6.contains("]:"),
        None => hostport.contains(':'),
    };
    let addr = if has_port {
        hostport.to_string()
    } else {
        format!("{hostport}:{default_port}")
    };
    addr.parse().or_else(|_| {
        std::net::ToSocketAddrs::to_socket_addrs(&addr.as_str())
            .ok()
            .and_then(|mut it| it.next())
            .ok_or(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(toml: &str) -> Result<Resolved, ConfigError> {
        let c = Config::from_toml(toml, Path::new("test.toml"))?;
        c.validate_values(&Schema::standard())
    }

    #[test]
    fn defaults_validate() {
        let r = check("").unwrap();
        assert_eq!(r.root_dn.unwrap().to_string(), "cn=admin,dc=example,dc=com");
        assert_eq!(
            r.listeners[0],
            Listener::Tcp("127.0.0.1:3389".parse().unwrap())
        );
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            r.listeners[1],
            Listener::Ldapi(cwd.join("pando-data/ldapi"))
        );
    }

    #[test]
    fn errors_name_the_key() {
        let e = check("[limits]\nsize_limit = \"many\"\n").unwrap_err();
        assert!(e.to_string().contains("test.toml:2"), "{e}");
        let e = check("bogus = 1\n").unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = check("suffixes = [\"not a dn\"]\n").unwrap_err();
        assert_eq!(e.key, "suffixes[0]");
        let e = check("[indexes]\nnoSuchAttr = [\"eq\"]\n").unwrap_err();
        assert_eq!(e.key, "indexes.noSuchAttr");
        let e = check("[indexes]\ncn = [\"fuzzy\"]\n").unwrap_err();
        assert_eq!(e.key, "indexes.cn");
        let e = check("listen = [\"http://x\"]\n").unwrap_err();
        assert_eq!(e.key, "listen[0]");
        let e = check("root_password_hash = \"secret\"\n").unwrap_err();
        assert_eq!(e.key, "root_password_hash");
        let e =
            check("suffixes = [\"dc=example,dc=com\", \"ou=x,dc=example,dc=com\"]\n").unwrap_err();
        assert_eq!(e.key, "suffixes[1]");
        let e = check("[limits]\nmax_pdu_bytes = 10\n").unwrap_err();
        assert_eq!(e.key, "limits.max_pdu_bytes");
        let e = check("[store]\ndurability = \"sometimes\"\n").unwrap_err();
        assert_eq!(e.key, "store.durability");
        let e = check("[store]\ndurability = \"batched\"\nbatched_max_ms = 0\n").unwrap_err();
        assert_eq!(e.key, "store.batched_max_ms");
        let e = check("threads = 5000\n").unwrap_err();
        assert_eq!(e.key, "threads");
        let e = check("threads = -1\n").unwrap_err();
        assert!(e.to_string().contains("test.toml:1"), "{e}");
        assert_eq!(check("threads = 1\n").unwrap().config.threads, 1);
    }

    #[test]
    fn sort_and_persistent_search_bounds_are_checked() {
        for (text, key) in [
            ("max_sort_keys = 0", "limits.max_sort_keys"),
            ("max_sort_keys = 5000", "limits.max_sort_keys"),
            ("max_sort_memory_mb = 2000000", "limits.max_sort_memory_mb"),
            (
                "persistent_search_reserve = 200000",
                "limits.persistent_search_reserve",
            ),
            (
                "max_persistent_searches_per_identity = 200000",
                "limits.max_persistent_searches_per_identity",
            ),
        ] {
            let e = check(&format!("[limits]\n{text}\n")).unwrap_err();
            assert_eq!(e.key, key);
        }
        // A reserve above the total leaves it to privileged requesters.
        let r = check("[limits]\nmax_persistent_searches = 1\n").unwrap();
        assert_eq!(r.config.limits.persistent_search_reserve, 10);
        let by = "[[limits.by]]\nwho = \"users\"\nreplication = true\n";
        assert_eq!(
            check(by).unwrap().config.limits.by[0].replication,
            Some(true)
        );
    }

    #[test]
    fn tls_settings() {
        let r = check("").unwrap();
        assert_eq!(r.tls, None);
        let r = check(
            "listen = [\"ldap://127.0.0.1:3389\", \"ldaps://127.0.0.1\", \"ldaps://[::1]:1636\"]\n\
             [tls]\ncert_file = \"/etc/pando/cert.pem\"\nkey_file = \"/etc/pando/key.pem\"\n",
        )
        .unwrap();
        assert_eq!(
            r.listeners[1],
            Listener::Ldaps("127.0.0.1:636".parse().unwrap())
        );
        assert_eq!(r.listeners[1].url(), "ldaps://127.0.0.1:636");
        assert_eq!(
            r.listeners[2],
            Listener::Ldaps("[::1]:1636".parse().unwrap())
        );
        let t = r.tls.unwrap();
        assert_eq!(t.cert_file, PathBuf::from("/etc/pando/cert.pem"));
        assert_eq!(t.client_certs, ClientCerts::None);
        assert_eq!(t.min_version, TlsVersion::V1_2);
        assert!(!t.self_signed);
        let r = check(
            "[tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\nca_file = \"ca.pem\"\n\
             client_certs = \"require\"\nmin_version = \"1.3\"\n",
        )
        .unwrap();
        let t = r.tls.unwrap();
        assert_eq!(t.client_certs, ClientCerts::Require);
        assert_eq!(t.min_version, TlsVersion::V1_3);
        assert_eq!(t.ca_file, Some(PathBuf::from("ca.pem")));
    }

    #[test]
    fn tls_errors_name_the_key() {
        let key = |toml: &str| check(toml).unwrap_err().key;
        // An ldaps listener without a certificate names the key to set.
        let e = check("listen = [\"ldap://127.0.0.1:1\", \"ldaps://127.0.0.1:2\"]\n").unwrap_err();
        assert_eq!(e.key, "tls.cert_file");
        assert!(e.problem.contains("listen[1]"), "{e}");
        assert_eq!(key("listen = [\"ldaps://no port here:x\"]\n"), "listen[0]");
        assert_eq!(key("[tls]\ncert_file = \"c.pem\"\n"), "tls.key_file");
        assert_eq!(key("[tls]\nkey_file = \"k.pem\"\n"), "tls.cert_file");
        assert_eq!(
            key("[tls]\ncert_file = \"\"\nkey_file = \"k.pem\"\n"),
            "tls.cert_file"
        );
        let base = "[tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\n";
        assert_eq!(
            key(&format!("{base}client_certs = \"maybe\"\n")),
            "tls.client_certs"
        );
        assert_eq!(
            key(&format!("{base}client_certs = \"request\"\n")),
            "tls.ca_file"
        );
        assert_eq!(key(&format!("{base}ca_file = \"ca.pem\"\n")), "tls.ca_file");
        assert_eq!(
            key(&format!("{base}min_version = \"1.1\"\n")),
            "tls.min_version"
        );
        assert_eq!(
            key("[tls]\nclient_certs = \"require\"\nca_file = \"ca.pem\"\n"),
            "tls.cert_file"
        );
        // Unknown keys and the command-line-only flag are refused in the file.
        let e = check("[tls]\ncertfile = \"c.pem\"\n").unwrap_err();
        assert!(e.to_string().contains("certfile"), "{e}");
        let e = check("[tls]\nself_signed = true\n").unwrap_err();
        assert!(e.to_string().contains("self_signed"), "{e}");
    }

    #[test]
    fn tls_self_signed_paths() {
        let mut c = Config::from_toml(
            "data_dir = \"/var/lib/pando\"\nlisten = [\"ldaps://127.0.0.1:1636\"]\n",
            Path::new("test.toml"),
        )
        .unwrap();
        c.tls.self_signed = true;
        let t = c.validate_values(&Schema::standard()).unwrap().tls.unwrap();
        assert!(t.self_signed);
        assert_eq!(t.cert_file, PathBuf::from("/var/lib/pando/tls/cert.pem"));
        assert_eq!(t.key_file, PathBuf::from("/var/lib/pando/tls/key.pem"));
        // A configured certificate wins over the flag.
        let mut c = Config::from_toml(
            "[tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\n",
            Path::new("test.toml"),
        )
        .unwrap();
        c.tls.self_signed = true;
        let t = c.validate_values(&Schema::standard()).unwrap().tls.unwrap();
        assert!(!t.self_signed);
        assert_eq!(t.cert_file, PathBuf::from("c.pem"));
    }

    #[test]
    fn ldapi_paths() {
        let r = check("listen = [\"ldapi://%2Ftmp%2Fx.sock\"]\n").unwrap();
        assert_eq!(
            r.listeners[0],
            Listener::Ldapi(PathBuf::from("/tmp/x.sock"))
        );
        assert_eq!(r.listeners[0].url(), "ldapi://%2Ftmp%2Fx.sock");
    }

    #[test]
    fn logs_and_metrics_settings() {
        let r = check(
            "[logs]\naccess = \"/tmp/a.log\"\nfile_mode = \"0640\"\n[metrics]\nlisten = \"9390\"\n",
        )
        .unwrap();
        assert_eq!(r.config.logs.mode().unwrap(), 0o640);
        assert_eq!(
            r.config.metrics.addr().unwrap(),
            Some("127.0.0.1:9390".parse().unwrap())
        );
        for (toml, key) in [
            ("[logs]\naccess_format = \"xml\"\n", "logs.access_format"),
            ("[logs]\non_full = \"wait\"\n", "logs.on_full"),
            ("[logs]\nfile_mode = \"rw\"\n", "logs.file_mode"),
            ("[logs]\nfile_mode = \"0400\"\n", "logs.file_mode"),
            ("[logs]\naccess_buffer = 0\n", "logs.access_buffer"),
            (
                "[logs]\naccess = \"/tmp/x\"\naudit = \"/tmp/x\"\n",
                "logs.audit",
            ),
            ("[metrics]\nlisten = \"localhost\"\n", "metrics.listen"),
        ] {
            let e = check(toml).unwrap_err();
            assert_eq!(e.key, key, "{toml}: {e}");
        }
    }
}
