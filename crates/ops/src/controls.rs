//! Request controls: the one place that decides which controls an
//! operation accepts, and their values, typed.
//!
//! [`SUPPORTED`] lists every control the server implements with the
//! operations it applies to; the root DSE's supportedControl is that list.
//! For each control a request carries (RFC 4511 4.1.11):
//! - unknown, or known but not applicable to the operation: refused with
//!   unavailableCriticalExtension when critical, ignored otherwise;
//! - applicable, with a malformed value, sent twice, or with a criticality
//!   its RFC forbids: protocolError;
//! - otherwise its typed value lands in [`Requested`].
//!
//! A new control is a line in [`SUPPORTED`], a field in [`Requested`] and
//! its behaviour where the operation uses it.

use pando_proto::control_values as cv;
use pando_proto::{oid, Control, DecodeLimits, Filter, PagedResults, ResultCode};

use crate::error::{LdapError, OpResult};

/// What an operation is, for deciding which controls apply (the kinds the
/// metrics count; Abandon and Unbind take no controls).
pub use pando_observe::metrics::OpKind;
use OpKind::*;

/// Updates that change an entry in place or by name.
const UPDATES: &[OpKind] = &[Add, Delete, Modify, ModDn];

/// A supported control: its OID, the operations it applies to, and how
/// its value is taken into [`Requested`].
pub struct Supported {
    pub oid: &'static str,
    pub applies_to: &'static [OpKind],
    parse: fn(&mut Requested, &Control, &DecodeLimits) -> OpResult<()>,
}

/// Every control the server implements (the root DSE lists them in this
/// order).
pub const SUPPORTED: &[Supported] = &[
    Supported {
        oid: oid::PAGED_RESULTS,
        applies_to: &[Search],
        parse: |r, c, _| {
            let v = value(c)?;
            let p = PagedResults::decode(v)
                .map_err(|_| LdapError::protocol("malformed paged results control value"))?;
            r.paged = Some(p);
            Ok(())
        },
    },
    Supported {
        oid: oid::SORT_REQUEST,
        applies_to: &[Search],
        parse: |r, c, limits| {
            let mut keys =
                cv::decode_sort_request(value(c)?, limits).map_err(|e| malformed(c, &e))?;
            let too_many = keys.len() > limits.max_sort_keys;
            keys.truncate(limits.max_sort_keys);
            r.sort = Some(Sort {
                keys,
                critical: c.critical,
                too_many,
            });
            Ok(())
        },
    },
    Supported {
        oid: oid::VLV_REQUEST,
        applies_to: &[Search],
        parse: |r, c, _| {
            let req = cv::VlvRequest::decode(value(c)?).map_err(|e| malformed(c, &e))?;
            r.vlv = Some(Vlv {
                req,
                critical: c.critical,
            });
            Ok(())
        },
    },
    Supported {
        oid: oid::PERSISTENT_SEARCH,
        applies_to: &[Search],
        parse: |r, c, _| {
            let p = cv::PersistentSearch::decode(value(c)?).map_err(|e| malformed(c, &e))?;
            r.persistent = Some(p);
            Ok(())
        },
    },
    Supported {
        oid: oid::SYNC_REQUEST,
        applies_to: &[Search],
        parse: |r, c, _| {
            let s =
                pando_proto::sync::SyncRequest::decode(value(c)?).map_err(|e| malformed(c, &e))?;
            r.sync = Some(s);
            Ok(())
        },
    },
    Supported {
        oid: oid::PROXIED_AUTHZ,
        applies_to: &[Search, Compare, Add, Delete, Modify, ModDn, Extended],
        parse: |r, c, _| {
            // RFC 4370 3: the control MUST be critical, else protocolError.
            if !c.critical {
                return Err(LdapError::protocol(
                    "the proxied authorization control must be marked critical",
                ));
            }
            let authz = std::str::from_utf8(value(c)?).map_err(|_| {
                LdapError::protocol("the proxied authorization identity is not UTF-8")
            })?;
            r.proxied_authz = Some(authz.to_string());
            Ok(())
        },
    },
    Supported {
        oid: oid::MATCHED_VALUES,
        applies_to: &[Search],
        parse: |r, c, limits| {
            let items =
                cv::decode_matched_values(value(c)?, limits).map_err(|e| malformed(c, &e))?;
            r.matched_values = Some(items);
            Ok(())
        },
    },
    Supported {
        oid: oid::SUBENTRIES,
        applies_to: &[Search],
        parse: |r, c, _| {
            let visible = cv::decode_subentries(value(c)?).map_err(|e| malformed(c, &e))?;
            r.subentries = Some(visible);
            Ok(())
        },
    },
    Supported {
        oid: oid::MANAGE_DSA_IT,
        applies_to: &[Search, Compare, Add, Delete, Modify, ModDn],
        parse: |r, c, _| {
            no_value(c)?;
            r.manage_dsa_it = true;
            Ok(())
        },
    },
    Supported {
        oid: oid::ASSERTION,
        applies_to: &[Search, Compare, Add, Delete, Modify, ModDn],
        parse: |r, c, limits| {
            let f = cv::decode_assertion(value(c)?, limits).map_err(|e| malformed(c, &e))?;
            r.assertion = Some(f);
            Ok(())
        },
    },
    Supported {
        oid: oid::PRE_READ,
        applies_to: &[Delete, Modify, ModDn],
        parse: |r, c, _| {
            let attrs = cv::decode_attribute_selection(value(c)?).map_err(|e| malformed(c, &e))?;
            r.pre_read = Some(ReadEntry {
                attrs,
                critical: c.critical,
            });
            Ok(())
        },
    },
    Supported {
        oid: oid::POST_READ,
        applies_to: &[Add, Modify, ModDn],
        parse: |r, c, _| {
            let attrs = cv::decode_attribute_selection(value(c)?).map_err(|e| malformed(c, &e))?;
            r.post_read = Some(ReadEntry {
                attrs,
                critical: c.critical,
            });
            Ok(())
        },
    },
    Supported {
        oid: oid::PERMISSIVE_MODIFY,
        applies_to: &[Modify],
        parse: |r, c, _| {
            no_value(c)?;
            r.permissive_modify = true;
            Ok(())
        },
    },
    Supported {
        oid: oid::TREE_DELETE,
        applies_to: &[Delete],
        parse: |r, c, _| {
            no_value(c)?;
            r.tree_delete = true;
            Ok(())
        },
    },
    Supported {
        oid: oid::NO_OP,
        applies_to: UPDATES,
        parse: no_op,
    },
    Supported {
        oid: oid::NO_OP_DRAFT,
        applies_to: UPDATES,
        parse: no_op,
    },
    Supported {
        oid: oid::RELAX,
        applies_to: UPDATES,
        parse: |r, c, _| {
            no_value(c)?;
            r.relax = true;
            Ok(())
        },
    },
    Supported {
        oid: oid::PASSWORD_POLICY,
        applies_to: &[Bind, Add, Modify, Extended],
        parse: |r, c, _| {
            no_value(c)?;
            r.ppolicy = true;
            Ok(())
        },
    },
    Supported {
        oid: oid::VALSORT,
        applies_to: &[Search],
        parse: |r, c, _| {
            r.valsort_weights = cv::decode_valsort(value(c)?).map_err(|e| malformed(c, &e))?;
            Ok(())
        },
    },
    Supported {
        oid: oid::DONT_USE_COPY,
        // RFC 6171: a server holding the original answers as usual.
        applies_to: &[Search, Compare],
        parse: |r, c, _| {
            no_value(c)?;
            // RFC 6171 3: the control MUST be critical.
            if !c.critical {
                return Err(LdapError::protocol(
                    "the don't-use-copy control must be marked critical",
                ));
            }
            r.dont_use_copy = true;
            Ok(())
        },
    },
];

fn no_op(r: &mut Requested, c: &Control, _: &DecodeLimits) -> OpResult<()> {
    no_value(c)?;
    r.no_op = true;
    Ok(())
}

/// The typed controls of one request, after [`parse`].
#[derive(Debug, Default, Clone)]
pub struct Requested {
    pub paged: Option<PagedResults>,
    /// RFC 2891 server-side sort.
    pub sort: Option<Sort>,
    /// Virtual list view (needs `sort`).
    pub vlv: Option<Vlv>,
    /// draft-ietf-ldapext-psearch-03: stay open and send changes.
    pub persistent: Option<cv::PersistentSearch>,
    /// RFC 4533: a replication consumer's content synchronization.
    pub sync: Option<pando_proto::sync::SyncRequest>,
    /// RFC 3876: the simple filter items values must match to be returned.
    pub matched_values: Option<Vec<Filter>>,
    /// RFC 3672: Some(true) returns only subentries, Some(false) only
    /// ordinary entries; absent, ordinary entries (and subentries named as
    /// a base-scope search's base).
    pub subentries: Option<bool>,
    pub manage_dsa_it: bool,
    /// RFC 4370: the authzId (`dn:…`, `u:…`, or empty for anonymous) the
    /// operation runs as, once `ops::proxy` allowed it.
    pub proxied_authz: Option<String>,
    /// RFC 4528: the operation goes ahead only if this filter is TRUE for
    /// its target entry (for an add: the entry being added).
    pub assertion: Option<Filter>,
    /// RFC 4527: attribute selections for the entry before / after the
    /// update, returned in response controls.
    pub pre_read: Option<ReadEntry>,
    pub post_read: Option<ReadEntry>,
    /// Adding a value already present or deleting one that is absent is
    /// not an error.
    pub permissive_modify: bool,
    /// Delete the entry and its whole subtree.
    pub tree_delete: bool,
    /// Do everything but commit; answer noOperation.
    pub no_op: bool,
    /// Administrators may set attributes the server otherwise maintains.
    pub relax: bool,
    pub dont_use_copy: bool,
    /// Weighted values keep their `{n}` weights (the value sorting
    /// overlay).
    pub valsort_weights: bool,
    /// The password policy response control is wanted.
    pub ppolicy: bool,
}

/// A server-side sort request (RFC 2891).
#[derive(Debug, Clone)]
pub struct Sort {
    pub keys: Vec<cv::SortKey>,
    /// Critical: a sort that cannot be done fails the search
    /// (unavailableCriticalExtension); otherwise the entries go unsorted.
    pub critical: bool,
    /// The request listed more than `limits.max_sort_keys` keys (`keys`
    /// holds the first of them): the search is refused.
    pub too_many: bool,
}

/// A virtual list view request.
#[derive(Debug, Clone)]
pub struct Vlv {
    pub req: cv::VlvRequest,
    pub critical: bool,
}

/// A pre-read or post-read request (RFC 4527).
#[derive(Debug, Clone)]
pub struct ReadEntry {
    /// The attribute selection, as a search's.
    pub attrs: Vec<String>,
    /// Critical: a requester that may not read the entry has the whole
    /// operation refused; otherwise it just gets no response control.
    pub critical: bool,
}

/// The typed controls of a request for an operation of `kind`, or the
/// error the operation is answered with (see the module header).
pub fn parse(kind: OpKind, controls: &[Control], limits: &DecodeLimits) -> OpResult<Requested> {
    let mut out = Requested::default();
    for (i, c) in controls.iter().enumerate() {
        let known = SUPPORTED
            .iter()
            .find(|s| s.oid == c.oid && s.applies_to.contains(&kind));
        let Some(s) = known else {
            if c.critical {
                return Err(unavailable(c, kind));
            }
            continue;
        };
        if controls[..i].iter().any(|d| d.oid == c.oid) {
            return Err(LdapError::protocol(format!(
                "control {} given more than once",
                c.oid
            )));
        }
        (s.parse)(&mut out, c, limits)?;
    }
    Ok(out)
}

/// The OIDs the root DSE lists as supportedControl.
pub fn supported_oids() -> impl Iterator<Item = &'static str> {
    SUPPORTED.iter().map(|s| s.oid)
}

fn unavailable(c: &Control, kind: OpKind) -> LdapError {
    let why = if SUPPORTED.iter().any(|s| s.oid == c.oid) {
        format!("critical control {} does not apply to {kind:?}", c.oid)
    } else {
        format!("critical control {} is not supported", c.oid)
    };
    LdapError::new(ResultCode::UNAVAILABLE_CRITICAL_EXTENSION, why)
}

fn value(c: &Control) -> OpResult<&[u8]> {
    c.value
        .as_deref()
        .ok_or_else(|| LdapError::protocol(format!("control {} needs a value", c.oid)))
}

fn no_value(c: &Control) -> OpResult<()> {
    match c.value {
        None => Ok(()),
        Some(_) => Err(LdapError::protocol(format!(
            "control {} takes no value",
            c.oid
        ))),
    }
}

fn malformed(c: &Control, e: &pando_proto::DecodeError) -> LdapError {
    LdapError::protocol(format!(
        "malformed value of control {}: {}",
        c.oid, e.reason
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctl(oid: &str, critical: bool, value: Option<Vec<u8>>) -> Control {
        Control {
            oid: oid.into(),
            critical,
            value,
        }
    }

    fn code(r: OpResult<Requested>) -> ResultCode {
        r.err().map_or(ResultCode::SUCCESS, |e| e.code)
    }

    #[test]
    fn unknown_and_inapplicable_controls_by_criticality() {
        let l = DecodeLimits::default();
        let unknown = ctl("1.2.3.4", true, None);
        assert_eq!(
            code(parse(Search, &[unknown], &l)),
            ResultCode::UNAVAILABLE_CRITICAL_EXTENSION
        );
        assert_eq!(
            code(parse(Search, &[ctl("1.2.3.4", false, None)], &l)),
            ResultCode::SUCCESS
        );
        // Tree delete applies to delete only.
        let td = ctl(oid::TREE_DELETE, true, None);
        assert_eq!(
            code(parse(Modify, std::slice::from_ref(&td), &l)),
            ResultCode::UNAVAILABLE_CRITICAL_EXTENSION
        );
        assert!(parse(Delete, &[td], &l).unwrap().tree_delete);
        // Not critical and not applicable: ignored, not applied.
        let r = parse(Modify, &[ctl(oid::TREE_DELETE, false, None)], &l).unwrap();
        assert!(!r.tree_delete);
    }

    #[test]
    fn malformed_and_repeated_controls_are_protocol_errors() {
        let l = DecodeLimits::default();
        let twice = [ctl(oid::NO_OP, false, None), ctl(oid::NO_OP, false, None)];
        assert_eq!(code(parse(Add, &twice, &l)), ResultCode::PROTOCOL_ERROR);
        let valued = ctl(oid::MANAGE_DSA_IT, false, Some(vec![]));
        assert_eq!(
            code(parse(Search, &[valued], &l)),
            ResultCode::PROTOCOL_ERROR
        );
        let bad = ctl(oid::ASSERTION, true, Some(vec![0x30]));
        assert_eq!(code(parse(Modify, &[bad], &l)), ResultCode::PROTOCOL_ERROR);
        let lax = ctl(oid::DONT_USE_COPY, false, None);
        assert_eq!(code(parse(Search, &[lax], &l)), ResultCode::PROTOCOL_ERROR);
    }

    #[test]
    fn sort_key_lists_are_cut_past_the_limit() {
        let l = DecodeLimits {
            max_sort_keys: 2,
            ..DecodeLimits::default()
        };
        let key = [0x30, 0x04, 0x04, 0x02, b'c', b'n'];
        let list = |n: usize| {
            let body: Vec<u8> = key.iter().copied().cycle().take(6 * n).collect();
            let mut v = vec![0x30, body.len() as u8];
            v.extend(body);
            ctl(oid::SORT_REQUEST, true, Some(v))
        };
        let two = parse(Search, &[list(2)], &l).unwrap().sort.unwrap();
        assert_eq!((two.keys.len(), two.too_many), (2, false));
        let many = parse(Search, &[list(20)], &l).unwrap().sort.unwrap();
        assert_eq!((many.keys.len(), many.too_many), (2, true));
    }

    #[test]
    fn values_are_typed() {
        let l = DecodeLimits::default();
        let mut f = Vec::new();
        Filter::parse("(sn=a)").unwrap().encode(&mut f);
        let sel = vec![0x30, 0x04, 0x04, 0x02, b'c', b'n'];
        let r = parse(
            Modify,
            &[
                ctl(oid::ASSERTION, true, Some(f)),
                ctl(oid::PRE_READ, false, Some(sel.clone())),
                ctl(oid::POST_READ, false, Some(sel)),
            ],
            &l,
        )
        .unwrap();
        assert_eq!(r.assertion, Some(Filter::parse("(sn=a)").unwrap()));
        assert_eq!(r.pre_read.unwrap().attrs, ["cn"]);
        assert!(!r.post_read.unwrap().critical);
    }
}
