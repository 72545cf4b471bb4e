//! Percent-decoding (RFC 3986 2.1), as LDAP URLs (RFC 4516), ldapi://
//! socket paths and LDIF's `file://` URLs write bytes: the one decoder
//! every caller uses; and the host and port an ldap:// or ldaps:// URL
//! names.

/// `s` with each `%XX` (two hexadecimal digits) replaced by its byte;
/// None when a `%` is not followed by two hexadecimal digits.
pub fn percent_decode(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while let Some(&c) = s.get(i) {
        if c == b'%' {
            let (hi, lo) = (s.get(i + 1)?, s.get(i + 2)?);
            let hi = (*hi as char).to_digit(16)?;
            let lo = (*lo as char).to_digit(16)?;
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    Some(out)
}

/// [`percent_decode`] of text that must decode to UTF-8 (a socket path
/// in a URL): the error names the text.
pub fn percent_decode_str(s: &str) -> Result<String, String> {
    let bytes = percent_decode(s.as_bytes())
        .ok_or_else(|| format!("'{s}': a % is not followed by two hexadecimal digits"))?;
    String::from_utf8(bytes).map_err(|_| format!("'{s}' does not decode to UTF-8"))
}

/// `host:port` of an ldap:// or ldaps:// URL (the port defaults to 389 or
/// 636; an IPv6 host is written in brackets), and whether it is LDAPS.
pub fn host_port(url: &str) -> Result<(String, u16, bool), String> {
    let (rest, tls) = match (url.strip_prefix("ldaps://"), url.strip_prefix("ldap://")) {
        (Some(r), _) => (r, true),
        (_, Some(r)) => (r, false),
        _ => return Err(format!("'{url}' is not an ldap:// or ldaps:// URL")),
    };
    let hostport = rest.split('/').next().unwrap_or("");
    let default = if tls { 636 } else { 389 };
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || hostport.starts_with('[') => {
            let port = p.parse().map_err(|_| format!("'{url}': bad port '{p}'"))?;
            (h.trim_matches(|c| c == '[' || c == ']').to_string(), port)
        }
        _ => (
            hostport.trim_matches(|c| c == '[' || c == ']').to_string(),
            default,
        ),
    };
    if host.is_empty() {
        return Err(format!("'{url}' names no host"));
    }
    Ok((host, port, tls))
}

/// Whether `url` names this host by a loopback address (or `localhost`):
/// what is sent to it never crosses a network.
pub fn is_loopback(url: &str) -> bool {
    host_port(url).is_ok_and(|(host, _, _)| {
        host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_decode_and_bad_ones_are_refused() {
        assert_eq!(
            percent_decode(b"%2Fvar%2frun%2Fldapi").unwrap(),
            b"/var/run/ldapi"
        );
        assert_eq!(percent_decode(b"a%20b%00").unwrap(), b"a b\0");
        // Not two hexadecimal digits (a sign is not a digit).
        for bad in [&b"%"[..], b"%4", b"%+1", b"%-1", b"%zz", b"x%4"] {
            assert_eq!(percent_decode(bad), None, "{:?}", bad);
        }
        assert_eq!(percent_decode_str("%2Ftmp").unwrap(), "/tmp");
        assert!(percent_decode_str("%ff").unwrap_err().contains("UTF-8"));
        assert!(percent_decode_str("%f")
            .unwrap_err()
            .contains("hexadecimal"));
    }

    #[test]
    fn urls_name_host_port_and_tls() {
        assert_eq!(
            host_port("ldap://127.0.0.1:3389").unwrap(),
            ("127.0.0.1".into(), 3389, false)
        );
        assert_eq!(
            host_port("ldaps://ldap.example.com/").unwrap(),
            ("ldap.example.com".into(), 636, true)
        );
        assert_eq!(
            host_port("ldap://[::1]:389").unwrap(),
            ("::1".into(), 389, false)
        );
        assert!(host_port("http://x").is_err());
        assert!(host_port("ldap://:389").is_err());
        assert!(host_port("ldap://h:port").is_err());
        assert!(is_loopback("ldap://127.0.0.1:389") && is_loopback("ldap://localhost/"));
        assert!(is_loopback("ldaps://[::1]:636") && !is_loopback("ldap://10.0.0.1"));
    }
}
