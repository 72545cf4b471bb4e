//! Error injection, for testing applications against a directory that
//! fails: rules that make chosen operations on chosen DNs answer a chosen
//! result code, wait first, or lose their connection, always or with a
//! probability. Configured only by administrators (it is configuration),
//! logged as a warning when it is turned on and at every injection, and
//! counted under `cn=Overlays,cn=Monitor`.
//!
//! A rule is one string of `key=value` words (values may be quoted):
//!
//! ```text
//! ops=search,modify subtree="ou=People,dc=example,dc=com" result=51 text="try later" p=0.5
//! ops=bind regex="^uid=test" delay=2000
//! ops=add dn="cn=x,dc=example,dc=com" disconnect
//! ```
//!
//! - `ops`: bind, search, compare, add, delete, modify, moddn, extended
//!   (default: every operation);
//! - at most one of `dn` (that entry), `subtree` (it and below), `regex`
//!   (matched against the normalised DN); none: every DN;
//! - `result=<code>` (1..=123) with an optional `text`, `delay=<ms>`
//!   (up to 60000; alone, the operation then runs), `disconnect`;
//! - `p=<probability>` between 0 and 1 (default 1).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use pando_model::{Dn, Schema};
use pando_proto::{ProtocolOp, ResultCode};

use super::related::within;
use pando_observe::metrics::OpKind;

enum Target {
    Any,
    Exact(String),
    Subtree(String),
    Regex(regex::Regex),
}

/// One compiled rule.
pub struct Rule {
    pub text: String,
    ops: Vec<OpKind>,
    target: Target,
    pub result: Option<(ResultCode, String)>,
    pub delay: Option<Duration>,
    pub disconnect: bool,
    probability: f64,
    pub injected: AtomicU64,
}

/// What to do to one operation.
pub struct Fault<'r> {
    pub rule: &'r Rule,
}

/// Split a rule into `key=value` words, honouring double quotes.
fn words(text: &str) -> Result<Vec<(String, Option<String>)>, String> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(c) = chars.peek().copied() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        if chars.peek() != Some(&'=') {
            out.push((key, None));
            continue;
        }
        chars.next();
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    None => return Err(format!("'{key}': unclosed quote")),
                    Some('"') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.peek().copied() {
                if c.is_whitespace() {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        out.push((key, Some(value)));
    }
}

fn op_kind(name: &str) -> Option<OpKind> {
    Some(match name {
        "bind" => OpKind::Bind,
        "search" => OpKind::Search,
        "compare" => OpKind::Compare,
        "add" => OpKind::Add,
        "delete" => OpKind::Delete,
        "modify" => OpKind::Modify,
        "moddn" => OpKind::ModDn,
        "extended" => OpKind::Extended,
        _ => return None,
    })
}

/// Compile one rule, checked.
pub fn parse_rule(schema: &Schema, text: &str) -> Result<Rule, String> {
    let mut rule = Rule {
        text: text.trim().to_string(),
        ops: Vec::new(),
        target: Target::Any,
        result: None,
        delay: None,
        disconnect: false,
        probability: 1.0,
        injected: AtomicU64::new(0),
    };
    let mut text_given = None;
    let norm = |v: &str| -> Result<String, String> {
        let dn = Dn::parse(v).map_err(|e| format!("'{v}' is not a DN: {e}"))?;
        schema.normalize_dn(&dn)
    };
    for (key, value) in words(text)? {
        let need = || {
            value
                .clone()
                .ok_or_else(|| format!("'{key}' needs a value ({key}=…)"))
        };
        let target_set = !matches!(rule.target, Target::Any);
        match key.as_str() {
            "ops" => {
                for o in need()?.split(',').filter(|o| !o.is_empty()) {
                    rule.ops.push(op_kind(o).ok_or_else(|| {
                        format!("'{o}' is not an operation (bind, search, compare, add, delete, modify, moddn, extended)")
                    })?);
                }
            }
            "dn" | "subtree" | "regex" if target_set => {
                return Err("give one of dn, subtree and regex".into())
            }
            "dn" => rule.target = Target::Exact(norm(&need()?)?),
            "subtree" => rule.target = Target::Subtree(norm(&need()?)?),
            "regex" => {
                let r = need()?;
                rule.target = Target::Regex(
                    regex::RegexBuilder::new(&r)
                        .size_limit(1 << 20)
                        .build()
                        .map_err(|e| format!("regex '{r}': {e}"))?,
                )
            }
            "result" => {
                let v = need()?;
                let code: u32 = v
                    .parse()
                    .ok()
                    .filter(|c| (1..=123).contains(c))
                    .ok_or_else(|| format!("result '{v}' is not a result code from 1 to 123"))?;
                rule.result = Some((ResultCode(code), String::new()));
            }
            "text" => text_given = Some(need()?),
            "delay" => {
                let v = need()?;
                let ms: u64 = v
                    .parse()
                    .ok()
                    .filter(|ms| *ms <= 60_000)
                    .ok_or_else(|| format!("delay '{v}' is not milliseconds from 0 to 60000"))?;
                rule.delay = Some(Duration::from_millis(ms));
            }
            "disconnect" if value.is_none() => rule.disconnect = true,
            "p" => {
                let v = need()?;
                rule.probability = v
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| format!("p '{v}' is not a probability from 0 to 1"))?;
            }
            other => {
                return Err(format!(
                    "'{other}' is not a rule word (ops, dn, subtree, regex, result, text, delay, disconnect, p)"
                ))
            }
        }
    }
    if let (Some(t), Some((_, text))) = (text_given, rule.result.as_mut()) {
        *text = t;
    }
    if rule.result.is_none() && rule.delay.is_none() && !rule.disconnect {
        return Err(format!(
            "'{}' does nothing: give result=<code>, delay=<ms> or disconnect",
            rule.text
        ));
    }
    Ok(rule)
}

/// The DN an operation names (None: it names none).
fn target_dn(op: &ProtocolOp) -> Option<&str> {
    Some(match op {
        ProtocolOp::BindRequest(b) => &b.name,
        ProtocolOp::SearchRequest(s) => &s.base,
        ProtocolOp::CompareRequest(c) => &c.dn,
        ProtocolOp::AddRequest(a) => &a.dn,
        ProtocolOp::DelRequest(d) => d,
        ProtocolOp::ModifyRequest(m) => &m.dn,
        ProtocolOp::ModifyDnRequest(m) => &m.dn,
        _ => return None,
    })
}

pub struct Errors {
    pub rules: Vec<Rule>,
}

impl Errors {
    pub fn new(rules: Vec<Rule>) -> Errors {
        tracing::warn!(
            rules = rules.len(),
            "error injection is on: operations matching its rules will fail on purpose"
        );
        Errors { rules }
    }

    /// The first rule that fires for `op`, counted and logged.
    pub fn pick(&self, schema: &Schema, op: &ProtocolOp) -> Option<Fault<'_>> {
        let kind = pando_observe::kind_of(op)?;
        let norm = target_dn(op).map(|d| {
            Dn::parse(d)
                .ok()
                .and_then(|dn| schema.normalize_dn(&dn).ok())
                .unwrap_or_else(|| d.to_ascii_lowercase())
        });
        for rule in &self.rules {
            if !rule.ops.is_empty() && !rule.ops.contains(&kind) {
                continue;
            }
            let hit = match (&rule.target, norm.as_deref()) {
                (Target::Any, _) => true,
                (_, None) => false,
                (Target::Exact(n), Some(d)) => n == d,
                (Target::Subtree(n), Some(d)) => within(d, n),
                (Target::Regex(r), Some(d)) => r.is_match(d),
            };
            if !hit || (rule.probability < 1.0 && rand::random::<f64>() >= rule.probability) {
                continue;
            }
            rule.injected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(rule = %rule.text, op = ?kind, dn = norm.as_deref().unwrap_or(""), "error injected");
            return Some(Fault { rule });
        }
        None
    }
}

/// Error injection as the operations consult it (`ops::seams::Faults`,
/// the first layer of `ops::stack`).
impl pando_ops::seams::Faults for Errors {
    fn pick(&self, schema: &Schema, request: &ProtocolOp) -> Option<pando_ops::seams::Fault> {
        let rule = Errors::pick(self, schema, request)?.rule;
        Some(pando_ops::seams::Fault {
            delay: rule.delay,
            disconnect: rule.disconnect,
            result: rule.result.clone(),
        })
    }

    fn counts(&self) -> Vec<String> {
        self.rules
            .iter()
            .map(|r| format!("injected={} {}", r.injected.load(Ordering::Relaxed), r.text))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_bad_ones_say_why() {
        let s = Schema::standard();
        let r = parse_rule(
            &s,
            r#"ops=search,modify subtree="ou=People, dc=Example,dc=com" result=51 text="try later" p=0.5"#,
        )
        .unwrap();
        assert_eq!(r.result, Some((ResultCode(51), "try later".into())));
        assert!(matches!(&r.target, Target::Subtree(n) if n == "ou=people,dc=example,dc=com"));
        assert!(
            parse_rule(&s, "ops=bind delay=20 disconnect")
                .unwrap()
                .disconnect
        );
        for (bad, why) in [
            ("ops=frob result=1", "frob"),
            ("result=0", "result"),
            ("delay=99999999", "delay"),
            ("p=2 result=1", "p"),
            ("dn=x=y,, result=1", "DN"),
            ("regex=( result=1", "regex"),
            ("ops=add", "does nothing"),
            ("dn=cn=a subtree=cn=b result=1", "one of"),
            ("colour=red", "colour"),
            (r#"text="open result=1"#, "quote"),
        ] {
            let e = parse_rule(&s, bad)
                .err()
                .unwrap_or_else(|| panic!("{bad} parsed"));
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn the_first_matching_rule_fires_and_is_counted() {
        let s = Schema::standard();
        let errors = Errors::new(vec![
            parse_rule(&s, "ops=delete dn=cn=a,dc=x result=53").unwrap(),
            parse_rule(&s, "regex=^cn=b result=32").unwrap(),
            parse_rule(&s, "ops=add p=0 result=1").unwrap(),
        ]);
        let del = |dn: &str| ProtocolOp::DelRequest(dn.into());
        assert_eq!(
            errors
                .pick(&s, &del("CN=A,DC=X"))
                .unwrap()
                .rule
                .result
                .as_ref()
                .unwrap()
                .0,
            ResultCode(53)
        );
        assert!(errors.pick(&s, &del("cn=c,dc=x")).is_none());
        assert_eq!(
            errors
                .pick(&s, &del("cn=b2,dc=x"))
                .unwrap()
                .rule
                .result
                .as_ref()
                .unwrap()
                .0,
            ResultCode(32)
        );
        let add = ProtocolOp::AddRequest(pando_proto::AddRequest {
            dn: "cn=z".into(),
            attrs: vec![],
        });
        assert!(errors.pick(&s, &add).is_none(), "p=0 never fires");
        assert_eq!(errors.rules[0].injected.load(Ordering::Relaxed), 1);
    }
}
