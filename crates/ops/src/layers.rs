//! The configured overlays as the operations run them: one ordered list
//! (`kinds`), the hooks each gives on writes (`write::hooks`) and on
//! searches (`search::hooks`), error injection (consulted before any
//! operation runs) and the access log (told of each operation's start and
//! end). Built by the overlays from the configuration; the operations
//! know them only by these traits.
//!
//! Must not name an overlay.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use pando_model::Schema;
use pando_proto::{ProtocolOp, ResultCode};

use super::search::hooks::SearchHook;
use super::write::hooks::Hook as WriteHook;
use crate::state::Server;
use pando_access::Identity;

/// What error injection does to one operation.
pub struct Fault {
    /// Wait this long first.
    pub delay: Option<Duration>,
    /// Close the connection instead of answering.
    pub disconnect: bool,
    /// Answer with this result instead of running it.
    pub result: Option<(ResultCode, String)>,
}

/// Error injection rules.
pub trait Faults: Send + Sync {
    /// The fault a rule puts on `request`, if one fires.
    fn pick(&self, schema: &Schema, request: &ProtocolOp) -> Option<Fault>;

    /// Each rule with how often it fired (cn=Monitor).
    fn counts(&self) -> Vec<String>;
}

/// A record begun when a request arrives, completed at its end.
pub type Begun = Box<dyn Any + Send + Sync>;

/// A log of operations (cn=accesslog).
pub trait OpLog: Send + Sync {
    /// The start of `request`'s record, when it is logged.
    fn begin(
        &self,
        conn: u64,
        who: &Identity,
        request: &ProtocolOp,
        schema: &Schema,
    ) -> Option<Begun>;

    /// The operation ended with `code` (None: no response), having sent
    /// `entries`.
    fn end(&self, server: &Server, begun: Begun, code: Option<u32>, entries: u64);
}

#[derive(Default)]
pub struct Layers {
    /// Each configured overlay's type, in order.
    pub kinds: Vec<&'static str>,
    /// Hooks on writes, in the configured order.
    pub write: Vec<Arc<dyn WriteHook + Send + Sync>>,
    /// Hooks on searches, in the configured order.
    pub search: Vec<Arc<dyn SearchHook + Send + Sync>>,
    pub faults: Vec<Arc<dyn Faults>>,
    pub op_log: Option<Arc<dyn OpLog>>,
}

impl Layers {
    /// No overlay is configured.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// The fault error injection puts on `request`, if a rule fires.
    pub fn fault(&self, schema: &Schema, request: &ProtocolOp) -> Option<Fault> {
        self.faults.iter().find_map(|f| f.pick(schema, request))
    }

    /// Each error injection rule with how often it fired.
    pub fn injection_counts(&self) -> Vec<String> {
        self.faults.iter().flat_map(|f| f.counts()).collect()
    }
}
