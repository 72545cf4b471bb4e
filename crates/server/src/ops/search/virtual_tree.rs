//! Entries that are not in the store but are searched like stored ones:
//! the root DSE, the subschema subentry, cn=Monitor, cn=config,
//! cn=accesslog and cn=changelog. Each is a [`VirtualTree`] in [`TREES`]; a
//! search whose base one of them owns is answered from its entries by
//! [`search`], with the same scope, filter, assertion, size limit and
//! attribute selection as a stored search.

use std::sync::Arc;

use pando_model::{Dn, Entry, Schema, Ternary};
use pando_proto::{LdapResult, ResultCode, Scope};

use super::emit::Emitter;
use super::{flush, paged_done, Out, SearchJob, SearchOutcome, Step};
use crate::error::{LdapError, OpResult};
use crate::observe::monitor;
use crate::ops::special::{SUBSCHEMA_DN, SUBSCHEMA_NORM};
use crate::state::Server;
use pando_access::Identity;

/// An entry of a virtual tree: DN as returned, normalised DN, content.
pub struct VirtualEntry {
    pub dn: String,
    pub norm: String,
    pub entry: Arc<Entry>,
}

pub trait VirtualTree: Sync {
    /// Whether this tree holds the entry named `base` (or would, were it
    /// to exist: a missing entry below cn=Monitor is noSuchObject here).
    fn owns(&self, schema: &Schema, base: &Dn) -> bool;

    /// Searches may only read the base entry itself (other scopes find
    /// nothing: noSuchObject).
    fn base_only(&self) -> bool {
        false
    }

    /// Whether `who` may read the entry; checked for each entry before
    /// anything else about it is looked at.
    fn may_read(&self, _server: &Server, _who: &Identity, _e: &VirtualEntry) -> bool {
        true
    }

    /// Whether `who` may see anything at all below `base_norm`, checked
    /// before the entries are made (making cn=Monitor's costs work).
    fn may_enter(&self, _server: &Server, _who: &Identity, _base_norm: &str) -> bool {
        true
    }

    /// The entries, now.
    fn entries(&self, server: &Server) -> Vec<VirtualEntry>;

    /// The entries a search may return: all of them, unless the tree is
    /// too large to make whole and narrows them by the search itself
    /// (every entry given is still checked for scope and filter).
    fn entries_for(
        &self,
        server: &Server,
        _job: &SearchJob,
        _base_norm: &str,
    ) -> Vec<VirtualEntry> {
        self.entries(server)
    }
}

/// Every virtual tree, asked in this order.
pub const TREES: &[&dyn VirtualTree] = &[
    &RootDse,
    &Subschema,
    &Monitor,
    &ConfigTree,
    &ACCESS_LOG_TREE,
    &RETRO_CHANGELOG_TREE,
];

/// The tree owning `base`, if any.
pub fn owner(schema: &Schema, base: &Dn) -> Option<&'static dyn VirtualTree> {
    TREES.iter().copied().find(|t| t.owns(schema, base))
}

/// The root DSE (RFC 4512 5.1): public, base scope only.
struct RootDse;

impl VirtualTree for RootDse {
    fn owns(&self, _: &Schema, base: &Dn) -> bool {
        base.is_root()
    }

    fn base_only(&self) -> bool {
        true
    }

    fn entries(&self, server: &Server) -> Vec<VirtualEntry> {
        let mut entry = server.special.root_dse(server);
        // The retro change log's range moves with every write: added
        // to the cached entry when it is read.
        let changelog = crate::overlays::retro_changelog::root_dse_attrs(server);
        if !changelog.is_empty() {
            Arc::make_mut(&mut entry).attrs.extend(changelog);
        }
        vec![VirtualEntry {
            dn: String::new(),
            norm: String::new(),
            entry,
        }]
    }
}

/// The subschema subentry (RFC 4512 4.2): public, base scope only.
struct Subschema;

impl VirtualTree for Subschema {
    // Only a one-RDN base can be cn=Subschema: others are not normalised.
    fn owns(&self, schema: &Schema, base: &Dn) -> bool {
        base.rdns.len() == 1 && schema.normalize_dn(base).is_ok_and(|n| n == SUBSCHEMA_NORM)
    }

    fn base_only(&self) -> bool {
        true
    }

    fn entries(&self, server: &Server) -> Vec<VirtualEntry> {
        vec![VirtualEntry {
            dn: SUBSCHEMA_DN.to_string(),
            norm: SUBSCHEMA_NORM.to_string(),
            entry: server.special.subschema(server),
        }]
    }
}

/// cn=Monitor (`observe::monitor`): made per search, each entry returned
/// only to those who may read it.
struct Monitor;

impl VirtualTree for Monitor {
    // Only a last RDN of one `cn` value can name it: others skip the
    // normalising.
    fn owns(&self, schema: &Schema, base: &Dn) -> bool {
        base.rdns
            .last()
            .filter(|r| {
                r.avas.len() == 1
                    && schema
                        .attribute(&r.avas[0].attr)
                        .is_some_and(|t| t.has_name("cn"))
            })
            .and_then(|r| schema.normalize_rdn(r).ok())
            .is_some_and(|r| r == monitor::MONITOR_NORM)
    }

    fn may_enter(&self, server: &Server, who: &Identity, base_norm: &str) -> bool {
        let probe = Entry {
            dn: Dn { rdns: Vec::new() },
            attrs: Vec::new(),
        };
        monitor::may_read(server, who, base_norm, &probe)
    }

    fn may_read(&self, server: &Server, who: &Identity, e: &VirtualEntry) -> bool {
        monitor::may_read(server, who, &e.norm, &e.entry)
    }

    fn entries(&self, server: &Server) -> Vec<VirtualEntry> {
        with_norms(server, monitor::entries(server))
    }
}

/// Made entries with their normalised DNs (one that does not normalise is
/// left out).
fn with_norms(server: &Server, made: Vec<(String, Entry)>) -> Vec<VirtualEntry> {
    made.into_iter()
        .filter_map(|(dn, entry)| {
            let norm = server.schema.normalize_dn(&entry.dn).ok()?;
            Some(VirtualEntry {
                dn,
                norm,
                entry: Arc::new(entry),
            })
        })
        .collect()
}

/// cn=config (`cn_config`): administrators only; to anyone else it does
/// not exist.
struct ConfigTree;

impl VirtualTree for ConfigTree {
    fn owns(&self, schema: &Schema, base: &Dn) -> bool {
        crate::ops::config_tree::under_config(schema, base).is_some()
    }

    fn may_enter(&self, _server: &Server, who: &Identity, _base_norm: &str) -> bool {
        crate::ops::config_tree::may_see(who)
    }

    fn may_read(&self, _server: &Server, who: &Identity, _e: &VirtualEntry) -> bool {
        crate::ops::config_tree::may_see(who)
    }

    fn entries(&self, server: &Server) -> Vec<VirtualEntry> {
        with_norms(server, server.config_tree.entries(server))
    }
}

/// A log shown as a tree (cn=accesslog, cn=changelog) when its overlay is
/// configured: administrators and those a rule naming it lets read. Too
/// large to make whole: a search's entries are read narrowed by its base,
/// filter and size limit.
struct LogTree {
    /// The root's RDN value (one `cn`) and the root's normalised DN.
    word: &'static [u8],
    suffix: &'static str,
    configured: fn(&Server) -> bool,
    may_read: fn(&Server, &Identity) -> bool,
    entries: LogEntries,
}

/// A log's entries for (base, scope, filter, most returned, most read).
type LogEntries =
    fn(&Server, &str, pando_proto::Scope, &pando_proto::Filter, u64, u64) -> Vec<(String, Entry)>;

/// cn=accesslog (`overlays::accesslog`).
const ACCESS_LOG_TREE: LogTree = LogTree {
    word: b"accesslog",
    suffix: crate::overlays::accesslog::SUFFIX,
    configured: |s| s.overlays.accesslog().is_some(),
    may_read: crate::overlays::accesslog::may_read,
    entries: crate::overlays::accesslog::entries,
};

/// cn=changelog (`overlays::retro_changelog`).
const RETRO_CHANGELOG_TREE: LogTree = LogTree {
    word: b"changelog",
    suffix: crate::overlays::retro_changelog::SUFFIX,
    configured: |s| s.overlays.retro_changelog().is_some(),
    may_read: crate::overlays::retro_changelog::may_read,
    entries: crate::overlays::retro_changelog::entries,
};

/// Records a search of cn=accesslog or cn=changelog reads at most (the
/// size limit stops it sooner).
const LOG_SCAN: u64 = 200_000;

impl VirtualTree for LogTree {
    fn owns(&self, schema: &Schema, base: &Dn) -> bool {
        base.rdns.last().is_some_and(|r| {
            r.avas.len() == 1
                && r.avas[0].value.eq_ignore_ascii_case(self.word)
                && schema.normalize_rdn(r).is_ok_and(|n| n == self.suffix)
        })
    }

    fn may_enter(&self, server: &Server, who: &Identity, _base_norm: &str) -> bool {
        (self.configured)(server) && (self.may_read)(server, who)
    }

    fn may_read(&self, server: &Server, who: &Identity, _e: &VirtualEntry) -> bool {
        (self.may_read)(server, who)
    }

    fn entries(&self, _server: &Server) -> Vec<VirtualEntry> {
        Vec::new()
    }

    fn entries_for(&self, server: &Server, job: &SearchJob, base_norm: &str) -> Vec<VirtualEntry> {
        let limit = match job.req.size_limit {
            n if n <= 0 => 0,
            n => n as u64 + 1,
        };
        with_norms(
            server,
            (self.entries)(
                server,
                base_norm,
                job.req.scope,
                &job.req.filter,
                limit,
                LOG_SCAN,
            ),
        )
    }
}

/// Whether `base` is cn=accesslog or below it.
pub fn in_access_log(schema: &Schema, base: &Dn) -> bool {
    ACCESS_LOG_TREE.owns(schema, base)
}

/// A search whose base `tree` owns.
pub(super) fn search(
    job: &SearchJob,
    out: &mut Out<'_>,
    tree: &dyn VirtualTree,
    emitter: &Emitter<'_>,
    base: &Dn,
) -> OpResult<Step> {
    let server = &*job.server;
    let schema = &*server.schema;
    let req = &job.req;
    let no_such = || LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object");
    let norm_base = schema.normalize_dn(base).map_err(|_| no_such())?;
    if (tree.base_only() && req.scope != Scope::Base)
        || !tree.may_enter(server, &job.who, &norm_base)
    {
        return Err(no_such());
    }
    let entries: Vec<VirtualEntry> = tree
        .entries_for(server, job, &norm_base)
        .into_iter()
        .filter(|e| tree.may_read(server, &job.who, e))
        .collect();
    let Some(base_entry) = entries.iter().find(|e| e.norm == norm_base) else {
        return Err(no_such());
    };
    super::hooks::before(job, None, &norm_base, &mut || {
        Ok((*base_entry.entry).clone())
    })?;
    let filter = schema.compile_filter(&req.filter);
    let mut n = 0u64;
    let mut buf = Vec::new();
    for e in &entries {
        let in_scope = crate::ops::norm_dn::in_scope(&norm_base, req.scope, &e.norm);
        if !in_scope || filter.matches(schema, &e.entry) != Ternary::True {
            continue;
        }
        if req.size_limit > 0 && n >= req.size_limit as u64 {
            flush(out, &mut buf)?;
            return Ok(Step::Done(Some(SearchOutcome {
                result: LdapResult::new(ResultCode::SIZE_LIMIT_EXCEEDED, "size limit exceeded"),
                controls: paged_done(job),
                entries: n,
            })));
        }
        emitter.emit(None, None, &e.dn, &e.entry, None, &[], &mut buf)?;
        n += 1;
    }
    if flush(out, &mut buf).is_err() {
        return Ok(Step::Done(None));
    }
    Ok(Step::Done(Some(SearchOutcome {
        result: LdapResult::success(),
        controls: paged_done(job),
        entries: n,
    })))
}
