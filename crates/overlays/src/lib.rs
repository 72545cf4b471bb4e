//! Overlays: features configured per server on top of the core
//! operations (`[[overlay]]` in the TOML file, one entry each below
//! `olcDatabase={1}mdb,cn=config`; docs/overlays.md). A configuration
//! change compiles them again. Where each acts:
//!
//! - write hooks (`pando_ops::seams::WriteHook`, after the built-in ones, in
//!   the configured order): refint, unique, memberof, valsort (weights),
//!   ppolicy (password changes, policy entries);
//! - search hooks (`pando_ops::seams::SearchHook`): valsort;
//! - binds and password changes (`ops::policy`): ppolicy;
//! - each request, before it runs (`ops::seams::Faults`, asked by the network
//!   frontend): errors;
//! - each operation's start and end (`ops::seams::OpLog`): accesslog, whose
//!   entries are the virtual tree `cn=accesslog` (`log_tree`);
//! - the virtual tree `cn=changelog` (`log_tree`): retrochangelog, which
//!   numbers the change log;
//! - searches, compares, writes and binds below a translucent suffix
//!   (`ops::remote`): translucent, which reads a remote server.
//!
//! Overlays do not act on changes a replication consumer receives: the
//! provider's overlays made the related changes, and they arrive too.
//!
//! This crate sits on the operations (`pando-ops`) and reaches the
//! server's other layers only through the operations' traits: it must not
//! depend on replication, cn=config, the network frontend or the server's
//! assembly.

pub mod accesslog;
pub mod change_shape;
pub mod errors;
pub mod log_tree;
pub mod memberof;
pub mod ppolicy;
pub mod refint;
pub mod related;
pub mod retro_changelog;
mod rules;
pub mod translucent;
pub mod unique;
pub mod valsort;

use std::sync::Arc;

use pando_model::Schema;

pub use pando_config::OverlayConfig;
pub use rules::check_rules;

use log_tree::LogTree;
use pando_ops::seams::{Layers, SearchHook, VirtualTree, WriteHook};

/// An attribute's name as the schema spells it (the name given when the
/// schema does not know it: settings were checked, so only in tests).
pub fn canonical(schema: &Schema, name: &str) -> String {
    schema
        .attribute(name)
        .map(|t| t.name().to_string())
        .unwrap_or_else(|| name.to_string())
}

type OnWrite = Arc<dyn WriteHook + Send + Sync>;
type ReadHook = Arc<dyn SearchHook + Send + Sync>;

/// One configured overlay, compiled: its hooks on writes and on searches.
pub struct Overlay {
    pub kind: &'static str,
    write: Option<OnWrite>,
    search: Option<ReadHook>,
}

/// The configured overlays, in order.
#[derive(Default)]
pub struct Overlays {
    list: Vec<Overlay>,
    /// The password policy overlay, which binds consult too.
    ppolicy: Option<Arc<ppolicy::PasswordPolicy>>,
    /// Error injection rules, which connections consult before running
    /// an operation.
    errors: Vec<Arc<errors::Errors>>,
    /// The access log, which every operation's end consults.
    accesslog: Option<Arc<accesslog::AccessLog>>,
    /// Translucent suffixes, which searches, compares, writes and binds
    /// below them consult.
    translucent: Vec<Arc<translucent::Translucent>>,
    /// The retro change log, whose entries are the virtual tree
    /// `cn=changelog`.
    retro_changelog: Option<Arc<retro_changelog::RetroChangelog>>,
}

impl Overlays {
    /// Compile the overlays of a validated configuration (what can still
    /// fail: reading a file a setting names).
    pub fn compile(
        configs: &[OverlayConfig],
        schema: &Arc<Schema>,
        max_pdu: usize,
    ) -> Result<Overlays, String> {
        let mut ppolicy = None;
        let mut translucent = Vec::new();
        let mut injected = Vec::new();
        let mut log = None;
        let mut retro = None;
        let list = configs
            .iter()
            .map(|c| {
                let (write, search): (Option<OnWrite>, Option<ReadHook>) = match c {
                    OverlayConfig::Refint(r) => {
                        (Some(Arc::new(refint::Refint::new(r, schema))), None)
                    }
                    OverlayConfig::Unique(u) => {
                        (Some(Arc::new(unique::Unique::new(u, schema))), None)
                    }
                    OverlayConfig::Memberof(m) => {
                        (Some(Arc::new(memberof::MemberOf::new(m, schema))), None)
                    }
                    OverlayConfig::Valsort(v) => {
                        // Validated: every rule parses.
                        let rules = v
                            .rules
                            .iter()
                            .filter_map(|r| valsort::parse_rule(schema, r).ok())
                            .collect();
                        let both = Arc::new(valsort::ValSort::new(rules, schema.clone()));
                        (Some(both.clone()), Some(both))
                    }
                    OverlayConfig::Ppolicy(p) => {
                        let pp = Arc::new(
                            ppolicy::PasswordPolicy::new(p, schema)
                                .map_err(|e| format!("ppolicy overlay: {e}"))?,
                        );
                        ppolicy = Some(pp.clone());
                        (Some(pp), None)
                    }
                    OverlayConfig::Errors(e) => {
                        // Validated: every rule parses.
                        let rules = e
                            .rules
                            .iter()
                            .filter_map(|r| errors::parse_rule(schema, r).ok())
                            .collect();
                        injected.push(Arc::new(errors::Errors::new(rules)));
                        (None, None)
                    }
                    OverlayConfig::Accesslog(a) => {
                        log = Some(Arc::new(
                            accesslog::AccessLog::new(a)
                                .map_err(|e| format!("accesslog overlay: {e}"))?,
                        ));
                        (None, None)
                    }
                    OverlayConfig::Translucent(t) => {
                        translucent
                            .push(Arc::new(translucent::Translucent::new(t, schema, max_pdu)));
                        (None, None)
                    }
                    OverlayConfig::Retrochangelog(r) => {
                        retro = Some(Arc::new(retro_changelog::RetroChangelog::new(r, schema)));
                        (None, None)
                    }
                };
                Ok(Overlay {
                    kind: c.type_name(),
                    write,
                    search,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Overlays {
            list,
            ppolicy,
            errors: injected,
            accesslog: log,
            translucent,
            retro_changelog: retro,
        })
    }

    /// The translucent suffixes, as the trees the operations reach them by.
    pub fn remotes(&self) -> Vec<Arc<dyn pando_ops::seams::RemoteTree>> {
        self.translucent
            .iter()
            .map(|t| t.clone() as Arc<dyn pando_ops::seams::RemoteTree>)
            .collect()
    }

    /// The password policy, as the operations consult it.
    pub fn policy(&self) -> Option<Arc<dyn pando_ops::seams::PasswordPolicy>> {
        self.ppolicy
            .clone()
            .map(|p| p as Arc<dyn pando_ops::seams::PasswordPolicy>)
    }

    /// What the operations run of the overlays: their types in order,
    /// their hooks, error injection and the access log (`ops::seams::Layers`).
    pub fn layers(&self) -> Layers {
        Layers {
            kinds: self.list.iter().map(|o| o.kind).collect(),
            write: self.list.iter().filter_map(|o| o.write.clone()).collect(),
            search: self.list.iter().filter_map(|o| o.search.clone()).collect(),
            faults: self
                .errors
                .iter()
                .map(|e| e.clone() as Arc<dyn pando_ops::seams::Faults>)
                .collect(),
            op_log: self
                .accesslog
                .clone()
                .map(|l| l as Arc<dyn pando_ops::seams::OpLog>),
        }
    }

    /// The logs' trees (cn=accesslog, cn=changelog), present whether or
    /// not their overlay is configured.
    pub fn trees(&self) -> Vec<Arc<dyn VirtualTree>> {
        vec![
            Arc::new(LogTree::new(self.accesslog.clone())),
            Arc::new(LogTree::new(self.retro_changelog.clone())),
        ]
    }
}
