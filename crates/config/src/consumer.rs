//! `[[replication.consumer]]`: what a consumer replicates and from where,
//! with the settings operators know from OpenLDAP's `syncrepl` directive.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A secret read from the configuration; never printed.
#[derive(Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(transparent)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// What configuration reads (cn=config, `pando config export`, the audit
/// log) show in place of a consumer's inline password. Given back in a
/// change, it stands for the password stored for the same consumer
/// ([`keep_hidden_credentials`]).
pub const HIDDEN_CREDENTIALS: &str = "****";

/// A configuration table holding a password for another server (a
/// consumer's provider, a push's target).
pub trait Credentialed {
    /// Its inline password.
    fn credentials(&self) -> Option<&Secret>;
    fn set_credentials(&mut self, secret: Option<Secret>);
    /// The same table talking to the same server as the same identity
    /// (for a consumer: rid, provider and bind_dn).
    fn same_peer(&self, other: &Self) -> bool;
}

impl Credentialed for ConsumerConfig {
    fn credentials(&self) -> Option<&Secret> {
        self.credentials.as_ref()
    }
    fn set_credentials(&mut self, secret: Option<Secret>) {
        self.credentials = secret;
    }
    fn same_peer(&self, o: &Self) -> bool {
        o.rid == self.rid && o.provider == self.provider && o.bind_dn == self.bind_dn
    }
}

/// The tables as a configuration read shows them: inline passwords
/// replaced by [`HIDDEN_CREDENTIALS`].
pub fn hide_credentials<T: Credentialed>(tables: &mut [T]) {
    for c in tables {
        if c.credentials().is_some() {
            c.set_credentials(Some(Secret(HIDDEN_CREDENTIALS.into())));
        }
    }
}

/// A table given back with the placeholder password (a tool writing back
/// what it read) keeps the password `stored` holds for it, as long as it
/// is the same table talking to the same server as the same identity
/// ([`Credentialed::same_peer`]): the stored password never goes to a host
/// an administrator names without giving it again. Where that does not
/// hold the placeholder stays, and validation refuses it.
pub fn keep_hidden_credentials<T: Credentialed>(tables: &mut [T], stored: &[T]) {
    for c in tables {
        if c.credentials().map(|s| s.0.as_str()) != Some(HIDDEN_CREDENTIALS) {
            continue;
        }
        let same = stored.iter().find(|o| o.same_peer(c));
        if let Some(secret) = same.and_then(|o| o.credentials().cloned()) {
            c.set_credentials(Some(secret));
        }
    }
}

/// A duration given as seconds or as `dd:hh:mm:ss` (syncrepl's interval).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum Interval {
    Seconds(u64),
    Text(String),
}

impl Interval {
    pub fn duration(&self) -> Result<Duration, String> {
        match self {
            Interval::Seconds(s) => Ok(Duration::from_secs(*s)),
            Interval::Text(t) => {
                let parts: Vec<&str> = t.split(':').collect();
                let nums: Result<Vec<u64>, _> = parts.iter().map(|p| p.parse::<u64>()).collect();
                match (parts.len(), nums) {
                    (4, Ok(n)) if n[1] < 24 && n[2] < 60 && n[3] < 60 => Ok(Duration::from_secs(
                        ((n[0] * 24 + n[1]) * 60 + n[2]) * 60 + n[3],
                    )),
                    (1, Ok(n)) => Ok(Duration::from_secs(n[0])),
                    _ => Err(format!(
                        "'{t}' is neither seconds nor dd:hh:mm:ss (hours below 24, minutes and seconds below 60)"
                    )),
                }
            }
        }
    }
}

/// One consumer: a search of a provider kept in step.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConsumerConfig {
    /// Replica ID, 0-999: names this consumer in cookies, logs and
    /// cn=Monitor.
    pub rid: u16,
    /// `ldap://host:port` or `ldaps://host:port`.
    pub provider: String,
    /// The subtree replicated (a suffix of this server or below one).
    pub search_base: String,
    /// `sub` (default), `one`, `base` or `children`.
    #[serde(default = "default_scope")]
    pub scope: String,
    #[serde(default = "default_filter")]
    pub filter: String,
    /// Attributes asked for (default `*` and `+`).
    #[serde(default = "default_attrs")]
    pub attrs: Vec<String>,
    /// `refreshAndPersist` (default) or `refreshOnly`.
    #[serde(default = "default_type", rename = "type")]
    pub kind: String,
    /// refreshOnly: time between refreshes (seconds or `dd:hh:mm:ss`).
    #[serde(default = "default_interval")]
    pub interval: Interval,
    /// After a failure: pairs of seconds and tries, the last count may be
    /// `+` (forever), as syncrepl's `retry` ("60 10 300 +").
    #[serde(default = "default_retry")]
    pub retry: String,
    /// `simple` (default), `sasl_external` (the TLS client certificate)
    /// or `none` (anonymous).
    #[serde(default = "default_bind")]
    pub bind_method: String,
    #[serde(default)]
    pub bind_dn: String,
    /// The simple bind password, or `credentials_file` holding it.
    #[serde(default)]
    pub credentials: Option<Secret>,
    #[serde(default)]
    pub credentials_file: Option<PathBuf>,
    /// StartTLS on an ldap:// provider (refused if it fails).
    #[serde(default)]
    pub start_tls: bool,
    /// Accept a simple bind over plain ldap:// to a host other than this
    /// one (a lab without TLS): the password crosses the network in clear.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_plaintext_password: bool,
    /// CA certificates (PEM) the provider's certificate must chain to;
    /// unset: the system's roots.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM) for `sasl_external`.
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    /// TCP keepalive idle time in seconds (0: off).
    #[serde(default = "default_keepalive")]
    pub keepalive_secs: u64,
    /// Connecting, binding, and each wait for the provider during a
    /// refresh, in seconds.
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
    /// Where writes to the replicated subtree are referred (default: the
    /// provider).
    #[serde(default)]
    pub update_referral: Option<String>,
    /// How often to ask the provider how many changes this consumer lacks
    /// (`repl::lag`), in seconds (0: never).
    #[serde(default = "default_count_behind")]
    pub count_behind_secs: u64,
    /// How often to compare the subtree held here with the provider's by
    /// content (`repl::check`: hash trees over the entries, not contextCSN),
    /// in seconds (0: never).
    #[serde(default = "default_check")]
    pub check_secs: u64,
    /// Into how many slices of the entryUUID space a comparison with a
    /// provider read whole (slapd) is cut, one slice per pass (1, 16, 256
    /// or 4096): what bounds a pass's reading and memory (the slice's
    /// digests, about 200 bytes an entry). A Pando provider is compared
    /// whole at every pass.
    #[serde(default = "default_check_slices")]
    pub check_slices: u32,
    /// `default` (entries whole) or `accesslog`: delta-sync, following
    /// the provider's access log (OpenLDAP's `syncdata=accesslog`) once a
    /// full refresh of the data has given a cookie.
    #[serde(default = "default_syncdata")]
    pub syncdata: String,
    /// Delta-sync: where the provider's log is.
    #[serde(default = "default_logbase")]
    pub logbase: String,
    /// Delta-sync: which of its records are changes to apply.
    #[serde(default = "default_logfilter")]
    pub logfilter: String,
    /// Also follow the provider's configuration (OpenLDAP replicates
    /// cn=config with a consumer of it): every shared key changed there
    /// later than here is taken (all keys but this server's own: its ID,
    /// listeners, files, consumers and pushes). The provider must be a
    /// Pando server and the consumer's identity one of its
    /// administrators.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub config: bool,
}

fn default_syncdata() -> String {
    "default".into()
}
fn default_logbase() -> String {
    "cn=accesslog".into()
}
fn default_logfilter() -> String {
    "(&(objectClass=auditWriteObject)(reqResult=0))".into()
}

fn default_scope() -> String {
    "sub".into()
}
fn default_filter() -> String {
    "(objectClass=*)".into()
}
fn default_attrs() -> Vec<String> {
    vec!["*".into(), "+".into()]
}
fn default_type() -> String {
    "refreshAndPersist".into()
}
fn default_interval() -> Interval {
    Interval::Seconds(86_400)
}
fn default_retry() -> String {
    "60 10 300 +".into()
}
pub(crate) fn default_bind() -> String {
    "simple".into()
}
pub(crate) fn default_keepalive() -> u64 {
    60
}
pub(crate) fn default_timeout() -> u64 {
    30
}
fn default_count_behind() -> u64 {
    30
}
fn default_check() -> u64 {
    3600
}
fn default_check_slices() -> u32 {
    16
}

/// How long to wait before each retry after a failure, from a retry
/// schedule: `(wait, tries)` pairs, `tries` None for "forever".
#[derive(Clone, Debug, PartialEq)]
pub struct Retry(pub Vec<(Duration, Option<u32>)>);

impl Retry {
    pub fn parse(text: &str) -> Result<Retry, String> {
        let words: Vec<&str> = text.split_whitespace().collect();
        if words.is_empty() || !words.len().is_multiple_of(2) {
            return Err(format!(
                "'{text}' is not pairs of seconds and tries (e.g. \"60 10 300 +\")"
            ));
        }
        let mut out = Vec::new();
        for (i, pair) in words.chunks(2).enumerate() {
            let secs: u64 = pair[0]
                .parse()
                .map_err(|_| format!("'{}' in '{text}' is not a number of seconds", pair[0]))?;
            let tries = match pair[1] {
                "+" if i == words.len() / 2 - 1 => None,
                "+" => return Err(format!("'+' (forever) may only end '{text}'")),
                n => Some(
                    n.parse::<u32>()
                        .map_err(|_| format!("'{n}' in '{text}' is not a count of tries or '+'"))?,
                ),
            };
            out.push((Duration::from_secs(secs), tries));
        }
        Ok(Retry(out))
    }

    /// The wait before try number `n` (from 1) after a failure; None: give
    /// up.
    pub fn wait(&self, n: u32) -> Option<Duration> {
        let mut left = n;
        for &(wait, tries) in &self.0 {
            match tries {
                None => return Some(wait),
                Some(t) if left <= t => return Some(wait),
                Some(t) => left -= t,
            }
        }
        None
    }
}

/// How a server reaches and binds to another (a consumer to its provider,
/// a push to its target): the settings both share, checked alike.
#[derive(Clone, Debug)]
pub struct Link<'a> {
    /// What the other server is to this one (`provider`, `target`).
    pub role: &'static str,
    /// What the table is called in messages (`consumer rid 001`).
    pub name: String,
    pub url: &'a str,
    pub bind_method: &'a str,
    pub bind_dn: &'a str,
    pub credentials: Option<&'a Secret>,
    pub credentials_file: Option<&'a PathBuf>,
    pub start_tls: bool,
    pub allow_plaintext_password: bool,
    pub tls_ca_file: Option<&'a PathBuf>,
    pub tls_cert_file: Option<&'a PathBuf>,
    pub tls_key_file: Option<&'a PathBuf>,
    pub keepalive_secs: u64,
    pub timeout_secs: u64,
}

impl Link<'_> {
    /// The bind, TLS and timeout settings; the error names the key and
    /// the problem.
    pub fn check(&self) -> Result<(), (String, String)> {
        let e = |k: &str, p: String| Err((k.to_string(), p));
        let role = self.role;
        match self.bind_method {
            "simple" => {
                if self.bind_dn.is_empty() {
                    return e("bind_dn", "a simple bind needs bind_dn".into());
                }
                if self.credentials.is_none() == self.credentials_file.is_none() {
                    return e(
                        "credentials",
                        "a simple bind needs exactly one of credentials and credentials_file"
                            .into(),
                    );
                }
                if let Some(p) = self.hidden_or_plaintext() {
                    return Err(p);
                }
            }
            "sasl_external" => {
                if self.tls_cert_file.is_none() || self.tls_key_file.is_none() {
                    return e(
                        "tls_cert_file",
                        "sasl_external needs tls_cert_file and tls_key_file".into(),
                    );
                }
                if !(self.start_tls || self.url.starts_with("ldaps://")) {
                    return e(
                        "bind_method",
                        format!("sasl_external needs TLS: an ldaps:// {role} or start_tls = true"),
                    );
                }
            }
            "none" => {}
            other => {
                return e(
                    "bind_method",
                    format!("'{other}' is not one of simple, sasl_external, none"),
                )
            }
        }
        if self.start_tls && self.url.starts_with("ldaps://") {
            return e("start_tls", format!("an ldaps:// {role} is already TLS"));
        }
        if self.timeout_secs == 0 {
            return e("timeout_secs", "must be at least 1".into());
        }
        Ok(())
    }

    /// A simple bind's password must be given (not the placeholder of a
    /// read) and must not cross a network in clear: an ldaps:// URL,
    /// StartTLS, a loopback address (the password never leaves the host),
    /// or the explicit `allow_plaintext_password`.
    fn hidden_or_plaintext(&self) -> Option<(String, String)> {
        let (name, role) = (&self.name, self.role);
        if self.credentials.map(|s| s.0.as_str()) == Some(HIDDEN_CREDENTIALS) {
            return Some((
                "credentials".into(),
                format!(
                    "{name}: '{HIDDEN_CREDENTIALS}' is what configuration reads show in place of the password; \
                     it keeps the stored password only for the same rid, {role} and bind_dn. Give the password (or credentials_file)"
                ),
            ));
        }
        let clear = self.url.starts_with("ldap://")
            && !self.start_tls
            && !self.allow_plaintext_password
            && !pando_proto::url::is_loopback(self.url);
        clear.then(|| {
            (
                "start_tls".into(),
                format!(
                    "{name}: a simple bind to {} over plain ldap:// sends the password in clear; \
                     use an ldaps:// {role} or start_tls = true (allow_plaintext_password = true accepts it, for a lab)",
                    self.url
                ),
            )
        })
    }
}

impl ConsumerConfig {
    /// Check the settings; the error names the problem (the caller adds
    /// the key).
    pub fn check(&self) -> Result<(), (String, String)> {
        let e = |k: &str, p: String| Err((k.to_string(), p));
        if self.rid > 999 {
            return e("rid", "must be between 0 and 999".into());
        }
        if !(self.provider.starts_with("ldap://") || self.provider.starts_with("ldaps://")) {
            return e(
                "provider",
                format!("'{}' is not an ldap:// or ldaps:// URL", self.provider),
            );
        }
        if !matches!(self.scope.as_str(), "sub" | "one" | "base" | "children") {
            return e(
                "scope",
                format!("'{}' is not one of sub, one, base, children", self.scope),
            );
        }
        if pando_proto::Filter::parse(&self.filter).is_err() {
            return e(
                "filter",
                format!("'{}' is not a valid LDAP filter", self.filter),
            );
        }
        if !matches!(self.kind.as_str(), "refreshOnly" | "refreshAndPersist") {
            return e(
                "type",
                format!("'{}' is not refreshOnly or refreshAndPersist", self.kind),
            );
        }
        if let Err(p) = self.interval.duration() {
            return e("interval", p);
        }
        if let Err(p) = Retry::parse(&self.retry) {
            return e("retry", p);
        }
        if !matches!(self.check_slices, 1 | 16 | 256 | 4096) {
            return e(
                "check_slices",
                format!("{} is not one of 1, 16, 256, 4096", self.check_slices),
            );
        }
        self.link().check()?;
        if !matches!(self.syncdata.as_str(), "default" | "accesslog") {
            return e(
                "syncdata",
                format!("'{}' is not default or accesslog", self.syncdata),
            );
        }
        if pando_model::Dn::parse(&self.logbase).is_err() {
            return e("logbase", format!("'{}' is not a DN", self.logbase));
        }
        if pando_proto::Filter::parse(&self.logfilter).is_err() {
            return e(
                "logfilter",
                format!("'{}' is not a valid LDAP filter", self.logfilter),
            );
        }
        Ok(())
    }

    /// How this consumer reaches and binds to its provider.
    pub fn link(&self) -> Link<'_> {
        Link {
            role: "provider",
            name: format!("consumer rid {:03}", self.rid),
            url: &self.provider,
            bind_method: &self.bind_method,
            bind_dn: &self.bind_dn,
            credentials: self.credentials.as_ref(),
            credentials_file: self.credentials_file.as_ref(),
            start_tls: self.start_tls,
            allow_plaintext_password: self.allow_plaintext_password,
            tls_ca_file: self.tls_ca_file.as_ref(),
            tls_cert_file: self.tls_cert_file.as_ref(),
            tls_key_file: self.tls_key_file.as_ref(),
            keepalive_secs: self.keepalive_secs,
            timeout_secs: self.timeout_secs,
        }
    }

    pub fn persist(&self) -> bool {
        self.kind == "refreshAndPersist"
    }

    /// Delta-sync (`syncdata = "accesslog"`).
    pub fn delta(&self) -> bool {
        self.syncdata == "accesslog"
    }

    /// The URL writes to the replicated subtree are referred to.
    pub fn referral(&self) -> String {
        self.update_referral
            .clone()
            .unwrap_or_else(|| self.provider.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_schedules_and_intervals_parse_as_syncrepl_writes_them() {
        let r = Retry::parse("60 10 300 +").unwrap();
        assert_eq!(r.wait(1), Some(Duration::from_secs(60)));
        assert_eq!(r.wait(10), Some(Duration::from_secs(60)));
        assert_eq!(r.wait(11), Some(Duration::from_secs(300)));
        assert_eq!(r.wait(10_000), Some(Duration::from_secs(300)));
        let r = Retry::parse("5 2").unwrap();
        assert_eq!((r.wait(2), r.wait(3)), (Some(Duration::from_secs(5)), None));
        for bad in ["", "60", "60 +  300 2", "x 1", "60 y"] {
            assert!(Retry::parse(bad).is_err(), "{bad}");
        }
        let i = Interval::Text("01:02:03:04".into());
        assert_eq!(i.duration().unwrap().as_secs(), 93_784);
        assert!(Interval::Text("00:25:00:00".into()).duration().is_err());
        assert_eq!(Interval::Seconds(5).duration().unwrap().as_secs(), 5);
    }

    fn consumer(provider: &str, extra: &str) -> ConsumerConfig {
        let text = format!(
            "rid = 5\nprovider = \"{provider}\"\nsearch_base = \"dc=x\"\nbind_dn = \"cn=r\"\ncredentials = \"pw\"\n{extra}"
        );
        toml::from_str(&text).unwrap()
    }

    #[test]
    fn check_slices_are_powers_of_16_up_to_4096() {
        assert_eq!(consumer("ldaps://db", "").check_slices, 16);
        assert!(consumer("ldaps://db", "check_slices = 256").check().is_ok());
        let (key, problem) = consumer("ldaps://db", "check_slices = 10")
            .check()
            .unwrap_err();
        assert_eq!(key, "check_slices");
        assert!(problem.contains("1, 16, 256, 4096"), "{problem}");
    }

    #[test]
    fn a_password_crosses_a_network_only_under_tls_or_when_allowed() {
        for ok in [
            consumer("ldaps://db.example.com", ""),
            consumer("ldap://db.example.com", "start_tls = true"),
            consumer("ldap://127.0.0.1:389", ""),
            consumer("ldap://[::1]:389", ""),
            consumer("ldap://localhost", ""),
            consumer("ldap://10.1.2.3", "allow_plaintext_password = true"),
            consumer("ldap://10.1.2.3", "bind_method = \"none\""),
        ] {
            assert_eq!(ok.check(), Ok(()), "{}", ok.provider);
        }
        let (key, why) = consumer("ldap://10.1.2.3", "").check().unwrap_err();
        assert_eq!(key, "start_tls");
        assert!(why.contains("rid 005") && why.contains("in clear"), "{why}");
        // The opt-out is written only when set.
        let text = toml::to_string(&consumer("ldaps://x", "")).unwrap();
        assert!(!text.contains("allow_plaintext_password"));
    }

    #[test]
    fn hidden_passwords_come_back_only_for_the_same_consumer_provider_and_identity() {
        let stored = vec![consumer("ldaps://a", "")];
        let mut shown = stored.clone();
        hide_credentials(&mut shown);
        assert_eq!(shown[0].credentials.as_ref().unwrap().0, HIDDEN_CREDENTIALS);
        let mut back = shown.clone();
        keep_hidden_credentials(&mut back, &stored);
        assert_eq!(back, stored);
        let mut moved = shown.clone();
        moved[0].provider = "ldaps://b".into();
        keep_hidden_credentials(&mut moved, &stored);
        assert_eq!(moved[0].credentials.as_ref().unwrap().0, HIDDEN_CREDENTIALS);
        assert_eq!(moved[0].check().unwrap_err().0, "credentials");
    }

    #[test]
    fn credentials_never_print() {
        let s = Secret("hunter2".into());
        assert_eq!(format!("{s:?}"), "<redacted>");
    }
}
