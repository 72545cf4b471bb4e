//! The cn=config tree as the operations see it: where it is and who may
//! see it (the trait through which they read and change it is
//! `seams::ConfigTree`; a write to it is `config_write`'s). The tree itself (its entries, and applying a
//! change to the running configuration) is `cn_config`'s, given to the
//! server when it is assembled; the operations name no configuration
//! code.

use pando_access::Identity;
use pando_model::{Dn, Schema};

/// The tree's root as clients write it.
pub const CONFIG_DN: &str = "cn=config";
/// The tree's root, normalised.
pub const CONFIG_NORM: &str = "cn=config";

/// The normalised DN when `dn` names cn=config or an entry below it.
pub fn under_config(schema: &Schema, dn: &Dn) -> Option<String> {
    // Only a last RDN of `cn=config` can be: others skip the normalising.
    let last = dn.rdns.last()?;
    if last.avas.len() != 1 || !last.avas[0].value.eq_ignore_ascii_case(b"config") {
        return None;
    }
    let norm = schema.normalize_dn(dn).ok()?;
    (norm == CONFIG_NORM || norm.ends_with(",cn=config")).then_some(norm)
}

/// Who may read and change the configuration: to anyone else the tree
/// does not exist.
pub fn may_see(who: &Identity) -> bool {
    who.is_admin() || who.is_break_glass()
}
