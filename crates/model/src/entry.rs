//! Entries: a DN and attributes with their values, in the order given.
//!
//! An `Entry` is not checked by construction; `Schema::check_entry`
//! canonicalises and validates it (descriptions become canonical, values
//! are syntax-checked, objectClass values get their defined names).

use crate::dn::Dn;

#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub dn: Dn,
    pub attrs: Vec<Attribute>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Attribute {
    /// Attribute description; canonical ("cn;lang-en") once checked.
    pub desc: String,
    pub values: Vec<Vec<u8>>,
}

impl Entry {
    pub fn new(dn: Dn) -> Self {
        Entry {
            dn,
            attrs: Vec::new(),
        }
    }

    /// The attribute whose description equals `desc` (ASCII
    /// case-insensitive, no alias or subtype resolution).
    pub fn get(&self, desc: &str) -> Option<&Attribute> {
        self.attrs
            .iter()
            .find(|a| a.desc.eq_ignore_ascii_case(desc))
    }

    pub fn get_mut(&mut self, desc: &str) -> Option<&mut Attribute> {
        self.attrs
            .iter_mut()
            .find(|a| a.desc.eq_ignore_ascii_case(desc))
    }

    pub fn remove(&mut self, desc: &str) -> Option<Attribute> {
        let i = self
            .attrs
            .iter()
            .position(|a| a.desc.eq_ignore_ascii_case(desc))?;
        Some(self.attrs.remove(i))
    }

    /// Append values to the attribute `desc`, creating it if needed. No
    /// checks: duplicates and syntax are `check_entry`'s business.
    pub fn add_values(&mut self, desc: &str, values: Vec<Vec<u8>>) {
        match self.get_mut(desc) {
            Some(a) => a.values.extend(values),
            None => self.attrs.push(Attribute {
                desc: desc.to_string(),
                values,
            }),
        }
    }

    /// Values of `desc` (case-insensitive exact description), empty if absent.
    pub fn values(&self, desc: &str) -> &[Vec<u8>] {
        self.get(desc).map(|a| a.values.as_slice()).unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_add_remove() {
        let mut e = Entry::new(Dn::parse("cn=a").unwrap());
        e.add_values("cn", vec![b"a".to_vec()]);
        e.add_values("CN", vec![b"b".to_vec()]);
        e.add_values("cn;lang-en", vec![b"c".to_vec()]);
        assert_eq!(e.attrs.len(), 2);
        assert_eq!(e.get("Cn").unwrap().values.len(), 2);
        assert_eq!(e.values("cn;LANG-EN"), &[b"c".to_vec()]);
        assert!(e.remove("cn").is_some());
        assert!(e.get("cn").is_none());
        assert!(e.remove("cn").is_none());
        assert!(e.values("sn").is_empty());
    }
}
