//! The replayable record of a proxy's traffic: every request a client
//! sends, as it was sent, one JSON line each: `{"t": seconds since the
//! proxy started, "conn": N, "ber": "<hex of the LDAPMessage>"}`. `pando
//! bench --replay FILE` plays it against any server. A simple bind's
//! password is withheld (the bind is recorded with an empty password and
//! `"withheld": true`; the replay supplies one) unless
//! `record_credentials` is set. The file is created 0600.

use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use pando_proto::{BindAuth, LdapMessage, ProtocolOp};

pub struct Recorder {
    out: Mutex<std::io::LineWriter<std::fs::File>>,
    started: Instant,
    credentials: bool,
}

impl Recorder {
    pub fn open(path: &Path, credentials: bool) -> Result<Recorder, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| format!("proxy.record {}: {e}", path.display()))?;
        Ok(Recorder {
            out: Mutex::new(std::io::LineWriter::new(f)),
            started: Instant::now(),
            credentials,
        })
    }

    /// One request: `frame` as received, `msg` decoded from it.
    pub fn request(&self, conn: u64, frame: &[u8], msg: &LdapMessage) {
        self.request_at(self.started.elapsed().as_secs_f64(), conn, frame, msg);
    }

    /// As `request`, at `t` seconds from the start of the record.
    pub fn request_at(&self, t: f64, conn: u64, frame: &[u8], msg: &LdapMessage) {
        let withheld = !self.credentials
            && matches!(&msg.op, ProtocolOp::BindRequest(b) if matches!(&b.auth, BindAuth::Simple(p) if !p.is_empty()));
        let bytes = if withheld {
            let mut m = msg.clone();
            if let ProtocolOp::BindRequest(b) = &mut m.op {
                b.auth = BindAuth::Simple(Vec::new());
            }
            m.to_bytes()
        } else {
            frame.to_vec()
        };
        let mut line = String::with_capacity(bytes.len() * 2 + 64);
        let _ = write!(line, "{{\"t\":{t:.6},\"conn\":{conn},\"ber\":\"");
        for b in &bytes {
            let _ = write!(line, "{b:02x}");
        }
        line.push('"');
        if withheld {
            line.push_str(",\"withheld\":true");
        }
        line.push_str("}\n");
        if let Ok(mut out) = self.out.lock() {
            let _ = out.write_all(line.as_bytes());
        }
    }
}
