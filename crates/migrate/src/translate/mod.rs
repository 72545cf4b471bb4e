//! The translation proper: an OpenLDAP [`Source`] → a Pando [`Config`] and
//! a [`Report`] of everything not translated exactly.

use std::collections::BTreeMap;
use std::path::PathBuf;

use pando_config::{AccessBy, Config, LimitsFor, OneOrMany};
use pando_model::{Dn, Schema};

use crate::acl::{self, DnSel, Translated};

mod overlays;
use crate::report::{Report, Severity};
use crate::source::{Directive, Section, Source};
use overlays::overlay;

/// Schema files slapd loads that Pando has built in.
const BUILT_IN_SCHEMA: &[&str] = &["core", "cosine", "inetorgperson", "nis", "ppolicy"];

/// Database types whose entries Pando serves.
const DATA_BACKENDS: &[&str] = &["mdb", "hdb", "bdb", "wt", "ldif"];

/// An access rule with where it came from.
#[derive(Clone, Debug)]
pub struct RuleOut {
    pub rule: Translated,
    pub origin: String,
}

pub struct Translation {
    pub config: Config,
    /// The access rules in order, each with its source (for comments).
    pub rules: Vec<RuleOut>,
    /// Schema files to copy beside the configuration: (name, source path).
    pub schema_files: Vec<(String, PathBuf)>,
    /// Replication consumers' bind passwords (replica ID, password), kept
    /// out of the configuration text.
    pub secrets: Vec<(u16, String)>,
    pub report: Report,
}

struct Ctx {
    cfg: Config,
    report: Report,
    schema: Schema,
    /// The source sets limits for anonymous clients itself.
    anonymous_limits_set: bool,
    /// Consumers' bind passwords, by replica ID.
    secrets: Vec<(u16, String)>,
    /// 389-DS: nsslapd-allow-anonymous-access is on (its default).
    dirsrv_anonymous: bool,
    /// The source is 389-DS's.
    dirsrv: bool,
    /// slapd's `add_content_acl on`: adding an entry also needs add on
    /// each of its attributes, which Pando does not check.
    add_content_acl: bool,
}

impl Ctx {
    fn exact(&mut self) {
        self.report.exact += 1;
    }
    fn note(&mut self, s: Severity, d: &Directive, why: impl Into<String>) {
        self.report.add(s, Some(&d.origin), &d.text(), why);
    }
    /// Exact when `notes` is empty, else one finding listing them.
    fn settle(&mut self, d: &Directive, s: Severity, notes: &[String]) {
        if notes.is_empty() {
            self.exact();
        } else {
            self.note(s, d, notes.join("; "));
        }
    }
    fn bad(&mut self, d: &Directive, e: String) {
        self.note(Severity::Dropped, d, format!("not understood: {e}"));
    }
}

pub fn translate(src: &Source) -> Translation {
    let mut cx = Ctx {
        cfg: Config::default(),
        report: Report::default(),
        schema: Schema::standard(),
        anonymous_limits_set: false,
        secrets: Vec::new(),
        dirsrv_anonymous: true,
        dirsrv: src.kind == crate::source::SourceKind::Dirsrv,
        add_content_acl: false,
    };
    // Pando's own administrators are configured from the source below.
    cx.cfg.auth.admins = Vec::new();
    cx.cfg.suffixes = Vec::new();
    let schema_files = schema(&mut cx, src);
    for d in &src.modules {
        cx.note(
            Severity::Note,
            d,
            "modules are built into Pando; nothing to load",
        );
    }
    global(&mut cx, &src.global);
    // slapd.conf's global access rules are the frontend's.
    let mut frontend = src.frontend().cloned().unwrap_or_default();
    frontend
        .directives
        .extend(src.global.all("access").cloned());
    section_settings(&mut cx, &frontend, true);
    let frontend_rules = rules_of(&mut cx, &frontend);
    let log_dbs = access_log_databases(src);
    let mut rules = Vec::new();
    let data: Vec<&Section> = src
        .databases
        .iter()
        .filter(|db| DATA_BACKENDS.contains(&db.kind.as_str()))
        .collect();
    let many = data.len() > 1;
    for db in &src.databases {
        match db.kind.as_str() {
            "frontend" => {}
            "config" => config_database(&mut cx, db),
            "monitor" => {
                if let Some(o) = &db.origin {
                    cx.report.add(
                        Severity::Note,
                        Some(o),
                        "database monitor",
                        "Pando serves cn=Monitor itself (administrators read it)",
                    );
                }
            }
            k if DATA_BACKENDS.contains(&k) => {
                let suffixes: Vec<String> =
                    db.all("suffix").filter_map(|d| d.single().ok()).collect();
                if suffixes
                    .iter()
                    .any(|s| log_dbs.iter().any(|l| same_dn(&cx.schema, l, s)))
                {
                    if let Some(o) = &db.origin {
                        cx.report.add(Severity::Note, Some(o), &format!("database {k} ({})", suffixes.join(", ")),
                            "the access log database: Pando keeps its log under cn=accesslog itself (see the accesslog overlay)");
                    }
                    continue;
                }
                rules.extend(data_database(&mut cx, src, db, &frontend_rules, many));
            }
            other => {
                if let Some(o) = &db.origin {
                    cx.report.add(
                        Severity::Dropped,
                        Some(o),
                        &format!("database {other}"),
                        format!("Pando has no '{other}' backend; its suffixes are not served"),
                    );
                }
            }
        }
    }
    for o in &src.plugins {
        overlay(&mut cx, o);
    }
    finish(&mut cx);
    Translation {
        config: cx.cfg,
        rules,
        schema_files,
        secrets: cx.secrets,
        report: cx.report,
    }
}

/// Where accesslog overlays write: those databases are Pando's cn=accesslog.
fn access_log_databases(src: &Source) -> Vec<String> {
    src.databases
        .iter()
        .flat_map(|db| db.overlays.iter())
        .filter(|o| o.name == "accesslog")
        .flat_map(|o| {
            o.directives
                .iter()
                .filter(|d| d.key == "accesslogdb" || d.key == "logdb")
        })
        .filter_map(|d| d.single().ok())
        .collect()
}

/// What holds for the configuration as a whole, once every part is read.
fn finish(cx: &mut Ctx) {
    if cx.cfg.suffixes.is_empty() {
        cx.report.add(
            Severity::Note,
            None,
            "(no data database)",
            "no suffix found; Pando's default dc=example,dc=com is kept",
        );
        cx.cfg.suffixes = Config::default().suffixes;
    }
    if cx.cfg.root_dn.is_none() && cx.cfg.root_password_hash.take().is_some() {
        cx.report.add(
            Severity::Dropped,
            None,
            "rootpw",
            "a root password with no root DN to go with it",
        );
    }
    if cx.cfg.auth.admins.is_empty() && cx.cfg.root_dn.is_none() {
        cx.cfg.root_dn = Some(String::new());
    }
    anonymous_limits(cx);
    if cx.cfg.tls.cert_file.is_none() {
        let (ldaps, rest): (Vec<String>, Vec<String>) = cx
            .cfg
            .listen
            .iter()
            .cloned()
            .partition(|l| l.starts_with("ldaps://"));
        if !ldaps.is_empty() {
            cx.cfg.listen = rest;
            cx.report.add(Severity::Note, None, "TLS", format!(
                "no certificate file: {} left out of listen until tls.cert_file and tls.key_file are set",
                ldaps.join(", ")
            ));
        }
        let d = Config::default().tls;
        let (certs, ca) = (cx.cfg.tls.client_certs.clone(), cx.cfg.tls.ca_file.take());
        if certs != d.client_certs || ca.is_some() {
            cx.cfg.tls.client_certs = d.client_certs;
            cx.report.add(Severity::Note, None, "TLS", format!(
                "no certificate file: TLS is off until tls.cert_file and tls.key_file are set; then set client_certs = \"{certs}\"{}",
                ca.map(|c| format!(" and ca_file = \"{}\"", c.display())).unwrap_or_default()
            ));
        }
    }
    if cx.dirsrv {
        cx.report.add(Severity::Differs, None, "add and delete rights",
            "Pando judges an add or delete by the rule covering the entry added or deleted (add/delete rights), as the translated ACIs grant them; check with --verify-against");
    }
}

fn same_dn(schema: &Schema, a: &str, b: &str) -> bool {
    norm(schema, a) == norm(schema, b)
}

fn norm(schema: &Schema, dn: &str) -> String {
    Dn::parse(dn)
        .ok()
        .and_then(|d| schema.normalize_dn(&d).ok())
        .unwrap_or_else(|| dn.to_ascii_lowercase())
}

// ------------------------------------------------------------------- schema

fn schema(cx: &mut Ctx, src: &Source) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for s in &src.schema {
        let name = s.name.to_ascii_lowercase();
        let text = format!("schema {}", s.name);
        if BUILT_IN_SCHEMA.contains(&name.as_str()) {
            cx.report.exact += 1;
        } else if name == "rfc2307bis" {
            cx.cfg.posix_schema = "rfc2307bis".into();
            cx.report.add(
                Severity::Note,
                Some(&s.origin),
                &text,
                "posix_schema = \"rfc2307bis\" (built in)",
            );
        } else if name == "schema" {
            // cn=schema.ldif itself: slapd's hard-coded definitions.
        } else {
            // With the files accepted before it: files build on each other.
            let mut files: Vec<PathBuf> = out
                .iter()
                .map(|(_, p): &(String, PathBuf)| p.clone())
                .collect();
            files.push(s.path.clone());
            let file_cfg = Config {
                schema_files: files,
                posix_schema: cx.cfg.posix_schema.clone(),
                ..Config::default()
            };
            match pando_config::schema_files::build(&file_cfg) {
                Ok(built) => {
                    cx.schema = built;
                    out.push((s.name.clone(), s.path.clone()));
                    cx.report.exact += 1;
                }
                Err(e) => cx.report.add(Severity::Dropped, Some(&s.origin), &text,
                    format!("does not load into Pando's schema: {e}; entries using its definitions will not import")),
            }
        }
    }
    if out.is_empty() && cx.cfg.posix_schema != "rfc2307" {
        let cfg = Config {
            posix_schema: cx.cfg.posix_schema.clone(),
            ..Config::default()
        };
        if let Ok(s) = pando_config::schema_files::build(&cfg) {
            cx.schema = s;
        }
    }
    out
}

// ------------------------------------------------------------------- global

fn global(cx: &mut Ctx, g: &Section) {
    for d in &g.directives {
        if d.key == "access" || section_setting(cx, d) {
            continue;
        }
        match d.key.as_str() {
            "serverid" => match d.words().ok().and_then(|w| w.first().and_then(|n| n.parse::<u16>().ok()).map(|n| (n, w.len()))) {
                Some((n, words)) => {
                    cx.cfg.replication.server_id = n;
                    if words > 1 {
                        cx.note(Severity::Note, d, "server ID kept; the URL naming this server is not needed by Pando");
                    } else {
                        cx.exact();
                    }
                }
                None => cx.bad(d, "not a server ID".into()),
            },
            "loglevel" => {
                let v = d.value.to_ascii_lowercase();
                let level = if v.contains("any") || v.contains("-1") || v.contains("trace") || v.contains("args") {
                    "debug"
                } else if v.trim() == "0" || v.contains("none") {
                    "warn"
                } else {
                    "info"
                };
                cx.cfg.log_level = level.into();
                cx.note(Severity::Note, d, format!("log_level = \"{level}\" (Pando logs every operation to the access log when [logs] access is set)"));
            }
            "threads" => match d.single().ok().and_then(|v| v.parse().ok()) {
                Some(n) => {
                    cx.cfg.threads = n;
                    cx.exact();
                }
                None => cx.bad(d, "not a number".into()),
            },
            "idletimeout" => num(cx, d, |c, n| c.limits.idle_timeout = n),
            "writetimeout" => num(cx, d, |c, n| c.limits.write_timeout = n),
            "sockbufmaxincomingauth" => num(cx, d, |c, n| c.limits.max_pdu_bytes = n as usize),
            "sockbufmaxincoming" => num(cx, d, |c, n| c.limits.anonymous.max_pdu_bytes = n as usize),
            "connmaxpendingauth" => num(cx, d, |c, n| c.limits.max_ops_per_connection = n as usize),
            "connmaxpending" => num(cx, d, |c, n| c.limits.anonymous.max_ops = n as usize),
            "tlscertificatefile" => path(cx, d, |c, p| c.tls.cert_file = Some(p)),
            "tlscertificatekeyfile" => path(cx, d, |c, p| c.tls.key_file = Some(p)),
            "tlscacertificatefile" => path(cx, d, |c, p| c.tls.ca_file = Some(p)),
            "tlsverifyclient" | "tlsprotocolmin" => tls_version_or_clients(cx, d),
            "tlscacertificatepath" => cx.note(Severity::Stricter, d, "Pando reads CA certificates from one file (tls.ca_file); concatenate the directory's certificates into one PEM file"),
            "tlsciphersuite" | "tlsdhparamfile" | "tlseccurves" | "tlscrlcheck" | "tlscrlfile" | "tlsrandfile" => {
                cx.note(Severity::Note, d, "Pando uses rustls's safe defaults (TLS 1.2/1.3, forward-secret AEAD suites); not configurable")
            }
            "pidfile" | "argsfile" | "modulepath" | "gentlehup" | "toolthreads" | "listenerthreads" | "threadqueues" => {
                cx.note(Severity::Dropped, d, "no meaning for Pando (one process, no modules)")
            }
            "dirsrvport" | "dirsrvsecureport" | "dirsrvlistenhost" => dirsrv_listener(cx, g, d),
            "addcontentacl" => add_content_acl(cx, d),
            "dirsrvsecurity" => cx.note(Severity::Note, d, "LDAPS is listed in `listen` when nsslapd-security is on"),
            "dirsrvanonymous" => {
                cx.dirsrv_anonymous = d.value.eq_ignore_ascii_case("on");
                cx.settle(d, Severity::Note, &[]);
            }
            "dirsrvsecurebinds" => {
                cx.cfg.auth.require_secure_binds = d.value.eq_ignore_ascii_case("on");
                cx.exact();
            }
            "dirsrvunmapped" => cx.note(Severity::Dropped, d, "no Pando counterpart (logging, tuning and password policy settings; Pando's password policy is the ppolicy overlay with a policy entry, docs/overlays.md)"),
            "dirsrvagreement" => cx.note(Severity::Differs, d, "389-DS replication agreements use its own protocol, which Pando does not speak: set up Pando servers as RFC 4533 consumers or a multi-provider ring instead (docs/replication.md)"),
            "dirsrvcertificate" => cx.note(Severity::Note, d, "389-DS keeps its certificate in an NSS database: export it and its key to PEM (pk12util, openssl pkcs12) and set tls.cert_file and tls.key_file"),
            "authzregexp" => cx.note(Severity::Stricter, d, "not translated: write an [[auth.external_map]] rule for it (docs/access-control.md); until then these identities map to no entry"),
            "authzpolicy" => cx.note(Severity::Stricter, d, "proxied authorization is granted by the 'proxy' right in access rules (docs/access-control.md)"),
            "passwordhash" => cx.note(Severity::Note, d, "Pando hashes clear-text passwords with its [passwords] scheme (default Argon2id); existing {SSHA}, {CRYPT}… hashes keep working"),
            "allow" | "disallow" | "require" | "security" => cx.note(Severity::Differs, d, "no direct counterpart; see [auth] require_secure_binds and the access rules' tls subject"),
            "attributeoptions" | "sortvals" | "rootdse" | "logfile" | "logfilerotate" | "referral" | "localssf" => cx.note(Severity::Dropped, d, "no Pando counterpart"),
            _ => cx.note(Severity::Dropped, d, "no Pando counterpart"),
        }
    }
}

/// `TLSVerifyClient` and `TLSProtocolMin`: tls.client_certs and
/// tls.min_version.
fn tls_version_or_clients(cx: &mut Ctx, d: &Directive) {
    if d.key == "tlsverifyclient" {
        let v = d.single().unwrap_or_default().to_ascii_lowercase();
        let m = match v.as_str() {
            "never" => "none",
            "allow" | "try" => "request",
            "demand" | "hard" | "true" => "require",
            _ => {
                cx.bad(d, "not never/allow/try/demand".into());
                return;
            }
        };
        cx.cfg.tls.client_certs = m.into();
        if v == "allow" {
            cx.note(Severity::Stricter, d, "client_certs = \"request\": a certificate that fails verification ends the handshake (the old server's 'allow' would go on)");
        } else {
            cx.exact();
        }
        return;
    }
    let v = d.single().unwrap_or_default();
    let (m, sev) = match v.as_str() {
        "3.4" => ("1.3", None),
        "3.3" => ("1.2", None),
        _ => ("1.2", Some(Severity::Stricter)),
    };
    cx.cfg.tls.min_version = m.into();
    match sev {
        Some(s) => cx.note(s, d, "Pando accepts TLS 1.2 and 1.3 only"),
        None => cx.exact(),
    }
}

/// 389-DS's port, secure port and listen host: Pando's `listen`, written
/// when the port directive is met (the host and security flag are read
/// from the same entry).
fn dirsrv_listener(cx: &mut Ctx, g: &Section, d: &Directive) {
    if d.key != "dirsrvport" {
        cx.exact();
        return;
    }
    let host = g
        .first("dirsrvlistenhost")
        .map(|h| h.value.clone())
        .unwrap_or_else(|| "0.0.0.0".into());
    let mut listen = vec![
        format!("ldap://{host}:{}", d.value.trim()),
        "ldapi://".into(),
    ];
    let secure = g
        .first("dirsrvsecurity")
        .is_some_and(|s| s.value.eq_ignore_ascii_case("on"));
    if let (true, Some(sp)) = (secure, g.first("dirsrvsecureport")) {
        listen.insert(1, format!("ldaps://{host}:{}", sp.value.trim()));
    }
    cx.cfg.listen = listen;
    cx.note(Severity::Note, d, "listen set from the port, secure port and listen host (ports below 1024 need root at start; see `user`)");
}

/// slapd's general limits also bind anonymous clients; Pando's
/// `[limits.anonymous]` are lower by default. Said, not changed.
fn anonymous_limits(cx: &mut Ctx) {
    if cx.anonymous_limits_set {
        return;
    }
    let (l, a) = (&cx.cfg.limits, &cx.cfg.limits.anonymous);
    let lower = |anon: u32, general: u32| anon != 0 && (general == 0 || anon < general);
    if lower(a.size_limit, l.size_limit) || lower(a.time_limit, l.time_limit) {
        let why = format!(
            "anonymous searches are held to Pando's [limits.anonymous] (size_limit {}, time_limit {} s), below the general limits the old server applies to them ({}, {} s); raise them if anonymous clients need more",
            a.size_limit, a.time_limit, l.size_limit, l.time_limit
        );
        cx.report.add(
            Severity::Stricter,
            None,
            "limits for anonymous clients",
            why,
        );
    }
}

/// `add_content_acl` (global, frontend or database): on, adding an entry
/// also needs add on each of its attributes, which Pando does not check;
/// the add right is then left out of every translated rule.
fn add_content_acl(cx: &mut Ctx, d: &Directive) {
    let on = matches!(
        d.value.trim().to_ascii_lowercase().as_str(),
        "on" | "true" | "yes"
    );
    cx.add_content_acl |= on;
    if on {
        cx.note(Severity::Stricter, d, "adding an entry also needs add on each of its attributes in slapd, which Pando does not check: the add right is left out of every translated rule");
    } else {
        cx.exact();
    }
}

fn num(cx: &mut Ctx, d: &Directive, set: impl FnOnce(&mut Config, u64)) {
    match d.single().ok().and_then(|v| v.parse::<u64>().ok()) {
        Some(n) => {
            set(&mut cx.cfg, n);
            cx.exact();
        }
        None => cx.bad(d, "not a number".into()),
    }
}

fn path(cx: &mut Ctx, d: &Directive, set: impl FnOnce(&mut Config, PathBuf)) {
    match d.single() {
        Ok(p) => {
            set(&mut cx.cfg, PathBuf::from(p));
            cx.exact();
        }
        Err(e) => cx.bad(d, e),
    }
}

/// Settings that may appear globally, in the frontend or in a database.
/// Returns whether `d` was one of them.
fn section_setting(cx: &mut Ctx, d: &Directive) -> bool {
    match d.key.as_str() {
        "sizelimit" | "timelimit" => {
            limit_words(cx, d, None);
            true
        }
        "limits" => {
            limits(cx, d);
            true
        }
        _ => false,
    }
}

fn section_settings(cx: &mut Ctx, s: &Section, frontend: bool) {
    for d in &s.directives {
        if d.key == "access" {
            continue;
        }
        if !section_setting(cx, d) && frontend {
            match d.key.as_str() {
                "addcontentacl" => add_content_acl(cx, d),
                "passwordhash" => cx.note(Severity::Note, d, "Pando hashes clear-text passwords with its [passwords] scheme (default Argon2id); existing hashes keep working"),
                _ => cx.note(Severity::Dropped, d, "no Pando counterpart"),
            }
        }
    }
}

/// `sizelimit 500`, `sizelimit size.soft=10 size.hard=20`, `timelimit …`;
/// into the general limits, or a `[[limits.by]]` entry.
fn limit_words(cx: &mut Ctx, d: &Directive, into: Option<&mut LimitsFor>) {
    let words = match d.words() {
        Ok(w) => w,
        Err(e) => return cx.bad(d, e),
    };
    let kind = if d.key == "timelimit" { "time" } else { "size" };
    let words: Vec<String> = words
        .into_iter()
        .map(|w| {
            if w.contains('=') {
                w
            } else {
                format!("{kind}={w}")
            }
        })
        .collect();
    apply_limits(cx, d, &words, into);
}

fn parse_limit(v: &str) -> Option<u32> {
    match v {
        "unlimited" | "none" | "-1" => Some(0),
        n => n.parse().ok(),
    }
}

fn apply_limits(cx: &mut Ctx, d: &Directive, specs: &[String], mut into: Option<&mut LimitsFor>) {
    let mut notes = Vec::new();
    for spec in specs {
        let Some((k, v)) = spec.split_once('=') else {
            return cx.bad(d, format!("'{spec}' is not name=value"));
        };
        let Some(n) = parse_limit(v) else {
            notes.push(format!("{spec}: not a number, left out"));
            continue;
        };
        match (k, into.as_deref_mut()) {
            ("size" | "size.soft", Some(f)) => f.size_limit = Some(n),
            ("size" | "size.soft", None) => cx.cfg.limits.size_limit = n,
            ("time" | "time.soft", Some(f)) => f.time_limit = Some(n),
            ("time" | "time.soft", None) => cx.cfg.limits.time_limit = n,
            ("size.unchecked", Some(f)) => f.unindexed_search_limit = Some(n as u64),
            ("size.unchecked", None) => cx.cfg.limits.unindexed_search_limit = n as u64,
            ("size.hard" | "time.hard", _) => notes.push(format!(
                "{spec}: Pando has one limit per requester, the soft one (a client asking for more gets it, not up to the hard limit)"
            )),
            ("size.pr" | "size.prtotal", _) => notes.push(format!("{spec}: paged searches follow the same size limit in Pando")),
            _ => notes.push(format!("{spec}: unknown limit, left out")),
        }
    }
    cx.settle(d, Severity::Stricter, &notes);
}

/// `limits <who> <limit>…`.
fn limits(cx: &mut Ctx, d: &Directive) {
    let words = match d.words() {
        Ok(w) if w.len() >= 2 => w,
        Ok(_) => return cx.bad(d, "needs a subject and limits".into()),
        Err(e) => return cx.bad(d, e),
    };
    let who = &words[0];
    let specs = &words[1..];
    let subject = match who.to_ascii_lowercase().as_str() {
        "*" => None,
        "anonymous" => {
            let mut f = LimitsFor {
                who: OneOrMany::One("anonymous".into()),
                size_limit: None,
                time_limit: None,
                unindexed_search_limit: None,
                replication: None,
            };
            apply_limits(cx, d, specs, Some(&mut f));
            cx.anonymous_limits_set = true;
            if let Some(n) = f.size_limit {
                cx.cfg.limits.anonymous.size_limit = n;
            }
            if let Some(n) = f.time_limit {
                cx.cfg.limits.anonymous.time_limit = n;
            }
            return;
        }
        "users" => Some(OneOrMany::One("users".into())),
        w => {
            let t = acl::translate(&[
                "to".into(),
                "*".into(),
                "by".into(),
                who.replace("dn.this", "dn").replace("dn.self", "dn"),
                "read".into(),
            ]);
            match t {
                Ok(t)
                    if t.by.len() == 1
                        && t.by[0].rights.items() == ["read"]
                        && !w.starts_with("self") =>
                {
                    Some(t.by[0].who.clone())
                }
                _ => {
                    cx.note(
                        Severity::Differs,
                        d,
                        "this subject has no Pando form; the general limits apply to it instead",
                    );
                    return;
                }
            }
        }
    };
    match subject {
        None => apply_limits(cx, d, specs, None),
        Some(s) => {
            let mut f = LimitsFor {
                who: s,
                size_limit: None,
                time_limit: None,
                unindexed_search_limit: None,
                replication: None,
            };
            apply_limits(cx, d, specs, Some(&mut f));
            cx.cfg.limits.by.push(f);
        }
    }
}

// ---------------------------------------------------------------- databases

fn config_database(cx: &mut Ctx, db: &Section) {
    for d in &db.directives {
        match d.key.as_str() {
            "rootdn" => {
                let dn = d.single().unwrap_or_default();
                if is_peercred_root(&dn) {
                    ldapi_owner_admin(cx, d);
                } else {
                    cx.note(Severity::Dropped, d, "cn=config's own root DN names no entry and cannot bind in Pando; cn=config is administered by root_dn and auth.admins");
                }
            }
            // Debian's default: root over ldapi manages cn=config through
            // a rule, the root DN being a name no one binds as.
            "access" if d.words().is_ok_and(|w| root_manages(&w)) => ldapi_owner_admin(cx, d),
            "access" => cx.note(
                Severity::Note,
                d,
                "cn=config is open to administrators only in Pando",
            ),
            _ => cx.note(
                Severity::Dropped,
                d,
                "setting of the cn=config database; no Pando counterpart",
            ),
        }
    }
}

/// Whether `dn` is root's identity over ldapi (SASL EXTERNAL,
/// `gidNumber=0+uidNumber=0,cn=peercred,cn=external,cn=auth`).
fn is_peercred_root(dn: &str) -> bool {
    dn.trim_matches('"')
        .to_ascii_lowercase()
        .starts_with("gidnumber=0+uidnumber=0,cn=peercred")
}

/// Whether an access rule's words give root over ldapi, alone, `manage`
/// or `write` (`by dn.exact=gidNumber=0+uidNumber=0,cn=peercred,… manage`),
/// read by the same translator as every other rule.
fn root_manages(words: &[String]) -> bool {
    acl::translate(words).is_ok_and(|t| {
        t.by.iter().any(|b| {
            matches!(&b.who, OneOrMany::One(w) if w.strip_prefix("dn:").is_some_and(is_peercred_root))
                && b.rights.items().iter().any(|r| *r == "all" || *r == "write")
        })
    })
}

/// Root (and the server's own user) over ldapi administers this server.
fn ldapi_owner_admin(cx: &mut Ctx, d: &Directive) {
    if !cx
        .cfg
        .auth
        .admins
        .iter()
        .any(|a| a == pando_config::LDAPI_OWNER)
    {
        cx.cfg.auth.admins.push(pando_config::LDAPI_OWNER.into());
    }
    cx.note(Severity::Differs, d, "auth.admins = [\"ldapi-owner\"]: root (and the server's own user) over ldapi, authenticated with EXTERNAL. Pando has one administrator role for data and configuration, so this identity also administers the data, which slapd's rules may not have allowed");
}

fn rules_of(cx: &mut Ctx, s: &Section) -> Vec<RuleOut> {
    let mut out = Vec::new();
    for d in s.all("access") {
        let words = match d.words() {
            Ok(w) => w,
            Err(e) => {
                cx.note(
                    Severity::Stricter,
                    d,
                    format!("cannot be read ({e}); not translated, so no one gets what it grants"),
                );
                continue;
            }
        };
        match acl::translate(&words) {
            Ok(mut t) => {
                t.attrs = t.attrs.map(|list| expand_classes(cx, list));
                if let Some(list) = &mut t.attrs {
                    let unknown: Vec<String> = list
                        .iter()
                        .filter(|a| {
                            !a.eq_ignore_ascii_case("entry") && cx.schema.attribute(a).is_none()
                        })
                        .cloned()
                        .collect();
                    list.retain(|a| !unknown.contains(a));
                    if !unknown.is_empty() {
                        t.notes.push((
                            Severity::Dropped,
                            format!(
                                "attributes not in Pando's schema, left out of the rule (no entry holds them here): {}",
                                unknown.join(", ")
                            ),
                        ));
                    }
                    // Only attributes Pando lacks: nothing here for it to
                    // decide. (Only `children` stays until the rights to
                    // add and delete are settled, see `children_rights`.)
                    if list.is_empty() && !t.children {
                        for (sev, why) in std::mem::take(&mut t.notes) {
                            cx.note(sev, d, why);
                        }
                        cx.note(
                            Severity::Dropped,
                            d,
                            "the rule covers no attribute Pando has: left out",
                        );
                        continue;
                    }
                }
                if t.notes.is_empty() {
                    cx.exact();
                }
                for (sev, why) in std::mem::take(&mut t.notes) {
                    cx.note(sev, d, why);
                }
                out.push(RuleOut {
                    rule: t,
                    origin: format!("{}: {}", d.origin, d.text()),
                });
            }
            Err(e) => cx.note(
                Severity::Stricter,
                d,
                format!("cannot be read ({e}); not translated, so no one gets what it grants"),
            ),
        }
    }
    out
}

/// `@inetOrgPerson` → the class's attribute types.
fn expand_classes(cx: &Ctx, list: Vec<String>) -> Vec<String> {
    let mut out = Vec::new();
    for a in list {
        match a.strip_prefix('@') {
            Some(oc) => {
                if let Some(attrs) = cx.schema.object_class_attrs(oc) {
                    out.extend(
                        attrs
                            .iter()
                            .map(|at| at.names.first().cloned().unwrap_or_else(|| at.oid.clone())),
                    );
                }
            }
            None => out.push(a),
        }
    }
    out
}

fn data_database(
    cx: &mut Ctx,
    src: &Source,
    db: &Section,
    frontend: &[RuleOut],
    many: bool,
) -> Vec<RuleOut> {
    let mut served = Vec::new();
    for d in db.all("suffix") {
        let Ok(s) = d.single() else { continue };
        if add_suffix(cx, d, &s) {
            served.push(s);
        }
    }
    let (own, frontend) = match src.kind {
        crate::source::SourceKind::OpenLdap => (rules_of(cx, db), frontend),
        crate::source::SourceKind::Dirsrv => (aci_rules(cx, src, &served), &[][..]),
    };
    for d in &db.directives {
        if d.key != "access" && !section_setting(cx, d) {
            database_directive(cx, d);
        }
    }
    for o in &db.overlays {
        overlay(cx, o);
    }
    database_rules(cx, src, db, own, frontend, &served, many)
}

/// One directive of a data database (suffix, access and limits aside).
fn database_directive(cx: &mut Ctx, d: &Directive) {
    match d.key.as_str() {
        "suffix" => {}
        "addcontentacl" => add_content_acl(cx, d),
        "rootdn" => {
            let dn = d.single().unwrap_or_default();
            if let Err(e) = Dn::parse(&dn) {
                cx.note(Severity::Dropped, d, format!("not a DN ({e}): no root DN from it"));
                return;
            }
            match &cx.cfg.root_dn {
                None => {
                    cx.cfg.root_dn = Some(dn);
                    cx.exact();
                }
                Some(r) if same_dn(&cx.schema, r, &dn) => cx.exact(),
                Some(_) => {
                    cx.cfg.auth.admins.push(dn);
                    cx.note(Severity::Differs, d, "a second database's root DN: added to auth.admins, administrator of every suffix here");
                }
            }
        }
        "rootpw" => {
            let pw = d.single().unwrap_or_default();
            if pw.starts_with('{') && pando_password::is_hashed(pw.as_bytes()) {
                cx.cfg.root_password_hash = Some(pw);
                cx.exact();
            } else if pw.starts_with('{') {
                cx.note(Severity::Stricter, d, "this hash scheme is not one Pando verifies; set root_password_hash with `pando passwd`");
            } else {
                cx.cfg.root_password_hash = Some(pando_password::hash_password(pw.as_bytes()));
                cx.note(Severity::Note, d, "a clear-text password: stored hashed (Argon2id) in root_password_hash");
            }
        }
        "index" => index(cx, d),
        "directory" => cx.note(Severity::Note, d, "the data moves with `slapcat | pando import` (README, \"Migrating from OpenLDAP\"); Pando's store is in data_dir"),
        "maxsize" => match d.single().ok().and_then(|v| v.parse::<u64>().ok()) {
            Some(b) => {
                cx.cfg.store.map_size_mb = (b >> 20).max(1);
                cx.exact();
            }
            None => cx.bad(d, "not a number".into()),
        },
        "checkpoint" | "envflags" | "dbnosync" | "maxreaders" | "mode" | "searchstack" | "rtxnsize" | "maxentrysize" | "multival" => {
            cx.note(Severity::Note, d, "Pando's store needs no such setting (durability: store.durability)")
        }
        "syncrepl" => syncrepl(cx, d),
        "multiprovider" | "mirrormode" => {
            let on = matches!(d.single().unwrap_or_default().to_ascii_lowercase().as_str(), "on" | "true" | "yes" | "1");
            cx.cfg.replication.multi_provider = on;
            cx.exact();
        }
        "updateref" => {
            let v = d.single().unwrap_or_default();
            for c in cx.cfg.replication.consumer.iter_mut() {
                c.update_referral = Some(v.clone());
            }
            cx.exact();
        }
        "lastmod" | "monitoring" | "hidden" => cx.note(Severity::Note, d, "Pando always keeps operational attributes and monitors every suffix"),
        "readonly" => cx.note(Severity::Differs, d, "Pando has no read-only switch: writes are governed by the access rules"),
        _ => cx.note(Severity::Dropped, d, "no Pando counterpart"),
    }
}

/// The database's rules, then the frontend's (slapd appends them), scoped
/// to its suffixes, `break` expanded, slapd's root DN first in each; with
/// no rules at all, slapd's default (everyone reads).
fn database_rules(
    cx: &mut Ctx,
    src: &Source,
    db: &Section,
    own: Vec<RuleOut>,
    frontend: &[RuleOut],
    suffixes: &[String],
    many: bool,
) -> Vec<RuleOut> {
    let mut list: Vec<RuleOut> = own;
    list.extend(frontend.iter().cloned());
    if list.is_empty() && src.kind == crate::source::SourceKind::OpenLdap {
        let origin = db
            .origin
            .as_ref()
            .map(|o| o.to_string())
            .unwrap_or_default();
        cx.report.add(
            Severity::Note,
            db.origin.as_ref(),
            &format!("database {} (no access rules)", db.kind),
            "slapd's default: everyone reads everything; translated as `to * by * read`",
        );
        let t = acl::translate(&crate::source::words("to * by * read").unwrap_or_default())
            .expect("valid rule");
        list.push(RuleOut {
            rule: t,
            origin: format!("{origin}: slapd's default rule"),
        });
    }
    let mut out = Vec::new();
    for s in suffixes {
        let scope = Translated::new(DnSel::Scoped("sub", s.clone()), None, None, Vec::new());
        let mut scoped = Vec::new();
        for r in &list {
            if let DnSel::Regex(re) = &r.rule.dn {
                if many {
                    cx.report.add(Severity::Differs, None, &r.origin, format!("dn.regex {re} is matched against every suffix in Pando, not only this database's"));
                }
            }
            match intersect(&cx.schema, &r.rule, &scope) {
                Meet::Empty => {}
                Meet::Rule(mut t) => {
                    t.by = r.rule.by.clone();
                    t.falls_through = r.rule.falls_through;
                    scoped.push(RuleOut {
                        rule: t,
                        origin: r.origin.clone(),
                    });
                }
                Meet::Unknown => scoped.push(r.clone()),
            }
        }
        out.extend(expand_breaks(cx, scoped));
    }
    let mut out = children_rights(cx, out);
    if cx.add_content_acl {
        for r in &mut out {
            for b in &mut r.rule.by {
                b.rights = without(&b.rights, &["add"]);
            }
        }
    }
    // Rules over `children` alone have done their part.
    out.retain(|r| r.rule.attrs.as_ref().is_none_or(|a| !a.is_empty()));
    // slapd's root DN passes every rule of its database.
    for r in &mut out {
        r.rule.by.insert(
            0,
            AccessBy {
                who: OneOrMany::One("admins".into()),
                rights: OneOrMany::One("all".into()),
            },
        );
    }
    out
}

/// `r` without the single rights `drop` (unchanged when it has none of them).
fn without(r: &OneOrMany, drop: &[&str]) -> OneOrMany {
    let all = acl::level_rights(r);
    if !all.iter().any(|x| drop.contains(&x.as_str())) {
        return r.clone();
    }
    let kept: Vec<String> = all
        .into_iter()
        .filter(|x| !drop.contains(&x.as_str()))
        .collect();
    if kept.is_empty() {
        OneOrMany::One("none".into())
    } else {
        OneOrMany::Many(kept)
    }
}

/// slapd lets an entry be added or deleted only with write on its parent's
/// `children` too; Pando asks only the rule covering the entry. So a
/// clause keeps add and delete only when, for every parent of the entries
/// its rule covers, the rule deciding that parent's `children` gives the
/// clause's subjects write as well (checked with the rules in their final
/// order). Elsewhere they are taken away (stricter, reported).
fn children_rights(cx: &mut Ctx, rules: Vec<RuleOut>) -> Vec<RuleOut> {
    let mut out = Vec::with_capacity(rules.len());
    for r in &rules {
        // add and delete are rights on the entry: a rule over attributes
        // only grants them nowhere.
        let covers_entry = r
            .rule
            .attrs
            .as_ref()
            .is_none_or(|l| l.iter().any(|a| a.eq_ignore_ascii_case("entry")));
        if !covers_entry {
            out.push(r.clone());
            continue;
        }
        let mut kept = r.clone();
        // The subtree's top entry, whose parent is outside it, when only
        // that parent's rules refuse: a rule of its own before this one.
        let mut top: Option<RuleOut> = None;
        let mut stripped = false;
        for (k, b) in r.rule.by.iter().enumerate() {
            let rights = acl::level_rights(&b.rights);
            if !rights.iter().any(|x| x == "add" || x == "delete") {
                continue;
            }
            let granted = |p: &DnSel| children_granted(&cx.schema, &rules, p, &b.who);
            match parent_regions(&r.rule.dn) {
                Some((outside, inside)) if inside.iter().all(granted) => {
                    if outside.is_some_and(|o| !granted(&o)) {
                        let head = top.get_or_insert_with(|| {
                            let mut h = r.clone();
                            if let DnSel::Scoped(_, d) = &r.rule.dn {
                                h.rule.dn = DnSel::Scoped("base", d.clone());
                            }
                            h
                        });
                        head.rule.by[k].rights = without(&b.rights, &["add", "delete"]);
                    }
                }
                _ => {
                    kept.rule.by[k].rights = without(&b.rights, &["add", "delete"]);
                    stripped = true;
                }
            }
        }
        if stripped {
            cx.report.add(Severity::Stricter, None, &r.origin,
                "add and delete left out for some of its subjects: slapd also needs write on the parent's 'children', and the rules deciding that here do not give it to them everywhere (grant them by hand if needed)");
        }
        out.extend(top);
        out.push(kept);
    }
    out
}

/// The parents of the entries a target covers, as targets: the parent of
/// a subtree's top entry (outside it; None for a suffix), then those
/// inside. None when that has no such form (a regular expression).
fn parent_regions(dn: &DnSel) -> Option<(Option<DnSel>, Vec<DnSel>)> {
    let parent = |d: &str| {
        Dn::parse(d)
            .ok()
            .and_then(|x| x.parent())
            .map(|p| DnSel::Scoped("base", p.to_string()))
    };
    Some(match dn {
        DnSel::Scoped("base", d) => (None, vec![parent(d)?]),
        DnSel::Scoped("one", d) => (None, vec![DnSel::Scoped("base", d.clone())]),
        DnSel::Scoped("children", d) => (None, vec![DnSel::Scoped("sub", d.clone())]),
        DnSel::Scoped(_, d) => (parent(d), vec![DnSel::Scoped("sub", d.clone())]),
        _ => return None,
    })
}

/// May targets `a` and `b` hold a common entry? (Filters aside.)
fn regions_meet(schema: &Schema, a: &DnSel, b: &DnSel) -> bool {
    let (DnSel::Scoped(sa, da), DnSel::Scoped(sb, db)) = (a, b) else {
        return true;
    };
    let (da, db) = (norm(schema, da), norm(schema, db));
    let depth = |d: &str| {
        if d.is_empty() {
            0
        } else {
            d.split(',').count()
        }
    };
    // Does the region (s, outer) reach into the one at `inner`?
    let reaches = |s: &str, outer: &str, inner: &str, inner_scope: &str| {
        if inner == outer {
            return !matches!(
                (s, inner_scope),
                ("base", "children") | ("base", "one") | ("children", "base") | ("one", "base")
            );
        }
        let below = outer.is_empty() || inner.ends_with(&format!(",{outer}"));
        below
            && match s {
                "sub" | "children" => true,
                "one" => depth(inner) == depth(outer) + 1 || inner_scope != "base",
                _ => false,
            }
    };
    reaches(sa, &da, &db, sb) || reaches(sb, &db, &da, sa)
}

/// Does every rule that may decide `children` on the entries of `region`
/// (the first covering rule, whichever it is for each entry) give the
/// subjects `who` write — with no earlier clause of it that could match
/// them and give less?
fn children_granted(schema: &Schema, rules: &[RuleOut], region: &DnSel, who: &OneOrMany) -> bool {
    // A subtree is its top entry and what is below: rules may cover each.
    let mut open: Vec<DnSel> = match region {
        DnSel::Scoped("sub", d) => vec![
            DnSel::Scoped("base", d.clone()),
            DnSel::Scoped("children", d.clone()),
        ],
        r => vec![r.clone()],
    };
    for t in rules
        .iter()
        .filter(|t| t.rule.children && regions_meet(schema, &t.rule.dn, region))
    {
        if !open.iter().any(|p| regions_meet(schema, &t.rule.dn, p)) {
            continue; // earlier rules decide all it could
        }
        let mut granted = false;
        for c in &t.rule.by {
            let rights = acl::level_rights(&c.rights);
            if c.who == *who {
                granted = rights.iter().any(|x| x == "write");
                break;
            }
            // An earlier clause that may hold for them decides instead.
            let anonymous_only = c.who.items() == ["anonymous"];
            if !anonymous_only && !rights.iter().any(|x| x == "write") {
                break;
            }
        }
        if !granted {
            return false;
        }
        // A rule with no filter is the first for every entry it holds:
        // later ones never decide there.
        if t.rule.filter.is_none() {
            open.retain(|p| !contains_region(schema, &t.rule.dn, p));
        }
        if open.is_empty() {
            return true;
        }
    }
    // Some parent may be covered by no rule: slapd refuses there.
    false
}

/// Does target `a` hold every entry of target `b`?
fn contains_region(schema: &Schema, a: &DnSel, b: &DnSel) -> bool {
    match (a, b) {
        (DnSel::Any, _) => true,
        (DnSel::Scoped(sa, da), DnSel::Scoped(sb, db)) => {
            let (da, db) = (norm(schema, da), norm(schema, db));
            let below = db.ends_with(&format!(",{da}")) || da.is_empty();
            match (*sa, *sb) {
                ("sub", _) => db == da || below,
                ("children", _) => below || (db == da && (*sb == "children" || *sb == "one")),
                ("base", "base") | ("one", "one") => db == da,
                _ => false,
            }
        }
        _ => false,
    }
}

/// 389-DS: the ACIs held in `suffixes` as rules (see [`crate::aci`]),
/// then binds for everyone (389-DS never refuses a bind for its ACIs).
/// The ACIs stored in the suffixes, parsed; those that do not parse are
/// reported (a deny becomes a deny of everything below its entry).
fn parsed_acis(cx: &mut Ctx, src: &Source, suffixes: &[String]) -> Vec<crate::aci::Aci> {
    let within = |dn: &str| {
        let n = norm(&cx.schema, dn);
        suffixes.iter().any(|s| {
            let s = norm(&cx.schema, s);
            n == s || n.ends_with(&format!(",{s}"))
        })
    };
    let mut acis = Vec::new();
    for (at, text, origin) in src.acis.iter().filter(|(at, _, _)| within(at)) {
        let shown = format!("aci: {text}");
        match crate::aci::parse(at, text, cx.dirsrv_anonymous) {
            Ok(a) if !within(&a.dn) => cx.report.add(
                Severity::Dropped,
                Some(origin),
                &shown,
                "its target is outside the entry's subtree; 389-DS ignores it too",
            ),
            Ok(mut a) => {
                cx.report.exact += 1;
                a.origin = origin.to_string();
                acis.push(a);
            }
            Err(why) if text.contains("deny") => {
                // A deny that does not map: everyone refused where it sits.
                cx.report.add(
                    Severity::Stricter,
                    Some(origin),
                    &shown,
                    format!("{why}: translated as a deny of everything to everyone below {at}"),
                );
                acis.push(crate::aci::Aci {
                    dn: at.clone(),
                    scope: "sub",
                    attrs: None,
                    filter: None,
                    deny: true,
                    rights: vec!["read"],
                    subjects: vec![vec!["*".into()]],
                    name: String::new(),
                    origin: origin.to_string(),
                });
            }
            Err(why) => cx.report.add(
                Severity::Stricter,
                Some(origin),
                &shown,
                format!("{why}: not translated, so no one gets what it grants"),
            ),
        }
    }
    acis
}

fn aci_rules(cx: &mut Ctx, src: &Source, suffixes: &[String]) -> Vec<RuleOut> {
    let acis = parsed_acis(cx, src, suffixes);
    if acis.is_empty() {
        cx.report.add(Severity::Stricter, None, "access control", "no ACI found in the suffix: only the root DN may read or write (389-DS refuses everyone else too); give the data export with --acis-from to translate its ACIs");
    }
    let mut unknown: Vec<String> = Vec::new();
    let mut out: Vec<RuleOut> = Vec::new();
    for (mut rule, used) in crate::aci::rules(&acis) {
        if let Some(list) = rule.attrs.as_mut() {
            let known =
                |a: &String| a.eq_ignore_ascii_case("entry") || cx.schema.attribute(a).is_some();
            for a in list.iter().filter(|a| !known(a)) {
                if !unknown.contains(a) {
                    unknown.push(a.clone());
                }
            }
            list.retain(known);
        }
        out.push(RuleOut {
            rule,
            origin: used.join("\n"),
        });
    }
    if !unknown.is_empty() {
        cx.report.add(
            Severity::Dropped,
            None,
            "ACI target attributes",
            format!(
                "not in Pando's schema, left out of the rules (no entry holds them here): {}",
                unknown.join(", ")
            ),
        );
    }
    let binds = acl::translate(
        &crate::source::words("to attrs=userPassword by * auth").unwrap_or_default(),
    )
    .expect("valid rule");
    out.push(RuleOut {
        rule: binds,
        origin: "389-DS: binds are not subject to ACIs".into(),
    });
    // The root DN reads and writes what no ACI names (ou=Groups with no
    // ACI of its own); Pando's administrators pass only the rules there are.
    let rest = acl::translate(&crate::source::words("to * by * none").unwrap_or_default())
        .expect("valid rule");
    out.push(RuleOut {
        rule: rest,
        origin: "389-DS: the root DN is not subject to ACIs".into(),
    });
    out
}

/// Serve `s` (a database's suffix): false when it cannot be one. A suffix
/// below another is served within it (slapd's subordinate and glued
/// databases are one tree here); one above another takes its place.
fn add_suffix(cx: &mut Ctx, d: &Directive, s: &str) -> bool {
    let parsed = match Dn::parse(s)
        .map_err(|e| e.to_string())
        .and_then(|dn| cx.schema.normalize_dn(&dn))
    {
        Ok(n) => n,
        Err(e) => {
            cx.note(
                Severity::Dropped,
                d,
                format!("not a DN ({e}): this database is not served"),
            );
            return false;
        }
    };
    if parsed.is_empty() {
        cx.note(Severity::Dropped, d, "the empty DN cannot be a suffix in Pando (it names the root DSE): this database is not served");
        return false;
    }
    let within = |inner: &str, outer: &str| inner == outer || inner.ends_with(&format!(",{outer}"));
    let existing: Vec<(usize, String)> = cx
        .cfg
        .suffixes
        .iter()
        .enumerate()
        .map(|(i, x)| (i, norm(&cx.schema, x)))
        .collect();
    if let Some((_, outer)) = existing.iter().find(|(_, x)| within(&parsed, x)) {
        if outer != &parsed {
            cx.note(
                Severity::Note,
                d,
                format!("served within the suffix {outer} (one tree in Pando)"),
            );
        } else {
            cx.exact();
        }
        return true;
    }
    let below: Vec<usize> = existing
        .iter()
        .filter(|(_, x)| within(x, &parsed))
        .map(|(i, _)| *i)
        .collect();
    for i in below.iter().rev() {
        let gone = cx.cfg.suffixes.remove(*i);
        cx.note(
            Severity::Note,
            d,
            format!("{gone} is served within this suffix (one tree in Pando)"),
        );
    }
    if below.is_empty() {
        cx.exact();
    }
    cx.cfg.suffixes.push(s.to_string());
    true
}

/// `by * break`: the rule's clauses come first in each later rule, within
/// the breaking rule's target.
fn expand_breaks(cx: &mut Ctx, rules: Vec<RuleOut>) -> Vec<RuleOut> {
    let mut rest: Vec<RuleOut> = Vec::new();
    for r in rules.into_iter().rev() {
        if !r.rule.falls_through {
            rest.insert(0, r);
            continue;
        }
        let mut first = Vec::new();
        for later in &rest {
            match intersect(&cx.schema, &r.rule, &later.rule) {
                Meet::Empty => {}
                Meet::Rule(mut t) => {
                    t.by = r
                        .rule
                        .by
                        .iter()
                        .cloned()
                        .chain(later.rule.by.iter().cloned())
                        .collect();
                    first.push(RuleOut {
                        rule: t,
                        origin: format!("{} (then) {}", r.origin, later.origin),
                    });
                }
                Meet::Unknown => {
                    cx.report.add(Severity::Stricter, None, &r.origin,
                        format!("its target and that of '{}' cannot be combined: its subjects get none there", later.origin));
                    let mut t = later.rule.clone();
                    t.by = r
                        .rule
                        .by
                        .iter()
                        .map(|b| AccessBy {
                            who: b.who.clone(),
                            rights: OneOrMany::One("none".into()),
                        })
                        .chain(later.rule.by.iter().cloned())
                        .collect();
                    first.push(RuleOut {
                        rule: t,
                        origin: format!("{} (then) {}", r.origin, later.origin),
                    });
                }
            }
        }
        first.extend(rest);
        rest = first;
    }
    rest
}

enum Meet {
    Empty,
    Rule(Translated),
    Unknown,
}

/// The entries and attributes both targets cover, as one target.
fn intersect(schema: &Schema, a: &Translated, b: &Translated) -> Meet {
    let dn = match (&a.dn, &b.dn) {
        (DnSel::Any, x) | (x, DnSel::Any) => x.clone(),
        (DnSel::Scoped(s1, d1), DnSel::Scoped(s2, d2)) => match meet_scopes(schema, s1, d1, s2, d2)
        {
            Some(Some(x)) => x,
            Some(None) => return Meet::Empty,
            None => return Meet::Unknown,
        },
        (DnSel::Regex(r1), DnSel::Regex(r2)) if r1 == r2 => a.dn.clone(),
        (DnSel::Regex(r), DnSel::Scoped("sub", d)) | (DnSel::Scoped("sub", d), DnSel::Regex(r)) => {
            // The regex names DNs ending in the subtree: keep the regex.
            let tail = r.trim_end_matches('$').to_ascii_lowercase();
            if tail.ends_with(&norm(schema, d)) {
                DnSel::Regex(r.clone())
            } else {
                return Meet::Unknown;
            }
        }
        _ => return Meet::Unknown,
    };
    let filter = match (&a.filter, &b.filter) {
        (None, f) | (f, None) => f.clone(),
        (Some(x), Some(y)) if x == y => Some(x.clone()),
        (Some(x), Some(y)) => Some(format!("(&{}{})", paren(x), paren(y))),
    };
    let attrs = match (&a.attrs, &b.attrs) {
        (None, x) | (x, None) => x.clone(),
        (Some(x), Some(y)) => {
            let both: Vec<String> = x
                .iter()
                .filter(|n| y.iter().any(|m| m.eq_ignore_ascii_case(n)))
                .cloned()
                .collect();
            Some(both)
        }
    };
    // No attribute in common, and not both over `children`: nothing shared.
    let children = a.children && b.children;
    if attrs.as_ref().is_some_and(|v| v.is_empty()) && !children {
        return Meet::Empty;
    }
    let mut t = Translated::new(dn, filter, attrs, Vec::new());
    t.children = children;
    Meet::Rule(t)
}

fn paren(f: &str) -> String {
    if f.starts_with('(') {
        f.to_string()
    } else {
        format!("({f})")
    }
}

/// Some(Some(region)), Some(None) = disjoint, None = no single region.
fn meet_scopes(
    schema: &Schema,
    s1: &'static str,
    d1: &str,
    s2: &'static str,
    d2: &str,
) -> Option<Option<DnSel>> {
    let (n1, n2) = (norm(schema, d1), norm(schema, d2));
    let below =
        |inner: &str, outer: &str| outer.is_empty() || inner.ends_with(&format!(",{outer}"));
    let depth = |n: &str| {
        if n.is_empty() {
            0
        } else {
            n.split(',').count()
        }
    };
    if n1 == n2 {
        let both = [s1, s2];
        let r = if s1 == s2 {
            Some(s1)
        } else if both.contains(&"sub") {
            Some(if s1 == "sub" { s2 } else { s1 })
        } else if both.contains(&"children") && both.contains(&"one") {
            Some("one")
        } else {
            None
        };
        return Some(r.map(|s| DnSel::Scoped(s, d1.to_string())));
    }
    // One strictly below the other: the outer region either holds the
    // whole inner one (sub, children), or meets it at one entry (one).
    let (outer_s, outer_n, inner_s, inner_d, inner_n) = if below(&n2, &n1) {
        (s1, n1, s2, d2, n2)
    } else if below(&n1, &n2) {
        (s2, n2, s1, d1, n1)
    } else {
        return Some(None);
    };
    match outer_s {
        "sub" | "children" => Some(Some(DnSel::Scoped(inner_s, inner_d.to_string()))),
        "one" if depth(&inner_n) == depth(&outer_n) + 1 => {
            if matches!(inner_s, "base" | "sub") {
                Some(Some(DnSel::Scoped("base", inner_d.to_string())))
            } else {
                Some(None)
            }
        }
        "one" | "base" => Some(None),
        _ => None,
    }
}

fn index(cx: &mut Ctx, d: &Directive) {
    let words = match d.words() {
        Ok(w) if !w.is_empty() => w,
        _ => return cx.bad(d, "needs attributes".into()),
    };
    let kinds_text = words.get(1).cloned().unwrap_or_else(|| "eq".into());
    let mut kinds = Vec::new();
    let mut notes = Vec::new();
    for k in kinds_text.split(',') {
        let k = k.trim().to_ascii_lowercase();
        let p = match k.as_str() {
            "eq" | "equality" => "eq",
            "pres" | "present" => "pres",
            "sub" | "substr" | "substring" | "subinitial" | "subany" | "subfinal" => "sub",
            "approx" | "approximate" => "approx",
            "nolang" | "nosubtypes" | "notags" => {
                notes.push(format!("'{k}': not needed"));
                continue;
            }
            other => {
                notes.push(format!("'{other}': unknown index kind, left out"));
                continue;
            }
        };
        if !kinds.contains(&p.to_string()) {
            kinds.push(p.to_string());
        }
    }
    for a in words[0].split(',') {
        let a = a.trim();
        if a.eq_ignore_ascii_case("default") {
            notes.push(
                "'default' index kinds: Pando has no default; give the kinds on each index line"
                    .into(),
            );
            continue;
        }
        let Some(oid) = cx.schema.attribute(a).map(|t| t.oid.clone()) else {
            notes.push(format!("'{a}': unknown attribute, left out"));
            continue;
        };
        // One entry per attribute: a name already there in another case
        // (389-DS writes `memberuid`, Pando's defaults `memberUid`) or
        // another of its names takes the kinds.
        let key = cx
            .cfg
            .indexes
            .keys()
            .find(|k| cx.schema.attribute(k).is_some_and(|t| t.oid == oid))
            .cloned()
            .unwrap_or_else(|| a.to_string());
        let e = cx.cfg.indexes.entry(key).or_default();
        for k in &kinds {
            if !e.contains(k) {
                e.push(k.clone());
            }
        }
    }
    cx.settle(d, Severity::Note, &notes);
}

/// `syncrepl rid=1 provider=ldap://… …`.
fn syncrepl(cx: &mut Ctx, d: &Directive) {
    let words = match d.words() {
        Ok(w) => w,
        Err(e) => return cx.bad(d, e),
    };
    let mut kv = BTreeMap::new();
    for w in &words {
        if let Some((k, v)) = w.split_once('=') {
            kv.insert(k.to_ascii_lowercase(), v.to_string());
        }
    }
    let mut notes = Vec::new();
    let t = consumer_table(&kv, &mut notes);
    let parsed: Result<pando_config::consumer::ConsumerConfig, _> =
        toml::Value::Table(t).try_into();
    match parsed {
        Ok(c)
            if !matches!(c.kind.as_str(), "refreshOnly" | "refreshAndPersist")
                || !matches!(c.syncdata.as_str(), "default" | "accesslog") =>
        {
            cx.note(Severity::Dropped, d, format!(
                "type={} syncdata={}: Pando follows RFC 4533 providers (refreshOnly, refreshAndPersist; whole entries or an accesslog); this consumer is not set up",
                c.kind, c.syncdata
            ));
        }
        Ok(mut c) => {
            if let Some(secret) = kv.get("credentials") {
                cx.secrets.push((c.rid, secret.clone()));
                notes.push("credentials: written to secrets/ beside pando.toml (0600) and named by credentials_file".into());
            }
            // Pando sends no password in clear across a network.
            let clear = c.bind_method == "simple"
                && c.provider.starts_with("ldap://")
                && !c.start_tls
                && !pando_proto::url::is_loopback(&c.provider);
            if clear {
                c.start_tls = true;
                notes.push(format!(
                    "a simple bind over plain {} sends the password in clear: start_tls = true (or an ldaps:// provider; allow_plaintext_password = true keeps slapd's behaviour, for a lab)",
                    c.provider
                ));
            }
            cx.cfg.replication.consumer.push(c);
            let severity = if clear {
                Severity::Stricter
            } else {
                Severity::Note
            };
            cx.settle(d, severity, &notes);
        }
        Err(e) => cx.bad(d, format!("{e}")),
    }
}

/// The `key=value` words of a `syncrepl` directive as the fields of a
/// Pando consumer; what has no counterpart goes into `notes`.
fn consumer_table(
    kv: &BTreeMap<String, String>,
    notes: &mut Vec<String>,
) -> toml::map::Map<String, toml::Value> {
    let mut t = toml::map::Map::new();
    let mut put = |k: &str, v: toml::Value| {
        t.insert(k.to_string(), v);
    };
    for (k, v) in kv {
        let s = toml::Value::String(v.clone());
        match k.as_str() {
            "rid" => put("rid", toml::Value::Integer(v.parse().unwrap_or(0))),
            "provider" => put("provider", s),
            "searchbase" => put("search_base", s),
            "scope" => put("scope", s),
            "filter" => put("filter", s),
            "attrs" => put(
                "attrs",
                toml::Value::Array(
                    v.split(',')
                        .map(|a| toml::Value::String(a.trim().into()))
                        .collect(),
                ),
            ),
            "type" => put("type", s),
            "interval" => put("interval", s),
            "retry" => put("retry", s),
            "bindmethod" => {
                let mech = kv.get("saslmech").map(|m| m.to_ascii_lowercase());
                let m = match (v.to_ascii_lowercase().as_str(), mech.as_deref()) {
                    ("sasl", Some("external")) => "sasl_external",
                    ("sasl", _) => {
                        notes.push("bindmethod=sasl: Pando's consumer binds simple or with SASL EXTERNAL; set bind_method and credentials".to_string());
                        "simple"
                    }
                    _ => "simple",
                };
                put("bind_method", toml::Value::String(m.into()))
            }
            "saslmech" | "authcid" | "authzid" | "realm" | "secprops" => {}
            "keepalive" => {
                let idle = v
                    .split(':')
                    .next()
                    .and_then(|n| n.parse::<i64>().ok())
                    .unwrap_or(0);
                put("keepalive_secs", toml::Value::Integer(idle))
            }
            "binddn" => put("bind_dn", s),
            // Kept out of pando.toml: written to a 0600 file beside it.
            "credentials" => {}
            "starttls" => put("start_tls", toml::Value::Boolean(v != "no")),
            "tls_cacert" => put("tls_ca_file", s),
            "tls_cert" => put("tls_cert_file", s),
            "tls_key" => put("tls_key_file", s),
            "timeout" => put(
                "timeout_secs",
                toml::Value::Integer(v.parse().unwrap_or(10)),
            ),
            "syncdata" => put("syncdata", s),
            "logbase" => put("logbase", s),
            "logfilter" => put("logfilter", s),
            other => notes.push(format!("{other}: not translated")),
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(conf: &str) -> Translation {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("slapd.conf");
        std::fs::write(&p, conf).unwrap();
        translate(&crate::source::read(&p).unwrap())
    }

    fn findings(t: &Translation) -> Vec<String> {
        t.report
            .findings
            .iter()
            .map(|f| format!("{}: {}", f.severity.word(), f.why))
            .collect()
    }

    #[test]
    fn root_over_ldapi_managing_cn_config_becomes_an_administrator() {
        // Debian's default: cn=config's root DN binds nowhere; a rule gives
        // root over ldapi (SASL EXTERNAL) manage.
        let debian = "database config\nrootdn cn=admin,cn=config\n\
                      access to * by dn.exact=gidNumber=0+uidNumber=0,cn=peercred,cn=external,cn=auth manage by * break\n\
                      database mdb\nsuffix dc=x\nrootdn cn=admin,dc=x\n";
        assert_eq!(run(debian).config.auth.admins, ["ldapi-owner"]);
        // Read access, or another identity, gives no administrator.
        for rule in [
            "access to * by dn.exact=gidNumber=0+uidNumber=0,cn=peercred,cn=external,cn=auth read",
            "access to * by dn.exact=gidNumber=1000+uidNumber=1000,cn=peercred,cn=external,cn=auth manage",
        ] {
            let conf = format!("database config\n{rule}\ndatabase mdb\nsuffix dc=x\nrootdn cn=admin,dc=x\n");
            assert!(run(&conf).config.auth.admins.is_empty(), "{rule}");
        }
    }

    #[test]
    fn subordinate_databases_are_one_tree_and_bad_suffixes_are_reported() {
        let t = run("database mdb\nsuffix \"ou=sub,dc=example,dc=com\"\n\
                     database mdb\nsuffix \"dc=example,dc=com\"\n\
                     database mdb\nsuffix \"\"\n\
                     database mdb\nsuffix \"not a dn\"\n");
        assert_eq!(t.config.suffixes, ["dc=example,dc=com"]);
        let f = findings(&t).join("\n");
        assert!(
            f.contains("ou=sub,dc=example,dc=com is served within this suffix"),
            "{f}"
        );
        assert!(f.contains("the empty DN cannot be a suffix"), "{f}");
        assert!(f.contains("not a DN"), "{f}");
    }

    fn rights_of(t: &Translation) -> Vec<String> {
        t.rules
            .iter()
            .map(|r| {
                let rule = r.rule.to_rule();
                let target = format!(
                    "{}{}",
                    rule.dn.unwrap_or_default(),
                    rule.scope.map(|s| format!("/{s}")).unwrap_or_default()
                );
                let by: Vec<String> = r
                    .rule
                    .by
                    .iter()
                    .skip(1)
                    .map(|b| b.rights.items().join(","))
                    .collect();
                format!("{target} {}", by.join(" "))
            })
            .collect()
    }

    #[test]
    fn add_and_delete_stand_only_where_the_rule_also_decides_children() {
        // Exact: one rule over the subtree decides entries and children,
        // except the subtree's top entry (its parent is outside).
        let t = run("database mdb\nsuffix dc=x\n\
                     access to attrs=userPassword by self write by * auth\n\
                     access to dn.subtree=ou=people,dc=x by group=cn=hr,dc=x write by * read\n");
        assert_eq!(
            rights_of(&t),
            [
                "dc=x write auth",
                "ou=people,dc=x/base auth,compare,search,read,write read",
                "ou=people,dc=x write read",
            ]
        );
        // A rule over children before it: the later rule no longer decides.
        let t = run("database mdb\nsuffix dc=x\n\
                     access to dn.base=ou=groups,dc=x attrs=children by * read\n\
                     access to * by group=cn=hr,dc=x write by * read\n");
        assert_eq!(rights_of(&t), ["dc=x auth,compare,search,read,write read"]);
        assert!(findings(&t).join("\n").contains("add and delete left out"));
        // add_content_acl: no add anywhere.
        let t = run("add_content_acl on\ndatabase mdb\nsuffix dc=x\naccess to * by users write\n");
        assert!(
            rights_of(&t).iter().all(|r| !r.contains("add")),
            "{:?}",
            rights_of(&t)
        );
    }

    #[test]
    fn syncrepl_becomes_a_consumer_without_its_password() {
        let t = run("database mdb\nsuffix dc=x\nrootdn cn=m,dc=x\n\
                     syncrepl rid=7 provider=ldap://10.0.0.1:389 bindmethod=simple binddn=\"cn=r,dc=x\" \
                     credentials=s3cret searchbase=\"dc=x\" type=refreshOnly interval=00:00:05:00 \
                     retry=\"5 5 300 +\" keepalive=240:10:30 syncdata=accesslog logbase=cn=accesslog\n");
        let c = &t.config.replication.consumer[0];
        assert_eq!(
            (c.rid, c.provider.as_str(), c.kind.as_str()),
            (7, "ldap://10.0.0.1:389", "refreshOnly")
        );
        assert_eq!(
            (c.bind_dn.as_str(), c.retry.as_str(), c.keepalive_secs),
            ("cn=r,dc=x", "5 5 300 +", 240)
        );
        assert!(c.credentials.is_none());
        assert_eq!(c.syncdata, "accesslog");
        assert_eq!(t.secrets, [(7, "s3cret".to_string())]);
        assert!(findings(&t).join("\n").contains("written to secrets/"));
        // Over plain ldap:// to another host the password would go in
        // clear: StartTLS is required (stricter, reported).
        assert!(c.start_tls);
        assert!(
            findings(&t).join("\n").contains("stricter: "),
            "{:?}",
            findings(&t)
        );
        let t = run("database mdb\nsuffix dc=x\nsyncrepl rid=1 provider=ldap://h type=dirSync searchbase=dc=x\n");
        assert!(t.config.replication.consumer.is_empty());
        assert!(findings(&t)
            .join("\n")
            .contains("this consumer is not set up"));
    }

    #[test]
    fn attributes_pando_lacks_are_left_out_of_rules() {
        let t = run("database mdb\nsuffix dc=x\n\
                     access to attrs=entryTtl by * write\n\
                     access to attrs=cn,authzTo by users write\n\
                     access to * by * read\n");
        let attrs: Vec<_> = t.rules.iter().map(|r| r.rule.attrs.clone()).collect();
        assert_eq!(attrs, [Some(vec!["cn".to_string()]), None]);
        let f = findings(&t).join("\n");
        assert!(
            f.contains("left out of the rule") && f.contains("authzTo"),
            "{f}"
        );
        assert!(f.contains("covers no attribute Pando has"), "{f}");
    }

    #[test]
    fn global_rules_follow_each_database_s_and_limits_keep_dns_with_spaces() {
        let t = run("access to * by users read by * none\n\
                     database mdb\nsuffix dc=x\n\
                     limits dn.exact=\"cn=Some User,dc=x\" size=10\n\
                     access to attrs=userPassword by self write by anonymous auth\n");
        let rules: Vec<_> = t
            .rules
            .iter()
            .map(|r| (r.rule.attrs.clone(), r.rule.by.len()))
            .collect();
        // admins first in each; the database's rule, then the global one.
        assert_eq!(
            rules,
            [(Some(vec!["userPassword".to_string()]), 3), (None, 3)]
        );
        assert_eq!(
            t.config.limits.by[0].who,
            OneOrMany::One("dn:cn=Some User,dc=x".into())
        );
        assert_eq!(t.config.limits.by[0].size_limit, Some(10));
    }
}
