//! Password quality: the policy's lengths, then the overlay's own checks
//! (character classes, a list of banned passwords, the account's own
//! names). Each failure says which rule the password broke.

use std::collections::HashSet;
use std::path::Path;

use pando_model::Entry;
use pando_proto::control_values::PolicyError;

use super::policy::Policy;

/// The overlay's quality checks beyond the policy entry's lengths.
#[derive(Debug, Default)]
pub struct Quality {
    /// Character classes (lower case, upper case, digits, others) a
    /// password must mix; 0 or 1: no rule.
    pub min_classes: u8,
    /// Passwords refused outright, lower-cased.
    pub banned: HashSet<String>,
}

impl Quality {
    /// Read the banned list: one password per line; empty lines and
    /// lines starting with `#` are skipped.
    pub fn load(min_classes: u8, banned_file: Option<&Path>) -> Result<Quality, String> {
        let mut banned = HashSet::new();
        if let Some(path) = banned_file {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            for line in text.lines().map(str::trim) {
                if !line.is_empty() && !line.starts_with('#') {
                    banned.insert(line.to_lowercase());
                }
            }
        }
        Ok(Quality {
            min_classes,
            banned,
        })
    }

    /// Check a clear-text password for the account `entry` under `p`.
    pub fn check(
        &self,
        p: &Policy,
        entry: Option<&Entry>,
        password: &[u8],
    ) -> Result<(), (PolicyError, String)> {
        let Ok(text) = std::str::from_utf8(password) else {
            return Err((
                PolicyError::InsufficientPasswordQuality,
                "the password is not UTF-8".into(),
            ));
        };
        let chars = text.chars().count();
        if chars < p.min_length as usize {
            return Err((
                PolicyError::PasswordTooShort,
                format!(
                    "the password has {chars} characters; at least {} are needed",
                    p.min_length
                ),
            ));
        }
        if p.max_length > 0 && chars > p.max_length as usize {
            return Err((
                PolicyError::PasswordTooLong,
                format!(
                    "the password has {chars} characters; at most {} are allowed",
                    p.max_length
                ),
            ));
        }
        let classes = [
            text.chars().any(char::is_lowercase),
            text.chars().any(char::is_uppercase),
            text.chars().any(|c| c.is_ascii_digit()),
            text.chars().any(|c| !c.is_alphanumeric()),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if classes < self.min_classes as usize {
            return Err((
                PolicyError::InsufficientPasswordQuality,
                format!(
                    "the password mixes {classes} kinds of characters (lower case, upper case, digits, others); {} are needed",
                    self.min_classes
                ),
            ));
        }
        let lower = text.to_lowercase();
        if self.banned.contains(&lower) {
            return Err((
                PolicyError::InsufficientPasswordQuality,
                "the password is on the list of banned passwords".into(),
            ));
        }
        if let Some(e) = entry {
            for attr in ["uid", "cn", "sn", "givenName", "mail"] {
                for v in e.values(attr) {
                    let name = String::from_utf8_lossy(v).to_lowercase();
                    if name.chars().count() >= 3 && lower.contains(&name) {
                        return Err((
                            PolicyError::InsufficientPasswordQuality,
                            format!("the password contains the account's {attr}"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pando_model::Dn;

    #[test]
    fn each_rule_names_itself() {
        let p = Policy {
            min_length: 8,
            max_length: 20,
            ..Policy::default()
        };
        let mut q = Quality {
            min_classes: 3,
            banned: HashSet::new(),
        };
        q.banned.insert("correcthorse1!".into());
        let mut e = Entry::new(Dn::parse("uid=alice").unwrap());
        e.add_values("uid", vec![b"alice".to_vec()]);
        let fails = |pw: &str| q.check(&p, Some(&e), pw.as_bytes()).unwrap_err().0;
        assert_eq!(fails("Ab1!"), PolicyError::PasswordTooShort);
        assert_eq!(
            fails("Ab1!Ab1!Ab1!Ab1!Ab1!Ab1!"),
            PolicyError::PasswordTooLong
        );
        assert_eq!(fails("abcdefgh1"), PolicyError::InsufficientPasswordQuality);
        assert_eq!(
            fails("CorrectHorse1!"),
            PolicyError::InsufficientPasswordQuality
        );
        assert_eq!(
            fails("Alice-2024x"),
            PolicyError::InsufficientPasswordQuality
        );
        assert!(q.check(&p, Some(&e), b"Tr0ub4dor&3").is_ok());
    }
}
