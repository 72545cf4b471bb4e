//! Schema checking of whole entries (RFC 4512 sections 2.4 and 3.3).
//!
//! `check_entry` canonicalises the entry in place and validates it:
//! 1. attribute descriptions become canonical (`Schema::canonical_desc`);
//!    attributes naming the same description are merged; attributes with
//!    no values are dropped;
//! 2. every value is checked against its syntax (invalidAttributeSyntax);
//! 3. duplicate values under the equality rule (raw bytes when the type has
//!    none) are rejected (attributeOrValueExists), SINGLE-VALUE is enforced
//!    (constraintViolation);
//! 4. objectClass values must name defined classes and are replaced by the
//!    classes' primary names; superclasses are NOT added to the stored
//!    values (as in OpenLDAP) — filters match superclasses instead;
//! 5. the structural classes (with their superclasses) must form a single
//!    chain; the most specific one is returned (objectClassViolation);
//! 6. every MUST of every class and superclass must be present (an
//!    attribute with options counts), every user attribute must be allowed
//!    by some class's MUST/MAY (a subtype of an allowed type is allowed;
//!    extensibleObject allows any; operational attributes always are);
//! 7. each AVA of the entry's RDN must be a value of the entry
//!    (namingViolation).
//!
//! For a modified entry (`check_entry_keeping` given the stored entry),
//! steps 2-4 skip the attributes whose values are exactly those stored
//! (they were checked when written), except SINGLE-VALUE.
//!
//! NO-USER-MODIFICATION is not checked here: whether a write may set an
//! operational attribute depends on who writes (the operations layer).

use std::collections::HashSet;
use std::fmt;

use pando_proto::ResultCode;

use crate::entry::{Attribute, Entry};
use crate::schema::{AttributeType, ObjectClass, ObjectClassKind, Schema};

/// A schema check failure: the LDAP result code and a message naming the
/// attribute or class concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaViolation {
    pub code: ResultCode,
    pub message: String,
}

impl SchemaViolation {
    pub fn new(code: ResultCode, message: impl Into<String>) -> Self {
        SchemaViolation {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for SchemaViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.code.name(),
            self.code.0,
            self.message
        )
    }
}

impl std::error::Error for SchemaViolation {}

const EXTENSIBLE_OBJECT: &str = "1.3.6.1.4.1.1466.101.120.111";

impl Schema {
    /// Is the RDN value `ava` among the entry's values (by the attribute's
    /// equality rule)? With the attribute type.
    fn rdn_value_present(
        &self,
        entry: &Entry,
        ava: &crate::dn::RdnAva,
    ) -> Result<(&AttributeType, bool), SchemaViolation> {
        let at = self.attribute(&ava.attr).ok_or_else(|| {
            SchemaViolation::new(
                ResultCode::NAMING_VIOLATION,
                format!("naming attribute '{}' is not defined", ava.attr),
            )
        })?;
        let want = match self.normalize(at, &ava.value) {
            Ok(k) => Some(k),
            Err(_) if at.equality.is_none() => None,
            Err(e) => {
                return Err(SchemaViolation::new(
                    ResultCode::NAMING_VIOLATION,
                    format!("naming attribute '{}' has an invalid value: {e}", ava.attr),
                ))
            }
        };
        let found = entry
            .attrs
            .iter()
            .filter(|a| {
                self.attribute(crate::desc::base(&a.desc))
                    .is_some_and(|x| x.oid == at.oid)
            })
            .flat_map(|a| a.values.iter())
            .any(|v| match &want {
                Some(k) => self.normalize(at, v).is_ok_and(|n| &n == k),
                None => v == &ava.value,
            });
        Ok((at, found))
    }

    /// Add the RDN's values the entry lacks (an add request need not list
    /// them, RFC 4511 4.7). Values that cannot be checked are left for
    /// [`Schema::check_entry`] to report.
    pub fn add_rdn_values(&self, entry: &mut Entry) {
        let Some(rdn) = entry.dn.rdn().cloned() else {
            return;
        };
        for ava in &rdn.avas {
            if let Ok((at, false)) = self.rdn_value_present(entry, ava) {
                let name = at.name().to_string();
                entry.add_values(&name, vec![ava.value.clone()]);
            }
        }
    }

    /// Validate a user or imported entry and canonicalise it in place (see
    /// the module docs for the rules). Returns the structural object
    /// class's primary name.
    pub fn check_entry(&self, entry: &mut Entry) -> Result<String, SchemaViolation> {
        self.check_entry_keeping(entry, None, None)
    }

    /// [`Schema::check_entry`] for a glue entry (`objectClass: glue`, a
    /// placeholder a replication consumer makes for a missing parent)
    /// received from a provider: OpenLDAP's hold no value of their RDN
    /// and slapd does not ask for one, so that rule (step 7) is left out;
    /// Pando's hold their RDN's values, which the class does not list, so
    /// the RDN's types are allowed.
    pub fn check_glue_entry(&self, entry: &mut Entry) -> Result<String, SchemaViolation> {
        self.check_classes_and_values(entry, None, None, true)
    }

    /// [`Schema::check_entry`] for a modified entry whose structural class
    /// must stay `stored`: a different one is objectClassModsProhibited,
    /// found before the attributes are checked against it (as slapd).
    /// `old` is the entry as stored: an attribute holding exactly the
    /// values it stores (same order) was checked when they were written
    /// and is not checked value by value again, as slapd checks only the
    /// values a modify brings; the rest of the rules apply to the whole
    /// entry.
    pub fn check_entry_keeping(
        &self,
        entry: &mut Entry,
        stored: Option<&str>,
        old: Option<&Entry>,
    ) -> Result<String, SchemaViolation> {
        let structural = self.check_classes_and_values(entry, stored, old, false)?;
        // 7. RDN values present.
        self.check_rdn_values(entry)?;
        Ok(structural)
    }

    /// Steps 1 to 6 of [`Schema::check_entry_keeping`] (`glue`: the RDN's
    /// types allowed whatever the classes say).
    fn check_classes_and_values(
        &self,
        entry: &mut Entry,
        stored: Option<&str>,
        old: Option<&Entry>,
        glue: bool,
    ) -> Result<String, SchemaViolation> {
        // 1. Canonical descriptions, merged.
        self.merge_descriptions(entry)?;
        // 2-4. Values.
        let oc_type = self.attribute("objectClass");
        self.check_values(entry, oc_type, old)?;
        // 5. Object classes and the structural chain.
        let (all, most) = self.classes(entry, oc_type)?;
        if let Some(stored) = stored.filter(|s| !most.has_name(s)) {
            return Err(SchemaViolation::new(
                ResultCode::OBJECT_CLASS_MODS_PROHIBITED,
                format!(
                    "structural object class modification from '{stored}' to '{}' not allowed",
                    most.name()
                ),
            ));
        }

        // 6. MUST and MAY.
        let rdn_types: Vec<usize> = match (glue, entry.dn.rdn()) {
            (true, Some(rdn)) => rdn
                .avas
                .iter()
                .filter_map(|ava| self.attribute_id(&ava.attr))
                .collect(),
            _ => Vec::new(),
        };
        self.check_must_may(entry, &all, &rdn_types)?;
        Ok(most.name().to_string())
    }

    /// Step 1: every description canonical, values of the same one merged,
    /// empty attributes dropped.
    fn merge_descriptions(&self, entry: &mut Entry) -> Result<(), SchemaViolation> {
        let mut attrs: Vec<Attribute> = Vec::with_capacity(entry.attrs.len());
        for a in entry.attrs.drain(..) {
            if a.values.is_empty() {
                continue;
            }
            let (desc, _) = self.canonical_desc(&a.desc)?;
            match attrs.iter_mut().find(|x| x.desc == desc) {
                Some(x) => x.values.extend(a.values),
                None => attrs.push(Attribute {
                    desc: desc.into_owned(),
                    values: a.values,
                }),
            }
        }
        entry.attrs = attrs;
        Ok(())
    }

    /// Steps 2-4: objectClass values named as the schema names them; every
    /// value valid per its syntax and given once; single-valued types
    /// with one value.
    fn check_values(
        &self,
        entry: &mut Entry,
        oc_type: Option<&AttributeType>,
        old: Option<&Entry>,
    ) -> Result<(), SchemaViolation> {
        for a in entry.attrs.iter_mut() {
            let at = self.type_of(&a.desc)?;
            let as_stored = old.is_some_and(|o| {
                o.attrs
                    .iter()
                    .any(|x| x.desc == a.desc && x.values == a.values)
            });
            if as_stored {
                self.check_single_value(at, a)?;
                continue;
            }
            let is_oc = oc_type.is_some_and(|o| o.oid == at.oid);
            if is_oc {
                for v in a.values.iter_mut() {
                    let name = std::str::from_utf8(v).ok().map(str::trim);
                    let oc = name.and_then(|n| self.object_class(n)).ok_or_else(|| {
                        SchemaViolation::new(
                            ResultCode::INVALID_ATTRIBUTE_SYNTAX,
                            format!(
                                "objectClass: unrecognized value '{}'",
                                String::from_utf8_lossy(v)
                            ),
                        )
                    })?;
                    *v = oc.name().as_bytes().to_vec();
                }
            }
            let mut seen: HashSet<Vec<u8>> = HashSet::new();
            for (i, v) in a.values.iter().enumerate() {
                self.validate(at, v).map_err(|e| {
                    SchemaViolation::new(
                        ResultCode::INVALID_ATTRIBUTE_SYNTAX,
                        format!("{}: value #{i} invalid per syntax: {e}", a.desc),
                    )
                })?;
                let key = if at.equality.is_some() {
                    self.normalize(at, v).map_err(|e| {
                        SchemaViolation::new(
                            ResultCode::INVALID_ATTRIBUTE_SYNTAX,
                            format!("{}: value #{i} invalid: {e}", a.desc),
                        )
                    })?
                } else {
                    v.clone()
                };
                // One value cannot repeat: normalised only to be checked.
                if a.values.len() > 1 && !seen.insert(key) {
                    return Err(SchemaViolation::new(
                        ResultCode::ATTRIBUTE_OR_VALUE_EXISTS,
                        format!("{}: value #{i} provided more than once", a.desc),
                    ));
                }
            }
            self.check_single_value(at, a)?;
        }
        Ok(())
    }

    /// Step 4: a single-valued type holds one value (checked on every
    /// attribute: the schema may have changed since it was written).
    fn check_single_value(&self, at: &AttributeType, a: &Attribute) -> Result<(), SchemaViolation> {
        if at.single_value && a.values.len() > 1 {
            return Err(SchemaViolation::new(
                ResultCode::CONSTRAINT_VIOLATION,
                format!(
                    "{}: multiple values provided for a single-valued attribute",
                    a.desc
                ),
            ));
        }
        Ok(())
    }

    /// Step 5: every class the entry's classes name or inherit, and the
    /// most specific structural class, which must inherit from all others.
    fn classes(
        &self,
        entry: &Entry,
        oc_type: Option<&AttributeType>,
    ) -> Result<(Vec<&ObjectClass>, &ObjectClass), SchemaViolation> {
        let oc_values: Vec<&ObjectClass> = entry
            .attrs
            .iter()
            .find(|a| oc_type.is_some_and(|o| a.desc == o.name()))
            .map(|a| {
                a.values
                    .iter()
                    .filter_map(|v| std::str::from_utf8(v).ok())
                    .filter_map(|n| self.object_class(n))
                    .collect()
            })
            .unwrap_or_default();
        if oc_values.is_empty() {
            return Err(SchemaViolation::new(
                ResultCode::OBJECT_CLASS_VIOLATION,
                "no objectClass attribute",
            ));
        }
        let mut all: Vec<&ObjectClass> = Vec::new();
        for oc in &oc_values {
            for c in self.class_closure(oc) {
                if !all.iter().any(|x| std::ptr::eq(*x, c)) {
                    all.push(c);
                }
            }
        }
        let structural: Vec<&ObjectClass> = all
            .iter()
            .copied()
            .filter(|c| c.kind == ObjectClassKind::Structural)
            .collect();
        if structural.is_empty() {
            return Err(SchemaViolation::new(
                ResultCode::OBJECT_CLASS_VIOLATION,
                "no structural object class provided",
            ));
        }
        // The most specific structural class must inherit from all others.
        let Some(most) = structural.iter().copied().find(|s| {
            let closure = self.class_closure(s);
            structural
                .iter()
                .all(|o| closure.iter().any(|c| std::ptr::eq(*c, *o)))
        }) else {
            let names: Vec<&str> = structural.iter().map(|c| c.name()).collect();
            return Err(SchemaViolation::new(
                ResultCode::OBJECT_CLASS_VIOLATION,
                format!(
                    "invalid structural object class chain ({})",
                    names.join("/")
                ),
            ));
        };
        Ok((all, most))
    }

    /// Step 6: every MUST of every class present; every attribute allowed
    /// by some class (operational ones and extensibleObject excepted).
    fn check_must_may(
        &self,
        entry: &Entry,
        all: &[&ObjectClass],
        also_allowed: &[usize],
    ) -> Result<(), SchemaViolation> {
        let extensible = all.iter().any(|c| c.oid == EXTENSIBLE_OBJECT);
        // Types by their place in the schema: each attribute's looked up
        // once, the classes' resolved when they were defined.
        let ids: Vec<Option<usize>> = entry
            .attrs
            .iter()
            .map(|a| self.attribute_id(crate::desc::base(&a.desc)))
            .collect();
        let mut allowed: Vec<usize> = also_allowed.to_vec();
        for c in all {
            for &id in &c.must_ids {
                allowed.push(id);
                if !ids.iter().flatten().any(|x| *x == id) {
                    return Err(SchemaViolation::new(
                        ResultCode::OBJECT_CLASS_VIOLATION,
                        format!(
                            "object class '{}' requires attribute '{}'",
                            c.name(),
                            self.attribute_at(id).name()
                        ),
                    ));
                }
            }
            allowed.extend_from_slice(&c.may_ids);
        }
        for (a, id) in entry.attrs.iter().zip(&ids) {
            let Some(id) = *id else {
                return Err(undefined(&a.desc));
            };
            if self.attribute_at(id).is_operational() || extensible {
                continue;
            }
            if !self.allowed_by(id, &allowed) {
                return Err(SchemaViolation::new(
                    ResultCode::OBJECT_CLASS_VIOLATION,
                    format!("attribute '{}' not allowed", a.desc),
                ));
            }
        }
        Ok(())
    }

    /// Whether the type at place `id` or one of its supertypes is among
    /// `allowed`.
    fn allowed_by(&self, id: usize, allowed: &[usize]) -> bool {
        let mut cur = Some(id);
        for _ in 0..crate::schema::MAX_SUP_DEPTH {
            let Some(c) = cur else { return false };
            if allowed.contains(&c) {
                return true;
            }
            cur = self.attribute_at(c).sup_id;
        }
        false
    }

    /// Step 7: the RDN's values are among the entry's.
    fn check_rdn_values(&self, entry: &Entry) -> Result<(), SchemaViolation> {
        if let Some(rdn) = entry.dn.rdn() {
            for ava in &rdn.avas {
                let (at, found) = self.rdn_value_present(entry, ava)?;
                if !found {
                    return Err(SchemaViolation::new(
                        ResultCode::NAMING_VIOLATION,
                        format!(
                            "value of naming attribute '{}' is not present in entry",
                            at.name()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn type_of(&self, desc: &str) -> Result<&AttributeType, SchemaViolation> {
        self.attribute(crate::desc::base(desc))
            .ok_or_else(|| undefined(desc))
    }
}

/// The error for an attribute description whose type the schema lacks.
fn undefined(desc: &str) -> SchemaViolation {
    SchemaViolation::new(
        ResultCode::UNDEFINED_ATTRIBUTE_TYPE,
        format!("{desc}: attribute type undefined"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dn::Dn;

    fn entry(dn: &str, attrs: &[(&str, &[&str])]) -> Entry {
        let mut e = Entry::new(Dn::parse(dn).unwrap());
        for (d, vals) in attrs {
            e.add_values(d, vals.iter().map(|v| v.as_bytes().to_vec()).collect());
        }
        e
    }

    fn code(r: Result<String, SchemaViolation>) -> u32 {
        r.unwrap_err().code.0
    }

    #[test]
    fn a_modified_entry_is_checked_value_by_value_only_where_it_changed() {
        let s = Schema::standard();
        let dn = "uid=ann,dc=example,dc=com";
        let base: [(&str, &[&str]); 4] = [
            ("objectClass", &["inetOrgPerson"]),
            ("uid", &["ann"]),
            ("cn", &["Ann"]),
            ("sn", &["A"]),
        ];
        // As stored: a value no longer valid (the schema changed since),
        // and two values of one type that became single-valued.
        let mut stored = entry(dn, &base);
        stored.add_values("telephoneNumber", vec![b"".to_vec()]);
        stored.add_values("preferredLanguage", vec![b"en".to_vec(), b"de".to_vec()]);
        let with = |extra: &[(&str, &[&str])]| {
            let mut e = stored.clone();
            for (d, vs) in extra {
                e.add_values(d, vs.iter().map(|v| v.as_bytes().to_vec()).collect());
            }
            e
        };
        // Without the stored entry, the empty telephone number is refused.
        assert_eq!(code(s.check_entry(&mut with(&[]))), 21);
        // With it, an untouched attribute is not checked again…
        let mut ok = with(&[("description", &["new"])]);
        ok.remove("preferredLanguage");
        assert_eq!(
            s.check_entry_keeping(&mut ok, Some("inetOrgPerson"), Some(&stored)),
            Ok("inetOrgPerson".to_string())
        );
        // …SINGLE-VALUE is, on every attribute…
        let mut two = with(&[("description", &["new"])]);
        assert_eq!(
            code(s.check_entry_keeping(&mut two, Some("inetOrgPerson"), Some(&stored))),
            19
        );
        // …and a changed attribute is checked whole: a duplicate is found.
        let mut dup = with(&[("cn", &["ann"])]);
        dup.remove("preferredLanguage");
        assert_eq!(
            code(s.check_entry_keeping(&mut dup, Some("inetOrgPerson"), Some(&stored))),
            20
        );
    }

    #[test]
    fn rfc2307bis_groups_are_group_of_names_with_posix_group_added() {
        let group = |ocs: &'static [&'static str]| {
            entry(
                "cn=staff,ou=groups,dc=example,dc=com",
                &[
                    ("objectClass", ocs),
                    ("cn", &["staff"]),
                    ("gidNumber", &["5000"]),
                    ("member", &["uid=ann,ou=people,dc=example,dc=com"]),
                    ("memberUid", &["änn"]),
                ],
            )
        };
        let bis = Schema::standard_with(crate::PosixSchema::Rfc2307bis);
        assert_eq!(
            bis.check_entry(&mut group(&["groupOfNames", "posixGroup"])),
            Ok("groupOfNames".to_string())
        );
        // posixGroup alone has no structural class; gecos takes UTF-8.
        assert_eq!(code(bis.check_entry(&mut group(&["posixGroup"]))), 65);
        let mut user = entry(
            "uid=ann,ou=people,dc=example,dc=com",
            &[
                ("objectClass", &["account", "posixAccount"]),
                ("uid", &["ann"]),
                ("cn", &["Änn"]),
                ("uidNumber", &["1"]),
                ("gidNumber", &["5000"]),
                ("homeDirectory", &["/home/ann"]),
                ("gecos", &["Änn Örtel"]),
            ],
        );
        assert!(bis.check_entry(&mut user).is_ok());
        // RFC 2307: posixGroup is structural and conflicts with groupOfNames.
        let nis = Schema::standard();
        assert!(nis
            .check_entry(&mut group(&["groupOfNames", "posixGroup"]))
            .is_err());
        assert!(nis.object_class("automountMap").is_none());
        assert!(bis.object_class("automountMap").is_some());
    }

    #[test]
    fn valid_inet_org_person() {
        let s = Schema::standard();
        let mut e = entry(
            "uid=jdoe,ou=people,dc=example,dc=com",
            &[
                ("objectclass", &["inetorgperson", "posixAccount", "top"]),
                ("commonName", &["John Doe"]),
                ("SN", &["Doe"]),
                ("uid", &["JDoe"]),
                ("uidNumber", &["1000"]),
                ("gidNumber", &["1000"]),
                ("homeDirectory", &["/home/jdoe"]),
                ("mail", &["jdoe@example.com"]),
                ("cn;lang-de", &["Hans"]),
                ("createTimestamp", &["20240101000000Z"]),
            ],
        );
        assert_eq!(s.check_entry(&mut e).unwrap(), "inetOrgPerson");
        assert_eq!(
            e.values("objectClass"),
            &[
                b"inetOrgPerson".to_vec(),
                b"posixAccount".to_vec(),
                b"top".to_vec()
            ]
        );
        assert!(e.get("cn").is_some() && e.get("sn").is_some());
        assert!(e.attrs.iter().any(|a| a.desc == "cn;lang-de"));
    }

    #[test]
    fn violations() {
        let s = Schema::standard();
        // Missing MUST.
        let mut e = entry("cn=a,o=x", &[("objectClass", &["person"]), ("cn", &["a"])]);
        let err = s.check_entry(&mut e).unwrap_err();
        assert_eq!(err.code, ResultCode::OBJECT_CLASS_VIOLATION);
        assert!(err.message.contains("'sn'"), "{err}");
        // Not allowed.
        let mut e = entry(
            "cn=a,o=x",
            &[
                ("objectClass", &["person"]),
                ("cn", &["a"]),
                ("sn", &["b"]),
                ("mail", &["m@x"]),
            ],
        );
        let err = s.check_entry(&mut e).unwrap_err();
        assert_eq!(err.code.0, 65);
        assert!(err.message.contains("mail"));
        // ... unless extensibleObject.
        let mut e = entry(
            "cn=a,o=x",
            &[
                ("objectClass", &["person", "extensibleObject"]),
                ("cn", &["a"]),
                ("sn", &["b"]),
                ("mail", &["m@x"]),
            ],
        );
        assert!(s.check_entry(&mut e).is_ok());
        // Two structural chains.
        let mut e = entry(
            "cn=a,o=x",
            &[
                ("objectClass", &["person", "device"]),
                ("cn", &["a"]),
                ("sn", &["b"]),
            ],
        );
        let err = s.check_entry(&mut e).unwrap_err();
        assert!(
            err.message
                .contains("invalid structural object class chain"),
            "{err}"
        );
        // No structural class.
        let mut e = entry(
            "uid=a,o=x",
            &[("objectClass", &["uidObject"]), ("uid", &["a"])],
        );
        let err = s.check_entry(&mut e).unwrap_err();
        assert_eq!(err.message, "no structural object class provided");
        // No objectClass at all.
        let mut e = entry("cn=a,o=x", &[("cn", &["a"])]);
        assert_eq!(code(s.check_entry(&mut e)), 65);
        // Unknown object class / attribute.
        let mut e = entry("cn=a", &[("objectClass", &["nosuch"]), ("cn", &["a"])]);
        assert_eq!(code(s.check_entry(&mut e)), 21);
        let mut e = entry(
            "cn=a",
            &[
                ("objectClass", &["device"]),
                ("cn", &["a"]),
                ("foo", &["a"]),
            ],
        );
        assert_eq!(code(s.check_entry(&mut e)), 17);
        // Single value.
        let mut e = entry("dc=a", &[("objectClass", &["domain"]), ("dc", &["a", "b"])]);
        assert_eq!(code(s.check_entry(&mut e)), 19);
        // Syntax: integer, boolean, DN.
        let base: &[(&str, &[&str])] = &[
            (
                "objectClass",
                &["account", "posixAccount", "extensibleObject"],
            ),
            ("uid", &["a"]),
            ("cn", &["a"]),
            ("uidNumber", &["1"]),
            ("gidNumber", &["1"]),
            ("homeDirectory", &["/"]),
        ];
        let mut e = entry("uid=a", base);
        assert!(s.check_entry(&mut e).is_ok());
        for (attr, bad) in [
            ("uidNumber", "x1"),
            ("hasSubordinates", "yes"),
            ("seeAlso", "not a dn"),
        ] {
            let mut e = entry("uid=a", base);
            e.remove(attr);
            e.add_values(attr, vec![bad.as_bytes().to_vec()]);
            let err = s.check_entry(&mut e).unwrap_err();
            assert_eq!(err.code, ResultCode::INVALID_ATTRIBUTE_SYNTAX, "{attr}");
            assert!(err.message.starts_with(attr), "{err}");
        }
        // Duplicates under the equality rule, also across alias names.
        let mut e = entry(
            "cn=a,o=x",
            &[
                ("objectClass", &["person"]),
                ("cn", &["a", "  A "]),
                ("sn", &["b"]),
            ],
        );
        let err = s.check_entry(&mut e).unwrap_err();
        assert_eq!(err.code, ResultCode::ATTRIBUTE_OR_VALUE_EXISTS);
        assert!(err.message.starts_with("cn"));
        let mut e = entry(
            "cn=a,o=x",
            &[
                ("objectClass", &["person"]),
                ("cn", &["a"]),
                ("commonName", &["A"]),
                ("sn", &["b"]),
            ],
        );
        assert_eq!(code(s.check_entry(&mut e)), 20);
    }

    #[test]
    fn a_subtype_is_allowed_where_its_supertype_is() {
        let mut s = Schema::standard();
        s.add_definitions(
            "attributetype ( 1.2.3.2 NAME 'fooName' SUP name )\n\
             attributetype ( 1.2.3.4 NAME 'fooNick' SUP fooName )\n\
             objectclass ( 1.2.3.3 NAME 'fooThing' SUP top STRUCTURAL MUST ( CN $ fooName ) MAY name )\n\
             objectclass ( 1.2.3.5 NAME 'barThing' SUP top STRUCTURAL MUST cn MAY fooName )",
        )
        .unwrap();
        // Two levels below `name`, a MAY of the class; MUST met by an alias.
        let mut e = entry(
            "cn=a,o=x",
            &[
                ("objectClass", &["fooThing"]),
                ("commonName", &["a"]),
                ("fooName", &["b"]),
                ("fooNick", &["c"]),
            ],
        );
        assert!(s.check_entry(&mut e).is_ok());
        // A supertype is not allowed where only its subtype is.
        let mut e = entry(
            "cn=a,o=x",
            &[
                ("objectClass", &["barThing"]),
                ("cn", &["a"]),
                ("fooNick", &["c"]),
                ("name", &["n"]),
            ],
        );
        let err = s.check_entry(&mut e).unwrap_err();
        assert_eq!(err.message, "attribute 'name' not allowed");
        // A MUST missing is named as the schema names it.
        let mut e = entry(
            "cn=a,o=x",
            &[("objectClass", &["fooThing"]), ("cn", &["a"])],
        );
        let err = s.check_entry(&mut e).unwrap_err();
        assert_eq!(
            err.message,
            "object class 'fooThing' requires attribute 'fooName'"
        );
    }

    #[test]
    fn naming() {
        let s = Schema::standard();
        let mut e = entry(
            "cn=Other,o=x",
            &[("objectClass", &["person"]), ("cn", &["a"]), ("sn", &["b"])],
        );
        assert_eq!(code(s.check_entry(&mut e)), 64);
        // Case and spaces do not matter; multi-valued RDNs need every AVA.
        let mut e = entry(
            "CN=  A +sn=B,o=x",
            &[("objectClass", &["person"]), ("cn", &["a"]), ("sn", &["b"])],
        );
        assert!(s.check_entry(&mut e).is_ok());
        let mut e = entry(
            "cn=a+sn=c,o=x",
            &[("objectClass", &["person"]), ("cn", &["a"]), ("sn", &["b"])],
        );
        assert_eq!(code(s.check_entry(&mut e)), 64);
        // The root DSE has no RDN to check.
        let mut e = entry("", &[("objectClass", &["device"]), ("cn", &["a"])]);
        assert!(s.check_entry(&mut e).is_ok());
        // A glue entry as slapd makes it: no RDN value, taken as glue only.
        let glue = entry(
            "ou=Temp,o=x",
            &[
                ("objectClass", &["top", "glue"]),
                ("structuralObjectClass", &["glue"]),
            ],
        );
        assert_eq!(code(s.check_entry(&mut glue.clone())), 64);
        assert_eq!(s.check_glue_entry(&mut glue.clone()).unwrap(), "glue");
        // Pando's own glue holds its RDN value: allowed in a glue entry.
        let mut with_rdn = glue.clone();
        with_rdn.add_values("ou", vec![b"Temp".to_vec()]);
        assert_eq!(s.check_glue_entry(&mut with_rdn).unwrap(), "glue");
        assert_eq!(code(s.check_entry(&mut with_rdn.clone())), 65);
        // The other rules still hold for it.
        let mut bad = glue.clone();
        bad.add_values("cn", vec![b"x".to_vec()]);
        assert_eq!(code(s.check_glue_entry(&mut bad)), 65);
    }

    #[test]
    fn abstract_and_auxiliary() {
        let s = Schema::standard();
        let mut e = entry(
            "dc=example,dc=com",
            &[
                ("objectClass", &["top", "dcObject", "organization"]),
                ("dc", &["example"]),
                ("o", &["Example"]),
            ],
        );
        assert_eq!(s.check_entry(&mut e).unwrap(), "organization");
        // Structural subclass plus its superclass is one chain.
        let mut e = entry(
            "cn=a",
            &[
                ("objectClass", &["person", "organizationalPerson"]),
                ("cn", &["a"]),
                ("sn", &["b"]),
                ("title", &["t"]),
            ],
        );
        assert_eq!(s.check_entry(&mut e).unwrap(), "organizationalPerson");
        // Empty attributes are dropped.
        let mut e = entry("cn=a", &[("objectClass", &["device"]), ("cn", &["a"])]);
        e.add_values("description", vec![]);
        assert!(s.check_entry(&mut e).is_ok());
        assert!(e.get("description").is_none());
    }
}
