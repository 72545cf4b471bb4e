//! Every message through the proxy, decoded: one line each (text or
//! JSON), requests as the client sent them and each operation's last
//! response with its result, entries, bytes and time. Credentials never
//! appear: a bind's password, SASL credentials and the values of adds,
//! modifies and compares are shown as counts or lengths.

use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use pando_proto::{BindAuth, Control, DecodeLimits, LdapMessage, ProtocolOp};

pub struct DecodeLog {
    out: Mutex<Box<dyn Write + Send>>,
    json: bool,
    /// The time lines carry when not now (a capture's packet times).
    at: Mutex<Option<f64>>,
}

impl DecodeLog {
    /// To `path` ("-": standard output); the file is created 0600.
    pub fn open(path: &Path, json: bool) -> Result<DecodeLog, String> {
        let out: Box<dyn Write + Send> = if path.as_os_str() == "-" {
            Box::new(std::io::stdout())
        } else {
            use std::os::unix::fs::OpenOptionsExt;
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| format!("proxy.decode_log {}: {e}", path.display()))?;
            Box::new(std::io::LineWriter::new(f))
        };
        Ok(DecodeLog {
            out: Mutex::new(out),
            json,
            at: Mutex::new(None),
        })
    }

    /// The lines that follow carry this time (seconds since 1970).
    pub fn set_time(&self, t: f64) {
        if let Ok(mut at) = self.at.lock() {
            *at = Some(t);
        }
    }

    fn fields(&self) -> Fields {
        let at = self.at.lock().ok().and_then(|a| *a);
        Fields::new(self.json, at)
    }

    /// A client's request, and where it goes ("proxy": answered here).
    pub fn request(&self, client: u64, msg: &LdapMessage, to: &str, size: usize) {
        let mut f = self.fields();
        f.num("conn", client);
        f.num("id", msg.id as u64);
        f.word("dir", "request");
        describe(&msg.op, &mut f);
        controls(&msg.controls, &mut f);
        f.num("bytes", size as u64);
        f.text("to", to);
        self.write(f);
    }

    /// An operation's last response (`rest`: its bytes after the ID).
    #[allow(clippy::too_many_arguments)]
    pub fn response(
        &self,
        client: u64,
        id: i32,
        from: &str,
        rest: &[u8],
        started: Instant,
        entries: u64,
        bytes: u64,
    ) {
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        self.response_ms(client, id, from, rest, ms, entries, bytes);
    }

    /// As `response`, the time to it given (`ms`).
    #[allow(clippy::too_many_arguments)]
    pub fn response_ms(
        &self,
        client: u64,
        id: i32,
        from: &str,
        rest: &[u8],
        ms: f64,
        entries: u64,
        bytes: u64,
    ) {
        let mut frame = Vec::with_capacity(rest.len() + 8);
        crate::frame::with_id(id, rest, &mut frame);
        let mut f = self.fields();
        f.num("conn", client);
        f.num("id", id as u64);
        f.word("dir", "response");
        match LdapMessage::decode(&frame, &DecodeLimits::default()) {
            Ok(m) => {
                f.word("op", op_name(&m.op));
                if let Some(r) = result_of(&m.op) {
                    f.num("result", u64::from(r.code.0));
                    f.word("name", r.code.name());
                    f.text("matched", &r.matched_dn);
                    f.text("diag", &r.message);
                }
                controls(&m.controls, &mut f);
            }
            Err(e) => {
                f.word("op", "undecodable");
                f.text("error", &e.reason);
            }
        }
        f.num("entries", entries);
        f.num("bytes", bytes);
        f.float("ms", ms);
        f.text("from", from);
        self.write(f);
    }

    /// Bytes from a client or a server that are not LDAP.
    pub fn garbage(&self, side: &str, who: &str, bytes: &[u8]) {
        let mut f = self.fields();
        f.word("dir", "garbage");
        f.word("from", side);
        f.text("who", who);
        f.num("bytes", bytes.len() as u64);
        let mut hex = String::new();
        for b in bytes.iter().take(32) {
            let _ = write!(hex, "{b:02x}");
        }
        f.word("head", &hex);
        self.write(f);
    }

    fn write(&self, f: Fields) {
        let line = f.finish();
        if let Ok(mut out) = self.out.lock() {
            let _ = out.write_all(line.as_bytes());
        }
    }
}

fn describe(op: &ProtocolOp, f: &mut Fields) {
    f.word("op", op_name(op));
    match op {
        ProtocolOp::BindRequest(b) => {
            f.text("dn", &b.name);
            match &b.auth {
                BindAuth::Simple(p) => {
                    f.word("auth", "simple");
                    f.word(
                        "password",
                        if p.is_empty() {
                            "<empty>"
                        } else {
                            "<redacted>"
                        },
                    );
                }
                BindAuth::Sasl {
                    mechanism,
                    credentials,
                } => {
                    f.word("auth", "sasl");
                    f.text("mechanism", mechanism);
                    f.num(
                        "credentials",
                        credentials.as_ref().map_or(0, |c| c.len() as u64),
                    );
                }
            }
        }
        ProtocolOp::SearchRequest(s) => {
            f.text("base", &s.base);
            f.word(
                "scope",
                ["base", "one", "sub", "children"][s.scope as usize],
            );
            f.text("filter", &s.filter.to_string());
            f.text("attrs", &s.attrs.join(","));
            f.num("size_limit", s.size_limit.max(0) as u64);
            f.num("time_limit", s.time_limit.max(0) as u64);
        }
        ProtocolOp::AddRequest(a) => {
            f.text("dn", &a.dn);
            let attrs: Vec<String> = a
                .attrs
                .iter()
                .map(|a| format!("{}:{}", a.name, a.values.len()))
                .collect();
            f.text("attrs", &attrs.join(","));
        }
        ProtocolOp::ModifyRequest(m) => {
            f.text("dn", &m.dn);
            let changes: Vec<String> = m
                .changes
                .iter()
                .map(|c| {
                    format!("{:?}:{}:{}", c.op, c.attr.name, c.attr.values.len()).to_lowercase()
                })
                .collect();
            f.text("changes", &changes.join(","));
        }
        ProtocolOp::DelRequest(dn) => f.text("dn", dn),
        ProtocolOp::ModifyDnRequest(m) => {
            f.text("dn", &m.dn);
            f.text("new_rdn", &m.new_rdn);
            f.word(
                "delete_old_rdn",
                if m.delete_old_rdn { "true" } else { "false" },
            );
            if let Some(s) = &m.new_superior {
                f.text("new_superior", s);
            }
        }
        ProtocolOp::CompareRequest(c) => {
            f.text("dn", &c.dn);
            f.text("attr", &c.ava.attr);
            f.num("value_bytes", c.ava.value.len() as u64);
        }
        ProtocolOp::AbandonRequest(id) => f.num("abandon", (*id).max(0) as u64),
        ProtocolOp::ExtendedRequest(e) => {
            f.text("name", &e.name);
            f.num(
                "value_bytes",
                e.value.as_ref().map_or(0, |v| v.len() as u64),
            );
        }
        _ => {}
    }
}

fn controls(list: &[Control], f: &mut Fields) {
    if list.is_empty() {
        return;
    }
    let shown: Vec<String> = list
        .iter()
        .map(|c| {
            if c.critical {
                format!("{}!", c.oid)
            } else {
                c.oid.clone()
            }
        })
        .collect();
    f.text("controls", &shown.join(","));
}

fn op_name(op: &ProtocolOp) -> &'static str {
    match op {
        ProtocolOp::BindRequest(_) => "bind",
        ProtocolOp::BindResponse(_) => "bind_response",
        ProtocolOp::UnbindRequest => "unbind",
        ProtocolOp::SearchRequest(_) => "search",
        ProtocolOp::SearchResultEntry(_) => "search_entry",
        ProtocolOp::SearchResultDone(_) => "search_done",
        ProtocolOp::SearchResultReference(_) => "search_reference",
        ProtocolOp::ModifyRequest(_) => "modify",
        ProtocolOp::ModifyResponse(_) => "modify_response",
        ProtocolOp::AddRequest(_) => "add",
        ProtocolOp::AddResponse(_) => "add_response",
        ProtocolOp::DelRequest(_) => "delete",
        ProtocolOp::DelResponse(_) => "delete_response",
        ProtocolOp::ModifyDnRequest(_) => "modrdn",
        ProtocolOp::ModifyDnResponse(_) => "modrdn_response",
        ProtocolOp::CompareRequest(_) => "compare",
        ProtocolOp::CompareResponse(_) => "compare_response",
        ProtocolOp::AbandonRequest(_) => "abandon",
        ProtocolOp::ExtendedRequest(_) => "extended",
        ProtocolOp::ExtendedResponse(_) => "extended_response",
        ProtocolOp::IntermediateResponse { .. } => "intermediate",
    }
}

fn result_of(op: &ProtocolOp) -> Option<&pando_proto::LdapResult> {
    Some(match op {
        ProtocolOp::BindResponse(r) => &r.result,
        ProtocolOp::ExtendedResponse(r) => &r.result,
        ProtocolOp::SearchResultDone(r)
        | ProtocolOp::ModifyResponse(r)
        | ProtocolOp::AddResponse(r)
        | ProtocolOp::DelResponse(r)
        | ProtocolOp::ModifyDnResponse(r)
        | ProtocolOp::CompareResponse(r) => r,
        _ => return None,
    })
}

/// One line: `key=value` pairs (text, quoted where needed) or a JSON object.
struct Fields {
    json: bool,
    line: String,
}

impl Fields {
    fn new(json: bool, at: Option<f64>) -> Fields {
        let now = || {
            let d = SystemTime::now().duration_since(UNIX_EPOCH);
            d.unwrap_or_default().as_secs_f64()
        };
        let t = at.unwrap_or_else(now);
        let mut f = Fields {
            json,
            line: String::with_capacity(200),
        };
        f.line.push_str(if json { "{" } else { "" });
        f.float("t", t);
        f
    }

    fn key(&mut self, k: &str) {
        if self.json {
            if self.line.len() > 1 {
                self.line.push(',');
            }
            let _ = write!(self.line, "\"{k}\":");
        } else {
            if !self.line.is_empty() {
                self.line.push(' ');
            }
            let _ = write!(self.line, "{k}=");
        }
    }

    fn num(&mut self, k: &str, v: u64) {
        self.key(k);
        let _ = write!(self.line, "{v}");
    }

    fn float(&mut self, k: &str, v: f64) {
        self.key(k);
        let _ = write!(self.line, "{v:.3}");
    }

    /// A value known to need no quoting in text.
    fn word(&mut self, k: &str, v: &str) {
        if self.json {
            self.text(k, v);
        } else {
            self.key(k);
            self.line.push_str(v);
        }
    }

    fn text(&mut self, k: &str, v: &str) {
        self.key(k);
        self.line.push('"');
        for c in v.chars() {
            match c {
                '"' => self.line.push_str("\\\""),
                '\\' => self.line.push_str("\\\\"),
                '\n' => self.line.push_str("\\n"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(self.line, "\\u{:04x}", c as u32);
                }
                c => self.line.push(c),
            }
        }
        self.line.push('"');
    }

    fn finish(mut self) -> String {
        if self.json {
            self.line.push('}');
        }
        self.line.push('\n');
        self.line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pando_proto::{BindRequest, LdapResult};

    #[test]
    fn a_bind_is_shown_without_its_password_and_json_is_json() {
        let dir = std::env::temp_dir().join(format!("pando-decode-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let log = DecodeLog::open(&dir, true).unwrap();
        let msg = LdapMessage {
            id: 1,
            op: ProtocolOp::BindRequest(BindRequest {
                version: 3,
                name: "cn=a \"b\",dc=x".into(),
                auth: BindAuth::Simple(b"s3cret!".to_vec()),
            }),
            controls: Vec::new(),
        };
        log.request(7, &msg, "ldap://127.0.0.1:1", 40);
        let done = LdapMessage {
            id: 1,
            op: ProtocolOp::BindResponse(pando_proto::BindResponse {
                result: LdapResult::new(pando_proto::ResultCode(49), "no"),
                server_sasl_creds: None,
            }),
            controls: Vec::new(),
        }
        .to_bytes();
        let (_, _, rest) = crate::frame::split(&done).unwrap();
        log.response(7, 1, "ldap://127.0.0.1:1", rest, Instant::now(), 0, 14);
        drop(log);
        let text = std::fs::read_to_string(&dir).unwrap();
        let _ = std::fs::remove_file(&dir);
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains(r#""dn":"cn=a \"b\",dc=x""#), "{text}");
        assert!(text.contains(r#""result":49"#), "{text}");
        assert_eq!(text.lines().count(), 2);
        assert!(text.lines().all(|l| l.starts_with('{') && l.ends_with('}')));
    }
}
