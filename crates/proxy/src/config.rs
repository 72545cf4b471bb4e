//! `[proxy]`: what `pando proxy` listens on, the servers behind it, and
//! how it checks them. Read from its own file (`pando proxy -c FILE`) or
//! built from the command line.

use std::path::PathBuf;

use serde::Deserialize;

/// A proxy's configuration file: `log_level` and the `[proxy]` section.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyFile {
    pub log_level: Option<String>,
    pub proxy: ProxyConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// Listener URLs: `ldap://host:port` (StartTLS offered when a
    /// certificate is set), `ldaps://host:port` or `ldapi:///absolute/path`.
    pub listen: Vec<String>,
    /// The certificate chain (PEM) clients are shown, and its key.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// `[[proxy.upstream]]`: the servers, in order of preference for writes.
    pub upstream: Vec<UpstreamConfig>,
    /// Seconds between two health checks of each server.
    pub health_secs: u64,
    /// Connecting, binding and each answer awaited from a server, seconds.
    pub timeout_secs: u64,
    /// A replica whose contextCSN (read at `base`) is behind the active
    /// provider's by more than this many seconds leaves the read rotation
    /// until it catches up. 0: lag is not checked.
    pub max_lag_secs: u64,
    /// Where contextCSN is read for the lag check ("" = no lag check).
    pub base: String,
    /// Connections per server shared by anonymous clients' operations.
    pub connections: usize,
    /// The identity of health and lag checks (empty: anonymous).
    pub bind_dn: String,
    /// The file holding `bind_dn`'s password.
    pub credentials_file: Option<PathBuf>,
    /// Every message decoded, one line each, to this file ("-": standard
    /// output). Unset: none.
    pub decode_log: Option<PathBuf>,
    /// `text` or `json` lines in the decode log.
    pub decode_format: String,
    /// Every client request recorded, replayable with `pando bench
    /// --replay`, to this file. Unset: none.
    pub record: Option<PathBuf>,
    /// Keep simple binds' passwords in the record (else withheld).
    pub record_credentials: bool,
    /// The largest message taken from a client or a server, bytes.
    pub max_pdu_bytes: usize,
    /// Client connections served at once; more are closed on accept.
    pub max_connections: usize,
    /// Operations one client connection may have running; more are
    /// answered `busy`.
    pub max_ops_per_connection: usize,
    /// Bytes of responses that may wait for one client (a slow reader)
    /// before it is disconnected; until then it holds up no one else.
    pub max_client_queue_bytes: usize,
    /// After a client's write, its reads go only to servers that hold it
    /// (by contextCSN), the provider if no replica does yet.
    pub read_your_writes: bool,
    /// `none`, or `replicas:N`: a write's success is answered only once N
    /// servers besides the one that took it hold it.
    pub acknowledge: String,
    /// How long a write waits for those N, seconds; past it the client is
    /// answered `unavailable` (the write was made, not yet copied).
    pub acknowledge_timeout_secs: u64,
    /// `host:port` of the live dashboard (`GET /dashboard`): each server's
    /// state, operations and outstanding ones second by second. Loopback
    /// addresses only. Unset: off.
    pub dashboard_listen: Option<String>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            listen: vec!["ldap://127.0.0.1:3390".into()],
            tls_cert_file: None,
            tls_key_file: None,
            upstream: Vec::new(),
            health_secs: 2,
            timeout_secs: 5,
            max_lag_secs: 0,
            base: String::new(),
            connections: 4,
            bind_dn: String::new(),
            credentials_file: None,
            decode_log: None,
            decode_format: "text".into(),
            record: None,
            record_credentials: false,
            max_pdu_bytes: 16 << 20,
            max_connections: 10_000,
            max_ops_per_connection: 256,
            max_client_queue_bytes: 32 << 20,
            read_your_writes: true,
            acknowledge: "none".into(),
            acknowledge_timeout_secs: 5,
            dashboard_listen: None,
        }
    }
}

/// One server behind the proxy.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// `ldap://host:port` or `ldaps://host:port`.
    pub url: String,
    /// `provider` (takes writes; the first healthy one in the list is the
    /// active one) or `replica` (reads only).
    pub role: String,
}

impl ProxyConfig {
    /// N of `acknowledge = "replicas:N"` (0 for `none`).
    pub fn acknowledge_replicas(&self) -> Result<usize, String> {
        if self.acknowledge == "none" {
            return Ok(0);
        }
        self.acknowledge
            .strip_prefix("replicas:")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&n| n >= 1 && n < self.upstream.len())
            .ok_or_else(|| {
                format!(
                    "proxy.acknowledge: {:?}: none, or replicas:N with N from 1 to the number of other servers ({})",
                    self.acknowledge,
                    self.upstream.len().saturating_sub(1)
                )
            })
    }

    /// Every value checked; the message names the key and what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.listen.is_empty() {
            return Err("proxy.listen: at least one listener is needed".into());
        }
        for l in &self.listen {
            let ok =
                l.starts_with("ldap://") || l.starts_with("ldaps://") || l.starts_with("ldapi:///");
            if !ok {
                return Err(format!(
                    "proxy.listen: {l:?}: ldap://host:port, ldaps://host:port or ldapi:///absolute/path"
                ));
            }
            if l.starts_with("ldaps://") && self.tls_cert_file.is_none() {
                return Err(format!(
                    "proxy.listen: {l:?} needs proxy.tls_cert_file and proxy.tls_key_file"
                ));
            }
        }
        if let Some(a) = &self.dashboard_listen {
            let addr: std::net::SocketAddr = a.parse().map_err(|_| {
                format!("proxy.dashboard_listen: {a:?} is not an address like 127.0.0.1:9390")
            })?;
            if !addr.ip().is_loopback() {
                return Err(format!(
                    "proxy.dashboard_listen: {a:?} is not a loopback address: the proxy's dashboard has no login; reach it through an SSH tunnel"
                ));
            }
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err("proxy.tls_cert_file and proxy.tls_key_file go together".into());
        }
        for u in &self.upstream {
            if u.role != "provider" && u.role != "replica" {
                return Err(format!(
                    "proxy.upstream {:?}: role {:?}: provider or replica",
                    u.url, u.role
                ));
            }
            pando_client::check_url(&u.url)
                .map_err(|e| format!("proxy.upstream {:?}: {e}", u.url))?;
        }
        if !self.upstream.iter().any(|u| u.role == "provider") {
            return Err("proxy.upstream: at least one server with role = \"provider\" is needed (writes go to it)".into());
        }
        if self.health_secs == 0 || self.timeout_secs == 0 {
            return Err("proxy.health_secs and proxy.timeout_secs: at least 1".into());
        }
        if self.connections == 0 || self.connections > 64 {
            return Err(format!("proxy.connections: {}: 1 to 64", self.connections));
        }
        if self.max_lag_secs > 0 && self.base.is_empty() {
            return Err("proxy.max_lag_secs needs proxy.base (where contextCSN is read)".into());
        }
        if !matches!(self.decode_format.as_str(), "text" | "json") {
            return Err(format!(
                "proxy.decode_format: {:?}: text or json",
                self.decode_format
            ));
        }
        self.acknowledge_replicas()?;
        if self.acknowledge_timeout_secs == 0 {
            return Err("proxy.acknowledge_timeout_secs: at least 1".into());
        }
        if self.max_connections == 0 || self.max_ops_per_connection == 0 {
            return Err(
                "proxy.max_connections and proxy.max_ops_per_connection: at least 1".into(),
            );
        }
        if self.max_pdu_bytes < 1024 {
            return Err("proxy.max_pdu_bytes: at least 1024".into());
        }
        if self.max_client_queue_bytes < self.max_pdu_bytes {
            return Err(
                "proxy.max_client_queue_bytes: at least max_pdu_bytes (a response must fit)".into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ProxyConfig, String> {
        let f: ProxyFile = toml::from_str(text).map_err(|e| e.to_string())?;
        f.proxy.validate().map(|_| f.proxy)
    }

    #[test]
    fn a_file_is_read_and_checked() {
        let c = parse(
            r#"
[proxy]
listen = ["ldap://127.0.0.1:4000"]
max_lag_secs = 5
base = "dc=example,dc=com"
[[proxy.upstream]]
url = "ldap://127.0.0.1:4001"
role = "provider"
[[proxy.upstream]]
url = "ldap://127.0.0.1:4002"
role = "replica"
"#,
        )
        .unwrap();
        assert_eq!(c.upstream.len(), 2);
        assert_eq!(c.health_secs, 2);
        let no_provider = "[proxy]\n[[proxy.upstream]]\nurl = \"ldap://h:1\"\nrole = \"replica\"\n";
        assert!(parse(no_provider).unwrap_err().contains("provider"));
        let bad_role = "[proxy]\n[[proxy.upstream]]\nurl = \"ldap://h:1\"\nrole = \"primary\"\n";
        assert!(parse(bad_role).unwrap_err().contains("primary"));
        let lag = "[proxy]\nmax_lag_secs = 3\n[[proxy.upstream]]\nurl = \"ldap://h:1\"\nrole = \"provider\"\n";
        assert!(parse(lag).unwrap_err().contains("proxy.base"));
        assert!(parse("[proxy]\nlisten_on = []\n")
            .unwrap_err()
            .contains("listen_on"));
    }
}
