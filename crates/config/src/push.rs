//! `[[replication.push]]`: a subtree of this server written, change by
//! change, to another LDAP server that cannot pull it (slapd without
//! syncprov, or any server taking ordinary writes): OpenLDAP's push-mode
//! syncrepl, kept in this server's own change log order.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::consumer::{
    default_bind, default_keepalive, default_timeout, Credentialed, Link, Retry, Secret,
};

/// One push: this server's subtree `search_base` written to `target`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PushConfig {
    /// Names this push (0-999) in logs, `pando repl status` and
    /// cn=Monitor, and its place in the change log kept in the store.
    pub rid: u16,
    /// `ldap://host:port` or `ldaps://host:port`: the server written to.
    pub target: String,
    /// The subtree pushed (a suffix of this server or below one); the
    /// target holds it under the same DN.
    pub search_base: String,
    /// Attributes never pushed (besides operational ones, which never
    /// are: the target keeps its own entryUUID, entryCSN, timestamps).
    #[serde(default)]
    pub exattrs: Vec<String>,
    /// After a failure (the target down, refusing the bind): pairs of
    /// seconds and tries, the last count may be `+` (forever).
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
    /// StartTLS on an ldap:// target (refused if it fails).
    #[serde(default)]
    pub start_tls: bool,
    /// Accept a simple bind over plain ldap:// to a host other than this
    /// one (a lab without TLS): the password crosses the network in clear.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_plaintext_password: bool,
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    /// TCP keepalive idle time in seconds (0: off).
    #[serde(default = "default_keepalive")]
    pub keepalive_secs: u64,
    /// Connecting, binding, and each wait for the target's answer, in
    /// seconds.
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
}

fn default_retry() -> String {
    "10 30 60 +".into()
}

impl PushConfig {
    /// Check the settings; the error names the problem (the caller adds
    /// the key).
    pub fn check(&self) -> Result<(), (String, String)> {
        let e = |k: &str, p: String| Err((k.to_string(), p));
        if self.rid > 999 {
            return e("rid", "must be between 0 and 999".into());
        }
        if !(self.target.starts_with("ldap://") || self.target.starts_with("ldaps://")) {
            return e(
                "target",
                format!("'{}' is not an ldap:// or ldaps:// URL", self.target),
            );
        }
        if let Err(p) = Retry::parse(&self.retry) {
            return e("retry", p);
        }
        for a in &self.exattrs {
            if a.is_empty()
                || !a
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ';' || c == '.')
            {
                return e("exattrs", format!("'{a}' is not an attribute name"));
            }
        }
        self.link().check()
    }

    /// How this push reaches and binds to its target.
    pub fn link(&self) -> Link<'_> {
        Link {
            role: "target",
            name: format!("push rid {:03}", self.rid),
            url: &self.target,
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
}

impl Credentialed for PushConfig {
    fn credentials(&self) -> Option<&Secret> {
        self.credentials.as_ref()
    }
    fn set_credentials(&mut self, secret: Option<Secret>) {
        self.credentials = secret;
    }
    fn same_peer(&self, o: &Self) -> bool {
        o.rid == self.rid && o.target == self.target && o.bind_dn == self.bind_dn
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::{hide_credentials, keep_hidden_credentials, HIDDEN_CREDENTIALS};

    fn push(target: &str, extra: &str) -> PushConfig {
        let text = format!(
            "rid = 7\ntarget = \"{target}\"\nsearch_base = \"dc=x\"\nbind_dn = \"cn=w\"\ncredentials = \"pw\"\n{extra}"
        );
        toml::from_str(&text).unwrap()
    }

    #[test]
    fn settings_are_checked_and_name_the_key() {
        assert_eq!(push("ldap://127.0.0.1:389", "").check(), Ok(()));
        assert_eq!(push("ldaps://db.example.com", "").retry, "10 30 60 +");
        for (extra, target, key, says) in [
            ("", "http://x", "target", "not an ldap://"),
            ("rid = 1000", "ldaps://x", "rid", "between 0 and 999"),
            ("retry = \"5\"", "ldaps://x", "retry", "pairs of seconds"),
            (
                "exattrs = [\"a b\"]",
                "ldaps://x",
                "exattrs",
                "not an attribute",
            ),
            ("", "ldap://10.1.2.3", "start_tls", "push rid 007"),
            (
                "start_tls = true",
                "ldaps://x",
                "start_tls",
                "ldaps:// target is already TLS",
            ),
            (
                "timeout_secs = 0",
                "ldaps://x",
                "timeout_secs",
                "at least 1",
            ),
        ] {
            let text = if extra.starts_with("rid") {
                format!("{extra}\ntarget = \"{target}\"\nsearch_base = \"dc=x\"\nbind_method = \"none\"\n")
            } else {
                String::new()
            };
            let p = if text.is_empty() {
                push(target, extra)
            } else {
                toml::from_str(&text).unwrap()
            };
            let (k, why) = p.check().unwrap_err();
            assert_eq!(k, key, "{extra} {target}: {why}");
            assert!(why.contains(says), "{why}");
        }
    }

    #[test]
    fn hidden_passwords_come_back_only_for_the_same_push_target_and_identity() {
        let stored = vec![push("ldaps://a", "")];
        let mut shown = stored.clone();
        hide_credentials(&mut shown);
        assert_eq!(shown[0].credentials.as_ref().unwrap().0, HIDDEN_CREDENTIALS);
        assert!(!format!("{shown:?}").contains("pw\""));
        let mut back = shown.clone();
        keep_hidden_credentials(&mut back, &stored);
        assert_eq!(back, stored);
        let mut moved = shown.clone();
        moved[0].target = "ldaps://b".into();
        keep_hidden_credentials(&mut moved, &stored);
        let (k, why) = moved[0].check().unwrap_err();
        assert_eq!(k, "credentials");
        assert!(
            why.contains("push rid 007") && why.contains("target"),
            "{why}"
        );
    }
}
