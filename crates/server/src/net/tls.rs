//! TLS: the server certificate and settings from `[tls]`, the handshake,
//! the generated self-signed certificate, and client certificate subjects
//! as LDAP DNs.
//!
//! A [`TlsContext`] holds the rustls configuration behind a lock that is
//! only ever swapped whole: each handshake clones the `Arc` current when it
//! starts, so `reload` (SIGHUP) affects new handshakes only and connections
//! already established keep the certificate they were set up with.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use x509_parser::asn1_rs::{Any, Class, Tag};
use x509_parser::x509::{AttributeTypeAndValue, X509Name};

use pando_config::{ClientCerts, TlsSettings, TlsVersion};

/// Longest a TLS handshake may take (ldaps accept or StartTLS): clients
/// that connect and say nothing must not hold connection slots for long.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Names the generated self-signed certificate is valid for.
pub const SELF_SIGNED_NAMES: &[&str] = &["localhost", "127.0.0.1", "::1"];

pub struct TlsContext {
    settings: TlsSettings,
    /// Replaced whole by `reload`; handshakes take a clone of the `Arc`.
    current: RwLock<Arc<ServerConfig>>,
}

/// Why a handshake did not complete.
#[derive(Debug)]
pub struct HandshakeFailed {
    pub reason: String,
    /// The client closed before saying anything useful (port probes,
    /// health checks): not worth more than a debug line.
    pub silent_close: bool,
}

impl std::fmt::Display for HandshakeFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

impl HandshakeFailed {
    /// Log at info, or at debug for a client that just closed.
    pub fn log(&self, conn: u64, peer: &str) {
        if self.silent_close {
            tracing::debug!(conn, peer, "{self}");
        } else {
            tracing::info!(conn, peer, "{self}");
        }
    }
}

/// What a completed handshake established.
pub struct Handshake<S> {
    pub stream: TlsStream<S>,
    /// RFC 4514 subject DN of the verified client certificate, if one was
    /// presented (rustls only reports certificates that passed verification).
    pub client_cert_dn: Option<String>,
}

impl TlsContext {
    /// Read the certificate, key and CA files. Errors name the config key
    /// and the file.
    pub fn load(settings: TlsSettings) -> Result<TlsContext, String> {
        let config = build(&settings)?;
        Ok(TlsContext {
            settings,
            current: RwLock::new(config),
        })
    }

    pub fn settings(&self) -> &TlsSettings {
        &self.settings
    }

    /// Re-read the files and use them for new handshakes. On any error the
    /// configuration in use stays, and the reason is logged.
    pub fn reload(&self) -> bool {
        match build(&self.settings) {
            Ok(config) => {
                match self.current.write() {
                    Ok(mut cur) => *cur = config,
                    Err(poisoned) => *poisoned.into_inner() = config,
                }
                tracing::info!(
                    cert = %self.settings.cert_file.display(),
                    "SIGHUP: TLS certificate and key reloaded; new connections use them"
                );
                true
            }
            Err(e) => {
                tracing::error!(
                    "SIGHUP: TLS files not reloaded, the certificate in use stays: {e}"
                );
                false
            }
        }
    }

    fn config(&self) -> Arc<ServerConfig> {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Run the server side of a handshake on `stream`, bounded by
    /// [`HANDSHAKE_TIMEOUT`].
    pub async fn accept<S>(&self, stream: S) -> Result<Handshake<S>, HandshakeFailed>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.config());
        let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return Err(HandshakeFailed {
                    reason: format!("TLS handshake failed: {e}"),
                    silent_close: e.kind() == std::io::ErrorKind::UnexpectedEof,
                })
            }
            Err(_) => {
                return Err(HandshakeFailed {
                    reason: format!(
                        "TLS handshake not completed within {} s",
                        HANDSHAKE_TIMEOUT.as_secs()
                    ),
                    silent_close: false,
                })
            }
        };
        let client_cert_dn = match stream.get_ref().1.peer_certificates() {
            Some([leaf, ..]) => match subject_dn(leaf) {
                Ok(dn) => Some(dn),
                Err(e) => {
                    // Verified, but its subject cannot serve as an
                    // identity: the connection goes on without one.
                    tracing::warn!("client certificate subject not usable: {e}");
                    None
                }
            },
            _ => None,
        };
        Ok(Handshake {
            stream,
            client_cert_dn,
        })
    }
}

/// Build a rustls server configuration from the files named in `s`.
fn build(s: &TlsSettings) -> Result<Arc<ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = pando_client::read_certs(&s.cert_file, "tls.cert_file")?;
    let key = PrivateKeyDer::from_pem_file(&s.key_file).map_err(|e| {
        // The PEM parser's messages never quote key material, but only the
        // I/O error is worth passing on.
        let why = match e {
            rustls::pki_types::pem::Error::Io(io) => io.to_string(),
            _ => "no PEM private key (PKCS#8, PKCS#1 or SEC1) found".to_string(),
        };
        format!("config key 'tls.key_file': {}: {why}", s.key_file.display())
    })?;
    let versions: &[&'static rustls::SupportedProtocolVersion] = match s.min_version {
        TlsVersion::V1_2 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::V1_3 => &[&rustls::version::TLS13],
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| format!("TLS protocol versions: {e}"))?;
    let verifier = match (s.client_certs, &s.ca_file) {
        (ClientCerts::None, _) | (_, None) => WebPkiClientVerifier::no_client_auth(),
        (mode, Some(ca_file)) => {
            let mut roots = RootCertStore::empty();
            for c in pando_client::read_certs(ca_file, "tls.ca_file")? {
                roots.add(c).map_err(|e| {
                    format!(
                        "config key 'tls.ca_file': {}: unusable CA certificate: {e}",
                        ca_file.display()
                    )
                })?;
            }
            let b = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let b = if mode == ClientCerts::Request {
                b.allow_unauthenticated()
            } else {
                b
            };
            b.build()
                .map_err(|e| format!("config key 'tls.ca_file': {}: {e}", ca_file.display()))?
        }
    };
    describe_leaf(&chain[0], &s.cert_file);
    let config = builder
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| {
            format!(
                "config keys 'tls.cert_file'/'tls.key_file': the key in {} cannot be used with the certificate in {}: {e}",
                s.key_file.display(),
                s.cert_file.display()
            )
        })?;
    Ok(Arc::new(config))
}

/// Log the certificate's subject and validity; warn when it is not valid now.
fn describe_leaf(der: &CertificateDer<'_>, file: &Path) {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        tracing::warn!(file = %file.display(), "the server certificate could not be parsed for logging");
        return;
    };
    let v = cert.validity();
    let until =
        pando_store::clock::generalized_time(v.not_after.timestamp().max(0) as u64 * 1_000_000);
    let subject = name_to_dn(cert.subject());
    if v.is_valid() {
        tracing::info!(file = %file.display(), %subject, valid_until = %until, "TLS certificate");
    } else {
        let from = pando_store::clock::generalized_time(
            v.not_before.timestamp().max(0) as u64 * 1_000_000,
        );
        tracing::warn!(file = %file.display(), %subject, valid_from = %from, valid_until = %until,
            "the TLS server certificate is not valid now; clients will refuse it");
    }
}

// ---------------------------------------------------------------------------
// Self-signed certificate (`pando serve --tls-self-signed`)

/// Make sure `cert_file` and `key_file` exist, generating a self-signed
/// certificate for [`SELF_SIGNED_NAMES`] when either is missing. Returns
/// whether it generated one. The directory is made 0700, the key written
/// 0600 and the certificate 0644, each through a temporary file and a
/// rename so a crash never leaves a half-written file in place.
pub fn ensure_self_signed(cert_file: &Path, key_file: &Path) -> Result<bool, String> {
    if cert_file.is_file() && key_file.is_file() {
        return Ok(false);
    }
    for f in [cert_file, key_file] {
        if let Some(dir) = f.parent() {
            crate::datadir::private_dir(dir)?;
        }
    }
    let (cert_pem, key_pem) = generate_self_signed()
        .map_err(|e| format!("cannot generate a self-signed certificate: {e}"))?;
    write_new(key_file, key_pem.as_bytes(), 0o600)?;
    write_new(cert_file, cert_pem.as_bytes(), 0o644)?;
    Ok(true)
}

/// PEM certificate and PEM key (ECDSA P-256), valid from today for ten years.
fn generate_self_signed() -> Result<(String, String), rcgen::Error> {
    let key = rcgen::KeyPair::generate()?;
    let names: Vec<String> = SELF_SIGNED_NAMES.iter().map(|s| s.to_string()).collect();
    let mut params = rcgen::CertificateParams::new(names)?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "Pando");
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        "Pando self-signed certificate (localhost)",
    );
    // `generalized_time` gives YYYYmmdd… in UTC; today 00:00 is in the past.
    let today = pando_store::clock::generalized_time(pando_store::clock::now_micros());
    let field = |r: std::ops::Range<usize>| today.get(r).and_then(|t| t.parse::<u16>().ok());
    if let (Some(y), Some(m), Some(d)) = (field(0..4), field(4..6), field(6..8)) {
        let d = d.min(28) as u8; // no 29 February ten years on
        params.not_before = rcgen::date_time_ymd(y as i32, m as u8, d);
        params.not_after = rcgen::date_time_ymd(y as i32 + 10, m as u8, d);
    }
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Write `data` to `path` with `mode`, atomically (temporary file + rename).
fn write_new(path: &Path, data: &[u8], mode: u32) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp = PathBuf::from(path);
    tmp.as_mut_os_string().push(".tmp");
    let _ = std::fs::remove_file(&tmp);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })
}

// ---------------------------------------------------------------------------
// Certificate subjects as LDAP DNs (RFC 4514)

/// Attribute types written by name; RFC 4514 section 3's table plus the
/// other string-valued X.520/PKCS #9 types that Pando's schema defines (so
/// the DN can be normalised for SASL EXTERNAL). PKCS #9 emailAddress is
/// `email`, as OpenLDAP writes it.
const SHORT_NAMES: &[(&str, &str)] = &[
    ("2.5.4.3", "cn"),
    ("2.5.4.4", "sn"),
    ("2.5.4.5", "serialNumber"),
    ("2.5.4.6", "c"),
    ("2.5.4.7", "l"),
    ("2.5.4.8", "st"),
    ("2.5.4.9", "street"),
    ("2.5.4.10", "o"),
    ("2.5.4.11", "ou"),
    ("2.5.4.12", "title"),
    ("2.5.4.17", "postalCode"),
    ("2.5.4.42", "givenName"),
    ("2.5.4.43", "initials"),
    ("2.5.4.44", "generationQualifier"),
    ("2.5.4.46", "dnQualifier"),
    ("0.9.2342.19200300.100.1.1", "uid"),
    ("0.9.2342.19200300.100.1.25", "dc"),
    ("1.2.840.113549.1.9.1", "email"),
];

/// The subject of a DER certificate as an LDAP DN string.
pub fn subject_dn(cert_der: &[u8]) -> Result<String, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der)
        .map_err(|e| format!("unparsable certificate: {e}"))?;
    Ok(name_to_dn(cert.subject()))
}

/// An X.501 Name as an RFC 4514 string. The certificate lists RDNs from the
/// root down; LDAP writes the most specific first, so the order is reversed.
/// AVAs of a multi-valued RDN keep their order, joined by `+`.
pub fn name_to_dn(name: &X509Name<'_>) -> String {
    let rdns: Vec<&_> = name.iter().collect();
    let mut out = String::new();
    for (i, rdn) in rdns.iter().rev().enumerate() {
        if i > 0 {
            out.push(',');
        }
        for (j, ava) in rdn.iter().enumerate() {
            if j > 0 {
                out.push('+');
            }
            push_ava(ava, &mut out);
        }
    }
    out
}

fn push_ava(ava: &AttributeTypeAndValue<'_>, out: &mut String) {
    let oid = ava.attr_type().to_id_string();
    let name = SHORT_NAMES.iter().find(|(o, _)| *o == oid).map(|(_, n)| *n);
    let text = name.and_then(|_| string_value(ava.attr_value()));
    match (name, text) {
        (Some(n), Some(t)) => {
            out.push_str(n);
            out.push('=');
            pando_model::dn::escape_value(t.as_bytes(), out);
        }
        // RFC 4514 2.4: a type written as an OID, or a value with no
        // string form, is `#` and the hex of the value's BER encoding.
        (n, _) => {
            out.push_str(n.unwrap_or(&oid));
            out.push_str("=#");
            for b in ber_encoding(ava.attr_value()) {
                out.push_str(&format!("{b:02x}"));
            }
        }
    }
}

/// The text of a directory string value, or None for other ASN.1 types
/// (and for bytes invalid in their declared string type).
fn string_value(v: &Any<'_>) -> Option<String> {
    if v.header.class() != Class::Universal || v.header.is_constructed() {
        return None;
    }
    let data = v.data;
    match v.header.tag() {
        Tag::Utf8String
        | Tag::PrintableString
        | Tag::Ia5String
        | Tag::NumericString
        | Tag::VisibleString => std::str::from_utf8(data).ok().map(str::to_string),
        // T.61 in practice carries Latin-1.
        Tag::TeletexString => Some(data.iter().map(|&b| b as char).collect()),
        Tag::BmpString => {
            let chunks = data.chunks_exact(2);
            if !chunks.remainder().is_empty() {
                return None;
            }
            let units = chunks.map(|c| u16::from_be_bytes([c[0], c[1]]));
            char::decode_utf16(units)
                .collect::<Result<String, _>>()
                .ok()
        }
        Tag::UniversalString => {
            let chunks = data.chunks_exact(4);
            if !chunks.remainder().is_empty() {
                return None;
            }
            chunks
                .map(|c| char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
                .collect()
        }
        _ => None,
    }
}

/// The value's BER (here DER) encoding: identifier, definite length, contents.
fn ber_encoding(v: &Any<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.data.len() + 6);
    let class = (v.header.class() as u8) << 6;
    let constructed = if v.header.is_constructed() { 0x20 } else { 0 };
    let tag = v.header.tag().0;
    if tag < 31 {
        out.push(class | constructed | tag as u8);
    } else {
        out.push(class | constructed | 0x1f);
        let mut groups = Vec::new();
        let mut t = tag;
        loop {
            groups.push((t & 0x7f) as u8);
            t >>= 7;
            if t == 0 {
                break;
            }
        }
        for (i, g) in groups.iter().rev().enumerate() {
            out.push(if i + 1 < groups.len() { g | 0x80 } else { *g });
        }
    }
    let len = v.data.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(v.data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::FromDer;

    // Minimal DER writer for test Names.
    fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        assert!(content.len() < 0x80);
        let mut v = vec![tag, content.len() as u8];
        v.extend_from_slice(content);
        v
    }

    fn oid(dotted: &str) -> Vec<u8> {
        let arcs: Vec<u64> = dotted.split('.').map(|a| a.parse().unwrap()).collect();
        let mut body = vec![(arcs[0] * 40 + arcs[1]) as u8];
        for &a in &arcs[2..] {
            let mut groups = vec![(a & 0x7f) as u8];
            let mut x = a >> 7;
            while x > 0 {
                groups.push((x & 0x7f) as u8 | 0x80);
                x >>= 7;
            }
            body.extend(groups.iter().rev());
        }
        tlv(0x06, &body)
    }

    /// AttributeTypeAndValue with an already encoded value.
    fn ava(t: &str, value: Vec<u8>) -> Vec<u8> {
        let mut c = oid(t);
        c.extend(value);
        tlv(0x30, &c)
    }

    fn utf8(s: &str) -> Vec<u8> {
        tlv(0x0c, s.as_bytes())
    }

    fn printable(s: &str) -> Vec<u8> {
        tlv(0x13, s.as_bytes())
    }

    /// Name from RDNs in certificate order (root first).
    fn name(rdns: &[Vec<Vec<u8>>]) -> Vec<u8> {
        let mut body = Vec::new();
        for avas in rdns {
            body.extend(tlv(0x31, &avas.concat()));
        }
        tlv(0x30, &body)
    }

    fn convert(der: &[u8]) -> String {
        let (rest, n) = X509Name::from_der(der).unwrap();
        assert!(rest.is_empty());
        name_to_dn(&n)
    }

    #[test]
    fn reversed_into_ldap_order_with_short_names() {
        let der = name(&[
            vec![ava("0.9.2342.19200300.100.1.25", tlv(0x16, b"com"))],
            vec![ava("0.9.2342.19200300.100.1.25", tlv(0x16, b"example"))],
            vec![ava("2.5.4.11", utf8("People"))],
            vec![ava("2.5.4.3", utf8("alice"))],
        ]);
        assert_eq!(convert(&der), "cn=alice,ou=People,dc=example,dc=com");
        let der = name(&[
            vec![ava("2.5.4.6", printable("DE"))],
            vec![ava("2.5.4.8", utf8("Bayern"))],
            vec![ava("2.5.4.7", utf8("München"))],
            vec![ava("2.5.4.10", utf8("Example"))],
            vec![ava("1.2.840.113549.1.9.1", tlv(0x16, b"a@example.com"))],
            vec![ava("0.9.2342.19200300.100.1.1", utf8("a1"))],
        ]);
        assert_eq!(
            convert(&der),
            "uid=a1,email=a@example.com,o=Example,l=München,st=Bayern,c=DE"
        );
    }

    #[test]
    fn short_names_are_schema_attributes_with_those_oids() {
        // So a certificate DN normalises for SASL EXTERNAL and mapping.
        let schema = pando_model::Schema::standard();
        for (oid, name) in SHORT_NAMES {
            let at = schema
                .attribute(name)
                .unwrap_or_else(|| panic!("{name} is not in the schema"));
            assert_eq!(at.oid, *oid, "{name}");
        }
        let dn = pando_model::Dn::parse("email=A@Example.com,cn=Alice,dc=example").unwrap();
        assert_eq!(
            schema.normalize_dn(&dn).unwrap(),
            "email=a@example.com,cn=alice,dc=example"
        );
    }

    #[test]
    fn multi_valued_rdn_keeps_its_avas_together() {
        let der = name(&[
            vec![ava("2.5.4.10", utf8("Example"))],
            vec![
                ava("2.5.4.3", utf8("Alice Liddell")),
                ava("0.9.2342.19200300.100.1.1", utf8("alice")),
            ],
        ]);
        assert_eq!(convert(&der), "cn=Alice Liddell+uid=alice,o=Example");
    }

    #[test]
    fn values_are_escaped() {
        let der = name(&[
            vec![ava("2.5.4.10", utf8(" lead and trail "))],
            vec![ava("2.5.4.11", utf8("#hash"))],
            vec![ava("2.5.4.3", utf8("a,b+c\"d\\e<f>g;h=i"))],
        ]);
        assert_eq!(
            convert(&der),
            "cn=a\\,b\\+c\\\"d\\\\e\\<f\\>g\\;h\\=i,ou=\\#hash,o=\\ lead and trail\\ "
        );
        let der = name(&[vec![ava("2.5.4.3", utf8("nul\0here"))]]);
        assert_eq!(convert(&der), "cn=nul\\00here");
        // Every escaped form parses back to the original value.
        let der = name(&[vec![ava("2.5.4.3", utf8("a,b+c\"d\\e<f>g;h=i "))]]);
        let dn = pando_model::Dn::parse(&convert(&der)).unwrap();
        assert_eq!(dn.rdns[0].avas[0].value, b"a,b+c\"d\\e<f>g;h=i ");
    }

    #[test]
    fn other_string_types_are_decoded() {
        // BMPString (UTF-16BE) and UniversalString (UCS-4BE) and T.61.
        let bmp: Vec<u8> = "Zoë".encode_utf16().flat_map(|u| u.to_be_bytes()).collect();
        let univ: Vec<u8> = "Ωmega"
            .chars()
            .flat_map(|c| (c as u32).to_be_bytes())
            .collect();
        let der = name(&[
            vec![ava("2.5.4.10", tlv(0x1c, &univ))],
            vec![ava("2.5.4.11", tlv(0x14, b"caf\xe9"))],
            vec![ava("2.5.4.3", tlv(0x1e, &bmp))],
        ]);
        assert_eq!(convert(&der), "cn=Zoë,ou=café,o=Ωmega");
    }

    #[test]
    fn unknown_types_and_non_strings_are_hex() {
        // organizationIdentifier (2.5.4.97) is not in the table: OID and BER.
        let der = name(&[
            vec![ava("2.5.4.97", utf8("VAT-1"))],
            vec![ava("2.5.4.3", tlv(0x04, b"\x01\x02"))],
        ]);
        assert_eq!(convert(&der), "cn=#04020102,2.5.4.97=#0c055641542d31");
        // An invalid UTF8String is not passed on as text.
        let der = name(&[vec![ava("2.5.4.3", tlv(0x0c, b"\xff"))]]);
        assert_eq!(convert(&der), "cn=#0c01ff");
    }

    #[test]
    fn long_lengths_and_tags_encode() {
        let data = vec![b'x'; 300];
        let hdr = x509_parser::asn1_rs::Header::new(Class::Universal, false, Tag(4), 300.into());
        let any = Any::new(hdr, &data);
        let enc = ber_encoding(&any);
        assert_eq!(&enc[..4], &[0x04, 0x82, 0x01, 0x2c]);
        assert_eq!(enc.len(), 304);
        let hdr =
            x509_parser::asn1_rs::Header::new(Class::ContextSpecific, true, Tag(200), 1.into());
        let any = Any::new(hdr, b"z");
        assert_eq!(ber_encoding(&any), vec![0xbf, 0x81, 0x48, 0x01, b'z']);
    }

    #[test]
    fn self_signed_files_and_subject() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let tls_dir = dir.path().join("tls");
        let (cert, key) = (tls_dir.join("cert.pem"), tls_dir.join("key.pem"));
        assert!(ensure_self_signed(&cert, &key).unwrap());
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&tls_dir), 0o700);
        assert_eq!(mode(&key), 0o600);
        assert_eq!(mode(&cert), 0o644);
        let pem = std::fs::read(&cert).unwrap();
        // Reused, not regenerated, on the next start.
        assert!(!ensure_self_signed(&cert, &key).unwrap());
        assert_eq!(std::fs::read(&cert).unwrap(), pem);
        let der = CertificateDer::from_pem_slice(&pem).unwrap();
        assert_eq!(
            subject_dn(&der).unwrap(),
            "cn=Pando self-signed certificate (localhost),o=Pando"
        );
        // And it loads as a server configuration.
        let ctx = TlsContext::load(TlsSettings {
            cert_file: cert.clone(),
            key_file: key.clone(),
            ca_file: None,
            client_certs: ClientCerts::None,
            min_version: TlsVersion::V1_3,
            self_signed: true,
        })
        .unwrap();
        assert!(ctx.reload());
        // A broken file on reload keeps the old configuration.
        let before = ctx.config();
        std::fs::write(&key, "not a key").unwrap();
        assert!(!ctx.reload());
        assert!(Arc::ptr_eq(&before, &ctx.config()));
    }

    #[tokio::test(start_paused = true)]
    async fn silent_clients_are_dropped_after_the_handshake_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        ensure_self_signed(&cert, &key).unwrap();
        let ctx = TlsContext::load(TlsSettings {
            cert_file: cert,
            key_file: key,
            ca_file: None,
            client_certs: ClientCerts::None,
            min_version: TlsVersion::V1_2,
            self_signed: true,
        })
        .unwrap();
        // Connected, but never says anything.
        let (_client, server) = tokio::io::duplex(4096);
        let started = tokio::time::Instant::now();
        let e = ctx.accept(server).await.err().unwrap();
        assert_eq!(started.elapsed(), HANDSHAKE_TIMEOUT);
        assert!(!e.silent_close);
        assert!(e.reason.contains("10 s"), "{e}");
        // One that closes at once is a quiet failure.
        let (client, server) = tokio::io::duplex(4096);
        drop(client);
        let e = ctx.accept(server).await.err().unwrap();
        assert!(e.silent_close, "{e}");
    }

    #[test]
    fn load_errors_name_key_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        let settings = |ca: Option<PathBuf>, mode| TlsSettings {
            cert_file: cert.clone(),
            key_file: key.clone(),
            ca_file: ca,
            client_certs: mode,
            min_version: TlsVersion::V1_2,
            self_signed: false,
        };
        let e = TlsContext::load(settings(None, ClientCerts::None))
            .err()
            .unwrap();
        assert!(e.contains("tls.cert_file") && e.contains("c.pem"), "{e}");
        ensure_self_signed(&cert, &key).unwrap();
        let e = TlsContext::load(settings(
            Some(dir.path().join("none.pem")),
            ClientCerts::Require,
        ))
        .err()
        .unwrap();
        assert!(e.contains("tls.ca_file") && e.contains("none.pem"), "{e}");
        // Another key than the certificate's.
        let other = dir.path().join("o");
        ensure_self_signed(&other.join("c.pem"), &other.join("k.pem")).unwrap();
        std::fs::copy(other.join("k.pem"), &key).unwrap();
        let e = TlsContext::load(settings(None, ClientCerts::None))
            .err()
            .unwrap();
        assert!(e.contains("tls.key_file") && e.contains("k.pem"), "{e}");
        std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\nsecret\n").unwrap();
        let e = TlsContext::load(settings(None, ClientCerts::None))
            .err()
            .unwrap();
        assert!(e.contains("tls.key_file") && !e.contains("secret"), "{e}");
    }
}
