//! The little HTTP Pando speaks (the crate `pando-web`): the metrics
//! endpoint and the live dashboards of the server and of `pando proxy`.
//! One request per connection (`Connection: close`), a bounded head read
//! within a time limit, whole responses; and the assets both dashboards
//! load (uPlot, its license, an icon, the styles they share), embedded in the binary so a page
//! works with no internet access.
//!
//! Layer: below the server and the proxy, above nothing of Pando's: it
//! must not name LDAP, the store, the server's state or the proxy's.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Longest request head accepted.
const MAX_REQUEST: usize = 8192;
/// A client gets this long to send its request.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The charts' library and what goes with it.
pub const UPLOT_JS: &[u8] = include_bytes!("../assets/uPlot.iife.min.js");
pub const UPLOT_CSS: &[u8] = include_bytes!("../assets/uPlot.min.css");
pub const UPLOT_LICENSE: &[u8] = include_bytes!("../assets/LICENSE.uPlot");
pub const ICON: &[u8] = include_bytes!("../assets/favicon.svg");
/// The styles both pages share.
pub const STYLE: &[u8] = include_bytes!("../assets/dashboard.css");

/// An asset every dashboard page loads, by its path under `/dashboard/`.
pub fn shared_asset(path: &str) -> Option<(&'static str, &'static [u8])> {
    Some(match path {
        "/dashboard/uPlot.iife.min.js" => ("text/javascript; charset=utf-8", UPLOT_JS),
        "/dashboard/uPlot.min.css" => ("text/css; charset=utf-8", UPLOT_CSS),
        "/dashboard/LICENSE.uPlot" => ("text/plain; charset=utf-8", UPLOT_LICENSE),
        "/dashboard/favicon.svg" => ("image/svg+xml", ICON),
        "/dashboard/dashboard.css" => ("text/css; charset=utf-8", STYLE),
        _ => return None,
    })
}

/// Now, in seconds since 1970: how the dashboards' data names a second.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A request's first line and head.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub query: String,
    /// The whole head, for its header lines.
    pub head: String,
}

impl Request {
    /// The value of `name=` in the query string.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .split('&')
            .find_map(|p| p.strip_prefix(name).and_then(|rest| rest.strip_prefix('=')))
    }

    /// The credentials of `Authorization: Basic` (user ID, password).
    /// Nothing of them is logged by this crate.
    pub fn basic_credentials(&self) -> Option<(String, Vec<u8>)> {
        use base64::Engine;
        let value = self.head.lines().skip(1).find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("authorization")
                .then(|| value.trim())
        })?;
        let (scheme, b64) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("basic") {
            return None;
        }
        let raw = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .ok()?;
        // The user ID of Basic cannot hold ':' (RFC 7617); the password can.
        let at = raw.iter().position(|&b| b == b':')?;
        let user = String::from_utf8(raw[..at].to_vec()).ok()?;
        Some((user, raw[at + 1..].to_vec()))
    }
}

/// Read one request's head from `stream`. Err: what to answer instead
/// (an empty answer: close without one).
pub async fn read_request<S>(stream: &mut S) -> Result<Request, Vec<u8>>
where
    S: AsyncRead + Unpin,
{
    let mut buf = Vec::with_capacity(1024);
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_REQUEST {
            return Err(response(431, "text/plain", b"request too large\n"));
        }
        let mut chunk = [0u8; 1024];
        match tokio::time::timeout(READ_TIMEOUT, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Err(Vec::new()),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut first = head.lines().next().unwrap_or("").split(' ');
    let (method, target) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    Ok(Request {
        method: method.to_string(),
        path: path.to_string(),
        query: query.to_string(),
        head,
    })
}

/// Write `reply` (the head only for a HEAD request) and close.
pub async fn send<S>(stream: &mut S, method: &str, mut reply: Vec<u8>)
where
    S: AsyncWrite + Unpin,
{
    if method == "HEAD" {
        let at = reply
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(reply.len(), |i| i + 4);
        reply.truncate(at);
    }
    let _ = stream.write_all(&reply).await;
    let _ = stream.shutdown().await;
}

/// A whole response. What is served loads nothing from elsewhere
/// (`default-src 'self'`).
pub fn response(code: u16, ctype: &str, body: &[u8]) -> Vec<u8> {
    let reason = match code {
        200 => "OK",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    };
    let mut r = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n\
         Content-Security-Policy: default-src 'self'; style-src 'self' 'unsafe-inline'\r\n\
         Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// 401 asking for Basic credentials; `who` says which.
pub fn unauthorized(realm: &str, who: &str) -> Vec<u8> {
    let body = format!("{who}\n");
    format!(
        "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"{realm}\", charset=\"UTF-8\"\r\n\
         Content-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    #[test]
    fn a_request_head_is_read_and_its_parts_found() {
        let raw = b"GET /dashboard/data?since=17&x=1 HTTP/1.1\r\nHost: a\r\nAuthorization: Basic Y249YWRtaW4sZGM9ZXhhbXBsZTpwdzpwdw==\r\n\r\n";
        let r = rt().block_on(read_request(&mut &raw[..])).unwrap();
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("GET", "/dashboard/data")
        );
        assert_eq!(r.param("since"), Some("17"));
        assert_eq!(r.param("x"), Some("1"));
        assert_eq!(r.param("s"), None);
        let (user, pw) = r.basic_credentials().unwrap();
        assert_eq!(
            (user.as_str(), pw.as_slice()),
            ("cn=admin,dc=example", &b"pw:pw"[..])
        );
    }

    #[test]
    fn an_endless_or_cut_head_gets_no_request() {
        let long = vec![b'a'; MAX_REQUEST + 2000];
        let err = rt().block_on(read_request(&mut &long[..])).unwrap_err();
        assert!(err.starts_with(b"HTTP/1.1 431"));
        let cut = b"GET / HTTP/1.1\r\nHost: a\r\n";
        assert!(rt()
            .block_on(read_request(&mut &cut[..]))
            .unwrap_err()
            .is_empty());
    }

    #[test]
    fn responses_say_their_length_and_load_nothing_from_elsewhere() {
        let r = String::from_utf8(response(200, "text/plain", b"hello")).unwrap();
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(r.contains("Content-Length: 5\r\n") && r.ends_with("\r\n\r\nhello"));
        assert!(r.contains("default-src 'self'"));
        assert!(shared_asset("/dashboard/uPlot.iife.min.js").is_some_and(|(_, b)| b.len() > 40_000));
        assert!(shared_asset("/dashboard/other.js").is_none());
    }
}
