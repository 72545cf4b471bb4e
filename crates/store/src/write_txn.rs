//! Changing the store inside a write job (`WriteTxn`): entries, their DN
//! records and index postings kept in step. Only the writer thread runs these.

use super::*;

impl<'e> WriteTxn<'e> {
    /// Run `f` on the writer thread once this job's changes are committed
    /// (durably, as the durability mode says), before any job of the batch
    /// is answered. Jobs' callbacks run in the order the jobs committed, so
    /// whatever `f` publishes is in commit order. Dropped unrun when the
    /// job or its batch is rolled back.
    pub fn after_commit(&mut self, f: impl FnOnce() + Send + 'static) {
        self.after_commit.push(Box::new(move |_: &Inner| f()));
    }

    /// [`WriteTxn::after_commit`] for the store's own steps.
    pub(crate) fn after_commit_inner(&mut self, f: impl FnOnce(&Inner) + Send + 'static) {
        self.after_commit.push(Box::new(f));
    }

    pub fn view(&self) -> View<'_> {
        // A writer sees its own uncommitted changes: no cached DNs.
        View {
            txn: &self.txn,
            inner: self.inner,
            catalog: &self.catalog,
            dn_snapshot: None,
            content: None,
        }
    }

    pub fn meta_delete(&mut self, key: &str) -> Result<(), StoreError> {
        self.inner.meta.delete(&mut self.txn, key.as_bytes())?;
        Ok(())
    }

    pub fn meta_put(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        Ok(self.inner.meta.put(&mut self.txn, key.as_bytes(), value)?)
    }

    pub(crate) fn allocate_id(&mut self) -> Result<EntryId, StoreError> {
        let next = match self.inner.meta.get(&self.txn, META_NEXT_ID)? {
            Some(v) => id_from(v)?,
            None => return Err(StoreError::Corrupt("meta has no next_id".into())),
        };
        self.inner
            .meta
            .put(&mut self.txn, META_NEXT_ID, &id_bytes(next + 1))?;
        Ok(next)
    }

    /// Store a new entry under `place`. The caller has checked that the parent
    /// exists and that no sibling has the same normalised RDN.
    pub fn add(&mut self, place: &Placement, attrs: &[Attribute]) -> Result<EntryId, StoreError> {
        let id = self.insert_records(place, attrs)?;
        self.update_indexes(id, &[], attrs)?;
        Ok(id)
    }

    /// id2entry and dn2id records of a new entry (no indexes).
    pub(crate) fn insert_records(
        &mut self,
        place: &Placement,
        attrs: &[Attribute],
    ) -> Result<EntryId, StoreError> {
        let key = self.inner.dn2id_layout.key(place.parent, &place.norm_rdn);
        if self.inner.dn2id.get(&self.txn, &key)?.is_some() {
            return Err(StoreError::Corrupt(format!(
                "dn2id already holds '{}'",
                place.rdn
            )));
        }
        let id = self.allocate_id()?;
        let mut buf = Vec::new();
        self.inner.codec.encode(attrs, &mut buf);
        self.put_placed(id, place, &buf)?;
        self.inner
            .dn2id
            .put(&mut self.txn, &key, &dn2id_value(id))?;
        Ok(id)
    }

    /// Store `record` (an encoded entry) as entry `id`'s, holding `place`;
    /// an `id2parent` record of a store before format 6 goes (the record
    /// holds the placement from now on).
    fn put_placed(
        &mut self,
        id: EntryId,
        place: &Placement,
        record: &[u8],
    ) -> Result<(), StoreError> {
        let (mut placement, mut placed) = (Vec::with_capacity(32), Vec::new());
        put_place(place, &mut placement);
        entry_codec::place(record, &placement, &mut placed)?;
        self.inner
            .id2entry
            .put(&mut self.txn, &id_bytes(id), &placed)?;
        // Empty but in stores older than format 6: a lookup on an empty
        // database ends at once.
        self.inner.id2parent.delete(&mut self.txn, &id_bytes(id))?;
        Ok(())
    }

    /// Entry `id`'s placement as stored now.
    fn current_place(&self, id: EntryId) -> Result<Placement, StoreError> {
        self.view()
            .placement(id)?
            .ok_or_else(|| StoreError::Corrupt(format!("entry {id} has no id2entry record")))
    }

    /// Replace the attributes of entry `id` (`old` must be what is stored).
    pub fn replace(
        &mut self,
        id: EntryId,
        old: &[Attribute],
        new: &[Attribute],
    ) -> Result<(), StoreError> {
        let place = self.current_place(id)?;
        let mut buf = Vec::new();
        self.inner.codec.encode(new, &mut buf);
        self.put_placed(id, &place, &buf)?;
        self.update_indexes(id, old, new)
    }

    /// Remove leaf entry `id` (`old` must be what is stored).
    pub fn delete(&mut self, id: EntryId, old: &[Attribute]) -> Result<(), StoreError> {
        self.inner.dn_generation.changing();
        if self.view().has_children(id)? {
            return Err(StoreError::Corrupt(format!(
                "delete of entry {id}, which has children"
            )));
        }
        let place = self.current_place(id)?;
        self.inner.dn2id.delete(
            &mut self.txn,
            &self.inner.dn2id_layout.key(place.parent, &place.norm_rdn),
        )?;
        self.inner.id2parent.delete(&mut self.txn, &id_bytes(id))?;
        self.inner.id2entry.delete(&mut self.txn, &id_bytes(id))?;
        self.update_indexes(id, old, &[])
    }

    /// Give entry `id` a new parent and/or RDN. Descendants are untouched:
    /// their DNs derive from this record.
    ///
    /// The caller has checked that the new DN is free and that the new
    /// parent is not the entry or below it; as `add` does for its DN, the
    /// store refuses all the same rather than let a caller's bug corrupt
    /// the tree: a taken dn2id key would be overwritten (its entry lost
    /// from dn2id), and a move below itself would cut the subtree off from
    /// every suffix in a parent cycle.
    pub fn rename(&mut self, id: EntryId, to: &Placement) -> Result<(), StoreError> {
        self.inner.dn_generation.changing();
        // Read once: its place now, and the attributes it keeps at the new one.
        let record = self
            .inner
            .id2entry
            .get(&self.txn, &id_bytes(id))?
            .ok_or_else(|| StoreError::Corrupt(format!("entry {id} has no id2entry record")))?
            .to_vec();
        let from = self.view().placement_in(id, &record)?;
        let key = self.inner.dn2id_layout.key(to.parent, &to.norm_rdn);
        // The entry's own key is free for it: a change of case only.
        if let Some(v) = self.inner.dn2id.get(&self.txn, &key)? {
            if dn2id_id(v)? != id {
                return Err(StoreError::Corrupt(format!(
                    "dn2id already holds '{}'",
                    to.rdn
                )));
            }
        }
        if to.parent != 0 && self.view().is_within(to.parent, id)? {
            return Err(StoreError::Corrupt(format!(
                "move of entry {id} below itself"
            )));
        }
        self.inner.dn2id.delete(
            &mut self.txn,
            &self.inner.dn2id_layout.key(from.parent, &from.norm_rdn),
        )?;
        self.inner
            .dn2id
            .put(&mut self.txn, &key, &dn2id_value(id))?;
        self.put_placed(id, to, &record)
    }

    pub(crate) fn update_indexes(
        &mut self,
        id: EntryId,
        old: &[Attribute],
        new: &[Attribute],
    ) -> Result<(), StoreError> {
        // Building indexes too (see `index_build`).
        let catalog = self.catalog.clone();
        // Most modifications leave most indexed attributes alone: when the
        // values are the same, so are the keys.
        let changed = (!old.is_empty() && !new.is_empty()).then(|| changed_bases(old, new));
        for (attr, dbs) in &catalog.indexes {
            if let Some(changed) = &changed {
                if !changed.iter().any(|b| b.eq_ignore_ascii_case(attr)) {
                    continue;
                }
            }
            for idx in dbs {
                let (before, after) = {
                    let view = self.view();
                    (
                        view.keys_of(old, attr, idx.kind),
                        view.keys_of(new, attr, idx.kind),
                    )
                };
                for k in before.difference(&after) {
                    self.change_posting(&idx.db, k, id, false)?;
                }
                for k in after.difference(&before) {
                    self.change_posting(&idx.db, k, id, true)?;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn change_posting(
        &mut self,
        db: &Db,
        key: &[u8],
        id: EntryId,
        add: bool,
    ) -> Result<(), StoreError> {
        crate::postings::change(&mut self.txn, db, key, id, add)
    }
}

/// The base types (as written) of the attributes of `old` and `new` that
/// have no twin (same description, same values) on the other side: the
/// only ones whose index keys can differ. A modification usually changes
/// a few of an entry's attributes, and keeps their order.
fn changed_bases<'a>(old: &'a [Attribute], new: &'a [Attribute]) -> Vec<&'a str> {
    let twin = |list: &[Attribute], i: usize, a: &Attribute| {
        let same = |b: &Attribute| b.desc == a.desc && b.values == a.values;
        list.get(i).is_some_and(same) || list.iter().any(same)
    };
    let mut changed = Vec::new();
    for (i, a) in new.iter().enumerate() {
        if !twin(old, i, a) {
            changed.push(pando_model::desc::base(&a.desc));
        }
    }
    for (i, a) in old.iter().enumerate() {
        if !twin(new, i, a) {
            changed.push(pando_model::desc::base(&a.desc));
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(list: &[(&str, &[&str])]) -> Vec<Attribute> {
        list.iter()
            .map(|(d, vs)| Attribute {
                desc: d.to_string(),
                values: vs.iter().map(|v| v.as_bytes().to_vec()).collect(),
            })
            .collect()
    }

    #[test]
    fn only_attributes_without_a_twin_count_as_changed() {
        let old = attrs(&[("cn", &["a"]), ("sn", &["b"]), ("mail", &["m"])]);
        // One value replaced, one attribute added: both named, nothing else.
        let new = attrs(&[
            ("cn", &["a"]),
            ("sn", &["c"]),
            ("mail", &["m"]),
            ("uid", &["u"]),
        ]);
        assert_eq!(changed_bases(&old, &new), ["sn", "uid", "sn"]);
        // Reordered, same values: nothing changed.
        let reordered = attrs(&[("mail", &["m"]), ("cn", &["a"]), ("sn", &["b"])]);
        assert!(changed_bases(&old, &reordered).is_empty());
        // A second description of one type removed, options dropped from the base.
        let old = attrs(&[("cn", &["a"]), ("cn;lang-en", &["b"])]);
        let new = attrs(&[("cn", &["a"])]);
        assert_eq!(changed_bases(&old, &new), ["cn"]);
        // Another spelling of the type is a change (its keys are recomputed).
        let new = attrs(&[("CN", &["a"]), ("cn;lang-en", &["b"])]);
        assert_eq!(changed_bases(&old, &new), ["CN", "cn"]);
    }
}
