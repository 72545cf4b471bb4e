//! What a search sends of an entry: the attributes the request selects
//! (RFC 4511 4.5.1.8, RFC 3673 `+`, RFC 4529 `@class`), less those the
//! requester may not read, with computed attributes, encoded straight
//! into the output buffer.

use std::sync::Arc;

use pando_model::{AttributeType, Dn, Entry, Schema};
use pando_proto::EntryEncoder;
use pando_store::{EntryId, View};

use crate::error::OpResult;
use crate::seams::EntryStep;
use crate::special::SUBSCHEMA_DN;
use crate::COMPUTED;
use pando_access::acl::{self, Access, EntryRules};

/// Which attributes a search returns (RFC 4511 4.5.1.8, RFC 3673, RFC 4529).
#[derive(Clone)]
pub(super) struct Selection {
    pub(super) all_user: bool,
    pub(super) all_oper: bool,
    /// Requested types (lowercase canonical names) with required options.
    pub(super) named: Vec<(String, Vec<String>)>,
    /// OIDs of the requested types, in the order of `named` (resolved once
    /// per search, not once per attribute of every entry).
    pub(super) named_oids: Vec<String>,
    /// Only stored attributes go out, never computed ones (replication:
    /// each server computes its own).
    pub(super) stored_only: bool,
}

/// The requested types met so far, so each is kept once.
enum Seen {
    /// Few: `named` itself is searched.
    Few,
    Many(std::collections::HashSet<(String, Vec<String>)>),
}

impl Seen {
    fn new(many: bool) -> Seen {
        if many {
            Seen::Many(Default::default())
        } else {
            Seen::Few
        }
    }

    /// Push `want` onto `named` unless it is there already.
    fn add(&mut self, named: &mut Vec<(String, Vec<String>)>, want: (String, Vec<String>)) {
        let new = match self {
            Seen::Few => !named.contains(&want),
            Seen::Many(set) => set.insert(want.clone()),
        };
        if new {
            named.push(want);
        }
    }
}

/// How many attribute lists each thread remembers the selection of, and
/// the longest list (in bytes of names) it remembers.
const REMEMBERED: usize = 4;
const REMEMBERED_BYTES: usize = 1024;

/// A remembered selection: the schema it was made against (held, so that
/// no other schema can take its address), the list, the selection.
type Remembered = (Arc<Schema>, Vec<String>, Arc<Selection>);

thread_local! {
    /// The selections this thread made last, newest last.
    static SELECTIONS: std::cell::RefCell<Vec<Remembered>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl Selection {
    /// [`Selection::new`], shared: a client names the same attributes
    /// search after search (a login's lookup, a mail router's), and each
    /// thread remembers the selections of the last few lists it saw.
    pub(super) fn remembered(schema: &Arc<Schema>, attrs: &[String]) -> Arc<Selection> {
        let same = |(s, a, _): &&Remembered| Arc::ptr_eq(s, schema) && a.as_slice() == attrs;
        let hit = SELECTIONS.with(|c| c.borrow().iter().find(same).map(|e| e.2.clone()));
        if let Some(sel) = hit {
            return sel;
        }
        let sel = Arc::new(Selection::new(schema, attrs));
        if attrs.iter().map(String::len).sum::<usize>() <= REMEMBERED_BYTES {
            SELECTIONS.with(|c| {
                let mut c = c.borrow_mut();
                if c.len() >= REMEMBERED {
                    c.remove(0);
                }
                c.push((schema.clone(), attrs.to_vec(), sel.clone()));
            });
        }
        sel
    }

    /// Each requested type is kept once, and not at all with options when
    /// it is also requested without (that request already covers it): a
    /// list naming `cn` 100,000 times, or `@class` as often, selects as
    /// one naming it once, and every attribute of every entry is tested
    /// against `named`.
    pub(super) fn new(schema: &Schema, attrs: &[String]) -> Selection {
        let mut s = Selection {
            all_user: attrs.is_empty(),
            all_oper: false,
            named: Vec::new(),
            named_oids: Vec::new(),
            stored_only: false,
        };
        // The usual list names a few types: compared one by one, without
        // hashing; a long one (any number of names) through a set.
        let mut seen = Seen::new(attrs.len() > 8);
        let mut classes = std::collections::HashSet::new();
        for a in attrs {
            match a.as_str() {
                "*" => s.all_user = true,
                "+" => s.all_oper = true,
                "1.1" => {}
                _ if a.starts_with('@') => {
                    if !classes.insert(a[1..].to_ascii_lowercase()) {
                        continue;
                    }
                    for at in schema.object_class_attrs(&a[1..]).unwrap_or_default() {
                        seen.add(&mut s.named, (at.name().to_ascii_lowercase(), Vec::new()));
                    }
                }
                // Unrecognised descriptions are ignored (RFC 4511 4.5.1.8).
                _ => {
                    if let Ok((desc, at)) = schema.canonical_desc(a) {
                        let want = (at.name().to_ascii_lowercase(), options_of(&desc));
                        seen.add(&mut s.named, want);
                    }
                }
            }
        }
        if s.named.iter().any(|(_, opts)| !opts.is_empty()) {
            let plain: std::collections::HashSet<String> = s
                .named
                .iter()
                .filter(|(_, opts)| opts.is_empty())
                .map(|(n, _)| n.clone())
                .collect();
            s.named
                .retain(|(n, opts)| opts.is_empty() || !plain.contains(n));
        }
        s.named_oids = s
            .named
            .iter()
            .map(|(n, _)| {
                schema
                    .attribute(n)
                    .map(|t| t.oid.clone())
                    .unwrap_or_default()
            })
            .collect();
        s
    }

    pub(super) fn wants(&self, schema: &Schema, at: &AttributeType, opts: &[String]) -> bool {
        // A multi-provider's per-attribute state goes only where it is
        // named (a Pando consumer asks for it; OpenLDAP's would refuse an
        // attribute type it does not know).
        let named_only = at
            .name()
            .eq_ignore_ascii_case(crate::write::merge::STATE_ATTR);
        let by_wildcard = if at.is_operational() {
            self.all_oper
        } else {
            self.all_user
        };
        if by_wildcard && !named_only {
            return true;
        }
        self.named
            .iter()
            .zip(&self.named_oids)
            .any(|((_, want_opts), oid)| {
                want_opts.iter().all(|o| opts.contains(o)) && is_subtype_of(schema, at, oid)
            })
    }

    /// No attribute at all goes out ("1.1" alone).
    pub(super) fn wants_nothing(&self) -> bool {
        !self.all_user && !self.all_oper && self.named.is_empty()
    }

    pub(super) fn wants_computed(&self, name: &str) -> bool {
        if self.stored_only {
            return false;
        }
        (self.all_oper && name != "numSubordinates")
            || self.named.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
    }
}

/// The names under which the attributes a search returns or tests can be
/// stored, when it names them (no `*` or `+`) and none has subtypes: then an
/// entry's other attributes are skipped, not decoded. None: decode all.
/// (A superset is enough: what goes out is still decided by the Emitter.)
pub(super) struct Wanted<'s> {
    pub(super) names: Vec<&'s str>,
}

impl<'s> Wanted<'s> {
    pub(super) fn new(
        schema: &'s Schema,
        sel: &Selection,
        tested: &[&'s AttributeType],
    ) -> Option<Wanted<'s>> {
        if sel.all_user || sel.all_oper {
            return None;
        }
        let mut names = Vec::new();
        let named = sel.named_oids.iter().map(|oid| schema.attribute(oid));
        for at in named.chain(tested.iter().map(|t| Some(*t))) {
            // An unresolvable request selects nothing.
            let Some(at) = at else { continue };
            if schema.has_subtypes(at) {
                return None;
            }
            names.extend(at.names.iter().map(String::as_str));
        }
        Some(Wanted { names })
    }

    pub(super) fn keep(&self, desc: &str) -> bool {
        self.keep_bytes(desc.as_bytes())
    }

    /// [`Wanted::keep`] on a description as stored: its type is one of the
    /// names (without case), followed by nothing or by options.
    pub(super) fn keep_bytes(&self, desc: &[u8]) -> bool {
        // Stored descriptions are names; an OID is decoded to be safe.
        desc.first().is_some_and(u8::is_ascii_digit)
            || self.names.iter().any(|n| {
                desc.get(..n.len())
                    .is_some_and(|t| t.eq_ignore_ascii_case(n.as_bytes()))
                    && matches!(desc.get(n.len()), None | Some(b';'))
            })
    }
}

/// `at` is the type with OID `oid` or one of its subtypes (an empty OID,
/// an unresolvable request, matches nothing). Types without a superior —
/// most of them — are decided without a schema lookup.
pub(super) fn is_subtype_of(schema: &Schema, at: &AttributeType, oid: &str) -> bool {
    let mut cur = Some(at);
    // Schemas are checked for SUP cycles on load; the bound is a backstop.
    for _ in 0..16 {
        let Some(c) = cur else { return false };
        if !oid.is_empty() && c.oid == oid {
            return true;
        }
        cur = c.sup.as_deref().and_then(|s| schema.attribute(s));
    }
    false
}

pub(super) fn options_of(desc: &str) -> Vec<String> {
    pando_model::desc::AttrDesc::new(desc)
        .options()
        .map(|o| o.to_ascii_lowercase())
        .collect()
}

/// Build the output of one entry into `buf`.
pub struct Emitter<'a> {
    pub(super) schema: &'a Schema,
    pub(super) sel: Arc<Selection>,
    pub(super) types_only: bool,
    /// The response's message ID; None: a bare SearchResultEntry (the
    /// value of a pre-read or post-read response control).
    pub(super) msg_id: Option<i32>,
    /// The search hooks' per-entry steps ([`super::hooks`]), applied to a
    /// copy of each decoded entry before it is encoded.
    pub(super) steps: Vec<EntryStep>,
}

/// Access decisions for the entry being emitted: only attributes the
/// requester may read go out.
pub struct Guard<'g, 'a> {
    pub(super) access: &'g mut Access<'a>,
    pub(super) rules: &'g EntryRules,
    pub(super) norm: &'g str,
}

impl Guard<'_, '_> {
    pub(super) fn may_read(&mut self, view: Option<&View<'_>>, at: &AttributeType) -> bool {
        self.access
            .allows(view, self.rules, self.norm, Some(at), acl::READ)
    }
}

impl Emitter<'_> {
    /// Encode a decoded entry, after the hooks' steps.
    #[allow(clippy::too_many_arguments)]
    pub fn emit(
        &self,
        view: Option<&View<'_>>,
        id: Option<EntryId>,
        dn: &str,
        entry: &Entry,
        guard: Option<Guard<'_, '_>>,
        controls: &[pando_proto::Control],
        buf: &mut Vec<u8>,
    ) -> OpResult<()> {
        let stepped;
        let entry = if self.steps.is_empty() {
            entry
        } else {
            let mut copy = entry.clone();
            for step in &self.steps {
                step(dn, &mut copy);
            }
            stepped = copy;
            &stepped
        };
        let attrs = entry
            .attrs
            .iter()
            .map(|a| (a.desc.as_str(), a.values.iter().map(Vec::as_slice)));
        self.emit_attrs(view, id, dn, attrs, guard, controls, buf)
    }

    /// [`Emitter::emit`] from (description, values) pairs: decoded
    /// attributes, or ones borrowed from the store; the message carries
    /// `controls` (none for a bare entry).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn emit_attrs<'v, V: Iterator<Item = &'v [u8]>>(
        &self,
        view: Option<&View<'_>>,
        id: Option<EntryId>,
        dn: &str,
        attrs: impl Iterator<Item = (&'v str, V)>,
        mut guard: Option<Guard<'_, '_>>,
        controls: &[pando_proto::Control],
        buf: &mut Vec<u8>,
    ) -> OpResult<()> {
        let mut enc = match self.msg_id {
            Some(id) => EntryEncoder::begin(buf, id, dn.as_bytes()),
            None => EntryEncoder::begin_bare(buf, dn.as_bytes()),
        };
        for (desc, values) in attrs {
            let base = pando_model::desc::base(desc);
            let Some(at) = self.schema.attribute(base) else {
                continue;
            };
            if COMPUTED.iter().any(|c| c.eq_ignore_ascii_case(base)) && id.is_some() {
                continue; // recomputed below for stored entries
            }
            if !self.sel.wants(self.schema, at, &options_of(desc)) {
                continue;
            }
            // Access last: only attributes that would go out are checked.
            if guard.as_mut().is_some_and(|g| !g.may_read(view, at)) {
                continue;
            }
            if self.types_only {
                enc.attr_names_only(desc.as_bytes());
            } else {
                enc.attr(desc.as_bytes(), values);
            }
        }
        if let (Some(view), Some(id)) = (view, id) {
            for name in COMPUTED {
                if !self.sel.wants_computed(name) {
                    continue;
                }
                let readable = match (self.schema.attribute(name), guard.as_mut()) {
                    (Some(at), Some(g)) => g.may_read(Some(view), at),
                    _ => true,
                };
                if !readable {
                    continue;
                }
                let access = guard.as_mut().map(|g| &mut *g.access);
                let Some(values) = computed_value(self.schema, view, access, id, dn, name)? else {
                    continue;
                };
                if self.types_only {
                    enc.attr_names_only(name.as_bytes());
                } else {
                    enc.attr(name.as_bytes(), values.iter().map(String::as_bytes));
                }
            }
        }
        enc.finish_with_controls(controls);
        Ok(())
    }
}

/// A SearchResultEntry on its own (the value of the RFC 4527 read-entry
/// response controls): `entry` named `dn`, with the attributes `attrs`
/// selects as a search would, less those `access` (None: unrestricted)
/// does not let the requester read. Computed attributes are not included.
pub fn encode_read_entry(
    schema: &Schema,
    view: Option<&View<'_>>,
    access: Option<&mut Access<'_>>,
    norm: &str,
    dn: &str,
    entry: &Entry,
    attrs: &[String],
) -> OpResult<Vec<u8>> {
    let emitter = Emitter {
        schema,
        sel: Arc::new(Selection::new(schema, attrs)),
        types_only: false,
        msg_id: None,
        steps: Vec::new(),
    };
    let mut buf = Vec::new();
    match access {
        Some(access) => {
            let rules = access.entry(schema, norm, entry);
            let guard = Guard {
                access,
                rules: &rules,
                norm,
            };
            emitter.emit(view, None, dn, entry, Some(guard), &[], &mut buf)?;
        }
        None => {
            emitter.emit(view, None, dn, entry, None, &[], &mut buf)?;
        }
    }
    Ok(buf)
}

/// The value of computed attribute `name` of entry `id`; None when it is
/// not given (a restricted count too costly to make). `access`: the
/// requester's, None when unrestricted.
pub(super) fn computed_value(
    schema: &Schema,
    view: &View<'_>,
    access: Option<&mut Access<'_>>,
    id: EntryId,
    dn: &str,
    name: &str,
) -> OpResult<Option<Vec<String>>> {
    // The replication state, on suffix entries only (one value per server ID).
    if name == "contextCSN" {
        let csns = match view.placement(id)? {
            Some(p) if p.parent == 0 => view.context_csns()?,
            _ => Vec::new(),
        };
        return Ok(Some(csns).filter(|c| !c.is_empty()));
    }
    let counts = matches!(name, "hasSubordinates" | "numSubordinates");
    // Children the requester may not see are not counted (they would
    // reveal entries a search does not return), unless it sees them all.
    if let (true, Some(access)) = (counts, access) {
        if !access.reads_every_entry() {
            let first_only = name == "hasSubordinates";
            let seen =
                visible_children(schema, view, access, id, first_only, MAX_CHILDREN_CHECKED)?;
            return Ok(seen.map(|n| {
                vec![match (first_only, n > 0) {
                    (true, true) => "TRUE".to_string(),
                    (true, false) => "FALSE".to_string(),
                    (false, _) => n.to_string(),
                }]
            }));
        }
    }
    Ok(Some(vec![match name {
        "entryDN" => dn.to_string(),
        "subschemaSubentry" => SUBSCHEMA_DN.to_string(),
        "hasSubordinates" => if view.has_children(id)? {
            "TRUE"
        } else {
            "FALSE"
        }
        .to_string(),
        _ => view.count_children(id)?.to_string(),
    }]))
}

/// Most children of one entry checked one by one for a restricted
/// requester's hasSubordinates or numSubordinates. Each check may decode
/// the child (rules with filters), and a `+` search asks for every entry
/// it returns, so the work is capped per entry.
pub(super) const MAX_CHILDREN_CHECKED: usize = 1000;

/// How many children of `id` the requester may see (read access to the
/// entry itself, as a search decides what it returns), counting up to the
/// first when `first_only`. None when that is not known after checking
/// `max` children: the attribute is then left out, which reveals nothing,
/// rather than given as a guess (a bound presented as a count).
pub fn visible_children(
    schema: &Schema,
    view: &View<'_>,
    access: &mut Access<'_>,
    id: EntryId,
    first_only: bool,
    max: usize,
) -> OpResult<Option<u64>> {
    let kids = view.children_up_to(id, max.saturating_add(1))?;
    let mut rules = EntryRules::default();
    let mut seen = 0u64;
    for &kid in kids.iter().take(max) {
        let (_, norm) = view.dn_pair(kid)?;
        let entry = Entry {
            dn: Dn { rdns: Vec::new() },
            attrs: if access.reads_entries() {
                view.attrs(kid)?.unwrap_or_default()
            } else {
                Vec::new()
            },
        };
        access.entry_into(schema, &norm, &entry, &mut rules);
        if access.allows(Some(view), &rules, &norm, None, acl::READ) {
            seen += 1;
            if first_only {
                return Ok(Some(seen));
            }
        }
    }
    Ok((kids.len() <= max).then_some(seen))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_requests_select_each_type_once() {
        let schema = Schema::standard();
        let mut attrs: Vec<String> = vec!["@inetOrgPerson".into(); 1000];
        attrs.extend(["cn", "CN", "2.5.4.3", "cn;lang-de", "sn;x", "sn;x"].map(String::from));
        let sel = Selection::new(&schema, &attrs);
        let once = Selection::new(&schema, &["@inetOrgPerson".to_string()]);
        // cn comes with the class; cn;lang-de is covered by cn; sn;x by sn.
        assert_eq!(sel.named, once.named);
        // The same short list (compared one by one, not through a set).
        let short = Selection::new(&schema, &attrs[999..]);
        assert_eq!(attrs[999..].len(), 7);
        assert_eq!(short.named, once.named);
        let tagged = Selection::new(&schema, &["sn;x".into(), "sn;x".into(), "cn".into()]);
        assert_eq!(tagged.named.len(), 2);
    }

    #[test]
    fn a_thread_remembers_the_selections_of_its_last_lists_per_schema() {
        let schema = Arc::new(Schema::standard());
        let list = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let cn = list(&["cn"]);
        let first = Selection::remembered(&schema, &cn);
        assert!(Arc::ptr_eq(&first, &Selection::remembered(&schema, &cn)));
        assert_eq!(first.named, Selection::new(&schema, &cn).named);
        // Another list is another selection; so is the same list against
        // another schema (an equal one: what counts is which).
        let mail = Selection::remembered(&schema, &list(&["mail"]));
        assert_eq!(mail.named, vec![("mail".to_string(), Vec::new())]);
        let other = Arc::new(Schema::standard());
        assert!(!Arc::ptr_eq(&first, &Selection::remembered(&other, &cn)));
        // Four lists are remembered: a fifth pushes out the oldest.
        for names in [&["sn"][..], &["uid"], &["cn", "sn"]] {
            Selection::remembered(&schema, &list(names));
        }
        assert!(!Arc::ptr_eq(&first, &Selection::remembered(&schema, &cn)));
        // A long list is selected but not kept.
        let long = vec!["description".to_string(); 200];
        let a = Selection::remembered(&schema, &long);
        assert!(!Arc::ptr_eq(&a, &Selection::remembered(&schema, &long)));
        assert_eq!(a.named.len(), 1);
    }

    #[test]
    fn wanted_names_match_stored_descriptions_by_type() {
        let schema = Schema::standard();
        let sel = Selection::new(&schema, &["commonName".to_string()]);
        let w = Wanted::new(&schema, &sel, &[]).expect("named attributes only");
        for (desc, kept) in [
            ("cn", true),
            ("CN", true),
            ("commonname", true),
            ("cn;lang-de", true),
            ("2.5.4.3", true), // an OID: looked at to be safe
            ("cnx", false),
            ("c", false),
            ("sn", false),
            ("", false),
        ] {
            assert_eq!(w.keep_bytes(desc.as_bytes()), kept, "{desc}");
            assert_eq!(w.keep(desc), kept, "{desc}");
        }
        let all = Selection::new(&schema, &["*".to_string()]);
        assert!(Wanted::new(&schema, &all, &[]).is_none());
    }
}
