//! Reading the store (`View`, shared by read and write transactions):
//! entries, DNs, children, indexes and candidate sets, the change log.
//! Nothing here writes.

use super::*;
use std::collections::BTreeMap;

/// An entry's placement as stored: in its record (format 6), or in
/// `id2parent` for a record written before.
enum PlaceBytes<'r, 't> {
    InRecord(&'r [u8]),
    Id2parent(&'t [u8]),
}

fn parse_stored_dn(id: EntryId, s: String) -> Result<Dn, StoreError> {
    Dn::parse(&s).map_err(|e| StoreError::Corrupt(format!("stored DN '{s}' of entry {id}: {e}")))
}

/// `rdn,up`, allocated once at its size (a search formats one DN pair per
/// entry it returns).
fn join_dn(rdn: &str, up: &str) -> String {
    let mut s = String::with_capacity(rdn.len() + 1 + up.len());
    s.push_str(rdn);
    s.push(',');
    s.push_str(up);
    s
}

/// The keys that the values of `attr_lower` in `attrs` produce for `kind`.
pub(crate) fn attr_keys(
    schema: &Schema,
    attrs: &[Attribute],
    attr_lower: &str,
    kind: IndexKind,
) -> BTreeSet<Vec<u8>> {
    let mut keys = BTreeSet::new();
    let bases = attrs.iter().map(|a| pando_model::desc::base(&a.desc));
    attr_keys_into(schema, attrs, bases, attr_lower, kind, &mut keys);
    keys
}

/// [`attr_keys`] added to `keys`, with each attribute's base type given
/// (`bases`, in the order of `attrs`) by a caller that computes them once
/// for every index.
pub(crate) fn attr_keys_into<'a>(
    schema: &Schema,
    attrs: &[Attribute],
    bases: impl Iterator<Item = &'a str>,
    attr_lower: &str,
    kind: IndexKind,
    keys: &mut BTreeSet<Vec<u8>>,
) {
    for (a, base) in attrs.iter().zip(bases) {
        if !base.eq_ignore_ascii_case(attr_lower) {
            continue;
        }
        if let Some(at) = schema.attribute(base) {
            for v in &a.values {
                index::keys_for(schema, at, kind, v, keys);
            }
        }
    }
}

thread_local! {
    /// Presence checks made by this thread (`View::holds`), counted in
    /// tests only.
    pub(crate) static HOLDS_CHECKED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// DNs this thread resolved by walking down from the suffix, counted in
    /// tests only.
    pub(crate) static WALKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// DNs this thread looked up below a remembered parent, counted in tests
    /// only.
    pub(crate) static BELOW_PARENT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// `id2parent` records this thread read (`View::placement`), counted in
    /// tests only.
    pub(crate) static PLACEMENTS_READ: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl<'t> View<'t> {
    pub fn schema(&self) -> &'t Schema {
        &self.catalog.schema
    }

    /// Resolve `dn` (already split into normalised RDNs, leftmost first).
    pub fn lookup_norm(&self, norm_rdns: &[String]) -> Result<Lookup, StoreError> {
        // A cached ID may have been learnt by a newer snapshot of the same
        // generation, holding entries added since this one was taken (see
        // `dn_cache`): it counts only if this snapshot holds the entry too.
        if let Some((id, learnt)) = dn_cache::id_of(self.dn_snapshot, norm_rdns) {
            if self.holds_cached(id, learnt)? {
                return Ok(Lookup::Found(id));
            }
        }
        // A known parent (a user's bind DN under ou=People): one lookup. A
        // child found in this snapshot's dn2id is in it; on a miss the
        // parent is the matched entry only if this snapshot holds it.
        if let Some((rdn, up)) = norm_rdns.split_first() {
            if let Some((parent, learnt)) = dn_cache::id_of(self.dn_snapshot, up) {
                if cfg!(test) {
                    BELOW_PARENT.with(|n| n.set(n.get() + 1));
                }
                match self
                    .inner
                    .dn2id
                    .get(self.txn, &self.inner.dn2id_layout.key(parent, rdn))?
                {
                    Some(v) => {
                        // An entry with children (a search base) is
                        // remembered itself, for the next time.
                        let id = dn2id_id(v)?;
                        dn_cache::remember_id(self.dn_snapshot, norm_rdns, id, self.content);
                        return Ok(Lookup::Found(id));
                    }
                    None if self.holds_cached(parent, learnt)? => {
                        return Ok(Lookup::Missing {
                            matched: Some(parent),
                        })
                    }
                    None => {}
                }
            }
        }
        if cfg!(test) {
            WALKS.with(|n| n.set(n.get() + 1));
        }
        let found = lookup_in(self.inner, self.txn, norm_rdns)?;
        if let Lookup::Found(id) = found {
            dn_cache::remember_id(self.dn_snapshot, norm_rdns, id, self.content);
            self.remember_parent(norm_rdns, id)?;
        }
        Ok(found)
    }

    /// After a walk from the suffix resolved `norm_rdns` to `id`: remember
    /// its parent (an entry with children), so the next DN below it (the
    /// next user's bind on a thread that serves only binds) takes one
    /// lookup instead of a walk.
    fn remember_parent(&self, norm_rdns: &[String], id: EntryId) -> Result<(), StoreError> {
        let Some((_, up)) = norm_rdns.split_first() else {
            return Ok(());
        };
        if up.is_empty() || self.dn_snapshot.is_none() {
            return Ok(());
        }
        if let Some(parent) = self.parent_of(id)? {
            if self.learn_node(parent, 0)?.is_some() {
                dn_cache::remember_id(self.dn_snapshot, up, parent, self.content);
            }
        }
        Ok(())
    }

    /// Whether this snapshot holds `id`, an ID the DN cache remembers as
    /// resolved by a snapshot of content generation `learnt`: without a
    /// lookup when this one's is known and not older (it holds everything
    /// that one held; the cache's DN generation rules out deletes between).
    fn holds_cached(&self, id: EntryId, learnt: Option<u64>) -> Result<bool, StoreError> {
        let newer = matches!((self.content, learnt), (Some(now), Some(then)) if now >= then);
        Ok(newer || self.holds(id)?)
    }

    /// Whether entry `id` is in this snapshot.
    pub(crate) fn holds(&self, id: EntryId) -> Result<bool, StoreError> {
        if cfg!(test) {
            HOLDS_CHECKED.with(|n| n.set(n.get() + 1));
        }
        Ok(self.entry_bytes(id)?.is_some())
    }

    /// Normalise each RDN of `dn` with the schema.
    pub fn normalize_rdns(&self, dn: &Dn) -> Result<Vec<String>, String> {
        dn.rdns
            .iter()
            .map(|r| self.catalog.schema.normalize_rdn(r))
            .collect()
    }

    pub fn lookup(&self, dn: &Dn) -> Result<Result<Lookup, String>, StoreError> {
        match self.normalize_rdns(dn) {
            Ok(n) => self.lookup_norm(&n).map(Ok),
            Err(e) => Ok(Err(e)),
        }
    }

    /// Where entry `id` is (its parent and RDN); None for a missing entry.
    pub fn placement(&self, id: EntryId) -> Result<Option<Placement>, StoreError> {
        match self.entry_bytes(id)? {
            Some(rec) => self.placement_in(id, rec).map(Some),
            None => Ok(None),
        }
    }

    /// [`View::placement`] of entry `id` whose record `rec` the caller
    /// read (a search reads it once for the scope and the attributes).
    pub fn placement_in(&self, id: EntryId, rec: &[u8]) -> Result<Placement, StoreError> {
        if cfg!(test) {
            PLACEMENTS_READ.with(|n| n.set(n.get() + 1));
        }
        match self.place_bytes(id, rec)? {
            PlaceBytes::InRecord(place) => read_place(id, place),
            PlaceBytes::Id2parent(v) => decode_placement(id, v),
        }
    }

    /// Where entry `id`'s placement is stored, given its record.
    fn place_bytes<'r>(
        &self,
        id: EntryId,
        rec: &'r [u8],
    ) -> Result<PlaceBytes<'r, 't>, StoreError> {
        if let Some(place) = entry_codec::placement_of(id, rec)? {
            return Ok(PlaceBytes::InRecord(place));
        }
        // Written before store format 6.
        match self.inner.id2parent.get(self.txn, &id_bytes(id))? {
            Some(v) => Ok(PlaceBytes::Id2parent(v)),
            None => Err(StoreError::Corrupt(format!(
                "entry {id} has no placement (neither in its record nor in id2parent)"
            ))),
        }
    }

    /// Parent ID (None for a suffix entry or a missing one), reading only
    /// the parent's field of the placement (a scope check walks up with it).
    pub fn parent_of(&self, id: EntryId) -> Result<Option<EntryId>, StoreError> {
        let Some(rec) = self.entry_bytes(id)? else {
            return Ok(None);
        };
        let parent = match self.place_bytes(id, rec)? {
            PlaceBytes::InRecord(place) => place_parent(id, place)?,
            PlaceBytes::Id2parent(v) if v.len() >= 8 => id_from(&v[..8])?,
            PlaceBytes::Id2parent(_) => {
                return Err(StoreError::Corrupt(format!(
                    "id2parent record {id} is malformed"
                )))
            }
        };
        Ok(Some(parent).filter(|&p| p != 0))
    }

    /// The DN of `id` as stored and normalised (empty for a missing entry).
    /// Parents' DNs come from (and go to) the thread's [`dn_cache`].
    pub fn dn_pair(&self, id: EntryId) -> Result<(String, String), StoreError> {
        if let Some(n) = dn_cache::node(self.dn_snapshot, id) {
            return Ok((n.dn, n.norm));
        }
        match self.placement(id)? {
            Some(p) => self.dn_pair_of(&p),
            None => Ok((String::new(), String::new())),
        }
    }

    /// [`View::dn_pair`] of the entry placed at `p` (read by the caller).
    pub fn dn_pair_of(&self, p: &Placement) -> Result<(String, String), StoreError> {
        self.dn_below(p, 0)
    }

    /// The DN of the entry placed at `p`: its RDN before its parent's DN,
    /// formatted from the cached parent when there is one. `depth`: parents
    /// walked so far.
    pub(crate) fn dn_below(
        &self,
        p: &Placement,
        depth: u32,
    ) -> Result<(String, String), StoreError> {
        let join = |n: &dn_cache::Node| (join_dn(&p.rdn, &n.dn), join_dn(&p.norm_rdn, &n.norm));
        Ok(self
            .below_parent(p, depth, join)?
            .unwrap_or_else(|| (p.rdn.clone(), p.norm_rdn.clone())))
    }

    /// `f` of the parent of the entry placed at `p`, cached or read (and
    /// then remembered); None for a suffix entry or a missing parent.
    fn below_parent<R>(
        &self,
        p: &Placement,
        depth: u32,
        f: impl Fn(&dn_cache::Node) -> R,
    ) -> Result<Option<R>, StoreError> {
        if p.parent == 0 {
            return Ok(None);
        }
        if let Some(r) = dn_cache::with_node(self.dn_snapshot, p.parent, &f) {
            return Ok(Some(r));
        }
        Ok(self.learn_node(p.parent, depth)?.map(|n| f(&n)))
    }

    /// Read what [`View::dn_pair`] needs of a parent that is not cached, and
    /// remember it for the next time.
    pub(crate) fn learn_node(
        &self,
        id: EntryId,
        depth: u32,
    ) -> Result<Option<dn_cache::Node>, StoreError> {
        // Depth is bounded by the DN length limit; this also stops a
        // corrupted parent cycle.
        if depth >= 1024 {
            return Err(StoreError::Corrupt(format!(
                "parent chain of entry {id} does not end"
            )));
        }
        let Some(p) = self.placement(id)? else {
            return Ok(None);
        };
        let (dn, norm) = self.dn_below(&p, depth + 1)?;
        let node = dn_cache::Node {
            parent: p.parent,
            dn,
            norm,
        };
        dn_cache::remember(self.dn_snapshot, id, node.clone());
        Ok(Some(node))
    }

    /// The entry's DN as stored (RDNs as given when added or renamed).
    pub fn dn_string(&self, id: EntryId) -> Result<String, StoreError> {
        let rec = self
            .entry_bytes(id)?
            .ok_or_else(|| StoreError::Corrupt(format!("entry {id} is missing")))?;
        self.dn_string_in(id, rec)
    }

    /// [`View::dn_string`] of entry `id` whose record `rec` the caller
    /// read.
    pub fn dn_string_in(&self, id: EntryId, rec: &[u8]) -> Result<String, StoreError> {
        let p = self.placement_in(id, rec)?;
        // A read view formats it below its parent's remembered DN: one
        // placement read instead of one per level.
        if self.dn_snapshot.is_some() {
            if let Some(dn) = self.below_parent(&p, 0, |n| join_dn(&p.rdn, &n.dn))? {
                return Ok(dn);
            }
        }
        let mut out = p.rdn;
        let mut cur = p.parent;
        // Depth is bounded by the DN length limit; the counter also stops a
        // corrupted parent cycle from looping forever.
        for _ in 0..1024 {
            if cur == 0 {
                return Ok(out);
            }
            let p = self.placement(cur)?.ok_or_else(|| {
                StoreError::Corrupt(format!("entry {cur} in a parent chain is missing"))
            })?;
            out.push(',');
            out.push_str(&p.rdn);
            cur = p.parent;
        }
        Err(StoreError::Corrupt(format!(
            "parent chain of entry {id} does not end"
        )))
    }

    pub fn dn(&self, id: EntryId) -> Result<Dn, StoreError> {
        let s = self.dn_string(id)?;
        parse_stored_dn(id, s)
    }

    /// [`View::dn`] of entry `id` whose record `rec` the caller read.
    pub fn dn_in(&self, id: EntryId, rec: &[u8]) -> Result<Dn, StoreError> {
        let s = self.dn_string_in(id, rec)?;
        parse_stored_dn(id, s)
    }

    /// The stored (possibly compressed) record of entry `id`.
    pub fn entry_bytes(&self, id: EntryId) -> Result<Option<&'t [u8]>, StoreError> {
        Ok(self.inner.id2entry.get(self.txn, &id_bytes(id))?)
    }

    /// The attributes in a record read with [`View::entry_bytes`].
    pub fn decode_attrs(&self, id: EntryId, bytes: &[u8]) -> Result<Vec<Attribute>, StoreError> {
        Ok(self
            .inner
            .codec
            .decode(id, Dn { rdns: vec![] }, bytes)?
            .attrs)
    }

    /// Only the attributes of entry `id` whose description `keep` accepts.
    pub fn attrs_where(
        &self,
        id: EntryId,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<Option<Vec<Attribute>>, StoreError> {
        match self.entry_bytes(id)? {
            Some(b) => self.attrs_where_in(id, b, keep).map(Some),
            None => Ok(None),
        }
    }

    /// [`View::attrs_where`] from entry `id`'s record `rec`, read by the
    /// caller with [`View::entry_bytes`].
    pub fn attrs_where_in(
        &self,
        id: EntryId,
        rec: &[u8],
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<Attribute>, StoreError> {
        Ok(self
            .inner
            .codec
            .decode_where(id, Dn { rdns: vec![] }, rec, Some(keep))?
            .attrs)
    }

    /// Run `f` on entry `id`'s attributes borrowed from the store, without
    /// copying them; None when there is no such entry.
    pub fn with_raw_attrs<R>(
        &self,
        id: EntryId,
        f: impl FnOnce(entry_codec::RawAttrs<'_>) -> R,
    ) -> Result<Option<R>, StoreError> {
        match self.entry_bytes(id)? {
            Some(b) => self.with_raw_in(id, b, f).map(Some),
            None => Ok(None),
        }
    }

    /// [`View::with_raw_attrs`] on entry `id`'s record `rec`, read by the
    /// caller with [`View::entry_bytes`].
    pub fn with_raw_in<R>(
        &self,
        id: EntryId,
        rec: &[u8],
        f: impl FnOnce(entry_codec::RawAttrs<'_>) -> R,
    ) -> Result<R, StoreError> {
        self.inner.codec.with_raw(id, rec, f)
    }

    /// The entry without its DN resolved (cheaper when the DN is not needed).
    pub fn attrs(&self, id: EntryId) -> Result<Option<Vec<Attribute>>, StoreError> {
        match self.entry_bytes(id)? {
            Some(b) => Ok(Some(self.decode_attrs(id, b)?)),
            None => Ok(None),
        }
    }

    pub fn entry(&self, id: EntryId) -> Result<Option<Entry>, StoreError> {
        match self.entry_bytes(id)? {
            Some(b) => {
                let dn = self.dn_in(id, b)?;
                Ok(Some(self.inner.codec.decode(id, dn, b)?))
            }
            None => Ok(None),
        }
    }

    /// Immediate children, in key order.
    pub fn children(&self, id: EntryId) -> Result<Vec<EntryId>, StoreError> {
        let mut out = Vec::new();
        for item in self
            .inner
            .dn2id
            .prefix_iter(self.txn, &self.inner.dn2id_layout.prefix(id))?
        {
            out.push(dn2id_id(item?.1)?);
        }
        Ok(out)
    }

    /// The first `max` children of `id` (in dn2id order, by RDN), for
    /// callers that must bound their work on a large parent.
    pub fn children_up_to(&self, id: EntryId, max: usize) -> Result<Vec<EntryId>, StoreError> {
        let mut out = Vec::new();
        for item in self
            .inner
            .dn2id
            .prefix_iter(self.txn, &self.inner.dn2id_layout.prefix(id))?
            .take(max)
        {
            out.push(dn2id_id(item?.1)?);
        }
        Ok(out)
    }

    pub fn has_children(&self, id: EntryId) -> Result<bool, StoreError> {
        Ok(self
            .inner
            .dn2id
            .prefix_iter(self.txn, &self.inner.dn2id_layout.prefix(id))?
            .next()
            .transpose()?
            .is_some())
    }

    pub fn count_children(&self, id: EntryId) -> Result<u64, StoreError> {
        let mut n = 0;
        for item in self
            .inner
            .dn2id
            .prefix_iter(self.txn, &self.inner.dn2id_layout.prefix(id))?
        {
            item?;
            n += 1;
        }
        Ok(n)
    }

    /// `id` and all its descendants. Stops with `None` once more than `limit`
    /// IDs were found (the caller decides whether that is an error).
    pub fn subtree(&self, id: EntryId, limit: u64) -> Result<Option<RoaringTreemap>, StoreError> {
        let mut set = RoaringTreemap::new();
        set.insert(id);
        let mut stack = vec![id];
        while let Some(cur) = stack.pop() {
            for item in self
                .inner
                .dn2id
                .prefix_iter(self.txn, &self.inner.dn2id_layout.prefix(cur))?
            {
                let child = dn2id_id(item?.1)?;
                set.insert(child);
                if set.len() > limit {
                    return Ok(None);
                }
                stack.push(child);
            }
        }
        Ok(Some(set))
    }

    /// True when `id` is `ancestor` or below it.
    pub fn is_within(&self, id: EntryId, ancestor: EntryId) -> Result<bool, StoreError> {
        let mut cur = id;
        for _ in 0..1024 {
            if cur == ancestor {
                return Ok(true);
            }
            let up = match dn_cache::parent(self.dn_snapshot, cur) {
                Some(p) => Some(p).filter(|&p| p != 0),
                None => self.parent_of(cur)?,
            };
            match up {
                Some(p) => cur = p,
                None => return Ok(false),
            }
        }
        Err(StoreError::Corrupt(format!(
            "parent chain of entry {id} does not end"
        )))
    }

    /// Number of entries in the store.
    pub fn entry_count(&self) -> Result<u64, StoreError> {
        Ok(self.inner.id2entry.len(self.txn)?)
    }

    /// IDs of the suffix entries (parent 0).
    pub fn roots(&self) -> Result<Vec<EntryId>, StoreError> {
        self.children(0)
    }

    /// The store's format number (`meta:format`). Below [`FORMAT_VERSION`]
    /// only in a read-only view of a store no Pando of this version has
    /// opened for writing yet: its indexes are not in this version's layout.
    pub fn store_format(&self) -> Result<u32, StoreError> {
        self.inner
            .meta
            .get(self.txn, META_FORMAT)?
            .and_then(format_of)
            .ok_or_else(|| StoreError::Format("unreadable format version in meta".into()))
    }

    pub fn meta_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .inner
            .meta
            .get(self.txn, key.as_bytes())?
            .map(|v| v.to_vec()))
    }

    /// The first `max` meta records whose keys start with `prefix`, in key
    /// order.
    pub fn meta_scan(
        &self,
        prefix: &str,
        max: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut out = Vec::new();
        for item in self.inner.meta.prefix_iter(self.txn, prefix.as_bytes())? {
            if out.len() == max {
                break;
            }
            let (k, v) = item?;
            out.push((String::from_utf8_lossy(k).into_owned(), v.to_vec()));
        }
        Ok(out)
    }

    /// Candidate IDs for a filter from the indexes (see [`plan`]).
    pub fn candidates(&self, filter: &pando_proto::Filter) -> Result<Candidates, StoreError> {
        plan::candidates(self, filter)
    }

    /// [`View::candidates`], and whether they are exactly the entries the
    /// filter matches, or are when their RDN says so (see
    /// [`plan::Exactness`]): a caller may skip testing those.
    pub fn candidates_exact(
        &self,
        filter: &pando_proto::Filter,
    ) -> Result<(Candidates, Exactness), StoreError> {
        plan::candidates_exact(self, filter)
    }

    pub(crate) fn posting(&self, db: &Db, key: &[u8]) -> Result<RoaringTreemap, StoreError> {
        crate::postings::read(self.txn, db, key)
    }

    /// The entries whose `attr_lower` (an attribute under uuidMatch with an
    /// equality index) holds a UUID from `from` through `to`, and possibly
    /// others (keys are the UUIDs' first bytes, [`index::eq_key`]): a
    /// superset to test. None when that index is not ready.
    pub fn ids_in_uuid_range(
        &self,
        attr_lower: &str,
        from: &[u8; 16],
        to: &[u8; 16],
    ) -> Result<Option<RoaringTreemap>, StoreError> {
        let (from, to) = (index::uuid_key(from), index::uuid_key(to));
        match self.index_db(attr_lower, IndexKind::Eq) {
            Some(db) => crate::postings::read_range(self.txn, db, Some(from), Some(to)).map(Some),
            None => Ok(None),
        }
    }

    /// The index (attribute, kind) if the planner may use it.
    pub(crate) fn index_db(&self, attr_lower: &str, kind: IndexKind) -> Option<&'t Db> {
        self.catalog.ready_db(attr_lower, kind)
    }

    /// The keys that `attrs` produce in the index (attr, kind).
    pub(crate) fn keys_of(
        &self,
        attrs: &[Attribute],
        attr_lower: &str,
        kind: IndexKind,
    ) -> BTreeSet<Vec<u8>> {
        attr_keys(&self.catalog.schema, attrs, attr_lower, kind)
    }

    /// Walk every store invariant; returns a list of problems (empty = consistent).
    pub fn verify(&self) -> Result<Vec<String>, StoreError> {
        let mut problems = Vec::new();
        let ids = self.verify_entries(&mut problems)?;
        for item in self.inner.dn2id.iter(self.txn)? {
            let (_, v) = item?;
            let id = dn2id_id(v)?;
            if !ids.contains(id) {
                problems.push(format!(
                    "dn2id names entry {id}, which has no id2entry record"
                ));
            }
        }
        for item in self.inner.id2parent.iter(self.txn)? {
            let (k, _) = item?;
            let id = id_from(k)?;
            match self.entry_bytes(id)? {
                None => problems.push(format!("id2parent has a record for missing entry {id}")),
                Some(rec) if entry_codec::placement_of(id, rec)?.is_some() => {
                    problems.push(format!(
                        "id2parent still has a record for entry {id}, which holds its placement"
                    ))
                }
                Some(_) => {}
            }
        }
        // One indexed attribute at a time: what its entries should produce
        // is held for its indexes only, so memory follows the largest
        // index, not all of them together.
        let mut by_attr: BTreeMap<&str, Vec<&IndexDb>> = BTreeMap::new();
        for (attr, idx) in self.catalog.ready() {
            by_attr.entry(attr).or_default().push(idx);
        }
        for (attr, idxs) in by_attr {
            self.verify_indexes_of(attr, &idxs, &mut problems)?;
        }
        Ok(problems)
    }

    /// Every entry decodes and has its DN records; the IDs of the entries.
    fn verify_entries(&self, problems: &mut Vec<String>) -> Result<RoaringTreemap, StoreError> {
        let mut ids = RoaringTreemap::new();
        for item in self.inner.id2entry.iter(self.txn)? {
            let (k, v) = item?;
            let id = id_from(k)?;
            ids.insert(id);
            if let Err(e) = self.decode_attrs(id, v) {
                problems.push(e.to_string());
                continue;
            }
            match self.placement_in(id, v) {
                Err(e) => problems.push(e.to_string()),
                Ok(p) => {
                    match self.inner.dn2id.get(
                        self.txn,
                        &self.inner.dn2id_layout.key(p.parent, &p.norm_rdn),
                    )? {
                        Some(v) if dn2id_id(v)? == id => {}
                        _ => problems.push(format!("entry {id} ({}) is missing from dn2id", p.rdn)),
                    }
                    if p.parent != 0
                        && self
                            .inner
                            .id2entry
                            .get(self.txn, &id_bytes(p.parent))?
                            .is_none()
                    {
                        problems.push(format!("entry {id} has a dangling parent {}", p.parent));
                    }
                }
            }
        }
        Ok(ids)
    }

    /// The indexes `idxs` of attribute `attr` list exactly what the
    /// entries' values produce (entries that do not decode were reported
    /// by [`verify_entries`](Self::verify_entries)).
    fn verify_indexes_of(
        &self,
        attr: &str,
        idxs: &[&IndexDb],
        problems: &mut Vec<String>,
    ) -> Result<(), StoreError> {
        let mut expected: Vec<HashMap<Vec<u8>, Wanted>> = vec![HashMap::new(); idxs.len()];
        let keep = |d: &str| pando_model::desc::base(d).eq_ignore_ascii_case(attr);
        for item in self.inner.id2entry.iter(self.txn)? {
            let (k, v) = item?;
            let id = id_from(k)?;
            let Ok(e) = self
                .inner
                .codec
                .decode_where(id, Dn { rdns: vec![] }, v, Some(&keep))
            else {
                continue;
            };
            for (i, idx) in idxs.iter().enumerate() {
                for key in self.keys_of(&e.attrs, attr, idx.kind) {
                    expected[i]
                        .entry(key)
                        .and_modify(|w| w.insert(id))
                        .or_insert(Wanted::One(id));
                }
            }
        }
        for (idx, want) in idxs.iter().zip(expected) {
            self.compare_index(&index::db_name(attr, idx.kind), &idx.db, want, problems)?;
        }
        Ok(())
    }

    /// Index `db` (named `name`) holds exactly the lists `want`. Each
    /// key found is taken out of `want`: what is left was never found.
    fn compare_index(
        &self,
        name: &str,
        db: &Db,
        mut want: HashMap<Vec<u8>, Wanted>,
        problems: &mut Vec<String>,
    ) -> Result<(), StoreError> {
        let empty = Wanted::Many(RoaringTreemap::new());
        crate::postings::each_key(self.txn, db, &mut |k, got| {
            let wanted = want.remove(k);
            let wanted = wanted.as_ref().unwrap_or(&empty);
            if !wanted.is(&got) {
                let wanted = wanted.to_set();
                problems.push(format!(
                    "{name}: key {:?} lists {} IDs, entries produce {} (extra {:?}, missing {:?})",
                    String::from_utf8_lossy(k),
                    got.len(),
                    wanted.len(),
                    (&got - &wanted).iter().take(5).collect::<Vec<_>>(),
                    (&wanted - &got).iter().take(5).collect::<Vec<_>>()
                ));
            }
        })
        .map_err(|e| StoreError::Corrupt(format!("{name}: {e}")))?;
        for (k, set) in want {
            problems.push(format!(
                "{name}: key {:?} is missing (entries {:?})",
                String::from_utf8_lossy(&k),
                set.to_set().iter().take(5).collect::<Vec<_>>()
            ));
        }
        Ok(())
    }
}

/// The entry IDs an index key should list, as `verify` collects them: most
/// keys of an attribute whose values are unique (uid, mail, entryUUID)
/// name one entry, held as one number instead of a bitmap (a bitmap per
/// key made the check of 10M entries hold 12 GB).
#[derive(Clone)]
enum Wanted {
    One(u64),
    Many(RoaringTreemap),
}

impl Wanted {
    fn insert(&mut self, id: u64) {
        match self {
            Wanted::One(one) if *one == id => {}
            Wanted::One(one) => {
                let set: RoaringTreemap = [*one, id].into_iter().collect();
                *self = Wanted::Many(set);
            }
            Wanted::Many(set) => {
                set.insert(id);
            }
        }
    }

    /// Whether `got` lists exactly these IDs.
    fn is(&self, got: &RoaringTreemap) -> bool {
        match self {
            Wanted::One(one) => got.len() == 1 && got.contains(*one),
            Wanted::Many(set) => got == set,
        }
    }

    fn to_set(&self) -> RoaringTreemap {
        match self {
            Wanted::One(one) => std::iter::once(*one).collect(),
            Wanted::Many(set) => set.clone(),
        }
    }
}
