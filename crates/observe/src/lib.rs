//! Observability's sinks (the crate `pando-observe`): counters and latency
//! histograms ([`metrics`]), the dashboard's second-by-second record
//! ([`station`]), the log files and their writer thread
//! ([`logfile`]), and the lines of the access and audit logs
//! ([`access_log`], [`audit`]). What reads the running server (cn=Monitor,
//! Prometheus) and the hooks operations call are the server's
//! (`pando_server::observe`).
//!
//! Below the operations: it formats what it is handed and must not name
//! the server's state, operations, overlays, replication or the network.

pub mod access_log;
pub mod audit;
pub mod logfile;
pub mod metrics;
mod op_kind;
pub mod station;

use pando_proto::ProtocolOp;

use access_log::AccessLog;
use audit::AuditLog;
use logfile::{LogFile, LogFileOptions, OnFull};
use metrics::OpKind;
use pando_config::LogsConfig;

/// Changes the level of the process's log (stderr) while serving.
pub type LevelSetter = std::sync::Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// The process's log is process-wide, and so is what changes its level.
static LOG_LEVEL: std::sync::OnceLock<LevelSetter> = std::sync::OnceLock::new();

/// Register how `log_level` changes while serving (the binary does, when
/// PANDO_LOG does not fix the level).
pub fn on_log_level(setter: LevelSetter) {
    let _ = LOG_LEVEL.set(setter);
}

/// Set the log level (`error` … `trace`, validated with the configuration).
pub fn set_log_level(level: &str) {
    if let Some(set) = LOG_LEVEL.get() {
        if let Err(e) = set(level) {
            tracing::warn!("log level not changed to {level}: {e}");
        }
    }
}

/// The log files, opened from `[logs]`.
#[derive(Default)]
pub struct Logs {
    pub access: Option<AccessLog>,
    pub audit: Option<AuditLog>,
}

impl Logs {
    /// Open the configured files (validated with the configuration).
    pub fn open(cfg: &LogsConfig) -> Result<Logs, String> {
        let mode = cfg.mode().map_err(|e| e.to_string())?;
        let access = match &cfg.access {
            Some(path) => {
                let format = cfg.format().map_err(|e| e.to_string())?;
                let on_full = cfg.on_full().map_err(|e| e.to_string())?;
                let file = LogFile::open(LogFileOptions {
                    path: path.clone(),
                    buffer: cfg.access_buffer,
                    on_full,
                    max_bytes: cfg.max_size_mb << 20,
                    daily: cfg.rotate_daily,
                    mode,
                })
                .map_err(|e| format!("logs.access: {e}"))?;
                Some(AccessLog { format, file })
            }
            None => None,
        };
        let audit = match &cfg.audit {
            Some(path) => Some(AuditLog {
                file: LogFile::open(LogFileOptions {
                    path: path.clone(),
                    buffer: 4096,
                    on_full: OnFull::Block,
                    max_bytes: cfg.max_size_mb << 20,
                    daily: cfg.rotate_daily,
                    mode,
                })
                .map_err(|e| format!("logs.audit: {e}"))?,
            }),
            None => None,
        };
        Ok(Logs { access, audit })
    }

    /// SIGHUP: reopen the files under their configured names.
    pub fn reopen(&self) {
        if let Some(a) = &self.access {
            a.file.reopen();
        }
        if let Some(a) = &self.audit {
            a.file.reopen();
        }
    }

    /// Write out everything queued (shutdown).
    pub fn close(&self) {
        if let Some(a) = &self.access {
            a.file.close();
        }
        if let Some(a) = &self.audit {
            a.file.close();
        }
    }

    pub fn access_dropped(&self) -> u64 {
        self.access
            .as_ref()
            .map(|a| a.file.dropped.load(std::sync::atomic::Ordering::Relaxed))
            .unwrap_or(0)
    }

    pub fn write_errors(&self) -> u64 {
        let e = |f: &LogFile| f.write_errors.load(std::sync::atomic::Ordering::Relaxed);
        self.access.as_ref().map(|a| e(&a.file)).unwrap_or(0)
            + self.audit.as_ref().map(|a| e(&a.file)).unwrap_or(0)
    }
}

/// Which connection and operation a task is serving, for the audit log.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpCtx {
    pub conn: u64,
    pub op: u64,
}

tokio::task_local! {
    pub static OP: OpCtx;
}

pub fn kind_of(op: &ProtocolOp) -> Option<OpKind> {
    Some(match op {
        ProtocolOp::BindRequest(_) => OpKind::Bind,
        ProtocolOp::SearchRequest(_) => OpKind::Search,
        ProtocolOp::CompareRequest(_) => OpKind::Compare,
        ProtocolOp::AddRequest(_) => OpKind::Add,
        ProtocolOp::DelRequest(_) => OpKind::Delete,
        ProtocolOp::ModifyRequest(_) => OpKind::Modify,
        ProtocolOp::ModifyDnRequest(_) => OpKind::ModDn,
        ProtocolOp::ExtendedRequest(_) => OpKind::Extended,
        ProtocolOp::AbandonRequest(_) => OpKind::Abandon,
        ProtocolOp::UnbindRequest => OpKind::Unbind,
        _ => return None,
    })
}
