//! A small blocking LDAP client for the commands that read a running
//! server (`pando stat`, `pando repl status`): ldap:// or ldapi://, a
//! simple bind or SASL EXTERNAL, base or subtree searches, and extended
//! operations.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::Duration;

use pando_proto::{
    frame_length, BindAuth, BindRequest, DecodeLimits, DerefAliases, ExtendedRequest, Filter,
    LdapMessage, ProtocolOp, Scope, SearchRequest,
};

/// How the commands that read a running server bind.
#[derive(clap::Args)]
pub struct BindArgs {
    /// Bind DN for ldap:// (default: SASL EXTERNAL over ldapi, anonymous over ldap).
    #[arg(long = "bind-dn", short = 'D')]
    pub bind_dn: Option<String>,
    /// Bind password for -D.
    #[arg(long = "bind-pw", short = 'w')]
    pub bind_pw: Option<String>,
    /// Read the bind password from this file (first line).
    #[arg(long = "bind-pw-file", short = 'y')]
    pub bind_pw_file: Option<std::path::PathBuf>,
}

impl BindArgs {
    /// Connect to `url` and bind as these arguments say.
    pub fn open(&self, url: &str) -> Result<Ldap, String> {
        Ldap::open(
            url,
            self.bind_dn.as_deref(),
            self.bind_pw.as_deref(),
            self.bind_pw_file.as_deref(),
        )
    }
}

/// A search request with no limits of its own, aliases not dereferenced.
pub fn search_request(
    base: &str,
    scope: Scope,
    filter: &str,
    attrs: &[&str],
) -> Result<SearchRequest, String> {
    Ok(SearchRequest {
        base: base.into(),
        scope,
        deref: DerefAliases::Never,
        size_limit: 0,
        time_limit: 0,
        types_only: false,
        filter: Filter::parse(filter).map_err(|e| e.to_string())?,
        attrs: attrs.iter().map(|a| a.to_string()).collect(),
    })
}

pub struct Ldap {
    stream: Box<dyn ReadWrite>,
    buf: Vec<u8>,
    next_id: i32,
    /// Bytes received so far.
    pub received: u64,
}

trait ReadWrite: Read + Write + Send {}
impl<T: Read + Write + Send> ReadWrite for T {}

impl Ldap {
    /// Connect to `url` and bind: simple with `dn` and the password (or
    /// the first line of `pw_file`), else SASL EXTERNAL over ldapi,
    /// else anonymously.
    pub fn open(
        url: &str,
        dn: Option<&str>,
        pw: Option<&str>,
        pw_file: Option<&std::path::Path>,
    ) -> Result<Ldap, String> {
        let (mut l, ldapi) = Ldap::connect(url)?;
        let pw = match (pw, pw_file) {
            (Some(p), _) => Some(p.to_string()),
            (None, Some(f)) => Some(
                std::fs::read_to_string(f)
                    .map_err(|e| format!("--bind-pw-file {}: {e}", f.display()))?
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string(),
            ),
            (None, None) => None,
        };
        match (dn, pw) {
            (Some(dn), Some(pw)) => l.bind(BindAuth::Simple(pw.into_bytes()), dn.to_string())?,
            (Some(_), None) => return Err("-D needs -w or -y".into()),
            (None, _) if ldapi => l.bind(
                BindAuth::Sasl {
                    mechanism: "EXTERNAL".into(),
                    credentials: None,
                },
                String::new(),
            )?,
            (None, _) => {}
        }
        Ok(l)
    }

    fn connect(url: &str) -> Result<(Ldap, bool), String> {
        // Long enough for a server digesting a large subtree (`repl check`).
        let timeout = Some(Duration::from_secs(120));
        if let Some(rest) = url.strip_prefix("ldap://") {
            let addr = rest.trim_end_matches('/');
            let s = std::net::TcpStream::connect(addr)
                .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
            let _ = s.set_read_timeout(timeout);
            Ok((Ldap::new(Box::new(s)), false))
        } else if let Some(rest) = url.strip_prefix("ldapi://") {
            let path = pando_proto::url::percent_decode_str(rest.trim_end_matches('/'))?;
            let s = std::os::unix::net::UnixStream::connect(&path)
                .map_err(|e| format!("cannot connect to {path}: {e}"))?;
            let _ = s.set_read_timeout(timeout);
            Ok((Ldap::new(Box::new(s)), true))
        } else {
            Err(format!(
                "--url '{url}': expected http://, ldap:// or ldapi://"
            ))
        }
    }

    fn new(stream: Box<dyn ReadWrite>) -> Ldap {
        Ldap {
            stream,
            buf: Vec::new(),
            next_id: 1,
            received: 0,
        }
    }

    fn send(&mut self, op: ProtocolOp) -> Result<i32, String> {
        self.send_with(op, Vec::new())
    }

    fn send_with(
        &mut self,
        op: ProtocolOp,
        controls: Vec<pando_proto::Control>,
    ) -> Result<i32, String> {
        let id = self.next_id;
        self.next_id += 1;
        let msg = LdapMessage { id, op, controls };
        self.stream
            .write_all(&msg.to_bytes())
            .map_err(|e| format!("sending to the server: {e}"))?;
        Ok(id)
    }

    fn recv(&mut self) -> Result<LdapMessage, String> {
        loop {
            match frame_length(&self.buf, 64 << 20) {
                Ok(Some(n)) => {
                    let frame: Vec<u8> = self.buf.drain(..n).collect();
                    return LdapMessage::decode(&frame, &DecodeLimits::default())
                        .map_err(|e| format!("bad response from the server: {}", e.reason));
                }
                Ok(None) => {}
                Err(e) => return Err(format!("bad response from the server: {e}")),
            }
            let mut chunk = [0u8; 16384];
            let n = self
                .stream
                .read(&mut chunk)
                .map_err(|e| format!("reading from the server: {e}"))?;
            if n == 0 {
                return Err("the server closed the connection".into());
            }
            self.received += n as u64;
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Send `op` with `controls`; the result code and, for a search, the
    /// entries returned (DN, attributes).
    pub fn request(
        &mut self,
        op: ProtocolOp,
        controls: Vec<pando_proto::Control>,
    ) -> Result<(u32, Vec<pando_proto::SearchResultEntry>), String> {
        self.send_with(op, controls)?;
        let mut entries = Vec::new();
        loop {
            match self.recv()?.op {
                ProtocolOp::SearchResultEntry(e) => entries.push(e),
                ProtocolOp::SearchResultReference(_) | ProtocolOp::IntermediateResponse { .. } => {}
                ProtocolOp::SearchResultDone(r)
                | ProtocolOp::ModifyResponse(r)
                | ProtocolOp::AddResponse(r)
                | ProtocolOp::DelResponse(r)
                | ProtocolOp::ModifyDnResponse(r)
                | ProtocolOp::CompareResponse(r) => return Ok((r.code.0, entries)),
                ProtocolOp::BindResponse(r) => return Ok((r.result.code.0, entries)),
                ProtocolOp::ExtendedResponse(r) => return Ok((r.result.code.0, entries)),
                _ => return Err("unexpected response".into()),
            }
        }
    }

    /// A search whose entries go to `each` as they arrive (a large subtree
    /// is never held whole); its result code and message.
    pub fn search_each(
        &mut self,
        req: SearchRequest,
        controls: Vec<pando_proto::Control>,
        each: &mut dyn FnMut(pando_proto::SearchResultEntry),
    ) -> Result<(u32, String), String> {
        self.send_with(ProtocolOp::SearchRequest(req), controls)?;
        loop {
            match self.recv()?.op {
                ProtocolOp::SearchResultEntry(e) => each(e),
                ProtocolOp::SearchResultDone(r) => return Ok((r.code.0, r.message)),
                ProtocolOp::SearchResultReference(_) | ProtocolOp::IntermediateResponse { .. } => {}
                _ => return Err("unexpected response to a search".into()),
            }
        }
    }

    /// A simple bind: its result code.
    pub fn simple_bind(&mut self, dn: &str, password: &str) -> Result<u32, String> {
        self.request(
            ProtocolOp::BindRequest(BindRequest {
                version: 3,
                name: dn.to_string(),
                auth: BindAuth::Simple(password.as_bytes().to_vec()),
            }),
            Vec::new(),
        )
        .map(|(code, _)| code)
    }

    /// Connected, not bound.
    pub fn connect_only(url: &str) -> Result<Ldap, String> {
        Ldap::connect(url).map(|(l, _)| l)
    }

    fn bind(&mut self, auth: BindAuth, name: String) -> Result<(), String> {
        self.send(ProtocolOp::BindRequest(BindRequest {
            version: 3,
            name,
            auth,
        }))?;
        match self.recv()?.op {
            ProtocolOp::BindResponse(r) if r.result.code.0 == 0 => Ok(()),
            ProtocolOp::BindResponse(r) => Err(format!(
                "bind failed: {} {}",
                r.result.code.0, r.result.message
            )),
            _ => Err("unexpected response to bind".into()),
        }
    }

    /// The response value of the extended operation `oid`.
    pub fn extended(&mut self, oid: &str, value: Vec<u8>) -> Result<Vec<u8>, String> {
        self.send(ProtocolOp::ExtendedRequest(ExtendedRequest {
            name: oid.into(),
            value: Some(value),
        }))?;
        match self.recv()?.op {
            ProtocolOp::ExtendedResponse(r) if r.result.code.0 == 0 => {
                Ok(r.value.unwrap_or_default())
            }
            ProtocolOp::ExtendedResponse(r) => Err(format!(
                "extended operation failed: {} {}",
                r.result.code.0, r.result.message
            )),
            _ => Err("unexpected response to an extended operation".into()),
        }
    }

    /// Every entry of a search of `base` (all user attributes and
    /// `extra`): DN (lowercase) → lowercase attribute → values.
    pub fn search_all(
        &mut self,
        base: &str,
        scope: Scope,
        extra: &[&str],
    ) -> Result<HashMap<String, HashMap<String, Vec<String>>>, String> {
        let mut attrs: Vec<&str> = extra.to_vec();
        if !attrs.is_empty() {
            attrs.push("*");
        }
        let req = search_request(base, scope, "(objectClass=*)", &attrs)?;
        self.send(ProtocolOp::SearchRequest(req))?;
        let mut out = HashMap::new();
        loop {
            match self.recv()?.op {
                ProtocolOp::SearchResultEntry(e) => {
                    let mut attrs = HashMap::new();
                    for a in e.attrs {
                        attrs.insert(
                            a.name.to_ascii_lowercase(),
                            a.values
                                .iter()
                                .map(|v| String::from_utf8_lossy(v).into_owned())
                                .collect(),
                        );
                    }
                    out.insert(e.dn.to_ascii_lowercase(), attrs);
                }
                ProtocolOp::SearchResultDone(r) if r.code.0 == 0 => return Ok(out),
                ProtocolOp::SearchResultDone(r) => {
                    return Err(format!(
                        "search of {base} failed: {} {}",
                        r.code.0, r.message
                    ))
                }
                _ => {}
            }
        }
    }
}
