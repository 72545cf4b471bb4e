//! Pando's data model: attribute types, object classes, syntaxes, matching
//! rules with RFC 4518 string preparation, distinguished names (RFC 4514),
//! entries, schema checking and search filter evaluation. Pure: no I/O.
//!
//! The key decision: every matching rule is reduced to bytes. Equality
//! rules map a value to a canonical form (equal iff the forms are equal),
//! ordering rules to a key whose memcmp order is the rule's order. The same
//! functions serve filter evaluation here and index keys in the store, so
//! an index can never disagree with a full scan.
//!
//! The standard schema (`Schema::standard`) is built from built-in syntaxes
//! and matching rules plus five embedded schema files (`schema/*.schema`,
//! RFC 4512 description syntax).

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod check;
pub mod desc;
pub mod dn;
pub mod entry;
pub mod filter;
mod matching;
mod prep;
pub mod schema;
pub mod secret;
mod syntax;

pub use check::SchemaViolation;
pub use desc::AttrDesc;
pub use dn::{Dn, DnError, Rdn, RdnAva};
pub use entry::{Attribute, Entry};
pub use filter::{CompiledFilter, Ternary};
pub use schema::{
    AttributeType, ObjectClass, ObjectClassKind, PosixSchema, Schema, SchemaError, SortOrder, Usage,
};
pub use syntax::generalized_time_seconds;
