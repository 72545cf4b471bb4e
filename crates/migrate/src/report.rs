//! The migration report: for every directive not translated exactly, the
//! original text, where it was, and what was done instead.

use std::fmt;

use crate::source::Origin;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Translated; worth knowing (a different spelling, a Pando default).
    Note,
    /// Not translated: it has no effect in Pando or no Pando counterpart,
    /// and leaving it out grants nothing.
    Dropped,
    /// Translated to something that grants or allows less.
    Stricter,
    /// Translated, but the behaviour may differ either way: check it with
    /// `pando migrate --verify-against`.
    Differs,
}

impl Severity {
    pub fn word(self) -> &'static str {
        match self {
            Severity::Note => "note",
            Severity::Dropped => "dropped",
            Severity::Stricter => "stricter",
            Severity::Differs => "differs",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Finding {
    pub severity: Severity,
    /// Where and what (None for findings about the whole configuration).
    pub origin: Option<Origin>,
    pub original: String,
    pub why: String,
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub findings: Vec<Finding>,
    /// Directives translated with no finding.
    pub exact: usize,
}

impl Report {
    pub fn add(
        &mut self,
        severity: Severity,
        origin: Option<&Origin>,
        original: &str,
        why: impl Into<String>,
    ) {
        self.findings.push(Finding {
            severity,
            origin: origin.cloned(),
            original: original.to_string(),
            why: why.into(),
        });
    }

    pub fn count(&self, s: Severity) -> usize {
        self.findings.iter().filter(|f| f.severity == s).count()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "# Migration report: {} translated exactly, {} notes, {} dropped, {} stricter, {} may differ",
            self.exact,
            self.count(Severity::Note),
            self.count(Severity::Dropped),
            self.count(Severity::Stricter),
            self.count(Severity::Differs),
        )?;
        writeln!(f, "#")?;
        writeln!(
            f,
            "# stricter: translated to something that allows less; differs: check with"
        )?;
        writeln!(
            f,
            "# `pando migrate --verify-against`; dropped: not translated, grants nothing."
        )?;
        for sev in [
            Severity::Differs,
            Severity::Stricter,
            Severity::Dropped,
            Severity::Note,
        ] {
            for x in self.findings.iter().filter(|x| x.severity == sev) {
                writeln!(f)?;
                match &x.origin {
                    Some(o) => writeln!(f, "{o}: {}", x.original)?,
                    None => writeln!(f, "(whole configuration): {}", x.original)?,
                }
                writeln!(f, "  {}: {}", sev.word(), x.why)?;
            }
        }
        Ok(())
    }
}
