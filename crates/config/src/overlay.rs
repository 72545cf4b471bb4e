//! `[[overlay]]` settings as the TOML file and cn=config hold them, and
//! their checks. Each overlay type's settings are one struct; the
//! attribute each setting is under cn=config is in [`SETTINGS`].

use pando_model::{Dn, Schema};
use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// One `[[overlay]]`: its type (`type = "refint"`…) and settings.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum OverlayConfig {
    Refint(RefintConfig),
    Unique(UniqueConfig),
    Memberof(MemberOfConfig),
    Valsort(ValsortConfig),
    Ppolicy(PpolicyConfig),
    Errors(ErrorsConfig),
    Accesslog(AccesslogConfig),
    Translucent(TranslucentConfig),
    Retrochangelog(RetroChangelogConfig),
}

/// Referential integrity: references to an entry follow it when it is
/// renamed and go when it is deleted.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RefintConfig {
    /// Attributes (DN syntax) whose values are kept pointing at entries.
    #[serde(default = "refint_attributes")]
    pub attributes: Vec<String>,
    /// The value left when removing a reference would leave the attribute
    /// empty (a group's last member); unset: such a delete is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nothing: Option<String>,
}

fn refint_attributes() -> Vec<String> {
    ["member", "uniqueMember", "manager", "owner", "seeAlso"]
        .map(String::from)
        .to_vec()
}

/// Attribute uniqueness within a subtree.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UniqueConfig {
    /// Attributes no two entries below `base` may share a value of.
    pub attributes: Vec<String>,
    /// The subtree; unset: every suffix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// Empty values must be unique too (by default they are ignored).
    #[serde(default)]
    pub strict: bool,
}

/// memberOf: each member of a group lists the group.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MemberOfConfig {
    /// Object classes that make an entry a group.
    #[serde(default = "memberof_groups")]
    pub group_classes: Vec<String>,
    /// The attributes of a group that name its members.
    #[serde(default = "memberof_members")]
    pub member_attributes: Vec<String>,
    /// The attribute kept on members.
    #[serde(default = "memberof_attribute")]
    pub memberof_attribute: String,
    /// A member DN naming no entry: `ignore` (kept in the group) or
    /// `error` (the change is refused).
    #[serde(default = "memberof_dangling")]
    pub dangling: String,
}

fn memberof_groups() -> Vec<String> {
    ["groupOfNames", "groupOfUniqueNames"]
        .map(String::from)
        .to_vec()
}

fn memberof_members() -> Vec<String> {
    ["member", "uniqueMember"].map(String::from).to_vec()
}

fn memberof_attribute() -> String {
    "memberOf".into()
}

fn memberof_dangling() -> String {
    "ignore".into()
}

/// Value sorting.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ValsortConfig {
    /// `<attribute> <base DN> <order>` each (see `overlays::valsort`).
    pub rules: Vec<String>,
}

/// Password policy.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct PpolicyConfig {
    /// The policy entry for accounts without `pwdPolicySubentry`; unset:
    /// such accounts have no policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_policy: Option<String>,
    /// A bind to a locked account says so in the password policy
    /// response (accountLocked); otherwise it is only invalidCredentials.
    #[serde(default)]
    pub use_lockout: bool,
    /// Character classes (lower, upper, digits, others) a password must
    /// mix when the policy checks quality.
    #[serde(default)]
    pub min_classes: u8,
    /// A file of banned passwords, one per line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub banned_file: Option<std::path::PathBuf>,
}

/// Error injection (see `overlays::errors` for the rule words).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ErrorsConfig {
    pub rules: Vec<String>,
}

/// The in-directory access log.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AccesslogConfig {
    /// Operations logged: add, delete, modify, modrdn, search, compare,
    /// bind, extended, or writes, reads, session, all.
    #[serde(default = "accesslog_ops")]
    pub ops: Vec<String>,
    /// Only operations that succeeded.
    #[serde(default)]
    pub success_only: bool,
    /// Days records other than successful writes are kept (0: forever);
    /// successful writes are the change log's and follow its retention.
    #[serde(default = "accesslog_purge_days")]
    pub purge_days: u64,
    /// Most records stored (reads, binds, failed writes); the oldest go
    /// first. Successful writes are the change log's and not counted.
    #[serde(default = "accesslog_max_records")]
    pub max_records: u64,
    /// Most bytes (database pages) the stored records take.
    #[serde(default = "accesslog_max_bytes")]
    pub max_bytes: u64,
    /// Most bytes of one stored record's values: longer values are cut,
    /// marked as cut.
    #[serde(default = "accesslog_max_record_bytes")]
    pub max_record_bytes: u64,
    /// Records waiting in memory for the writer; more are dropped (and
    /// counted).
    #[serde(default = "accesslog_queue_records")]
    pub queue_records: u64,
}

impl AccesslogConfig {
    /// Bounds of the numeric settings: (key, value, least, most).
    pub fn bounds(&self) -> [(&'static str, u64, u64, u64); 4] {
        [
            ("max_records", self.max_records, 100, 1 << 32),
            ("max_bytes", self.max_bytes, 1 << 20, 1 << 40),
            ("max_record_bytes", self.max_record_bytes, 512, 1 << 20),
            ("queue_records", self.queue_records, 1, 1 << 20),
        ]
    }
}

/// The retro change log: `cn=changelog`, the change log numbered, as
/// DSEE and 389-DS serve it.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RetroChangelogConfig {
    /// Attributes left out of the `changes` shown (a sync tool that needs
    /// no password hashes: `["userPassword"]`).
    #[serde(default)]
    pub exclude_attributes: Vec<String>,
}

/// Translucency: a suffix whose entries come from a remote server, with
/// local attributes and local entries added here.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TranslucentConfig {
    /// The suffix (one of the server's) the remote server's entries are
    /// shown in; the remote holds them under the same names.
    pub suffix: String,
    /// `ldap://host:port` or `ldaps://host:port`.
    pub uri: String,
    /// `simple` (default), `sasl_external` (the TLS client certificate)
    /// or `none` (anonymous): how the server binds to read the remote.
    #[serde(default = "translucent_bind_method")]
    pub bind_method: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bind_dn: String,
    /// The file holding the service account's password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_file: Option<std::path::PathBuf>,
    /// StartTLS on an ldap:// URI (refused if it fails).
    #[serde(default)]
    pub start_tls: bool,
    /// CA certificates (PEM) the remote's certificate must chain to;
    /// unset: the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca_file: Option<std::path::PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<std::path::PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<std::path::PathBuf>,
    /// Connecting, binding and each wait for an answer, in seconds.
    #[serde(default = "translucent_timeout")]
    pub timeout_secs: u64,
    /// Attributes clients may set here on the remote's entries (added to,
    /// or overriding, the remote's values).
    #[serde(default)]
    pub local_attributes: Vec<String>,
    /// Writes to other attributes of the remote's entries: `refuse`
    /// (default) or `local` (kept here, overriding the remote's values).
    #[serde(default = "translucent_remote_writes")]
    pub remote_writes: String,
    /// Most entries one search reads from the remote.
    #[serde(default = "translucent_max_entries")]
    pub max_entries: u64,
    /// Most connections to the remote at once for searches and reads
    /// (kept between searches); searches beyond wait for one.
    #[serde(default = "translucent_max_connections")]
    pub max_connections: usize,
}

fn translucent_bind_method() -> String {
    "simple".into()
}

fn translucent_timeout() -> u64 {
    5
}

fn translucent_remote_writes() -> String {
    "refuse".into()
}

fn translucent_max_entries() -> u64 {
    100_000
}

fn translucent_max_connections() -> usize {
    8
}

fn accesslog_ops() -> Vec<String> {
    vec!["writes".into()]
}

fn accesslog_purge_days() -> u64 {
    7
}

fn accesslog_max_records() -> u64 {
    100_000
}

fn accesslog_max_bytes() -> u64 {
    64 << 20
}

fn accesslog_max_record_bytes() -> u64 {
    4096
}

fn accesslog_queue_records() -> u64 {
    2048
}

/// How a setting is written as attribute values under cn=config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettingForm {
    Text,
    Boolean,
    Integer,
    List,
}

/// One setting of an overlay type: its key in `[[overlay]]` and its
/// attribute under cn=config (OpenLDAP's name where it has the same
/// meaning).
#[derive(Debug)]
pub struct Setting {
    pub key: &'static str,
    pub attr: &'static str,
    pub form: SettingForm,
    /// Attribute type number (`cn_config::OID_ARC.1.<n>`).
    pub n: u32,
}

const fn s(n: u32, key: &'static str, attr: &'static str, form: SettingForm) -> Setting {
    Setting { key, attr, form, n }
}

/// One overlay type: its name (`type`), its object class under cn=config
/// (with its number, `OID_ARC.2.<n>`) and its settings.
#[derive(Debug)]
pub struct OverlayType {
    pub name: &'static str,
    pub class: &'static str,
    pub class_n: u32,
    pub settings: &'static [Setting],
}

use SettingForm::*;

/// Every overlay type. Numbers are OIDs: append, never reuse.
pub const TYPES: &[OverlayType] = &[
    OverlayType {
        name: "refint",
        class: "olcRefintConfig",
        class_n: 11,
        settings: &[
            s(300, "attributes", "olcRefintAttribute", List),
            s(301, "nothing", "olcRefintNothing", Text),
        ],
    },
    OverlayType {
        name: "unique",
        class: "olcUniqueConfig",
        class_n: 12,
        settings: &[
            s(310, "attributes", "olcUniqueAttribute", List),
            s(311, "base", "olcUniqueBase", Text),
            s(312, "strict", "olcUniqueStrict", Boolean),
        ],
    },
    OverlayType {
        name: "memberof",
        class: "olcMemberOfConfig",
        class_n: 13,
        settings: &[
            s(320, "group_classes", "olcMemberOfGroupOC", List),
            s(321, "member_attributes", "olcMemberOfMemberAD", List),
            s(322, "memberof_attribute", "olcMemberOfMemberOfAD", Text),
            s(323, "dangling", "olcMemberOfDangling", Text),
        ],
    },
    OverlayType {
        name: "valsort",
        class: "olcValSortConfig",
        class_n: 14,
        settings: &[s(330, "rules", "olcValSortAttr", List)],
    },
    OverlayType {
        name: "ppolicy",
        class: "olcPPolicyConfig",
        class_n: 15,
        settings: &[
            s(340, "default_policy", "olcPPolicyDefault", Text),
            s(341, "use_lockout", "olcPPolicyUseLockout", Boolean),
            s(342, "min_classes", "pandoPPolicyMinClasses", Integer),
            s(343, "banned_file", "pandoPPolicyBannedFile", Text),
        ],
    },
    OverlayType {
        name: "errors",
        class: "pandoErrorsConfig",
        class_n: 16,
        settings: &[s(350, "rules", "pandoErrorRule", List)],
    },
    OverlayType {
        name: "accesslog",
        class: "olcAccessLogConfig",
        class_n: 17,
        settings: &[
            s(360, "ops", "olcAccessLogOps", List),
            s(361, "success_only", "olcAccessLogSuccess", Boolean),
            s(362, "purge_days", "pandoAccessLogPurgeDays", Integer),
            s(363, "max_records", "pandoAccessLogMaxRecords", Integer),
            s(364, "max_bytes", "pandoAccessLogMaxBytes", Integer),
            s(
                365,
                "max_record_bytes",
                "pandoAccessLogMaxRecordBytes",
                Integer,
            ),
            s(366, "queue_records", "pandoAccessLogQueueRecords", Integer),
        ],
    },
    OverlayType {
        name: "translucent",
        class: "pandoTranslucentConfig",
        class_n: 18,
        settings: &[
            s(370, "suffix", "pandoTranslucentSuffix", Text),
            s(371, "uri", "pandoTranslucentURI", Text),
            s(372, "bind_method", "pandoTranslucentBindMethod", Text),
            s(373, "bind_dn", "pandoTranslucentBindDN", Text),
            s(
                374,
                "credentials_file",
                "pandoTranslucentCredentialsFile",
                Text,
            ),
            s(375, "start_tls", "pandoTranslucentStartTLS", Boolean),
            s(376, "tls_ca_file", "pandoTranslucentCACertFile", Text),
            s(377, "tls_cert_file", "pandoTranslucentCertFile", Text),
            s(378, "tls_key_file", "pandoTranslucentKeyFile", Text),
            s(379, "timeout_secs", "pandoTranslucentTimeout", Integer),
            s(
                380,
                "local_attributes",
                "pandoTranslucentLocalAttribute",
                List,
            ),
            s(381, "remote_writes", "pandoTranslucentRemoteWrites", Text),
            s(382, "max_entries", "pandoTranslucentMaxEntries", Integer),
            s(
                383,
                "max_connections",
                "pandoTranslucentMaxConnections",
                Integer,
            ),
        ],
    },
    OverlayType {
        name: "retrochangelog",
        class: "pandoRetroChangelogConfig",
        class_n: 19,
        settings: &[s(
            390,
            "exclude_attributes",
            "pandoRetroChangelogExcludeAttribute",
            List,
        )],
    },
];

/// The type named `name` (any case).
pub fn overlay_type(name: &str) -> Option<&'static OverlayType> {
    TYPES.iter().find(|t| t.name.eq_ignore_ascii_case(name))
}

impl OverlayConfig {
    pub fn type_name(&self) -> &'static str {
        match self {
            OverlayConfig::Refint(_) => "refint",
            OverlayConfig::Unique(_) => "unique",
            OverlayConfig::Memberof(_) => "memberof",
            OverlayConfig::Valsort(_) => "valsort",
            OverlayConfig::Ppolicy(_) => "ppolicy",
            OverlayConfig::Errors(_) => "errors",
            OverlayConfig::Accesslog(_) => "accesslog",
            OverlayConfig::Translucent(_) => "translucent",
            OverlayConfig::Retrochangelog(_) => "retrochangelog",
        }
    }
}

/// The error for setting `key` of `[[overlay]]` number `i`, of type `kind`.
pub fn err(i: usize, kind: &str, key: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        key: format!("overlay[{i}].{key}"),
        problem: format!("({kind}) {}", problem.into()),
    }
}

/// An attribute type the schema knows, with DN syntax when `dn` is set.
fn check_attr(schema: &Schema, name: &str, dn: bool) -> Result<(), String> {
    let Some(at) = schema.attribute(name) else {
        return Err(format!("'{name}' is not an attribute type of the schema"));
    };
    if dn && !is_dn_syntax(at) {
        return Err(format!(
            "'{name}' does not hold DNs (its syntax is {})",
            at.syntax.as_deref().unwrap_or("unknown")
        ));
    }
    Ok(())
}

/// DN syntax, or OpenLDAP's name-and-optional-UID (uniqueMember).
pub fn is_dn_syntax(at: &pando_model::AttributeType) -> bool {
    matches!(
        at.syntax.as_deref(),
        Some("1.3.6.1.4.1.1466.115.121.1.12" | "1.3.6.1.4.1.1466.115.121.1.34")
    )
}

/// Check every overlay's settings against the schema and the indexes.
/// The rule languages of the overlays (errors and valsort rules, accesslog
/// operation lists, the password quality file, a translucent overlay's
/// remote) are judged by the overlays themselves
/// (`pando_server::overlays::check_rules`).
pub fn validate(
    overlays: &[OverlayConfig],
    schema: &Schema,
    indexes: &std::collections::BTreeMap<String, Vec<String>>,
) -> Result<(), ConfigError> {
    let eq_indexed = |attr: &str| {
        indexes
            .iter()
            .any(|(a, kinds)| a.eq_ignore_ascii_case(attr) && kinds.iter().any(|k| k == "eq"))
    };
    for (i, o) in overlays.iter().enumerate() {
        let kind = o.type_name();
        // One memberof (it lists every group class and member attribute),
        // one ppolicy, one accesslog, one retro change log.
        let single = matches!(
            o,
            OverlayConfig::Memberof(_)
                | OverlayConfig::Ppolicy(_)
                | OverlayConfig::Accesslog(_)
                | OverlayConfig::Retrochangelog(_)
        );
        if single && overlays[..i].iter().any(|p| p.type_name() == kind) {
            return Err(err(i, kind, "type", format!("one {kind} overlay at most")));
        }
        let checked = match o {
            OverlayConfig::Refint(r) => check_refint(r, schema),
            OverlayConfig::Unique(u) => check_unique(u, schema, &eq_indexed),
            OverlayConfig::Memberof(m) => check_memberof(m, schema),
            OverlayConfig::Ppolicy(p) => check_ppolicy(p, schema),
            OverlayConfig::Accesslog(a) => check_accesslog(a),
            OverlayConfig::Translucent(t) => check_translucent(t, &overlays[..i], schema),
            OverlayConfig::Retrochangelog(r) => r
                .exclude_attributes
                .iter()
                .try_for_each(|a| check_attr(schema, a, false))
                .map_err(|e| ("exclude_attributes", e)),
            OverlayConfig::Errors(e) if e.rules.is_empty() => {
                Err(("rules", "name at least one rule".into()))
            }
            OverlayConfig::Valsort(v) if v.rules.is_empty() => {
                Err(("rules", "name at least one rule".into()))
            }
            OverlayConfig::Errors(_) | OverlayConfig::Valsort(_) => Ok(()),
        };
        checked.map_err(|(key, e)| err(i, kind, key, e))?;
    }
    Ok(())
}

/// A failed check: the setting's key and the problem.
type Checked = Result<(), (&'static str, String)>;

/// `text` is a DN the schema can normalise.
fn check_dn(schema: &Schema, key: &'static str, text: &str) -> Checked {
    let dn = Dn::parse(text).map_err(|e| (key, format!("'{text}' is not a DN: {e}")))?;
    schema.normalize_dn(&dn).map_err(|e| (key, e))?;
    Ok(())
}

fn check_refint(r: &RefintConfig, schema: &Schema) -> Checked {
    if r.attributes.is_empty() {
        return Err(("attributes", "name at least one attribute".into()));
    }
    for a in &r.attributes {
        check_attr(schema, a, true).map_err(|e| ("attributes", e))?;
    }
    match &r.nothing {
        Some(n) => check_dn(schema, "nothing", n),
        None => Ok(()),
    }
}

fn check_unique(u: &UniqueConfig, schema: &Schema, eq_indexed: &dyn Fn(&str) -> bool) -> Checked {
    if u.attributes.is_empty() {
        return Err(("attributes", "name at least one attribute".into()));
    }
    for a in &u.attributes {
        check_attr(schema, a, false).map_err(|e| ("attributes", e))?;
        let at = schema.attribute(a).map(|t| t.name().to_string());
        let name = at.as_deref().unwrap_or(a);
        if !eq_indexed(name) && !eq_indexed(a) {
            return Err((
                "attributes",
                format!("'{a}' needs an equality index (indexes: {a} = [\"eq\"], or olcDbIndex: {a} eq): each write looks its values up"),
            ));
        }
    }
    match &u.base {
        Some(b) => check_dn(schema, "base", b),
        None => Ok(()),
    }
}

fn check_memberof(m: &MemberOfConfig, schema: &Schema) -> Checked {
    if m.group_classes.is_empty() || m.member_attributes.is_empty() {
        return Err((
            "group_classes",
            "name at least one group class and one member attribute".into(),
        ));
    }
    for c in &m.group_classes {
        if schema.object_class(c).is_none() {
            return Err((
                "group_classes",
                format!("'{c}' is not an object class of the schema"),
            ));
        }
    }
    for a in &m.member_attributes {
        check_attr(schema, a, true).map_err(|e| ("member_attributes", e))?;
    }
    check_attr(schema, &m.memberof_attribute, true).map_err(|e| ("memberof_attribute", e))?;
    if !matches!(m.dangling.as_str(), "ignore" | "error") {
        return Err((
            "dangling",
            format!("'{}' is not ignore or error", m.dangling),
        ));
    }
    Ok(())
}

fn check_ppolicy(p: &PpolicyConfig, schema: &Schema) -> Checked {
    if let Some(d) = &p.default_policy {
        check_dn(schema, "default_policy", d)?;
    }
    if p.min_classes > 4 {
        return Err((
            "min_classes",
            format!("{} is more than the 4 classes there are", p.min_classes),
        ));
    }
    Ok(())
}

fn check_accesslog(a: &AccesslogConfig) -> Checked {
    for (key, v, least, most) in a.bounds() {
        if !(least..=most).contains(&v) {
            return Err((key, format!("{v} is outside {least}..={most}")));
        }
    }
    Ok(())
}

/// One translucent overlay per suffix (`before`: the overlays listed
/// before this one).
fn check_translucent(t: &TranslucentConfig, before: &[OverlayConfig], schema: &Schema) -> Checked {
    let norm = |s: &str| Dn::parse(s).ok().and_then(|d| schema.normalize_dn(&d).ok());
    let mine = norm(&t.suffix);
    let taken = before.iter().any(|p| match p {
        OverlayConfig::Translucent(o) => mine.is_some() && norm(&o.suffix) == mine,
        _ => false,
    });
    if taken {
        return Err((
            "suffix",
            format!("another translucent overlay serves {}", t.suffix),
        ));
    }
    Ok(())
}
