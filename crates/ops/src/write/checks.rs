//! Checks made on a write request before the store is touched, and where a
//! new entry goes.

use pando_model::{Dn, Schema};
use pando_proto::ResultCode;
use pando_store::{Lookup, Placement, View};

use crate::error::{LdapError, OpResult};
use crate::state::Server;
use pando_access::Identity;

/// Attributes the server maintains; clients may not set them.
const MAINTAINED: &[&str] = &[
    "createTimestamp",
    "modifyTimestamp",
    "creatorsName",
    "modifiersName",
    "entryUUID",
    "entryCSN",
    "structuralObjectClass",
    "entryDN",
    "subschemaSubentry",
    "hasSubordinates",
    "numSubordinates",
];

/// Refuse an add or modify carrying more than `limits.max_values_per_operation`
/// values, unless from an administrator; checked before any schema, access
/// or store work.
pub(super) fn check_value_count(
    server: &Server,
    who: &Identity,
    counts: impl Iterator<Item = usize>,
) -> OpResult<()> {
    let max = server.cfg.config.limits.max_values_per_operation;
    if max == 0 || who.is_admin() {
        return Ok(());
    }
    let n: usize = counts.sum();
    if n > max {
        return Err(LdapError::new(
            ResultCode::ADMIN_LIMIT_EXCEEDED,
            format!("{n} attribute values in one operation; at most {max} are accepted"),
        ));
    }
    Ok(())
}

/// Check userPassword values a client sends and count the clear-text ones
/// (`clear`: counted so far in the operation). Each clear-text value costs
/// a slow hash, so an operation may carry at most
/// `passwords.max_clear_values`; a value hashed with a key-stretching
/// scheme is taken as given only from administrators, because each bind
/// against it costs what its parameters say (up to a minute and a gigabyte
/// for argon2's accepted maximum), which a user could set to tie up the
/// hashing queue. Checked before anything is hashed or looked up.
pub(super) fn check_password_values(
    server: &Server,
    who: &Identity,
    clear: usize,
    values: &[Vec<u8>],
) -> OpResult<usize> {
    let clear = clear
        + values
            .iter()
            .filter(|v| !pando_password::is_hashed(v))
            .count();
    let max = server.cfg.config.passwords.max_clear_values;
    if clear > max {
        return Err(LdapError::new(
            ResultCode::CONSTRAINT_VIOLATION,
            format!("userPassword: at most {max} clear-text values per operation"),
        ));
    }
    let costly =
        |v: &Vec<u8>| pando_password::is_hashed(v) && !pando_password::is_cheap_to_verify(v);
    if !who.is_admin() && values.iter().any(costly) {
        return Err(LdapError::new(
            ResultCode::CONSTRAINT_VIOLATION,
            "userPassword: only administrators may store values hashed with a \
             key-stretching scheme; send the password in clear and the server hashes it",
        ));
    }
    Ok(clear)
}

/// A new entryUUID (RFC 4122 version 4, random).
pub fn random_uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40; // version 4
    b[8] = (b[8] & 0x3f) | 0x80; // RFC 4122 variant
    pando_proto::sync::uuid_text(&b)
}

/// Clients may not set what the server maintains, except administrators
/// under the relax rules control (`relaxed`), and then only the stamps a
/// replica or a migration must carry over, never computed attributes.
pub(super) fn reject_maintained(schema: &Schema, desc: &str, relaxed: bool) -> OpResult<()> {
    let Some(at) = schema.attribute(pando_model::desc::base(desc)) else {
        return Ok(());
    };
    // Under relax an administrator may also set memberOf and the password
    // policy state (data moved from another directory, or repaired by
    // hand: clearing pwdFailureTime).
    let stamp = super::local::STAMPED.iter().any(|m| at.has_name(m))
        || at.has_name("memberOf")
        || at.name().starts_with("pwd");
    if relaxed && stamp {
        return Ok(());
    }
    if at.no_user_modification || MAINTAINED.iter().any(|m| at.has_name(m)) {
        return Err(LdapError::new(
            ResultCode::CONSTRAINT_VIOLATION,
            format!("{}: no user modification allowed", at.name()),
        ));
    }
    Ok(())
}

/// Where a new entry with DN `dn` goes: its parent must exist (or the DN is
/// a configured suffix) and the DN must be free.
pub(super) fn placement_for(server: &Server, view: &View<'_>, dn: &Dn) -> OpResult<Placement> {
    let rdns = crate::norm_rdns(view, dn)?;
    let norm_dn = rdns.join(",");
    if server.suffix_of(&norm_dn).is_none() {
        return Err(LdapError::unwilling(format!(
            "no global superior knowledge: '{dn}' is outside every suffix"
        )));
    }
    if let Lookup::Found(_) = view.lookup_norm(&rdns)? {
        return Err(LdapError::new(
            ResultCode::ENTRY_ALREADY_EXISTS,
            "entry already exists",
        ));
    }
    if server.is_suffix(&norm_dn) {
        return Ok(Placement {
            parent: 0,
            rdn: dn.to_string(),
            norm_rdn: norm_dn,
        });
    }
    // The parent itself must exist; otherwise matchedDN names the deepest
    // existing ancestor.
    let rdn = dn.rdn().map(|r| r.to_string()).unwrap_or_default();
    match view.lookup_norm(&rdns[1..])? {
        Lookup::Found(parent) => Ok(Placement {
            parent,
            rdn,
            norm_rdn: rdns[0].clone(),
        }),
        Lookup::Missing { matched } => Err(crate::no_such_object(view, matched)?),
    }
}
