//! TLS towards clients: `ldaps://` listeners, and StartTLS taken as a
//! connection's first request (what `ldapsearch -ZZ` and every client
//! library send before anything else). The certificate and key are read
//! once at start.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use tokio_rustls::TlsAcceptor;

use crate::config::ProxyConfig;

/// How long a client may take over its TLS handshake.
pub const HANDSHAKE: Duration = Duration::from_secs(10);

/// The acceptor for `tls_cert_file` and `tls_key_file`; None when unset.
pub fn acceptor(cfg: &ProxyConfig) -> Result<Option<TlsAcceptor>, String> {
    let (Some(cert), Some(key)) = (&cfg.tls_cert_file, &cfg.tls_key_file) else {
        return Ok(None);
    };
    let chain = pando_client::read_certs(cert, "proxy.tls_cert_file")?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        let why = match e {
            rustls::pki_types::pem::Error::Io(io) => io.to_string(),
            _ => "no PEM private key (PKCS#8, PKCS#1 or SEC1) found".to_string(),
        };
        format!("proxy.tls_key_file: {}: {why}", key.display())
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS protocol versions: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("proxy.tls_cert_file and tls_key_file: {e}"))?;
    Ok(Some(TlsAcceptor::from(Arc::new(config))))
}
