//! Observability: counters and latency histograms ([`metrics`]), the
//! access and audit logs, the `cn=Monitor` subtree and the Prometheus
//! endpoint.
//!
//! The network layer calls four hooks: [`conn_opened`]/[`conn_closed`],
//! [`OpStart::new`] when a request has been decoded and [`OpStart::finish`]
//! when its response has been queued. Write operations call
//! [`audit`] after their change has been committed; the connection and
//! operation numbers reach them through the task-local [`OP`].

pub mod access_log;
pub mod audit;
pub mod logfile;
pub mod metrics;
pub mod monitor;
mod monitor_slapd;
pub mod prometheus;

use std::time::Instant;

use pando_proto::{LdapMessage, ProtocolOp};

use crate::state::Server;
use access_log::{AccessLog, ConnEvent, OpResultLine, Request};
use audit::AuditLog;
use logfile::{LogFile, LogFileOptions, OnFull};
use metrics::OpKind;
use pando_access::Identity;
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

pub fn conn_opened(server: &Server, conn: u64, peer: &str, tls: bool) {
    server.metrics.conn_opened();
    if let Some(a) = &server.logs.access {
        a.conn(conn, ConnEvent::Accept { peer, tls });
    }
}

pub fn conn_closed(server: &Server, conn: u64, reason: &str) {
    server.metrics.conn_closed();
    if let Some(a) = &server.logs.access {
        a.conn(conn, ConnEvent::Closed { reason });
    }
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

/// A request on its way: what it was and when it arrived.
pub struct OpStart {
    pub kind: OpKind,
    pub conn: u64,
    pub op: u64,
    pub msgid: i32,
    received: Instant,
    /// When it started running (after waiting for its turn).
    started: Option<Instant>,
    /// Described only when the access log is on.
    request: Option<Request>,
    /// The in-directory access log's record, when it logs this operation.
    logged: Option<Box<crate::overlays::accesslog::Pending>>,
}

impl OpStart {
    /// Count a decoded request made by `who`; None for PDUs that are not
    /// requests.
    pub fn new(
        server: &Server,
        conn: u64,
        op: u64,
        msg: &LdapMessage,
        who: &Identity,
    ) -> Option<OpStart> {
        let kind = kind_of(&msg.op)?;
        server.metrics.op_initiated(kind);
        let logged = server
            .overlays
            .accesslog()
            .and_then(|l| l.begin(conn, who, &msg.op, &server.schema));
        Some(OpStart {
            kind,
            conn,
            op,
            msgid: msg.id,
            received: Instant::now(),
            started: None,
            request: server
                .logs
                .access
                .as_ref()
                .map(|_| Request::of(&server.schema, &msg.op)),
            logged,
        })
    }

    /// The operation begins running now; the time before is queue time.
    pub fn started(&mut self) {
        self.started = Some(Instant::now());
    }

    pub fn ctx(&self) -> OpCtx {
        OpCtx {
            conn: self.conn,
            op: self.op,
        }
    }

    /// The response has been queued (`code`), or there is none (None:
    /// abandon, unbind, an abandoned read). `entries`: search results sent.
    pub fn finish(self, server: &Server, code: Option<u32>, entries: u64) {
        let now = Instant::now();
        let etime = now.duration_since(self.received).as_micros() as u64;
        let qtime = self
            .started
            .map(|s| s.duration_since(self.received).as_micros() as u64)
            .unwrap_or(0);
        let m = &server.metrics;
        m.op_completed(self.kind, etime, qtime, entries);
        if code.is_some() {
            m.add(&m.pdus_out, 1 + entries);
        }
        if let (Some(log), Some(p)) = (server.overlays.accesslog(), self.logged) {
            log.end(server, *p, code, entries);
        }
        if let (Some(a), Some(r)) = (&server.logs.access, &self.request) {
            a.op(&OpResultLine {
                time_micros: crate::clock::now_micros(),
                conn: self.conn,
                op: self.op,
                msgid: self.msgid,
                request: r,
                code,
                nentries: entries,
                etime_us: etime,
                qtime_us: qtime,
            });
        }
    }
}

/// Record a committed change in the audit log (when configured).
pub fn audit(server: &Server, who: &Identity, record: audit::Record<'_>) {
    let Some(a) = &server.logs.audit else { return };
    let ctx = OP.try_with(|c| *c).unwrap_or_default();
    a.write(
        &server.schema,
        &audit::Origin {
            time_micros: crate::clock::now_micros(),
            who: who.dn(),
            proxied_by: who.proxy_requester(),
            conn: ctx.conn,
            op: ctx.op,
        },
        &record,
    );
}

/// Is the audit log on? (Callers skip copying data for it otherwise.)
pub fn auditing(server: &Server) -> bool {
    server.logs.audit.is_some()
}
