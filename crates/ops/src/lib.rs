//! LDAP operations, one file each, and the state they run on. Every
//! operation takes the server state (`state::Server`: the compiled
//! configuration and the runtime handles), the caller's identity (a copy
//! fixed when it started) and its request, and returns an LDAP result;
//! searches also stream entries to the connection. Writes go through one
//! pipeline (`write`).
//!
//! The layers above reach the operations through this crate's traits and
//! are given to the state, never named here: the overlays (`layers`,
//! `policy`, `remote`, `search::virtual_tree`), replication's consumers
//! (`replicas`), cn=config (`config_tree`), the live configuration
//! (`state::Current`). Must not depend on the network frontend, the
//! overlays, replication, cn=config or the server's assembly.

pub mod audit;
pub mod bind;
pub mod capacity;
pub mod compare;
pub mod config_tree;
pub mod config_write;
pub mod controls;
pub mod digest;
pub mod digest_answer;
pub mod error;
pub mod extended;
pub mod feed;
pub mod hashing;
pub mod job;
pub mod norm_dn;
pub mod operation;
pub mod policy;
pub mod proxy;
pub mod rehash;
pub mod remote;
pub mod replicas;
pub mod seams;
pub mod search;
pub mod special;
pub mod stack;
pub mod state;
pub mod throttle;
pub mod write;

use std::sync::Arc;

use pando_model::{AttributeType, Dn, Entry, Schema};
use pando_proto::ResultCode;
use pando_store::{Candidates, EntryId, Lookup, View};

use pando_access::acl::{self, Access, EntryRules, Rights};

use crate::error::{LdapError, OpResult};
use crate::state::Server;
use pando_access::Identity;

/// Most distinct search bases a thread remembers; past it its cache starts
/// over. Kept small: every thread that runs searches (up to the blocking
/// pool's) keeps its own, and a search with a new base only pays for
/// parsing it.
const BASE_CACHE_MAX: usize = 256;

/// Parsed and normalised search bases by their text. Normalisation depends
/// only on the schema, which does not change while the server runs, so
/// entries never go stale. Each thread keeps its own (a search takes no
/// lock and touches no cache line another core writes); a thread's cache
/// holds one server's bases at a time, told apart by `id`.
pub struct BaseCache {
    id: u64,
}

impl Default for BaseCache {
    fn default() -> BaseCache {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        BaseCache {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }
}

/// A search base parsed, with its normalised RDNs and its normalised DN
/// (the RDNs joined).
pub type ParsedBase = Arc<(Dn, Vec<String>, String)>;

thread_local! {
    /// This thread's bases: the owning cache's `id` and the map.
    static BASES: std::cell::RefCell<(u64, std::collections::HashMap<String, ParsedBase>)> =
        std::cell::RefCell::new((0, std::collections::HashMap::new()));
}

impl BaseCache {
    /// `raw` parsed and normalised (invalidDNSyntax naming the problem).
    pub fn get(&self, schema: &Schema, raw: &str) -> OpResult<ParsedBase> {
        let hit = BASES.with(|b| {
            let b = b.borrow();
            (b.0 == self.id).then(|| b.1.get(raw).cloned()).flatten()
        });
        if let Some(hit) = hit {
            return Ok(hit);
        }
        let dn = parse_dn(raw)?;
        let rdns = dn
            .rdns
            .iter()
            .map(|r| schema.normalize_rdn(r))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| LdapError::invalid_dn(format!("invalid DN '{raw}': {e}")))?;
        let norm = rdns.join(",");
        let v = Arc::new((dn, rdns, norm));
        BASES.with(|b| {
            let mut b = b.borrow_mut();
            if b.0 != self.id || b.1.len() >= BASE_CACHE_MAX {
                b.1.clear();
                b.0 = self.id;
            }
            b.1.insert(raw.to_string(), v.clone());
        });
        Ok(v)
    }
}

/// Whether the store may hold subentries (objectClass `subentry`, RFC 3672):
/// searches hide them only then, so the common search pays for nothing. It
/// starts unknown (the first search asks the objectClass index once), is
/// set by every write of a subentry, and is never cleared while the server
/// runs (a stale "maybe" costs one index lookup per search, nothing else).
#[derive(Default)]
pub struct Subentries {
    /// 0 = unknown, 1 = none, 2 = maybe.
    state: std::sync::atomic::AtomicU8,
}

impl Subentries {
    /// Could the store hold one? `probe` asks the index when unknown.
    pub fn maybe(&self, probe: impl FnOnce() -> bool) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        match self.state.load(Relaxed) {
            1 => false,
            2 => true,
            _ => {
                let found = probe();
                // A write that set "maybe" meanwhile wins.
                let _ = self
                    .state
                    .compare_exchange(0, if found { 2 } else { 1 }, Relaxed, Relaxed);
                self.state.load(Relaxed) == 2
            }
        }
    }

    /// A subentry is being written.
    pub fn written(&self) {
        self.state.store(2, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Whether an entry's objectClass values name `subentry`.
pub fn is_subentry(entry: &Entry) -> bool {
    entry
        .get("objectClass")
        .is_some_and(|a| a.values.iter().any(|v| v.eq_ignore_ascii_case(b"subentry")))
}

/// Operational attributes computed on read, never stored.
pub const COMPUTED: &[&str] = &[
    "entryDN",
    "subschemaSubentry",
    "hasSubordinates",
    "numSubordinates",
    "contextCSN",
];

use pando_model::desc::is_password;

/// Every userPassword value, whatever its options, in stored order.
pub fn password_values(attrs: &[pando_model::Attribute]) -> Vec<Vec<u8>> {
    attrs
        .iter()
        .filter(|a| is_password(&a.desc))
        .flat_map(|a| a.values.iter().cloned())
        .collect()
}

/// Parse a DN from a request.
pub fn parse_dn(s: &str) -> OpResult<Dn> {
    Dn::parse(s).map_err(|e| LdapError::invalid_dn(format!("invalid DN '{s}': {e}")))
}

/// A bind DN's normalised RDNs and their join (the identity's normalised
/// DN), or invalidDNSyntax naming the problem.
pub fn bind_dn_rdns(server: &Server, raw: &str) -> OpResult<(Vec<String>, String)> {
    if let Some(done) = split_norm(&server.schema, &server.base_cache, raw) {
        return Ok(done);
    }
    let dn = parse_dn(raw)?;
    let rdns = dn
        .rdns
        .iter()
        .map(|r| server.schema.normalize_rdn(r))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| LdapError::invalid_dn(format!("invalid DN: {e}")))?;
    let norm = rdns.join(",");
    Ok((rdns, norm))
}

/// [`bind_dn_rdns`] without parsing the whole DN: only its first RDN is
/// parsed and normalised, the rest (the parent every user below it shares)
/// comes from this thread's base cache. None for anything but a short DN
/// with a parent that both parse and normalise: the caller then takes the
/// general path, which gives the same answer (or the same error).
fn split_norm(schema: &Schema, bases: &BaseCache, raw: &str) -> Option<(Vec<String>, String)> {
    // Short enough that no RDN or AVA limit can be reached.
    if raw.len() > 1024 {
        return None;
    }
    let (first, rest) = pando_model::Rdn::parse_first(raw).ok()?;
    let parent = bases.get(schema, rest?).ok()?;
    if parent.1.is_empty() {
        return None;
    }
    let first = schema.normalize_rdn(&first).ok()?;
    let mut norm = String::with_capacity(first.len() + 1 + parent.2.len());
    norm.push_str(&first);
    norm.push(',');
    norm.push_str(&parent.2);
    let mut rdns = Vec::with_capacity(1 + parent.1.len());
    rdns.push(first);
    rdns.extend(parent.1.iter().cloned());
    Some((rdns, norm))
}

/// Normalised RDNs of `dn`, or invalidDNSyntax naming the problem.
pub fn norm_rdns(view: &View<'_>, dn: &Dn) -> OpResult<Vec<String>> {
    view.normalize_rdns(dn)
        .map_err(|e| LdapError::invalid_dn(format!("invalid DN '{dn}': {e}")))
}

/// Resolve an existing entry, or noSuchObject with the deepest existing
/// ancestor as matchedDN (RFC 4511 4.1.9).
pub fn resolve(view: &View<'_>, dn: &Dn) -> OpResult<EntryId> {
    let rdns = norm_rdns(view, dn)?;
    match view.lookup_norm(&rdns)? {
        Lookup::Found(id) => Ok(id),
        Lookup::Missing { matched } => Err(no_such_object(view, matched)?),
    }
}

pub fn no_such_object(view: &View<'_>, matched: Option<EntryId>) -> OpResult<LdapError> {
    let e = LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object");
    Ok(match matched {
        Some(m) => e.with_matched(view.dn_string(m)?),
        None => e,
    })
}

/// Check that `who` holds every `(attribute, right)` in `checks` on the
/// entry `norm` (None = the entry itself). A refusal does not reveal an
/// entry the requester may not see: noSuchObject then, not
/// insufficientAccessRights (RFC 4511 4.1.9). Anonymous writers are told to
/// authenticate (strongerAuthRequired), as slapd does.
pub fn require(
    server: &Server,
    view: &View<'_>,
    who: &Identity,
    norm: &str,
    entry: &Entry,
    checks: &[(Option<&AttributeType>, Rights)],
) -> OpResult<()> {
    let mut access = Access::new(&server.acl, who);
    if access.unrestricted() {
        return Ok(());
    }
    let rules = access.entry(&server.schema, norm, entry);
    for (attr, right) in checks {
        if access.allows(Some(view), &rules, norm, *attr, *right) {
            continue;
        }
        if who.is_anonymous() && right & (acl::WRITE | acl::ADD | acl::DELETE) != 0 {
            return Err(LdapError::new(
                ResultCode::STRONGER_AUTH_REQUIRED,
                "modifications require authentication",
            ));
        }
        if !visible(&mut access, view, &rules, norm) {
            return Err(LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object"));
        }
        let what = match attr {
            Some(at) => format!("attribute {}", at.name()),
            None => "the entry".to_string(),
        };
        return Err(LdapError::access(format!(
            "no {} access to {what}",
            acl::right_name(*right)
        )));
    }
    Ok(())
}

/// May the requester know the entry exists at all?
pub fn visible(access: &mut Access<'_>, view: &View<'_>, rules: &EntryRules, norm: &str) -> bool {
    [acl::SEARCH, acl::READ, acl::COMPARE]
        .into_iter()
        .any(|r| access.allows(Some(view), rules, norm, None, r))
}

/// Like [`resolve`], but the matchedDN of a noSuchObject names only an
/// ancestor the requester may see.
pub fn resolve_for(server: &Server, view: &View<'_>, who: &Identity, dn: &Dn) -> OpResult<EntryId> {
    resolve_norm_for(server, view, who, dn).map(|(id, _)| id)
}

/// [`resolve_for`], also giving the entry's normalised RDNs.
pub fn resolve_norm_for(
    server: &Server,
    view: &View<'_>,
    who: &Identity,
    dn: &Dn,
) -> OpResult<(EntryId, Vec<String>)> {
    let rdns = norm_rdns(view, dn)?;
    let id = resolve_rdns_for(server, view, who, &rdns)?;
    Ok((id, rdns))
}

/// [`resolve_norm_for`] with the RDNs already normalised.
pub fn resolve_rdns_for(
    server: &Server,
    view: &View<'_>,
    who: &Identity,
    rdns: &[String],
) -> OpResult<EntryId> {
    match view.lookup_norm(rdns)? {
        Lookup::Found(id) => Ok(id),
        Lookup::Missing { matched: None } => Err(no_such_object(view, None)?),
        Lookup::Missing { matched: Some(m) } => {
            let mut access = Access::new(&server.acl, who);
            let shown = access.unrestricted() || {
                let entry = stored_entry(view, m)?;
                let norm = norm_dn_of(view, m)?;
                let rules = access.entry(&server.schema, &norm, &entry);
                visible(&mut access, view, &rules, &norm)
            };
            Err(no_such_object(view, shown.then_some(m))?)
        }
    }
}

/// The answer to an operation whose assertion control (RFC 4528) is not
/// TRUE for its target.
pub fn assertion_failed() -> LdapError {
    LdapError::new(
        ResultCode::ASSERTION_FAILED,
        "the assertion control's filter is not true for the entry",
    )
}

/// The assertion control on an entry the requester reads whole (a
/// cn=config entry, which only those who may read all of it see): the
/// filter as a search of it evaluates it.
pub fn assertion_on_whole_entry(
    schema: &Schema,
    entry: &Entry,
    filter: &pando_proto::Filter,
) -> OpResult<()> {
    match schema.compile_filter(filter).matches(schema, entry) {
        pando_model::Ternary::True => Ok(()),
        _ => Err(assertion_failed()),
    }
}

/// Whether an assertion (RFC 4528) is TRUE for `entry` (normalised DN
/// `norm`) as the requester sees it: items on attributes it may not
/// search evaluate to Undefined, so an assertion reveals no more than a
/// search would.
pub fn assertion_holds(
    server: &Server,
    view: &View<'_>,
    who: &Identity,
    norm: &str,
    entry: &Entry,
    filter: &pando_proto::Filter,
) -> bool {
    let schema = &*server.schema;
    let mut access = Access::new(&server.acl, who);
    let compiled = if access.unrestricted() {
        schema.compile_filter(filter)
    } else {
        let rules = access.entry(schema, norm, entry);
        let mut types = Vec::new();
        search::types_in_filter(schema, filter, &mut types);
        let hidden: Vec<&str> = types
            .into_iter()
            .filter(|at| !access.allows(Some(view), &rules, norm, Some(at), acl::SEARCH))
            .map(|at| at.oid.as_str())
            .collect();
        schema.compile_filter_hiding(filter, &|at| hidden.contains(&at.oid.as_str()))
    };
    compiled.matches(schema, entry) == pando_model::Ternary::True
}

/// What [`unique_indexed`] found.
pub enum Unique {
    One(EntryId),
    /// None, or more than one.
    NoneOrMany,
    /// The filter is not answered by an index: not looked at.
    Unindexed,
}

/// The single entry within `base` (None: anywhere) matching `filter`,
/// found through the indexes only: identity mappings (SASL EXTERNAL, the
/// `u:` form of proxied authorization) never scan the tree.
pub fn unique_indexed(
    server: &Server,
    view: &View<'_>,
    base: Option<EntryId>,
    filter: &pando_proto::Filter,
) -> OpResult<Unique> {
    let Candidates::Ids(ids) = view.candidates(filter)? else {
        return Ok(Unique::Unindexed);
    };
    let compiled = server.schema.compile_filter(filter);
    let mut found = None;
    for id in ids.iter() {
        if let Some(b) = base {
            if !view.is_within(id, b)? {
                continue;
            }
        }
        let Some(entry) = view.entry(id)? else {
            continue;
        };
        if compiled.matches(&server.schema, &entry) == pando_model::Ternary::True
            && found.replace(id).is_some()
        {
            return Ok(Unique::NoneOrMany);
        }
    }
    Ok(found.map_or(Unique::NoneOrMany, Unique::One))
}

/// A stored entry's attributes as an [`Entry`] for access checks (which
/// take the DN separately, normalised).
pub fn stored_entry(view: &View<'_>, id: EntryId) -> OpResult<Entry> {
    Ok(Entry {
        dn: Dn { rdns: Vec::new() },
        attrs: view.attrs(id)?.unwrap_or_default(),
    })
}

/// The normalised DN of a stored entry (normalised RDNs joined by commas).
pub fn norm_dn_of(view: &View<'_>, id: EntryId) -> OpResult<String> {
    Ok(view.dn_pair(id)?.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole DN parsed and normalised: what `split_norm` must agree with.
    fn whole(schema: &Schema, raw: &str) -> Option<(Vec<String>, String)> {
        let dn = Dn::parse(raw).ok()?;
        let rdns = dn
            .rdns
            .iter()
            .map(|r| schema.normalize_rdn(r))
            .collect::<Result<Vec<_>, _>>()
            .ok()?;
        let norm = rdns.join(",");
        Some((rdns, norm))
    }

    #[test]
    fn a_bind_dn_split_at_its_first_rdn_normalises_as_the_whole() {
        let schema = Schema::standard();
        let bases = BaseCache::default();
        for raw in [
            "uid=user.1,ou=People,dc=example,dc=com",
            "UID=User.1 , OU=people,DC=Example,dc=COM",
            "  cn=Ann  Lee+uid=ann,ou=People,dc=example,dc=com",
            "cn=a\\,b,ou=People,dc=example,dc=com",
            "cn=\\20lead,ou=People,dc=example,dc=com",
            "cn=#04024869,ou=People,dc=example,dc=com",
            "2.5.4.3=x,o=y",
            "cn=only",
        ] {
            let split = split_norm(&schema, &bases, raw);
            if raw == "cn=only" {
                assert_eq!(split, None, "no parent: the general path");
            } else {
                assert_eq!(split, whole(&schema, raw), "{raw}");
                assert!(split.is_some(), "{raw}");
            }
        }
        // Anything the whole DN refuses goes the general way, for its error.
        assert_eq!(
            split_norm(&schema, &bases, ""),
            None,
            "the root: the general path"
        );
        for bad in [
            "uid=a,",
            "uid=a,,dc=com",
            "uid=a+,dc=com",
            "nosuchtype=a,dc=com",
            "uid=a,nosuchtype=b",
            "=a,dc=com",
        ] {
            assert_eq!(whole(&schema, bad), None, "{bad}");
            assert_eq!(split_norm(&schema, &bases, bad), None, "{bad}");
        }
        let long = format!("cn={},dc=com", "a".repeat(2000));
        assert_eq!(
            split_norm(&schema, &bases, &long),
            None,
            "long: parsed whole"
        );
    }
}
