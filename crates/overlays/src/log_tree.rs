//! The logs shown as trees, cn=accesslog and cn=changelog, searched like
//! stored entries (`ops::search::virtual_tree`) when their overlay is
//! configured.

use std::sync::Arc;

use pando_model::{Attribute, Dn, Entry, Schema};
use pando_proto::sync::{Cookie, SyncRequest};
use pando_proto::{Filter, Scope};

use super::accesslog::{self, AccessLog};
use super::retro_changelog::{self, RetroChangelog};
use pando_access::Identity;
use pando_ops::seams::{Synchronizing, VirtualEntry, VirtualTree};
use pando_ops::search::virtual_tree::with_norms;
use pando_ops::search::SearchJob;
use pando_ops::state::Server;

/// A log as its tree reads it.
pub trait Log: Send + Sync + 'static {
    /// The root's RDN value (one `cn`) and the root's normalised DN.
    const WORD: &'static [u8];
    const SUFFIX: &'static str;

    /// Whether `who` may read the log.
    fn may_read(server: &Server, who: &Identity) -> bool;

    /// The entries for (base, scope, filter, most returned, most read).
    fn entries(
        &self,
        server: &Server,
        base_norm: &str,
        scope: Scope,
        filter: &Filter,
        limit: u64,
        scan: u64,
    ) -> Vec<(String, Entry)>;

    /// What the log adds to the root DSE.
    fn root_dse_attrs(&self, _server: &Server) -> Vec<Attribute> {
        Vec::new()
    }

    /// Its content synchronization, if it serves one (`log`: None when
    /// the overlay is not configured).
    fn synchronize<'a>(
        _log: Option<Arc<Self>>,
        _job: &'a Arc<SearchJob>,
        _req: SyncRequest,
        _theirs: Cookie,
    ) -> Option<Synchronizing<'a>> {
        None
    }
}

impl Log for AccessLog {
    const WORD: &'static [u8] = b"accesslog";
    const SUFFIX: &'static str = accesslog::SUFFIX;

    fn may_read(server: &Server, who: &Identity) -> bool {
        accesslog::may_read(server, who)
    }

    fn entries(
        &self,
        server: &Server,
        base_norm: &str,
        scope: Scope,
        filter: &Filter,
        limit: u64,
        scan: u64,
    ) -> Vec<(String, Entry)> {
        accesslog::entries(self, server, base_norm, scope, filter, limit, scan)
    }

    fn synchronize<'a>(
        log: Option<Arc<Self>>,
        job: &'a Arc<SearchJob>,
        req: SyncRequest,
        theirs: Cookie,
    ) -> Option<Synchronizing<'a>> {
        Some(Box::pin(accesslog::sync::run(job, req, theirs, log)))
    }
}

impl Log for RetroChangelog {
    const WORD: &'static [u8] = b"changelog";
    const SUFFIX: &'static str = retro_changelog::SUFFIX;

    fn may_read(server: &Server, who: &Identity) -> bool {
        retro_changelog::may_read(server, who)
    }

    fn entries(
        &self,
        server: &Server,
        base_norm: &str,
        scope: Scope,
        filter: &Filter,
        limit: u64,
        scan: u64,
    ) -> Vec<(String, Entry)> {
        retro_changelog::entries(self, server, base_norm, scope, filter, limit, scan)
    }

    fn root_dse_attrs(&self, server: &Server) -> Vec<Attribute> {
        retro_changelog::root_dse_attrs(server)
    }
}

/// A log shown as a tree: administrators and those a rule naming it lets
/// read; noSuchObject to everyone when its overlay is not configured. Too
/// large to make whole: a search's entries are read narrowed by its base,
/// filter and size limit.
pub struct LogTree<L: Log> {
    log: Option<Arc<L>>,
}

impl<L: Log> LogTree<L> {
    /// The tree of `log` (None: not configured).
    pub fn new(log: Option<Arc<L>>) -> LogTree<L> {
        LogTree { log }
    }
}

/// Records a search of cn=accesslog or cn=changelog reads at most (the
/// size limit stops it sooner).
const LOG_SCAN: u64 = 200_000;

impl<L: Log> VirtualTree for LogTree<L> {
    fn owns(&self, schema: &Schema, base: &Dn) -> bool {
        base.rdns.last().is_some_and(|r| {
            r.avas.len() == 1
                && r.avas[0].value.eq_ignore_ascii_case(L::WORD)
                && schema.normalize_rdn(r).is_ok_and(|n| n == L::SUFFIX)
        })
    }

    fn may_enter(&self, server: &Server, who: &Identity, _base_norm: &str) -> bool {
        self.log.is_some() && L::may_read(server, who)
    }

    fn may_read(&self, server: &Server, who: &Identity, _e: &VirtualEntry) -> bool {
        L::may_read(server, who)
    }

    fn entries(&self, _server: &Server) -> Vec<VirtualEntry> {
        Vec::new()
    }

    fn root_dse_attrs(&self, server: &Server) -> Vec<Attribute> {
        self.log
            .as_ref()
            .map_or_else(Vec::new, |l| l.root_dse_attrs(server))
    }

    fn synchronize<'a>(
        &self,
        job: &'a Arc<SearchJob>,
        req: SyncRequest,
        theirs: Cookie,
    ) -> Option<Synchronizing<'a>> {
        L::synchronize(self.log.clone(), job, req, theirs)
    }

    fn entries_for(&self, server: &Server, job: &SearchJob, base_norm: &str) -> Vec<VirtualEntry> {
        let Some(log) = &self.log else {
            return Vec::new();
        };
        let limit = match job.req.size_limit {
            n if n <= 0 => 0,
            n => n as u64 + 1,
        };
        let made = log.entries(
            server,
            base_norm,
            job.req.scope,
            &job.req.filter,
            limit,
            LOG_SCAN,
        );
        with_norms(server, made)
    }
}
