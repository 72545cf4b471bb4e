//! Translucency: a suffix whose entries come from a remote LDAP server,
//! read through over LDAP (`remote`), with entries and attributes kept
//! here shown with them (docs/overlays.md).
//!
//! What this server stores below a translucent suffix is of two kinds:
//!
//! - a **local part** of a remote entry: an entry of structural class
//!   `glue` (as slapd's translucent overlay keeps them), holding the RDN's
//!   values and the attributes set here; shown merged with the remote
//!   entry of the same name, its attributes replacing the remote's of the
//!   same type (objectClass values are added). A part whose remote entry
//!   is gone is not shown. Parts are also made for the ancestors of a
//!   local entry that exist only remotely, so the store's tree is whole.
//! - a **local entry**: any other entry, shown as it is; it hides a
//!   remote entry of the same name.
//!
//! Searches (`ops::search::translucent`) find the local entries that may
//! match through the store's indexes, ask the remote with a filter made
//! weaker (`relax`) where parts (or `local_attributes`) may override
//! attributes, look each remote entry's part up by name, and test every
//! merged entry against the client's filter here, with this server's
//! access rules.

pub mod remote;
mod search;
mod tree;
pub mod write;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use pando_model::{Attribute, Dn, Entry, Schema};
use pando_proto::{Ava, Filter};
use pando_store::Candidates;

use pando_client::Endpoint;
use pando_config::overlay::TranslucentConfig;
use pando_ops::error::OpResult;

/// Object classes of a local part that are bookkeeping, not shown.
const PART_CLASSES: &[&str] = &["top", "glue", "extensibleObject"];

/// One translucent overlay, compiled.
pub struct Translucent {
    /// The suffix, normalised.
    pub suffix_norm: String,
    pub suffix: String,
    pub remote: remote::Remote,
    /// Attribute types (canonical names, lower case) clients may set here
    /// on remote entries.
    local: HashSet<String>,
    /// Writes to any other attribute of a remote entry are kept here too.
    remote_writes_local: bool,
    /// Most entries one search reads from the remote (and from here).
    pub max_entries: u64,
    /// The types the suffix's parts override.
    pub parts: Arc<PartTypes>,
}

/// The attribute types the parts of a suffix override (see
/// [`overridden_types`]), remembered for one store generation: a write
/// anywhere makes the next search read them again (the parts are found
/// through the objectClass index).
#[derive(Default)]
pub struct PartTypes(Mutex<Option<(u64, Arc<Vec<String>>)>>);

impl PartTypes {
    /// The types, read from `rtxn` when the remembered ones are of
    /// another generation.
    pub fn types(
        &self,
        schema: &Schema,
        rtxn: &pando_store::ReadTxn<'_>,
        suffix_norm: &str,
    ) -> OpResult<Arc<Vec<String>>> {
        let generation = rtxn.generation();
        if let (Some(g), Ok(cache)) = (generation, self.0.lock()) {
            if let Some((at, types)) = &*cache {
                if *at == g {
                    return Ok(types.clone());
                }
            }
        }
        let view = rtxn.view();
        let mut types: Vec<String> = Vec::new();
        let suffix = Dn::parse(suffix_norm).unwrap_or_else(|_| Dn::root());
        let rdns = pando_ops::norm_rdns(&view, &suffix)?;
        if let pando_store::Lookup::Found(top) = view.lookup_norm(&rdns)? {
            let glue = Filter::Equality(Ava {
                attr: "objectClass".into(),
                value: b"glue".to_vec(),
            });
            let ids = match view.candidates(&glue)? {
                Candidates::Ids(ids) => ids,
                Candidates::All => view.subtree(top, u64::MAX)?.unwrap_or_default(),
            };
            for id in ids {
                if id != top && !view.is_within(id, top)? {
                    continue;
                }
                let mut e = pando_ops::stored_entry(&view, id)?;
                if !is_part(&e) {
                    continue;
                }
                e.dn = view.dn(id)?;
                for t in overridden_types(schema, &e) {
                    if !types.contains(&t) {
                        types.push(t);
                    }
                }
            }
        }
        let types = Arc::new(types);
        if let (Some(g), Ok(mut cache)) = (generation, self.0.lock()) {
            *cache = Some((g, types.clone()));
        }
        Ok(types)
    }
}

/// Check settings; the error names the setting key.
pub fn check(
    t: &TranslucentConfig,
    schema: &Schema,
    suffixes: &[Dn],
) -> Result<(), (&'static str, String)> {
    let dn =
        Dn::parse(&t.suffix).map_err(|e| ("suffix", format!("'{}' is not a DN: {e}", t.suffix)))?;
    let norm = schema.normalize_dn(&dn).map_err(|e| ("suffix", e))?;
    if !suffixes
        .iter()
        .any(|s| schema.normalize_dn(s).is_ok_and(|n| n == norm))
    {
        let list: Vec<String> = suffixes.iter().map(|s| s.to_string()).collect();
        return Err((
            "suffix",
            format!(
                "'{}' is not one of the server's suffixes ({})",
                t.suffix,
                list.join("; ")
            ),
        ));
    }
    pando_client::check_url(&t.uri).map_err(|e| ("uri", e.0))?;
    match t.bind_method.as_str() {
        "none" => {}
        "simple" => {
            if !t.start_tls && !t.uri.starts_with("ldaps://") {
                return Err((
                    "bind_method",
                    "a simple bind sends the service account's password: use an ldaps:// uri or start_tls (or bind_method = \"none\")".into(),
                ));
            }
            if t.bind_dn.is_empty() {
                return Err(("bind_dn", "a simple bind needs bind_dn".into()));
            }
            let Some(f) = &t.credentials_file else {
                return Err((
                    "credentials_file",
                    "a simple bind needs credentials_file (the service account's password)".into(),
                ));
            };
            std::fs::metadata(f).map_err(|e| {
                (
                    "credentials_file",
                    format!("cannot read {}: {e}", f.display()),
                )
            })?;
        }
        "sasl_external" => {
            if t.tls_cert_file.is_none() || t.tls_key_file.is_none() {
                return Err((
                    "tls_cert_file",
                    "sasl_external needs tls_cert_file and tls_key_file".into(),
                ));
            }
            if !t.start_tls && !t.uri.starts_with("ldaps://") {
                return Err((
                    "bind_method",
                    "sasl_external needs TLS: an ldaps:// uri or start_tls".into(),
                ));
            }
        }
        other => {
            return Err((
                "bind_method",
                format!("'{other}' is not simple, sasl_external or none"),
            ))
        }
    }
    if !(1..=300).contains(&t.timeout_secs) {
        return Err(("timeout_secs", "must be 1 to 300 seconds".into()));
    }
    if t.max_entries == 0 {
        return Err(("max_entries", "must be at least 1".into()));
    }
    if !(1..=1024).contains(&t.max_connections) {
        return Err(("max_connections", "must be 1 to 1024".into()));
    }
    for a in &t.local_attributes {
        if schema.attribute(a).is_none() {
            return Err((
                "local_attributes",
                format!("'{a}' is not an attribute type of the schema"),
            ));
        }
    }
    if !matches!(t.remote_writes.as_str(), "refuse" | "local") {
        return Err((
            "remote_writes",
            format!("'{}' is not refuse or local", t.remote_writes),
        ));
    }
    Ok(())
}

impl Translucent {
    /// Compile checked settings.
    pub fn new(t: &TranslucentConfig, schema: &Schema, max_pdu: usize) -> Translucent {
        let suffix_norm = Dn::parse(&t.suffix)
            .ok()
            .and_then(|d| schema.normalize_dn(&d).ok())
            .unwrap_or_default();
        let endpoint = Endpoint {
            url: t.uri.clone(),
            bind_method: t.bind_method.clone(),
            bind_dn: t.bind_dn.clone(),
            credentials: None,
            credentials_file: t.credentials_file.clone(),
            start_tls: t.start_tls,
            tls_ca_file: t.tls_ca_file.clone(),
            tls_cert_file: t.tls_cert_file.clone(),
            tls_key_file: t.tls_key_file.clone(),
            keepalive_secs: 60,
            timeout_secs: t.timeout_secs,
        };
        Translucent {
            suffix_norm,
            suffix: t.suffix.clone(),
            remote: remote::Remote::new(endpoint, max_pdu, t.max_connections),
            local: t
                .local_attributes
                .iter()
                .map(|a| super::canonical(schema, a).to_ascii_lowercase())
                .collect(),
            remote_writes_local: t.remote_writes == "local",
            max_entries: t.max_entries,
            parts: Arc::default(),
        }
    }

    /// Whether the entry named `norm` (normalised) is in this suffix.
    pub fn covers(&self, norm: &str) -> bool {
        norm == self.suffix_norm || pando_access::acl::is_below(norm, &self.suffix_norm)
    }

    /// The attributes clients may set here on remote entries (canonical
    /// names, lower case): the remote may not know them, so searches
    /// treat tests of them as overridden wherever parts are.
    pub fn local_types(&self) -> impl Iterator<Item = &String> {
        self.local.iter()
    }

    /// What a client is told when the remote failed: the failure itself
    /// for administrators (it may name the service account); others are
    /// pointed at the server's log, where it is too.
    pub fn failure_text(&self, admin: bool, e: &pando_client::ClientError) -> String {
        if admin {
            format!("the remote server of {} failed: {e}", self.suffix)
        } else {
            format!(
                "the remote server of {} could not be read (the server's log says why)",
                self.suffix
            )
        }
    }

    /// Whether clients may set attribute `name` (canonical) here on a
    /// remote entry.
    pub fn may_keep_locally(&self, name: &str) -> bool {
        self.remote_writes_local || self.local.contains(&name.to_ascii_lowercase())
    }
}

/// Whether a stored entry is the local part of a remote entry.
pub fn is_part(e: &Entry) -> bool {
    e.values("objectClass")
        .iter()
        .any(|v| v.eq_ignore_ascii_case(b"glue"))
}

/// The attribute type of a description, without options, in lower case.
fn type_of(desc: &str) -> String {
    pando_model::desc::base(desc).to_ascii_lowercase()
}

/// The types of the entry's RDN (lower case, as written in its DN).
fn naming_types(schema: &Schema, dn: &Dn) -> Vec<String> {
    dn.rdns
        .first()
        .map(|rdn| {
            rdn.avas
                .iter()
                .map(|a| super::canonical(schema, &a.attr).to_ascii_lowercase())
                .collect()
        })
        .unwrap_or_default()
}

/// The attribute types (canonical, lower case) whose values in a merged
/// entry come from the part rather than the remote: its user attributes
/// other than the RDN's, and objectClass when it adds a class.
pub fn overridden_types(schema: &Schema, part: &Entry) -> Vec<String> {
    let naming = naming_types(schema, &part.dn);
    let mut out = Vec::new();
    for a in &part.attrs {
        let t = super::canonical(schema, &type_of(&a.desc)).to_ascii_lowercase();
        if t == "objectclass" {
            if a.values.iter().any(|v| !is_part_class(v)) && !out.contains(&t) {
                out.push(t);
            }
            continue;
        }
        let operational = schema.attribute(&t).is_none_or(|at| at.is_operational());
        if !operational && !naming.contains(&t) && !out.contains(&t) {
            out.push(t);
        }
    }
    out
}

/// `top`, `glue` and `extensibleObject`: a part's own classes, not shown.
pub(super) fn is_part_class(v: &[u8]) -> bool {
    PART_CLASSES
        .iter()
        .any(|c| c.as_bytes().eq_ignore_ascii_case(v))
}

/// The remote entry as shown with its local part: the part's attributes
/// (of [`overridden_types`]) replace the remote's of the same type, its
/// object classes other than the bookkeeping ones are added.
pub fn merge(schema: &Schema, mut remote: Entry, part: &Entry) -> Entry {
    let overridden = overridden_types(schema, part);
    for a in &part.attrs {
        let t = super::canonical(schema, &type_of(&a.desc)).to_ascii_lowercase();
        if !overridden.contains(&t) {
            continue;
        }
        if t == "objectclass" {
            let shown: Vec<Vec<u8>> = a
                .values
                .iter()
                .filter(|v| !is_part_class(v))
                .filter(|v| {
                    !remote
                        .values("objectClass")
                        .iter()
                        .any(|r| r.eq_ignore_ascii_case(v))
                })
                .cloned()
                .collect();
            remote.add_values("objectClass", shown);
            continue;
        }
        remote
            .attrs
            .retain(|r| super::canonical(schema, &type_of(&r.desc)).to_ascii_lowercase() != t);
    }
    for a in &part.attrs {
        let t = super::canonical(schema, &type_of(&a.desc)).to_ascii_lowercase();
        if t != "objectclass" && overridden.contains(&t) {
            remote.attrs.push(Attribute {
                desc: a.desc.clone(),
                values: a.values.clone(),
            });
        }
    }
    remote
}

/// What a relaxed filter became.
#[derive(Debug, PartialEq)]
pub enum Relaxed {
    /// Every entry may match (ask the remote for all in scope).
    All,
    /// No entry can match.
    None,
    Filter(Filter),
}

/// A filter that holds for every remote entry whose merge with a part
/// could match `f`: each test of an attribute in `types` (which parts
/// override) becomes true where it is asserted and false where it is
/// negated, so the remote's answer includes every entry that could match
/// once merged (the merged entry is then tested against `f` here).
pub fn relax(schema: &Schema, f: &Filter, types: &[String]) -> Relaxed {
    relax_in(schema, f, types, true)
}

fn relax_in(schema: &Schema, f: &Filter, types: &[String], positive: bool) -> Relaxed {
    // An overridden type, or one of its supertypes (a test of `name`
    // also looks at cn, a subtype).
    let overridden = |attr: &str| {
        let t = super::canonical(schema, &type_of(attr)).to_ascii_lowercase();
        types.contains(&t)
            || schema.attribute(&t).is_some_and(|sup| {
                types.iter().any(|o| {
                    schema
                        .attribute(o)
                        .is_some_and(|sub| schema.is_subtype(sub, sup))
                })
            })
    };
    // A test the parts may change: true when asserted, false when negated.
    let loose = || {
        if positive {
            Relaxed::All
        } else {
            Relaxed::None
        }
    };
    match f {
        Filter::And(fs) => {
            let mut kept = Vec::new();
            for g in fs {
                match relax_in(schema, g, types, positive) {
                    Relaxed::None => return Relaxed::None,
                    Relaxed::All => {}
                    Relaxed::Filter(g) => kept.push(g),
                }
            }
            match kept.len() {
                0 => Relaxed::All,
                1 => Relaxed::Filter(kept.pop().unwrap_or(Filter::And(Vec::new()))),
                _ => Relaxed::Filter(Filter::And(kept)),
            }
        }
        Filter::Or(fs) => {
            let mut kept = Vec::new();
            for g in fs {
                match relax_in(schema, g, types, positive) {
                    Relaxed::All => return Relaxed::All,
                    Relaxed::None => {}
                    Relaxed::Filter(g) => kept.push(g),
                }
            }
            match kept.len() {
                0 => Relaxed::None,
                1 => Relaxed::Filter(kept.pop().unwrap_or(Filter::Or(Vec::new()))),
                _ => Relaxed::Filter(Filter::Or(kept)),
            }
        }
        Filter::Not(g) => match relax_in(schema, g, types, !positive) {
            Relaxed::All => Relaxed::None,
            Relaxed::None => Relaxed::All,
            Relaxed::Filter(g) => Relaxed::Filter(Filter::Not(Box::new(g))),
        },
        Filter::Equality(Ava { attr, .. })
        | Filter::GreaterOrEqual(Ava { attr, .. })
        | Filter::LessOrEqual(Ava { attr, .. })
        | Filter::Approx(Ava { attr, .. })
        | Filter::Present(attr)
            if overridden(attr) =>
        {
            loose()
        }
        Filter::Substrings(s) if overridden(&s.attr) => loose(),
        Filter::Extensible(m) if m.attr.as_deref().is_none_or(overridden) && !types.is_empty() => {
            loose()
        }
        other => Relaxed::Filter(other.clone()),
    }
}

#[cfg(test)]
mod tests;
