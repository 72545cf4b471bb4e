//! Entries that are not in the store but are searched like stored ones:
//! the root DSE, the subschema subentry, cn=Monitor, cn=config,
//! cn=accesslog and cn=changelog. Each is a [`VirtualTree`]: the root DSE,
//! the subschema entry and cn=config are the operations' own ([`BUILT_IN`]);
//! the others are given by the layers that make them (cn=Monitor by
//! observability, the logs by their overlays) in `Server::trees`. A search
//! whose base one of them owns is answered from its entries by [`search`],
//! with the same scope, filter, assertion, size limit and attribute
//! selection as a stored search.
//!
//! Must not name any tree's maker: this file knows trees only by the trait.

use std::sync::Arc;

use pando_model::{Attribute, Dn, Entry, Schema, Ternary};
use pando_proto::{LdapResult, ResultCode, Scope};

use super::emit::Emitter;
use super::{flush, paged_done, Out, SearchJob, SearchOutcome, Step};
use crate::error::{LdapError, OpResult};
use crate::seams::{VirtualEntry, VirtualTree};
use crate::special::{SUBSCHEMA_DN, SUBSCHEMA_NORM};
use crate::state::Server;
use pando_access::Identity;

/// The operations' own trees, asked first.
const BUILT_IN: &[&dyn VirtualTree] = &[&RootDse, &Subschema, &ConfigTree];

/// The tree owning `base`, if any: the built-in ones, then those the
/// server was given.
pub fn owner<'s>(server: &'s Server, base: &Dn) -> Option<&'s dyn VirtualTree> {
    let schema = &server.schema;
    BUILT_IN
        .iter()
        .copied()
        .find(|t| t.owns(schema, base))
        .or_else(|| {
            server
                .trees
                .iter()
                .map(|t| &**t)
                .find(|t| t.owns(schema, base))
        })
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
        let mut entry = server
            .special
            .root_dse(&server.suffixes, server.cfg.tls.is_some());
        // A log's range moves with every write: added to the cached entry
        // when it is read.
        let extra: Vec<Attribute> = server
            .trees
            .iter()
            .flat_map(|t| t.root_dse_attrs(server))
            .collect();
        if !extra.is_empty() {
            Arc::make_mut(&mut entry).attrs.extend(extra);
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
            entry: server.special.subschema(&server.schema, server.rt.started),
        }]
    }
}

/// Made entries with their normalised DNs (one that does not normalise is
/// left out).
pub fn with_norms(server: &Server, made: Vec<(String, Entry)>) -> Vec<VirtualEntry> {
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
        crate::config_tree::under_config(schema, base).is_some()
    }

    fn may_enter(&self, _server: &Server, who: &Identity, _base_norm: &str) -> bool {
        crate::config_tree::may_see(who)
    }

    fn may_read(&self, _server: &Server, who: &Identity, _e: &VirtualEntry) -> bool {
        crate::config_tree::may_see(who)
    }

    fn entries(&self, server: &Server) -> Vec<VirtualEntry> {
        with_norms(server, server.rt.config_tree.entries(server))
    }
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
        let in_scope = crate::norm_dn::in_scope(&norm_base, req.scope, &e.norm);
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
