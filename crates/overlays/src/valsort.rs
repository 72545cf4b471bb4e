//! Value sorting: values of configured attributes of entries below a base
//! are returned in a defined order (alphabetical, numeric, or by weights
//! `{n}` written in front of each value) instead of the order they are
//! stored in. Rules are written as slapd's `olcValSortAttr`:
//! `<attribute> <base DN> <order>`, order one of `alpha-ascend`,
//! `alpha-descend`, `numeric-ascend`, `numeric-descend`, `weighted`, or
//! `weighted` followed by an alpha or numeric order for equal weights.
//!
//! Weighted values are stored with their weight and go out without it;
//! a write leaving a value of such an attribute without a weight is
//! refused.

use pando_model::{Entry, Schema};
use pando_proto::ResultCode;
use pando_store::View;

use super::related::within;
use pando_ops::error::{LdapError, OpResult};
use pando_ops::seams::WriteHook;
use pando_ops::seams::{EntryStep, SearchHook};
use pando_ops::search::SearchJob;
use pando_ops::write::{Change, WriteCtx};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Alpha { descend: bool },
    Numeric { descend: bool },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The attribute as the schema names it.
    pub attr: String,
    /// Normalised base.
    pub base: String,
    pub weighted: bool,
    /// The order (among equal weights when weighted); None: weights only.
    pub order: Option<Order>,
}

fn order(word: &str) -> Option<Order> {
    Some(match word {
        "alpha-ascend" => Order::Alpha { descend: false },
        "alpha-descend" => Order::Alpha { descend: true },
        "numeric-ascend" => Order::Numeric { descend: false },
        "numeric-descend" => Order::Numeric { descend: true },
        _ => return None,
    })
}

/// Parse one rule, checked against the schema.
pub fn parse_rule(schema: &Schema, text: &str) -> Result<Rule, String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let (attr, base, rest) = match words.as_slice() {
        [a, b, rest @ ..] if !rest.is_empty() => (*a, *b, rest),
        _ => {
            return Err(format!(
                "'{text}' is not '<attribute> <base DN> <order>' (order: alpha-ascend, alpha-descend, numeric-ascend, numeric-descend, weighted [alpha-…|numeric-…])"
            ))
        }
    };
    let Some(at) = schema.attribute(attr) else {
        return Err(format!("'{attr}' is not an attribute type of the schema"));
    };
    let dn = pando_model::Dn::parse(base).map_err(|e| format!("'{base}' is not a DN: {e}"))?;
    let base = schema.normalize_dn(&dn)?;
    let (weighted, order) = match rest {
        ["weighted"] => (true, None),
        ["weighted", o] => (
            true,
            Some(order(o).ok_or_else(|| format!("'{o}' is not an order"))?),
        ),
        [o] => (
            false,
            Some(order(o).ok_or_else(|| format!("'{o}' is not an order"))?),
        ),
        _ => return Err(format!("'{}' is not an order", rest.join(" "))),
    };
    // As slapd: numeric orders for numeric syntaxes only, alphabetical
    // ones for the others.
    let numeric_syntax = matches!(
        at.syntax.as_deref(),
        Some("1.3.6.1.4.1.1466.115.121.1.27" | "1.3.6.1.4.1.1466.115.121.1.36")
    );
    match order {
        Some(Order::Numeric { .. }) if !numeric_syntax => {
            return Err(format!(
                "numeric order for '{attr}', whose syntax is not numeric"
            ))
        }
        Some(Order::Alpha { .. }) if numeric_syntax => {
            return Err(format!(
                "alphabetical order for '{attr}', whose syntax is numeric"
            ))
        }
        _ => {}
    }
    Ok(Rule {
        attr: at.name().to_string(),
        base,
        weighted,
        order,
    })
}

/// A weighted value: its weight, the sort key of the value without it,
/// the value without it, the value as stored.
type Weighted = (u64, Vec<u8>, Vec<u8>, Vec<u8>);

pub struct ValSort {
    rules: Vec<Rule>,
    schema: std::sync::Arc<Schema>,
}

/// A value's weight and the value without it (`{12}text` → (12, text)).
fn split_weight(v: &[u8]) -> Option<(u64, &[u8])> {
    let rest = v.strip_prefix(b"{")?;
    let end = rest.iter().position(|b| *b == b'}')?;
    let n = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
    Some((n, &rest[end + 1..]))
}

fn compare(order: Order, a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    use std::cmp::Ordering::{Greater, Less};
    let directed = |o: std::cmp::Ordering, descend: bool| if descend { o.reverse() } else { o };
    match order {
        Order::Alpha { descend } => directed(a.cmp(b), descend),
        Order::Numeric { descend } => {
            let num = |v: &[u8]| {
                std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.trim().parse::<i128>().ok())
            };
            match (num(a), num(b)) {
                (Some(x), Some(y)) => directed(x.cmp(&y), descend),
                // Values that are not numbers go after the numbers, in
                // either direction.
                (Some(_), None) => Less,
                (None, Some(_)) => Greater,
                (None, None) => a.cmp(b),
            }
        }
    }
}

impl ValSort {
    pub fn new(rules: Vec<Rule>, schema: std::sync::Arc<Schema>) -> ValSort {
        ValSort { rules, schema }
    }

    /// Sort the values `rule` names in `entry`, weights removed; with
    /// `keep_weights` (the value sorting control) a weighted attribute's
    /// values stay as stored, weights and all, as slapd returns them.
    /// Alphabetical orders compare values as the attribute's equality rule
    /// normalises them (`description` ignores case), as slapd does.
    pub fn sort(schema: &Schema, rule: &Rule, entry: &mut Entry, keep_weights: bool) {
        let at = schema.attribute(&rule.attr);
        let key = |v: &[u8]| -> Vec<u8> {
            at.and_then(|t| schema.normalize(t, v).ok())
                .unwrap_or_else(|| v.to_vec())
        };
        for a in entry.attrs.iter_mut() {
            let base = pando_model::desc::base(&a.desc);
            if !base.eq_ignore_ascii_case(&rule.attr) {
                continue;
            }
            if rule.weighted && keep_weights {
                // As slapd: the values as stored, weights and all.
                continue;
            }
            if rule.weighted {
                let mut weighted: Vec<Weighted> = a
                    .values
                    .drain(..)
                    .map(|v| match split_weight(&v) {
                        Some((w, rest)) => (w, key(rest), rest.to_vec(), v),
                        None => (u64::MAX, key(&v), v.clone(), v),
                    })
                    .collect();
                weighted.sort_by(|(wa, ka, _, _), (wb, kb, _, _)| {
                    wa.cmp(wb).then_with(|| match rule.order {
                        Some(o) => compare(o, ka, kb),
                        None => std::cmp::Ordering::Equal,
                    })
                });
                a.values = weighted
                    .into_iter()
                    .map(|(_, _, bare, stored)| if keep_weights { stored } else { bare })
                    .collect();
            } else if let Some(o) = rule.order {
                let mut keyed: Vec<(Vec<u8>, Vec<u8>)> =
                    a.values.drain(..).map(|v| (key(&v), v)).collect();
                keyed.sort_by(|(x, _), (y, _)| compare(o, x, y));
                a.values = keyed.into_iter().map(|(_, v)| v).collect();
            }
        }
    }
}

impl SearchHook for ValSort {
    fn per_entry(&self, job: &SearchJob) -> Option<EntryStep> {
        let asked = &job.req.attrs;
        let all_user = asked.is_empty() || asked.iter().any(|a| a == "*");
        let rules: Vec<Rule> = self
            .rules
            .iter()
            .filter(|r| all_user || asked.iter().any(|a| a.eq_ignore_ascii_case(&r.attr)))
            .cloned()
            .collect();
        if rules.is_empty() {
            return None;
        }
        let schema = self.schema.clone();
        let keep_weights = job.controls.valsort_weights;
        Some(Box::new(move |dn: &str, entry: &mut Entry| {
            let applies: Vec<&Rule> = rules
                .iter()
                .filter(|r| entry.get(&r.attr).is_some())
                .collect();
            if applies.is_empty() {
                return;
            }
            let Some(norm) = pando_model::Dn::parse(dn)
                .ok()
                .and_then(|d| schema.normalize_dn(&d).ok())
            else {
                return;
            };
            for r in applies.into_iter().filter(|r| within(&norm, &r.base)) {
                ValSort::sort(&schema, r, entry, keep_weights);
            }
        }))
    }
}

impl WriteHook for ValSort {
    /// A weighted attribute's values must each carry a weight.
    fn check(&self, _ctx: &WriteCtx, _view: &View<'_>, changes: &[Change]) -> OpResult<()> {
        for c in changes {
            let Some(after) = &c.after else { continue };
            for r in self.rules.iter().filter(|r| r.weighted) {
                if !within(c.norm(), &r.base) {
                    continue;
                }
                if let Some(v) = after
                    .values(&r.attr)
                    .iter()
                    .find(|v| split_weight(v).is_none())
                {
                    return Err(LdapError::new(
                        ResultCode::CONSTRAINT_VIOLATION,
                        format!(
                            "{}: '{}' has no weight; values are sorted by weight here, written {{n}}value",
                            r.attr,
                            String::from_utf8_lossy(v)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(values: &[&str]) -> Entry {
        let mut e = Entry::new(pando_model::Dn::parse("cn=g,dc=x").unwrap());
        e.add_values(
            "description",
            values.iter().map(|v| v.as_bytes().to_vec()).collect(),
        );
        e
    }

    fn values(e: &Entry) -> Vec<String> {
        e.values("description")
            .iter()
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect()
    }

    #[test]
    fn rules_parse_and_sort_as_slapd_names_them() {
        let schema = Schema::standard();
        let mut r = parse_rule(&schema, "description dc=X alpha-descend").unwrap();
        r.order = Some(Order::Numeric { descend: true });
        let mut e = entry(&["9", "10", "x", "2"]);
        ValSort::sort(&schema, &r, &mut e, false);
        assert_eq!(values(&e), ["10", "9", "2", "x"]);
        let why = parse_rule(&schema, "description dc=X numeric-descend").unwrap_err();
        assert!(why.contains("not numeric"), "{why}");
        assert!(parse_rule(&schema, "uidNumber dc=X numeric-ascend").is_ok());
        let r = parse_rule(&schema, "description dc=x alpha-ascend").unwrap();
        ValSort::sort(&schema, &r, &mut e, false);
        assert_eq!(values(&e), ["10", "2", "9", "x"]);
        let r = parse_rule(&schema, "description dc=x weighted alpha-descend").unwrap();
        assert!(r.weighted);
        let mut e = entry(&["{2}b", "{1}z", "{2}c", "{1}a"]);
        let mut kept = e.clone();
        ValSort::sort(&schema, &r, &mut e, false);
        assert_eq!(values(&e), ["z", "a", "c", "b"]);
        ValSort::sort(&schema, &r, &mut kept, true);
        assert_eq!(values(&kept), ["{2}b", "{1}z", "{2}c", "{1}a"]);
        assert!(parse_rule(&schema, "nosuch dc=x weighted")
            .unwrap_err()
            .contains("nosuch"));
        assert!(parse_rule(&schema, "description dc=x sideways")
            .unwrap_err()
            .contains("sideways"));
        assert!(parse_rule(&schema, "description").is_err());
    }
}
