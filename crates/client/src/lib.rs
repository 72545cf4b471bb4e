//! A small LDAP client (the crate `pando-client`) for the server talking
//! to another server (a replication consumer to its provider, translucency
//! to its remote, password-policy failures forwarded to a provider):
//! connect (plain, LDAPS or StartTLS, checking the peer's certificate),
//! bind (simple or SASL EXTERNAL), send requests and read responses, on
//! the server's own codec. Every wait is bounded by the endpoint's
//! timeout; what the peer sends is decoded as strictly as a client's
//! requests are, within the server's message size limit.
//!
//! Beside the operations, below everything that uses it: it must not name
//! the server's state, operations, overlays or replication.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pando_proto::{
    frame_length, oid, BindAuth, BindRequest, Control, DecodeLimits, ExtendedRequest, LdapMessage,
    LdapResult, PagedResults, ProtocolOp, ResultCode, SearchRequest, SearchResultEntry,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use pando_config::consumer::Secret;

/// Where and how to connect and bind: built from a consumer's or an
/// overlay's settings.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// `ldap://host:port` or `ldaps://host:port`.
    pub url: String,
    /// `simple`, `sasl_external` (the TLS client certificate) or `none`.
    pub bind_method: String,
    pub bind_dn: String,
    /// The simple bind password, or the file holding it.
    pub credentials: Option<Secret>,
    pub credentials_file: Option<PathBuf>,
    /// StartTLS on an ldap:// URL (refused if it fails).
    pub start_tls: bool,
    /// CA certificates (PEM) the peer's certificate must chain to; unset:
    /// the system's roots.
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM) for `sasl_external`.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// TCP keepalive idle time in seconds (0: off).
    pub keepalive_secs: u64,
    /// Connecting, binding, and each wait for an answer, in seconds.
    pub timeout_secs: u64,
}

impl Endpoint {
    /// The simple bind password.
    pub fn password(&self) -> std::io::Result<Vec<u8>> {
        match (&self.credentials, &self.credentials_file) {
            (Some(s), _) => Ok(s.0.clone().into_bytes()),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)?;
                Ok(text.trim_end_matches(['\r', '\n']).as_bytes().to_vec())
            }
            (None, None) => Ok(Vec::new()),
        }
    }
}

/// Why talking to the peer failed; the text names the problem.
#[derive(Debug)]
pub struct ClientError(pub String);

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn fail<T>(why: impl Into<String>) -> Result<T, ClientError> {
    Err(ClientError(why.into()))
}

/// A connection's byte stream: TCP, or TLS over it.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// A connection to another server.
pub struct Client {
    stream: Box<dyn Stream>,
    buf: Vec<u8>,
    next_id: i32,
    timeout: Duration,
    max_pdu: usize,
    limits: DecodeLimits,
    /// What the peer is called in messages.
    pub url: String,
}

/// How a consumer reaches and binds to its provider, or a push its target.
impl From<pando_config::consumer::Link<'_>> for Endpoint {
    fn from(c: pando_config::consumer::Link<'_>) -> Endpoint {
        Endpoint {
            url: c.url.to_string(),
            bind_method: c.bind_method.to_string(),
            bind_dn: c.bind_dn.to_string(),
            credentials: c.credentials.cloned(),
            credentials_file: c.credentials_file.cloned(),
            start_tls: c.start_tls,
            tls_ca_file: c.tls_ca_file.cloned(),
            tls_cert_file: c.tls_cert_file.cloned(),
            tls_key_file: c.tls_key_file.cloned(),
            keepalive_secs: c.keepalive_secs,
            timeout_secs: c.timeout_secs,
        }
    }
}

impl From<&pando_config::consumer::ConsumerConfig> for Endpoint {
    fn from(c: &pando_config::consumer::ConsumerConfig) -> Endpoint {
        Endpoint::from(c.link())
    }
}

/// `host:port` of an ldap:// or ldaps:// URL, and whether it is LDAPS.
fn host_port(url: &str) -> Result<(String, u16, bool), ClientError> {
    pando_proto::url::host_port(url).map_err(ClientError)
}

/// Whether `url` is an ldap:// or ldaps:// URL naming a host (and a valid
/// port, when it names one).
pub fn check_url(url: &str) -> Result<(), ClientError> {
    host_port(url).map(|_| ())
}

/// Turn on TCP keepalive with `idle` seconds before the first probe.
fn keepalive(stream: &TcpStream, idle: u64) {
    use std::os::fd::AsRawFd;
    if idle == 0 {
        return;
    }
    let fd = stream.as_raw_fd();
    let on: libc::c_int = 1;
    let idle = idle.min(i32::MAX as u64) as libc::c_int;
    let size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` is an open socket owned by `stream` for the duration of
    // the calls; the option values point at live c_ints of the given size.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_KEEPALIVE,
            (&on as *const libc::c_int).cast(),
            size,
        );
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_KEEPIDLE,
            (&idle as *const libc::c_int).cast(),
            size,
        );
    }
}

/// The TLS settings for talking to the peer: its certificate checked
/// against `tls_ca_file` (or the system's CA bundle), the client
/// certificate offered when configured.
fn tls_connector(cfg: &Endpoint) -> Result<tokio_rustls::TlsConnector, ClientError> {
    let mut roots = rustls::RootCertStore::empty();
    let ca = cfg
        .tls_ca_file
        .clone()
        .unwrap_or_else(|| "/etc/ssl/certs/ca-certificates.crt".into());
    for c in read_certs(&ca, "tls_ca_file").map_err(ClientError)? {
        roots
            .add(c)
            .map_err(|e| ClientError(format!("{}: unusable CA certificate: {e}", ca.display())))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError(format!("TLS: {e}")))?
        .with_root_certificates(roots);
    let config = match (&cfg.tls_cert_file, &cfg.tls_key_file) {
        (Some(cert), Some(key)) => {
            let chain = read_certs(cert, "tls_cert_file").map_err(ClientError)?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|_| {
                ClientError(format!("{}: no usable PEM private key", key.display()))
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| ClientError(format!("client certificate: {e}")))?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

impl Client {
    /// Connect to `cfg.url`, with TLS as configured (LDAPS, or
    /// StartTLS when asked for), within the endpoint's timeout.
    pub async fn connect(cfg: &Endpoint, max_pdu: usize) -> Result<Client, ClientError> {
        let (host, port, ldaps) = host_port(&cfg.url)?;
        let timeout = Duration::from_secs(cfg.timeout_secs);
        let tcp =
            match tokio::time::timeout(timeout, TcpStream::connect((host.as_str(), port))).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return fail(format!("cannot connect to {}: {e}", cfg.url)),
                Err(_) => {
                    return fail(format!(
                        "cannot connect to {}: no answer within {}s",
                        cfg.url, cfg.timeout_secs
                    ))
                }
            };
        let _ = tcp.set_nodelay(true);
        keepalive(&tcp, cfg.keepalive_secs);
        let mut client = Client {
            stream: Box::new(tcp),
            buf: Vec::new(),
            next_id: 1,
            timeout,
            max_pdu,
            limits: DecodeLimits::default(),
            url: cfg.url.clone(),
        };
        if ldaps || cfg.start_tls {
            if cfg.start_tls {
                client.start_tls().await?;
            }
            let connector = tls_connector(cfg)?;
            let name = ServerName::try_from(host.clone())
                .map_err(|_| ClientError(format!("'{host}' is not a name TLS can check")))?;
            let plain = std::mem::replace(&mut client.stream, Box::new(tokio::io::duplex(1).0));
            let tls = tokio::time::timeout(timeout, connector.connect(name, plain))
                .await
                .map_err(|_| ClientError(format!("TLS handshake with {} timed out", cfg.url)))?
                .map_err(|e| ClientError(format!("TLS with {}: {e}", cfg.url)))?;
            client.stream = Box::new(tls);
        }
        Ok(client)
    }

    async fn start_tls(&mut self) -> Result<(), ClientError> {
        let id = self
            .send(
                ProtocolOp::ExtendedRequest(ExtendedRequest {
                    name: oid::START_TLS.into(),
                    value: None,
                }),
                Vec::new(),
            )
            .await?;
        let m = self.recv(Some(self.timeout)).await?;
        match m.op {
            ProtocolOp::ExtendedResponse(r)
                if m.id == id && r.result.code == ResultCode::SUCCESS =>
            {
                // Bytes after the answer came before TLS: not to be trusted.
                if !self.buf.is_empty() {
                    return fail(format!("{} sent data after agreeing to StartTLS", self.url));
                }
                Ok(())
            }
            ProtocolOp::ExtendedResponse(r) => fail(format!(
                "{} refused StartTLS: {} {}",
                self.url, r.result.code.0, r.result.message
            )),
            other => fail(format!(
                "{} answered StartTLS with {:?}",
                self.url,
                other.tag()
            )),
        }
    }

    /// Bind as the endpoint says.
    pub async fn bind(&mut self, cfg: &Endpoint) -> Result<(), ClientError> {
        let (name, auth) = match cfg.bind_method.as_str() {
            "none" => return Ok(()),
            "sasl_external" => (
                String::new(),
                BindAuth::Sasl {
                    mechanism: "EXTERNAL".into(),
                    credentials: None,
                },
            ),
            _ => {
                let pw = cfg.password().map_err(|e| {
                    ClientError(format!(
                        "cannot read credentials_file {:?}: {e}",
                        cfg.credentials_file
                    ))
                })?;
                (cfg.bind_dn.clone(), BindAuth::Simple(pw))
            }
        };
        let id = self
            .send(
                ProtocolOp::BindRequest(BindRequest {
                    version: 3,
                    name,
                    auth,
                }),
                Vec::new(),
            )
            .await?;
        let m = self.recv(Some(self.timeout)).await?;
        match m.op {
            ProtocolOp::BindResponse(r) if m.id == id && r.result.code == ResultCode::SUCCESS => {
                Ok(())
            }
            ProtocolOp::BindResponse(r) => fail(format!(
                "bind to {} as '{}' failed: {} ({}) {}",
                self.url,
                cfg.bind_dn,
                r.result.code.0,
                r.result.code.name(),
                r.result.message
            )),
            other => fail(format!(
                "{} answered a bind with {:?}",
                self.url,
                other.tag()
            )),
        }
    }

    /// Send a request; its message ID.
    pub async fn send(
        &mut self,
        op: ProtocolOp,
        controls: Vec<Control>,
    ) -> Result<i32, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut out = Vec::new();
        LdapMessage { id, op, controls }.encode(&mut out);
        let write = async {
            self.stream.write_all(&out).await?;
            self.stream.flush().await
        };
        match tokio::time::timeout(self.timeout, write).await {
            Ok(Ok(())) => Ok(id),
            Ok(Err(e)) => fail(format!("sending to {}: {e}", self.url)),
            Err(_) => fail(format!(
                "sending to {}: not taken within {}s",
                self.url,
                self.timeout.as_secs()
            )),
        }
    }

    /// The stream, connected (TLS included) and bound, with the bytes
    /// already read from it and the next message ID: for a caller that
    /// relays messages itself (`pando proxy`).
    pub fn into_parts(self) -> (Box<dyn Stream>, Vec<u8>, i32) {
        (self.stream, self.buf, self.next_id)
    }

    /// How long each wait for the peer may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A whole message is already read (the next `recv` does not wait).
    pub fn has_message(&self) -> bool {
        matches!(frame_length(&self.buf, self.max_pdu), Ok(Some(_)))
    }

    /// The next message, waiting at most `wait` (None: as long as it
    /// takes; the connection's keepalive notices a dead peer).
    pub async fn recv(&mut self, wait: Option<Duration>) -> Result<LdapMessage, ClientError> {
        loop {
            match frame_length(&self.buf, self.max_pdu) {
                Ok(Some(n)) => {
                    let frame: Vec<u8> = self.buf.drain(..n).collect();
                    return LdapMessage::decode(&frame, &self.limits).map_err(|e| {
                        ClientError(format!(
                            "{} sent a malformed message: {}",
                            self.url, e.reason
                        ))
                    });
                }
                Ok(None) => {}
                Err(e) => return fail(format!("{} sent a malformed message: {e:?}", self.url)),
            }
            let mut chunk = [0u8; 64 * 1024];
            let read = self.stream.read(&mut chunk);
            let n = match wait {
                Some(w) => match tokio::time::timeout(w, read).await {
                    Ok(r) => r,
                    Err(_) => {
                        return fail(format!("{} sent nothing for {}s", self.url, w.as_secs()))
                    }
                },
                None => read.await,
            }
            .map_err(|e| ClientError(format!("reading from {}: {e}", self.url)))?;
            if n == 0 {
                return fail(format!("{} closed the connection", self.url));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The value of an extended operation's successful answer.
    pub async fn extended(&mut self, name: &str, value: Vec<u8>) -> Result<Vec<u8>, ClientError> {
        let wait = self.timeout;
        self.extended_within(name, value, wait).await
    }

    /// [`Client::extended`], waiting at most `wait` for the answer (an
    /// operation known to take long on the peer).
    pub async fn extended_within(
        &mut self,
        name: &str,
        value: Vec<u8>,
        wait: Duration,
    ) -> Result<Vec<u8>, ClientError> {
        let op = ProtocolOp::ExtendedRequest(pando_proto::ExtendedRequest {
            name: name.into(),
            value: Some(value),
        });
        let id = self.send(op, Vec::new()).await?;
        let m = self.recv(Some(wait)).await?;
        match m.op {
            ProtocolOp::ExtendedResponse(r)
                if m.id == id && r.result.code == ResultCode::SUCCESS =>
            {
                Ok(r.value.unwrap_or_default())
            }
            ProtocolOp::ExtendedResponse(r) => fail(format!(
                "{} answered extended operation {name} with {} ({}) {}",
                self.url,
                r.result.code.0,
                r.result.code.name(),
                r.result.message
            )),
            other => fail(format!(
                "{} answered an extended operation with {:?}",
                self.url,
                other.tag()
            )),
        }
    }

    /// Send a request answered by one response (add, delete, modify,
    /// modify DN, compare) and wait for its result, whatever its code.
    pub async fn request(
        &mut self,
        op: ProtocolOp,
        controls: Vec<Control>,
    ) -> Result<LdapResult, ClientError> {
        let id = self.send(op, controls).await?;
        let wait = self.timeout;
        let m = self.recv(Some(wait)).await?;
        if m.id != id {
            return fail(format!(
                "{} answered message {} (expected {id})",
                self.url, m.id
            ));
        }
        match m.op {
            ProtocolOp::AddResponse(r)
            | ProtocolOp::DelResponse(r)
            | ProtocolOp::ModifyResponse(r)
            | ProtocolOp::ModifyDnResponse(r)
            | ProtocolOp::CompareResponse(r) => Ok(r),
            other => fail(format!(
                "{} answered with an unexpected {:?}",
                self.url,
                other.tag()
            )),
        }
    }

    /// Every entry `req` finds, read in pages of `page` (RFC 2696, so a
    /// server's size limit for the identity does not cut the answer
    /// short), with the last page's result. A server without paging
    /// answers at once, whole.
    pub async fn search_all(
        &mut self,
        req: SearchRequest,
        page: i32,
    ) -> Result<(Vec<SearchResultEntry>, LdapResult), ClientError> {
        let mut entries = Vec::new();
        let mut cookie = Vec::new();
        let wait = self.timeout;
        loop {
            let paged = Control {
                oid: pando_proto::oid::PAGED_RESULTS.into(),
                critical: false,
                value: Some(PagedResults { size: page, cookie }.encode()),
            };
            let id = self
                .send(ProtocolOp::SearchRequest(req.clone()), vec![paged])
                .await?;
            let (done, controls) = loop {
                let m = self.recv(Some(wait)).await?;
                match m.op {
                    _ if m.id != id => {
                        return fail(format!(
                            "{} answered message {} (expected {id})",
                            self.url, m.id
                        ))
                    }
                    ProtocolOp::SearchResultEntry(e) => entries.push(e),
                    ProtocolOp::SearchResultReference(_) => {}
                    ProtocolOp::SearchResultDone(r) => break (r, m.controls),
                    other => {
                        return fail(format!(
                            "{} answered a search with {:?}",
                            self.url,
                            other.tag()
                        ))
                    }
                }
            };
            let next = controls
                .iter()
                .find(|c| c.oid == pando_proto::oid::PAGED_RESULTS)
                .and_then(|c| PagedResults::decode(c.value.as_deref()?).ok())
                .map(|p| p.cookie)
                .unwrap_or_default();
            if done.code != ResultCode::SUCCESS || next.is_empty() {
                return Ok((entries, done));
            }
            cookie = next;
        }
    }

    /// Say goodbye (best effort).
    pub async fn unbind(mut self) {
        let _ = self.send(ProtocolOp::UnbindRequest, Vec::new()).await;
        let _ = self.stream.shutdown().await;
    }
}

/// Every CERTIFICATE block of a PEM file (at least one).
pub fn read_certs(
    path: &std::path::Path,
    key: &str,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    let fail = |why: String| format!("config key '{key}': {}: {why}", path.display());
    let certs = rustls::pki_types::CertificateDer::pem_file_iter(path)
        .map_err(|e| fail(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(e.to_string()))?;
    if certs.is_empty() {
        return Err(fail("no PEM CERTIFICATE found".into()));
    }
    Ok(certs)
}
