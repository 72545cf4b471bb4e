//! The access log: one line per operation result, plus connection open and
//! close, in a text format close to OpenLDAP's or in JSON (one object per
//! line).
//!
//! Text:
//! ```text
//! 2026-11-22T07:02:25.123456Z conn=5 ACCEPT from IP=127.0.0.1:5555
//! 2026-11-22T07:02:25.123789Z conn=5 op=1 msgid=1 BIND dn="cn=admin,dc=example,dc=com" method=128 RESULT tag=97 err=0 nentries=0 etime=0.000310 qtime=0.000002
//! 2026-11-22T07:02:25.124012Z conn=5 op=2 msgid=2 SRCH base="dc=example,dc=com" scope=2 filter="(uid=alice)" attrs="cn mail" RESULT tag=101 err=0 nentries=1 etime=0.000123 qtime=0.000004
//! 2026-11-22T07:02:25.124100Z conn=5 op=3 msgid=3 UNBIND
//! 2026-11-22T07:02:25.124150Z conn=5 closed (unbind)
//! ```
//! `etime` runs from the request's arrival to its response being queued to
//! the connection; `qtime` is the part of it spent waiting (for a slot on
//! the connection, or behind the connection's previous write).
//!
//! What is never logged: bind credentials, attribute values of writes
//! (only the DN and, for modify, the attribute names), extended request
//! values (Password Modify carries passwords); compare logs the attribute
//! type only.

use std::fmt::Write as _;

use pando_model::Schema;
use pando_proto::{BindAuth, Filter, ProtocolOp};

use crate::logfile::LogFile;

pub use pando_config::LogFormat as Format;

/// A field value of a log line.
#[derive(Clone, Debug, PartialEq)]
pub enum Val {
    Str(String),
    /// A DN or a filter in its string form, which has escapes of its own
    /// (RFC 4514, RFC 4515): the text format keeps them as they are.
    Ldap(String),
    Num(u64),
}

/// What a request was, for its log line: the OpenLDAP-style tag (`SRCH`)
/// and its key arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub tag: &'static str,
    pub fields: Vec<(&'static str, Val)>,
}

fn s(v: impl Into<String>) -> Val {
    Val::Str(v.into())
}

fn ldap(v: impl Into<String>) -> Val {
    Val::Ldap(v.into())
}

impl Request {
    /// Describe a decoded request. Only DNs, scopes, filters (values of
    /// secret attributes withheld), attribute names, methods and OIDs:
    /// never credentials or written values.
    pub fn of(schema: &Schema, op: &ProtocolOp) -> Request {
        let (tag, fields) = match op {
            ProtocolOp::BindRequest(b) => {
                let mut f = vec![("dn", ldap(b.name.clone()))];
                match &b.auth {
                    BindAuth::Simple(_) => f.push(("method", Val::Num(128))),
                    BindAuth::Sasl { mechanism, .. } => {
                        f.push(("method", Val::Num(163)));
                        f.push(("mech", s(mechanism.clone())));
                    }
                }
                ("BIND", f)
            }
            ProtocolOp::SearchRequest(r) => (
                "SRCH",
                vec![
                    ("base", ldap(r.base.clone())),
                    ("scope", Val::Num(r.scope as u64)),
                    ("filter", ldap(shown_filter(schema, &r.filter))),
                    ("attrs", s(r.attrs.join(" "))),
                ],
            ),
            ProtocolOp::CompareRequest(r) => (
                "CMP",
                vec![("dn", ldap(r.dn.clone())), ("attr", s(r.ava.attr.clone()))],
            ),
            ProtocolOp::AddRequest(r) => ("ADD", vec![("dn", ldap(r.dn.clone()))]),
            ProtocolOp::DelRequest(dn) => ("DEL", vec![("dn", ldap(dn.clone()))]),
            ProtocolOp::ModifyRequest(r) => {
                let mut names: Vec<&str> = Vec::new();
                for c in &r.changes {
                    if !names.iter().any(|n| n.eq_ignore_ascii_case(&c.attr.name)) {
                        names.push(&c.attr.name);
                    }
                }
                (
                    "MOD",
                    vec![("dn", ldap(r.dn.clone())), ("attrs", s(names.join(" ")))],
                )
            }
            ProtocolOp::ModifyDnRequest(r) => {
                let mut f = vec![
                    ("dn", ldap(r.dn.clone())),
                    ("newrdn", ldap(r.new_rdn.clone())),
                    ("deleteoldrdn", Val::Num(r.delete_old_rdn as u64)),
                ];
                if let Some(sup) = &r.new_superior {
                    f.push(("newsuperior", ldap(sup.clone())));
                }
                ("MODRDN", f)
            }
            ProtocolOp::ExtendedRequest(r) => ("EXT", vec![("oid", s(r.name.clone()))]),
            ProtocolOp::AbandonRequest(id) => ("ABANDON", vec![("msgid", Val::Num(*id as u64))]),
            ProtocolOp::UnbindRequest => ("UNBIND", Vec::new()),
            _ => ("UNKNOWN", Vec::new()),
        };
        Request { tag, fields }
    }
}

/// The tag a request of `kind` has in its log line, for a line made
/// without the request at hand (the dashboard's, when the access log is
/// off).
pub fn tag_of(kind: crate::op_kind::OpKind) -> &'static str {
    use crate::op_kind::OpKind::*;
    match kind {
        Bind => "BIND",
        Search => "SRCH",
        Compare => "CMP",
        Add => "ADD",
        Delete => "DEL",
        Modify => "MOD",
        ModDn => "MODRDN",
        Extended => "EXT",
        Abandon => "ABANDON",
        Unbind => "UNBIND",
    }
}

/// The response's application tag (OpenLDAP prints it as `tag=`).
pub fn result_tag(request_tag: &str) -> u64 {
    match request_tag {
        "BIND" => 97,
        "SRCH" => 101,
        "MOD" => 103,
        "ADD" => 105,
        "DEL" => 107,
        "MODRDN" => 109,
        "CMP" => 111,
        "EXT" => 120,
        _ => 0,
    }
}

/// A finished operation.
pub struct OpResultLine<'a> {
    pub time_micros: u64,
    pub conn: u64,
    pub op: u64,
    pub msgid: i32,
    pub request: &'a Request,
    /// None: no response (abandon, unbind, an abandoned search).
    pub code: Option<u32>,
    pub nentries: u64,
    pub etime_us: u64,
    pub qtime_us: u64,
}

/// Quote for the text format: `"` and `\` escaped, control characters as
/// `\xNN`, so a line is always one line.
fn quote_text(out: &mut String, v: &str) {
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Quote a DN or filter for the text format, escaped once: its own
/// escapes (`\2a`, `\,`) stay as sent, so the line shows the string the
/// client sent; a `"` (or `\"`) becomes `\22` and a control character
/// `\XX`, which mean the same in RFC 4514 DNs and RFC 4515 filters, so a
/// line stays one line and its quotes unambiguous. A backslash that
/// escapes nothing becomes `\5c`.
fn quote_ldap_text(out: &mut String, v: &str) {
    let control = |c: char| (c as u32) < 0x20 || c == '\u{7f}';
    out.push('"');
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('"') => out.push_str("\\22"),
                Some(n) if control(n) => {
                    let _ = write!(out, "\\5c\\{:02x}", n as u32);
                }
                Some(n) => {
                    out.push('\\');
                    out.push(n);
                }
                None => out.push_str("\\5c"),
            },
            '"' => out.push_str("\\22"),
            c if control(c) => {
                let _ = write!(out, "\\{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

pub fn quote_json(out: &mut String, v: &str) {
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn secs6(us: u64) -> String {
    format!("{}.{:06}", us / 1_000_000, us % 1_000_000)
}

pub fn op_line(format: Format, l: &OpResultLine<'_>) -> String {
    let mut out = String::with_capacity(256);
    let time = pando_store::clock::rfc3339_micros(l.time_micros);
    match format {
        Format::Text => {
            let _ = write!(
                out,
                "{time} conn={} op={} msgid={} {}",
                l.conn, l.op, l.msgid, l.request.tag
            );
            for (k, v) in &l.request.fields {
                let _ = write!(out, " {k}=");
                match v {
                    Val::Str(x) => quote_text(&mut out, x),
                    Val::Ldap(x) => quote_ldap_text(&mut out, x),
                    Val::Num(n) => {
                        let _ = write!(out, "{n}");
                    }
                }
            }
            if let Some(code) = l.code {
                let _ = write!(
                    out,
                    " RESULT tag={} err={code} nentries={} etime={} qtime={}",
                    result_tag(l.request.tag),
                    l.nentries,
                    secs6(l.etime_us),
                    secs6(l.qtime_us)
                );
            }
        }
        Format::Json => {
            out.push_str("{\"time\":");
            quote_json(&mut out, &time);
            let _ = write!(
                out,
                ",\"conn\":{},\"op\":{},\"msgid\":{},\"type\":\"{}\"",
                l.conn, l.op, l.msgid, l.request.tag
            );
            for (k, v) in &l.request.fields {
                let _ = write!(out, ",\"{k}\":");
                match v {
                    Val::Str(x) | Val::Ldap(x) => quote_json(&mut out, x),
                    Val::Num(n) => {
                        let _ = write!(out, "{n}");
                    }
                }
            }
            if let Some(code) = l.code {
                let _ = write!(
                    out,
                    ",\"tag\":{},\"err\":{code},\"nentries\":{},\"etime_us\":{},\"qtime_us\":{}",
                    result_tag(l.request.tag),
                    l.nentries,
                    l.etime_us,
                    l.qtime_us
                );
            }
            out.push('}');
        }
    }
    out.push('\n');
    out
}

/// `ACCEPT` (open) or `closed` line of a connection.
pub fn conn_line(format: Format, time_micros: u64, conn: u64, event: ConnEvent<'_>) -> String {
    let time = pando_store::clock::rfc3339_micros(time_micros);
    let mut out = String::with_capacity(128);
    match (format, event) {
        (Format::Text, ConnEvent::Accept { peer, tls }) => {
            let _ = write!(out, "{time} conn={conn} ACCEPT from ");
            if peer.starts_with('/') || peer.is_empty() || peer.starts_with("ldapi") {
                let _ = write!(out, "PATH=");
                quote_text(&mut out, peer);
            } else {
                let _ = write!(out, "IP={peer}");
            }
            if tls {
                out.push_str(" tls=1");
            }
        }
        (Format::Text, ConnEvent::Closed { reason }) => {
            let _ = write!(out, "{time} conn={conn} closed ({reason})");
        }
        (Format::Json, ConnEvent::Accept { peer, tls }) => {
            out.push_str("{\"time\":");
            quote_json(&mut out, &time);
            let _ = write!(out, ",\"conn\":{conn},\"type\":\"ACCEPT\",\"peer\":");
            quote_json(&mut out, peer);
            let _ = write!(out, ",\"tls\":{tls}}}");
        }
        (Format::Json, ConnEvent::Closed { reason }) => {
            out.push_str("{\"time\":");
            quote_json(&mut out, &time);
            let _ = write!(out, ",\"conn\":{conn},\"type\":\"CLOSED\",\"reason\":");
            quote_json(&mut out, reason);
            out.push('}');
        }
    }
    out.push('\n');
    out
}

#[derive(Clone, Copy, Debug)]
pub enum ConnEvent<'a> {
    Accept { peer: &'a str, tls: bool },
    Closed { reason: &'a str },
}

/// The access log: a format and a file written by its own thread.
pub struct AccessLog {
    pub format: Format,
    pub file: LogFile,
}

impl AccessLog {
    pub fn op(&self, l: &OpResultLine<'_>) {
        self.file.write(op_line(self.format, l));
    }

    pub fn conn(&self, conn: u64, event: ConnEvent<'_>) {
        self.file.write(conn_line(
            self.format,
            pando_store::clock::now_micros(),
            conn,
            event,
        ));
    }
}

/// Stands for an assertion value on a secret attribute in logs.
pub const WITHHELD: &[u8] = b"(withheld)";

/// A filter's string form with the values it asserts on secret
/// attributes (`pando_model::secret`) replaced by [`WITHHELD`]: a filter
/// such as `(userPassword=guess)` is a password guess.
pub fn shown_filter(schema: &Schema, f: &Filter) -> String {
    fn hide(schema: &Schema, f: &mut Filter) {
        let secret = |a: &str| schema.is_secret(a);
        match f {
            Filter::And(items) | Filter::Or(items) => {
                items.iter_mut().for_each(|i| hide(schema, i));
            }
            Filter::Not(inner) => hide(schema, inner),
            Filter::Equality(a)
            | Filter::GreaterOrEqual(a)
            | Filter::LessOrEqual(a)
            | Filter::Approx(a) => {
                if secret(&a.attr) {
                    a.value = WITHHELD.to_vec();
                }
            }
            Filter::Substrings(sf) => {
                if secret(&sf.attr) {
                    sf.initial = Some(WITHHELD.to_vec());
                    sf.any.clear();
                    sf.final_ = None;
                }
            }
            // No attribute: the rule may apply to any, secrets included.
            Filter::Extensible(m) => {
                if m.attr.as_deref().is_none_or(secret) {
                    m.value = WITHHELD.to_vec();
                }
            }
            Filter::Present(_) => {}
        }
    }
    let needs = |a: &str| schema.is_secret(a);
    if !mentions(f, &needs) {
        return f.to_string();
    }
    let mut copy = f.clone();
    hide(schema, &mut copy);
    copy.to_string()
}

/// Whether `f` asserts a value on an attribute `secret` holds for (or on
/// no attribute).
fn mentions(f: &Filter, secret: &dyn Fn(&str) -> bool) -> bool {
    match f {
        Filter::And(items) | Filter::Or(items) => items.iter().any(|i| mentions(i, secret)),
        Filter::Not(inner) => mentions(inner, secret),
        Filter::Equality(a)
        | Filter::GreaterOrEqual(a)
        | Filter::LessOrEqual(a)
        | Filter::Approx(a) => secret(&a.attr),
        Filter::Substrings(sf) => secret(&sf.attr),
        Filter::Extensible(m) => m.attr.as_deref().is_none_or(secret),
        Filter::Present(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pando_proto::{
        AddRequest, BindRequest, Change, ExtendedRequest, ModOp, ModifyRequest, PartialAttribute,
    };

    fn line(f: Format, op: &ProtocolOp, code: Option<u32>) -> String {
        let r = Request::of(&Schema::standard(), op);
        op_line(
            f,
            &OpResultLine {
                time_micros: 1_763_795_000_000_123,
                conn: 5,
                op: 2,
                msgid: 3,
                request: &r,
                code,
                nentries: 1,
                etime_us: 123,
                qtime_us: 4,
            },
        )
    }

    #[test]
    fn text_search_line() {
        let op = LdapSearch::op();
        let l = line(Format::Text, &op, Some(0));
        assert_eq!(
            l,
            "2025-11-22T07:03:20.000123Z conn=5 op=2 msgid=3 SRCH base=\"dc=example,dc=com\" scope=2 filter=\"(uid=alice)\" attrs=\"cn mail\" RESULT tag=101 err=0 nentries=1 etime=0.000123 qtime=0.000004\n"
        );
    }

    struct LdapSearch;
    impl LdapSearch {
        fn op() -> ProtocolOp {
            ProtocolOp::SearchRequest(pando_proto::SearchRequest {
                base: "dc=example,dc=com".into(),
                scope: pando_proto::Scope::Sub,
                deref: pando_proto::DerefAliases::Never,
                size_limit: 0,
                time_limit: 0,
                types_only: false,
                filter: pando_proto::Filter::parse("(uid=alice)").unwrap(),
                attrs: vec!["cn".into(), "mail".into()],
            })
        }
    }

    #[test]
    fn json_line_is_one_object() {
        let l = line(Format::Json, &LdapSearch::op(), Some(32));
        assert!(l.starts_with("{\"time\":\"2025-11-22T07:03:20.000123Z\",\"conn\":5"));
        assert!(l.contains("\"type\":\"SRCH\""));
        assert!(l.contains("\"filter\":\"(uid=alice)\""));
        assert!(l.ends_with("\"err\":32,\"nentries\":1,\"etime_us\":123,\"qtime_us\":4}\n"));
    }

    #[test]
    fn no_credentials_or_values() {
        let secret = b"s3cret-Pa55".to_vec();
        let ops = [
            ProtocolOp::BindRequest(BindRequest {
                version: 3,
                name: "uid=a,dc=x".into(),
                auth: BindAuth::Simple(secret.clone()),
            }),
            ProtocolOp::AddRequest(AddRequest {
                dn: "uid=a,dc=x".into(),
                attrs: vec![PartialAttribute {
                    name: "userPassword".into(),
                    values: vec![secret.clone()],
                }],
            }),
            ProtocolOp::ModifyRequest(ModifyRequest {
                dn: "uid=a,dc=x".into(),
                changes: vec![Change {
                    op: ModOp::Replace,
                    attr: PartialAttribute {
                        name: "userPassword".into(),
                        values: vec![secret.clone()],
                    },
                }],
            }),
            ProtocolOp::ExtendedRequest(ExtendedRequest {
                name: "1.3.6.1.4.1.4203.1.11.1".into(),
                value: Some(secret.clone()),
            }),
        ];
        for op in &ops {
            for f in [Format::Text, Format::Json] {
                let l = line(f, op, Some(0));
                assert!(!l.contains("s3cret"), "{l}");
            }
        }
        let l = line(Format::Text, &ops[2], Some(0));
        assert!(
            l.contains("MOD dn=\"uid=a,dc=x\" attrs=\"userPassword\""),
            "{l}"
        );
    }

    #[test]
    fn quoting_keeps_one_line() {
        let op = ProtocolOp::DelRequest("cn=a\"b\\c\nd,dc=x".into());
        let l = line(Format::Text, &op, Some(0));
        assert_eq!(l.lines().count(), 1);
        // A quote becomes \22; the backslash escape stays; the newline
        // (after a backslash that escapes nothing it can) is \5c\0a.
        assert!(l.contains(r#"dn="cn=a\22b\c\0ad,dc=x""#), "{l}");
        let j = line(Format::Json, &op, Some(0));
        assert!(j.contains(r#""dn":"cn=a\"b\\c\nd,dc=x""#), "{j}");
    }

    #[test]
    fn filter_values_on_secrets_are_withheld() {
        let s = Schema::standard();
        let shown = |f: &str| shown_filter(&s, &pando_proto::Filter::parse(f).unwrap());
        assert_eq!(
            shown("(&(uid=a)(|(userPassword=guess)(sambaNTPassword=8846*)))"),
            "(&(uid=a)(|(userPassword=\\28withheld\\29)(sambaNTPassword=\\28withheld\\29*)))"
        );
        assert_eq!(shown("(2.5.4.35:=x)"), "(2.5.4.35:=\\28withheld\\29)");
        assert_eq!(shown("(uid=a*)"), "(uid=a*)");
    }

    #[test]
    fn dns_and_filters_are_logged_escaped_once() {
        let search = |f: &str, base: &str| {
            let ProtocolOp::SearchRequest(mut r) = LdapSearch::op() else {
                unreachable!()
            };
            r.base = base.into();
            r.filter = pando_proto::Filter::parse(f).unwrap();
            ProtocolOp::SearchRequest(r)
        };
        let l = line(
            Format::Text,
            &search("(uid=ali\\2a)", "cn=Comma\\, Person"),
            Some(0),
        );
        assert!(l.contains(r#"filter="(uid=ali\2a)""#), "{l}");
        assert!(l.contains(r#"base="cn=Comma\, Person""#), "{l}");
        let l = line(Format::Text, &search("(cn=say \"hi\")", "cn=x\\"), Some(0));
        assert!(l.contains(r#"filter="(cn=say \22hi\22)""#), "{l}");
        assert!(l.contains(r#"base="cn=x\5c""#), "{l}");
        // JSON escapes as JSON does; decoded, the strings are the same.
        let j = line(Format::Json, &search("(uid=ali\\2a)", "dc=x"), Some(0));
        assert!(j.contains(r#""filter":"(uid=ali\\2a)""#), "{j}");
    }

    #[test]
    fn connection_lines() {
        let t = conn_line(
            Format::Text,
            0,
            7,
            ConnEvent::Accept {
                peer: "127.0.0.1:5555",
                tls: false,
            },
        );
        assert_eq!(
            t,
            "1970-01-01T00:00:00.000000Z conn=7 ACCEPT from IP=127.0.0.1:5555\n"
        );
        let c = conn_line(Format::Text, 0, 7, ConnEvent::Closed { reason: "unbind" });
        assert_eq!(c, "1970-01-01T00:00:00.000000Z conn=7 closed (unbind)\n");
        let u = line(Format::Text, &ProtocolOp::UnbindRequest, None);
        assert!(u.ends_with("msgid=3 UNBIND\n"), "{u}");
    }
}
