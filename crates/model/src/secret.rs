//! Which attributes hold secrets: values that let their holder
//! authenticate, or that are password hashes crackable offline. Logs
//! (the audit log, the text access log, the in-directory access log's
//! read records) and conflict records show such an attribute's name and
//! how many values it had, never the values.
//!
//! An attribute type is secret when any of its names, or of the types it
//! derives from (SUP), is
//! - one of [`SECRET_NAMES`] (password attributes of the common schemas:
//!   RFC 4519, RFC 3112, the password policy draft, Samba, Kerberos,
//!   Active Directory, cn=config's root password), or
//! - a name containing "password" (any case): schemas name password
//!   attributes that way (sambaNTPassword, sambaLMPassword,
//!   sambaPasswordHistory…), and hiding a non-secret
//!   (passwordExpirationTime) costs less than showing a secret,
//! - or when its syntax is authPasswordSyntax (RFC 3112).
//!
//! userPassword itself is special in one place: the audit log writes its
//! stored (hashed, salted) form so the log can be replayed; every other
//! secret is withheld there too.

use crate::schema::Schema;

/// Secret attribute names beyond those containing "password".
pub const SECRET_NAMES: &[&str] = &[
    "userPassword",
    "authPassword",
    "pwdHistory",
    "sambaNTPassword",
    "sambaLMPassword",
    "sambaPasswordHistory",
    "sambaClearTextPassword",
    "krbPrincipalKey",
    "krb5Key",
    "unicodePwd",
    "dBCSPwd",
    "ntPwdHistory",
    "lmPwdHistory",
    "supplementalCredentials",
    "userPKCS12",
    "olcRootPW",
];

/// RFC 3112's authPasswordSyntax.
const AUTH_PASSWORD_SYNTAX: &str = "1.3.6.1.4.1.4203.1.1.2";

/// How deep a SUP chain is followed (schemas nest two or three levels).
const MAX_SUP_DEPTH: usize = 8;

/// Whether the name `name` (no options) marks a secret by itself.
fn secret_name(name: &str) -> bool {
    SECRET_NAMES.iter().any(|s| s.eq_ignore_ascii_case(name))
        || name.to_ascii_lowercase().contains("password")
}

/// Whether the attribute description `desc` (options allowed) names a
/// secret, by its name alone: for descriptions in the schema's canonical
/// form, or where no schema is at hand.
pub fn is_secret(desc: &str) -> bool {
    secret_name(crate::desc::base(desc))
}

impl Schema {
    /// Whether the attribute description `desc` (any of its type's names,
    /// its OID, options allowed) names a secret: the type, or one it
    /// derives from, is secret by name or syntax (see the module).
    pub fn is_secret(&self, desc: &str) -> bool {
        let base = crate::desc::base(desc);
        if secret_name(base) {
            return true;
        }
        let mut at = self.attribute(base);
        for _ in 0..MAX_SUP_DEPTH {
            let Some(t) = at else { return false };
            if t.names.iter().any(|n| secret_name(n))
                || t.syntax.as_deref() == Some(AUTH_PASSWORD_SYNTAX)
            {
                return true;
            }
            at = t.sup.as_deref().and_then(|s| self.attribute(s));
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_by_list_name_oid_and_options() {
        let s = Schema::standard();
        for d in [
            "userPassword",
            "USERPASSWORD;binary",
            "2.5.4.35",
            "sambaNTPassword",
            "sambaLMPassword",
            "pwdHistory",
            "authPassword",
            "krbPrincipalKey",
            "unicodePwd",
        ] {
            assert!(s.is_secret(d), "{d}");
        }
        for d in ["cn", "mail", "description", "2.5.4.3", "pwdChangedTime"] {
            assert!(!s.is_secret(d), "{d}");
        }
        assert!(is_secret("sambaNTPassword") && is_secret("pwdhistory;x"));
        assert!(!is_secret("uid"));
    }
}
