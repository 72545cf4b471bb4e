//! The two entries that live outside the naming contexts: the root DSE
//! (RFC 4512 5.1) and the subschema subentry (RFC 4512 4.2).

use std::sync::{Arc, RwLock};

use pando_model::{Attribute, Dn, Entry};
use pando_proto::oid;

use pando_model::Schema;

pub const SUBSCHEMA_DN: &str = "cn=Subschema";
pub const SUBSCHEMA_NORM: &str = "cn=subschema";

/// Pando's own OID arc: a UUID-derived OID under 2.25 (ITU-T X.667), which
/// needs no registration and cannot collide with anyone else's.
pub const PANDO_ARC: &str = "2.25.15972167931155808496075090497880241257";
/// Online backup: request value = destination directory on the server
/// host; response value = the backup's manifest. Administrators only.
pub const BACKUP_EXOP: &str = "2.25.15972167931155808496075090497880241257.1.1";
/// Replication lag in changes: request value = a replica's CSNs; response
/// value = logged operations newer than them per server ID (see
/// `ops::extended`). For authenticated identities that may read contextCSN.
pub const CHANGES_BEHIND_EXOP: &str = "2.25.15972167931155808496075090497880241257.1.2";
/// Failed password checks a read-only consumer forwards to its provider
/// (password policy lockout across replicas): request value = the
/// account's DN, a newline, and how many failures; no response value
/// (see `policy::PasswordPolicy::forwarded_failures`).
pub const PWD_FAILURES_EXOP: &str = "2.25.15972167931155808496075090497880241257.1.3";
/// Replica digests (`pando repl check`): request value = a base DN and a
/// question about its hash tree; response value = the tree's nodes or the
/// entries under some of them (see `ops::digest`). For authenticated
/// identities, over what they may read.
pub const DIGEST_EXOP: &str = "2.25.15972167931155808496075090497880241257.1.4";
/// The shared configuration (a consumer with `config = true` follows its
/// provider's): no request value (or an empty one); response value = the shared keys'
/// values and when each last changed (see `ConfigTree::shared_state`).
/// Administrators only.
pub const CONFIG_STATE_EXOP: &str = "2.25.15972167931155808496075090497880241257.1.5";

/// Extended operations this server implements (and StartTLS when a
/// certificate is configured).
pub const SUPPORTED_EXTENSIONS: &[&str] = &[
    oid::WHOAMI,
    oid::PASSWD_MODIFY,
    oid::CANCEL,
    BACKUP_EXOP,
    CHANGES_BEHIND_EXOP,
    PWD_FAILURES_EXOP,
    DIGEST_EXOP,
    CONFIG_STATE_EXOP,
];
/// SASL mechanisms: EXTERNAL (ldapi peer credentials, TLS client certificates).
pub const SUPPORTED_SASL_MECHANISMS: &[&str] = &["EXTERNAL"];
/// supportedFeatures: all operational attributes ("+", RFC 3673),
/// "@objectClass" lists (RFC 4529), absolute true/false filters (RFC 4526),
/// modify-increment (RFC 4525).
pub const SUPPORTED_FEATURES: &[&str] = &[
    "1.3.6.1.4.1.4203.1.5.1",
    "1.3.6.1.4.1.4203.1.5.2",
    "1.3.6.1.4.1.4203.1.5.3",
    "1.3.6.1.1.14",
];

fn attr(desc: &str, values: impl IntoIterator<Item = impl Into<Vec<u8>>>) -> Attribute {
    Attribute {
        desc: desc.to_string(),
        values: values.into_iter().map(Into::into).collect(),
    }
}

/// The root DSE and the subschema entry, built once and shared by every
/// search that reads them (the subschema is tens of kilobytes of text:
/// rebuilding it per request let a client buy much server work with a
/// small request). `invalidate` when the schema or the server's
/// capabilities change.
#[derive(Default)]
pub struct SpecialEntries {
    root_dse: RwLock<Option<Arc<Entry>>>,
    subschema: RwLock<Option<Arc<Entry>>>,
}

impl SpecialEntries {
    /// `suffixes`: the naming contexts; `start_tls`: whether StartTLS is
    /// offered (a `[tls]` section).
    pub fn root_dse(&self, suffixes: &[(Dn, String)], start_tls: bool) -> Arc<Entry> {
        Self::cached(&self.root_dse, || build_root_dse(suffixes, start_tls))
    }

    /// `started`: when the schema was loaded (the server's start).
    pub fn subschema(&self, schema: &Schema, started: std::time::SystemTime) -> Arc<Entry> {
        Self::cached(&self.subschema, || build_subschema(schema, started))
    }

    pub fn invalidate(&self) {
        for slot in [&self.root_dse, &self.subschema] {
            *slot.write().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }

    fn cached(slot: &RwLock<Option<Arc<Entry>>>, build: impl FnOnce() -> Entry) -> Arc<Entry> {
        if let Some(e) = slot.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
            return e.clone();
        }
        let e = Arc::new(build());
        *slot.write().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
        e
    }
}

fn build_root_dse(suffixes: &[(Dn, String)], start_tls: bool) -> Entry {
    Entry {
        dn: Dn { rdns: Vec::new() },
        attrs: vec![
            attr("objectClass", ["top", "extensibleObject"]),
            attr(
                "namingContexts",
                suffixes.iter().map(|(d, _)| d.to_string()),
            ),
            attr("subschemaSubentry", [SUBSCHEMA_DN]),
            attr("configContext", [crate::config_tree::CONFIG_DN]),
            // Where tools (LAM, phpLDAPadmin) look for the monitor, as on slapd.
            attr("monitorContext", ["cn=Monitor"]),
            attr("supportedLDAPVersion", ["3"]),
            attr("supportedControl", super::controls::supported_oids()),
            attr(
                "supportedExtension",
                SUPPORTED_EXTENSIONS
                    .iter()
                    .copied()
                    .chain(start_tls.then_some(oid::START_TLS)),
            ),
            attr(
                "supportedSASLMechanisms",
                SUPPORTED_SASL_MECHANISMS.iter().copied(),
            ),
            attr("supportedFeatures", SUPPORTED_FEATURES.iter().copied()),
            attr("vendorName", ["Pando project"]),
            attr(
                "vendorVersion",
                [format!("Pando {}", env!("CARGO_PKG_VERSION"))],
            ),
        ],
    }
}

fn build_subschema(schema: &Schema, started: std::time::SystemTime) -> Entry {
    let mut attrs = vec![
        attr(
            "objectClass",
            ["top", "subentry", "subschema", "extensibleObject"],
        ),
        attr("cn", ["Subschema"]),
        attr("structuralObjectClass", ["subentry"]),
    ];
    for (name, values) in schema.subschema_attrs() {
        attrs.push(attr(name, values));
    }
    // RFC 4512 4.2: clients compare modifyTimestamp to decide whether to
    // read the schema again. The schema is loaded at start and changes
    // only then, so both are the start time.
    let loaded = started
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    let stamp = pando_store::clock::generalized_time(loaded);
    attrs.push(attr("createTimestamp", [stamp.clone()]));
    attrs.push(attr("modifyTimestamp", [stamp]));
    // As on every entry (and as slapd shows them here with `+`).
    attrs.push(attr("entryDN", [SUBSCHEMA_DN]));
    attrs.push(attr("subschemaSubentry", [SUBSCHEMA_DN]));
    let dn = Dn::parse(SUBSCHEMA_DN).unwrap_or(Dn { rdns: Vec::new() });
    Entry { dn, attrs }
}
