//! The logs shown as trees, cn=accesslog and cn=changelog, searched like
//! stored entries (`ops::search::virtual_tree`) when their overlay is
//! configured.

use std::sync::Arc;

use pando_model::{Attribute, Dn, Entry, Schema};
use pando_proto::sync::{Cookie, SyncRequest};

use crate::ops::search::virtual_tree::{with_norms, Synchronizing, VirtualEntry, VirtualTree};
use crate::ops::search::SearchJob;
use crate::state::Server;
use pando_access::Identity;

/// A log shown as a tree (cn=accesslog, cn=changelog) when its overlay is
/// configured: administrators and those a rule naming it lets read. Too
/// large to make whole: a search's entries are read narrowed by its base,
/// filter and size limit.
pub struct LogTree {
    /// The root's RDN value (one `cn`) and the root's normalised DN.
    word: &'static [u8],
    suffix: &'static str,
    configured: fn(&Server) -> bool,
    may_read: fn(&Server, &Identity) -> bool,
    entries: LogEntries,
    /// What the log adds to the root DSE.
    root_dse: fn(&Server) -> Vec<Attribute>,
    /// Its content synchronization, if it serves one.
    sync: Option<Sync>,
}

type Sync = for<'a> fn(&'a Arc<SearchJob>, SyncRequest, Cookie) -> Synchronizing<'a>;

/// A log's entries for (base, scope, filter, most returned, most read).
type LogEntries =
    fn(&Server, &str, pando_proto::Scope, &pando_proto::Filter, u64, u64) -> Vec<(String, Entry)>;

/// cn=accesslog (`accesslog`).
pub const ACCESS_LOG_TREE: LogTree = LogTree {
    word: b"accesslog",
    suffix: super::accesslog::SUFFIX,
    configured: |s| s.overlays.accesslog().is_some(),
    may_read: super::accesslog::may_read,
    entries: super::accesslog::entries,
    root_dse: |_| Vec::new(),
    sync: Some(|job, req, theirs| Box::pin(super::accesslog::sync::run(job, req, theirs))),
};

/// cn=changelog (`retro_changelog`).
pub const RETRO_CHANGELOG_TREE: LogTree = LogTree {
    word: b"changelog",
    suffix: super::retro_changelog::SUFFIX,
    configured: |s| s.overlays.retro_changelog().is_some(),
    may_read: super::retro_changelog::may_read,
    entries: super::retro_changelog::entries,
    root_dse: super::retro_changelog::root_dse_attrs,
    sync: None,
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

    fn root_dse_attrs(&self, server: &Server) -> Vec<Attribute> {
        (self.root_dse)(server)
    }

    fn synchronize<'a>(
        &self,
        job: &'a Arc<SearchJob>,
        req: SyncRequest,
        theirs: Cookie,
    ) -> Option<Synchronizing<'a>> {
        self.sync.map(|run| run(job, req, theirs))
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
