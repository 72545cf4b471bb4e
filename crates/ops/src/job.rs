//! What an operation runs with and answers: the typed request
//! ([`Operation`]) and its [`Response`], a search's job and how it ended,
//! a write's context. The layers above the operations are handed these
//! (see `seams`), so they hold the state but name nothing that runs an
//! operation: plain data, with constructors.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use pando_proto::{Control, LdapResult, ProtocolOp, SearchRequest};
use tokio::sync::mpsc;

use crate::controls::Requested;
use crate::state::Server;
use pando_access::Identity;

/// One request, ready to run.
pub struct Operation {
    pub msg_id: i32,
    /// The identity it runs as: the connection's when it arrived.
    pub who: Identity,
    pub request: ProtocolOp,
    pub controls: Requested,
}

/// What an operation answers.
pub struct Response {
    pub op: ProtocolOp,
    pub controls: Vec<Control>,
}

impl Response {
    pub fn code(&self) -> Option<u32> {
        Some(match &self.op {
            ProtocolOp::AddResponse(r)
            | ProtocolOp::DelResponse(r)
            | ProtocolOp::ModifyResponse(r)
            | ProtocolOp::ModifyDnResponse(r)
            | ProtocolOp::CompareResponse(r)
            | ProtocolOp::SearchResultDone(r) => r.code.0,
            ProtocolOp::ExtendedResponse(e) => e.result.code.0,
            ProtocolOp::BindResponse(b) => b.result.code.0,
            _ => return None,
        })
    }
}

pub struct SearchJob {
    pub server: Arc<Server>,
    pub who: Identity,
    pub msg_id: i32,
    /// The connection it came on (`limits.max_persistent_searches_per_connection`).
    pub conn: u64,
    pub req: SearchRequest,
    pub controls: Requested,
    pub abandoned: Arc<AtomicBool>,
    pub out: mpsc::Sender<Vec<u8>>,
}

impl SearchJob {
    /// The search goes on after its results (persistent search, or a
    /// sync provider's refreshAndPersist or refreshOnly).
    pub fn followed(&self) -> bool {
        self.controls.persistent.is_some() || self.controls.sync.is_some()
    }
}

/// What a search ends with; None when it was abandoned (no response is sent).
pub struct SearchOutcome {
    pub result: LdapResult,
    pub controls: Vec<Control>,
    pub entries: u64,
}

/// How a search run by [`run_to_end`] finished.
pub enum Finished {
    /// Answer with this.
    Done(SearchOutcome),
    /// Abandoned or cancelled: no response is sent.
    Abandoned,
    /// Its thread panicked.
    Failed,
}

/// The way a search went, for the hooks' `after`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Answered before any entry was looked at (a control's refusal, a
    /// paged search abandoned with size 0).
    Refused,
    /// The entries of a virtual tree, unsorted.
    VirtualTree,
    /// Stored entries in ID order (unsorted).
    Streamed,
    /// Stored entries sorted (sort or VLV control).
    Sorted,
}

/// Who writes, and with which controls; shared with the writer thread.
pub struct WriteCtx {
    pub server: Arc<Server>,
    pub who: Identity,
    pub controls: Requested,
    /// A modify of an entry the store holds only part of.
    pub partial: Option<Arc<dyn crate::seams::Partial>>,
}

impl WriteCtx {
    pub fn new(server: &Arc<Server>, who: &Identity, controls: Requested) -> Arc<WriteCtx> {
        Arc::new(WriteCtx {
            server: server.clone(),
            who: who.clone(),
            controls,
            partial: None,
        })
    }

    /// The relax rules control is in force: an administrator may set the
    /// attributes the server otherwise maintains.
    pub fn relaxed(&self) -> bool {
        self.controls.relax && self.who.is_admin()
    }
}
