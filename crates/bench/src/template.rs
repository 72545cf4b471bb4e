//! Request templates: the user's `%d` strings, and whole LDAPMessages
//! pre-compiled so that sending one costs writing a few byte runs.
//!
//! A request is built once with [`pando_proto`]'s encoder, with private-use
//! marker characters where the variable parts go (the key, a counter, a DN
//! found by a search). The encoding is then cut into a small tree: complete
//! TLVs without a marker become literal byte runs; only the elements on the
//! path to a marker stay structured, because their lengths change with the
//! values put in. Encoding a request is then: compute the lengths of those
//! few elements and copy the runs, into a buffer the caller reuses. No
//! filter, string or vector is built per operation.

use pando_proto::ber::{self, tag, Reader};
use pando_proto::{LdapMessage, ProtocolOp};

/// Marker for the key (`%d` in user templates): U+E000, a private-use code
/// point that no real filter, DN or value of ours contains.
pub const KEY: char = '\u{E000}';
/// Marker for a per-operation counter (modify values).
pub const COUNTER: char = '\u{E001}';
/// Marker for a DN found at run time (the bind step of authrate).
pub const DN: char = '\u{E002}';

/// Variable slots, in the order [`MessageTemplate::encode`] takes them.
pub const VAR_KEY: usize = 0;
pub const VAR_COUNTER: usize = 1;
pub const VAR_DN: usize = 2;
const NVARS: usize = 3;

/// UTF-8 of the markers: EE 80 80+n.
const MARK0: u8 = 0xee;
const MARK1: u8 = 0x80;

fn marker_at(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i..i + 3) {
        Some(&[MARK0, MARK1, n]) if (0x80..0x80 + NVARS as u8).contains(&n) => {
            Some(usize::from(n - 0x80))
        }
        _ => None,
    }
}

fn has_marker(b: &[u8]) -> bool {
    (0..b.len()).any(|i| marker_at(b, i).is_some())
}

/// Refuses user text that already contains one of the marker characters.
pub fn check_no_markers(what: &str, s: &str) -> Result<(), String> {
    if s.chars().any(|c| ('\u{E000}'..='\u{E002}').contains(&c)) {
        return Err(format!(
            "{what} contains a private-use character U+E000..U+E002, which pando bench reserves"
        ));
    }
    Ok(())
}

/// A user template such as `(uid=user.%d)`: `%d` stands for the key and
/// `%%` for a percent sign; any other `%` sequence is an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextTemplate {
    /// The template with each `%d` replaced by [`KEY`] and `%%` by `%`.
    marked: String,
    keys: usize,
}

impl TextTemplate {
    /// `what` names the option in error messages (e.g. `--filter`).
    pub fn parse(what: &str, s: &str) -> Result<TextTemplate, String> {
        check_no_markers(what, s)?;
        let mut marked = String::with_capacity(s.len() + 4);
        let mut keys = 0;
        let mut chars = s.char_indices();
        while let Some((i, c)) = chars.next() {
            if c != '%' {
                marked.push(c);
                continue;
            }
            match chars.next() {
                Some((_, 'd')) => {
                    marked.push(KEY);
                    keys += 1;
                }
                Some((_, '%')) => marked.push('%'),
                Some((_, other)) => {
                    return Err(format!(
                        "{what} '{s}': unknown '%{other}' at offset {i}; use %d for the key or %% for a percent sign"
                    ))
                }
                None => {
                    return Err(format!(
                        "{what} '{s}': lone '%' at the end; use %d for the key or %% for a percent sign"
                    ))
                }
            }
        }
        Ok(TextTemplate { marked, keys })
    }

    /// The template with [`KEY`] markers, for building a [`MessageTemplate`].
    pub fn marked(&self) -> &str {
        &self.marked
    }

    /// How many times the key appears.
    pub fn key_count(&self) -> usize {
        self.keys
    }

    /// The text for one key (for messages and checks, not the hot path).
    pub fn render(&self, key: u64) -> String {
        self.marked.replace(KEY, &key.to_string())
    }
}

/// Writes `v` in decimal into `buf`, returning the digits.
pub fn decimal(v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    let mut v = v;
    loop {
        i -= 1;
        if let Some(d) = buf.get_mut(i) {
            *d = b'0' + (v % 10) as u8;
        }
        v /= 10;
        if v == 0 {
            break;
        }
    }
    buf.get(i..).unwrap_or_default()
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Lit(Vec<u8>),
    Var(usize),
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    /// Complete TLVs without variables.
    Lit(Vec<u8>),
    /// The messageID INTEGER.
    MsgId,
    /// A primitive element whose contents hold variables.
    Prim { tag: u8, parts: Vec<Part> },
    /// A constructed element with a variable somewhere below.
    Cons { tag: u8, children: Vec<Node> },
}

/// An LDAPMessage with holes; see the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageTemplate {
    /// Children of the outer LDAPMessage SEQUENCE: [MsgId, op..., controls].
    top: Vec<Node>,
}

fn int_len(v: i32) -> usize {
    match v {
        0..=0x7f => 1,
        0x80..=0x7fff => 2,
        0x8000..=0x7f_ffff => 3,
        _ => 4,
    }
}

fn len_len(len: usize) -> usize {
    match len {
        0..=0x7f => 1,
        0x80..=0xff => 2,
        0x100..=0xffff => 3,
        0x1_0000..=0xff_ffff => 4,
        _ => 5,
    }
}

fn compile_children(content: &[u8]) -> Result<Vec<Node>, String> {
    let mut r = Reader::new(content);
    let mut out: Vec<Node> = Vec::new();
    while !r.is_empty() {
        let before = r.remaining();
        let (t, c) = r.read_tlv().map_err(|e| e.to_string())?;
        let whole = before
            .get(..before.len() - r.remaining().len())
            .unwrap_or_default();
        let node = compile_element(t, c, whole)?;
        // Adjacent literal runs are merged so that encoding copies fewer pieces.
        match (out.last_mut(), node) {
            (Some(Node::Lit(prev)), Node::Lit(next)) => prev.extend_from_slice(&next),
            (_, node) => out.push(node),
        }
    }
    Ok(out)
}

fn compile_element(t: u8, content: &[u8], whole: &[u8]) -> Result<Node, String> {
    if !has_marker(whole) {
        return Ok(Node::Lit(whole.to_vec()));
    }
    if t & 0x20 != 0 {
        return Ok(Node::Cons {
            tag: t,
            children: compile_children(content)?,
        });
    }
    let mut parts = Vec::new();
    let mut lit = Vec::new();
    let mut i = 0;
    while let Some(&b) = content.get(i) {
        if let Some(v) = marker_at(content, i) {
            if !lit.is_empty() {
                parts.push(Part::Lit(std::mem::take(&mut lit)));
            }
            parts.push(Part::Var(v));
            i += 3;
        } else {
            lit.push(b);
            i += 1;
        }
    }
    if !lit.is_empty() {
        parts.push(Part::Lit(lit));
    }
    Ok(Node::Prim { tag: t, parts })
}

impl MessageTemplate {
    /// Compiles `op`, whose strings may hold the markers [`KEY`],
    /// [`COUNTER`] and [`DN`].
    pub fn compile(op: ProtocolOp) -> Result<MessageTemplate, String> {
        let bytes = LdapMessage {
            id: 1,
            op,
            controls: Vec::new(),
        }
        .to_bytes();
        let mut outer = Reader::new(&bytes);
        let body = outer.read(tag::SEQUENCE).map_err(|e| e.to_string())?;
        let mut r = Reader::new(body);
        r.read(tag::INTEGER).map_err(|e| e.to_string())?;
        let mut top = vec![Node::MsgId];
        top.extend(compile_children(r.remaining())?);
        Ok(MessageTemplate { top })
    }

    /// Appends the message with ID `id` and the variables `vars` (indexed by
    /// [`VAR_KEY`], [`VAR_COUNTER`], [`VAR_DN`]) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>, id: i32, vars: &[&[u8]; 3]) {
        let content: usize = self.top.iter().map(|n| tlv_len(n, id, vars)).sum();
        out.reserve(content + 6);
        out.push(tag::SEQUENCE);
        ber::write_len(out, content);
        for n in &self.top {
            write_node(n, out, id, vars);
        }
    }
}

fn var<'a>(vars: &[&'a [u8]; 3], i: usize) -> &'a [u8] {
    vars.get(i).copied().unwrap_or_default()
}

fn content_len(n: &Node, id: i32, vars: &[&[u8]; 3]) -> usize {
    match n {
        Node::Lit(b) => b.len(),
        Node::MsgId => int_len(id),
        Node::Prim { parts, .. } => parts
            .iter()
            .map(|p| match p {
                Part::Lit(b) => b.len(),
                Part::Var(v) => var(vars, *v).len(),
            })
            .sum(),
        Node::Cons { children, .. } => children.iter().map(|c| tlv_len(c, id, vars)).sum(),
    }
}

fn tlv_len(n: &Node, id: i32, vars: &[&[u8]; 3]) -> usize {
    let c = content_len(n, id, vars);
    match n {
        Node::Lit(_) => c,
        _ => 1 + len_len(c) + c,
    }
}

fn write_node(n: &Node, out: &mut Vec<u8>, id: i32, vars: &[&[u8]; 3]) {
    match n {
        Node::Lit(b) => out.extend_from_slice(b),
        Node::MsgId => ber::write_int(out, tag::INTEGER, i64::from(id)),
        Node::Prim { tag, parts } => {
            out.push(*tag);
            ber::write_len(out, content_len(n, id, vars));
            for p in parts {
                match p {
                    Part::Lit(b) => out.extend_from_slice(b),
                    Part::Var(v) => out.extend_from_slice(var(vars, *v)),
                }
            }
        }
        Node::Cons { tag, children } => {
            out.push(*tag);
            ber::write_len(out, content_len(n, id, vars));
            for c in children {
                write_node(c, out, id, vars);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pando_proto::{
        AddRequest, BindAuth, BindRequest, Change, DecodeLimits, DerefAliases, Filter, ModOp,
        ModifyRequest, PartialAttribute, Scope, SearchRequest,
    };

    #[test]
    fn text_template_substitutes_and_escapes() {
        let t = TextTemplate::parse("--filter", "(uid=user.%d)").unwrap();
        assert_eq!(t.key_count(), 1);
        assert_eq!(t.render(42), "(uid=user.42)");
        let t = TextTemplate::parse("--filter", "(|(uid=%d)(cn=100%% %d))").unwrap();
        assert_eq!(t.key_count(), 2);
        assert_eq!(t.render(7), "(|(uid=7)(cn=100% 7))");
        let t = TextTemplate::parse("--base", "ou=People,dc=example,dc=com").unwrap();
        assert_eq!(t.key_count(), 0);
        assert_eq!(t.render(1), "ou=People,dc=example,dc=com");
    }

    #[test]
    fn text_template_errors_name_the_problem() {
        let e = TextTemplate::parse("--filter", "(uid=%s)").unwrap_err();
        assert!(
            e.contains("--filter") && e.contains("'%s'") && e.contains("offset 5"),
            "{e}"
        );
        let e = TextTemplate::parse("--dn-template", "uid=%").unwrap_err();
        assert!(e.contains("lone '%'"), "{e}");
        let e = TextTemplate::parse("--filter", "(cn=\u{E000})").unwrap_err();
        assert!(e.contains("private-use"), "{e}");
    }

    #[test]
    fn decimal_digits() {
        let mut b = [0u8; 20];
        assert_eq!(decimal(0, &mut b), b"0");
        assert_eq!(decimal(9, &mut b), b"9");
        assert_eq!(decimal(1234567890, &mut b), b"1234567890");
        assert_eq!(decimal(u64::MAX, &mut b), b"18446744073709551615");
    }

    fn search(filter: &str, base: &str) -> ProtocolOp {
        ProtocolOp::SearchRequest(SearchRequest {
            base: base.into(),
            scope: Scope::Sub,
            deref: DerefAliases::Never,
            size_limit: 0,
            time_limit: 0,
            types_only: false,
            filter: Filter::parse(filter).unwrap(),
            attrs: vec!["cn".into(), "mail".into()],
        })
    }

    /// The template's bytes must equal proto's encoding of the same message
    /// with the values substituted, for any key length and message ID.
    fn check_same(tpl_op: ProtocolOp, concrete: impl Fn(&str, &str, &str) -> ProtocolOp) {
        let t = MessageTemplate::compile(tpl_op).unwrap();
        let mut out = Vec::new();
        for (id, key, ctr, dn) in [
            (1, "0", "5", "uid=a,dc=x"),
            (127, "12", "", "cn=b"),
            (128, "99999", "123456", ""),
            (
                70000,
                "1234567890123",
                "1",
                "uid=user.5,ou=People,dc=example,dc=com",
            ),
            (i32::MAX, "7", "77", &"x".repeat(300)),
        ] {
            out.clear();
            t.encode(
                &mut out,
                id,
                &[key.as_bytes(), ctr.as_bytes(), dn.as_bytes()],
            );
            let want = LdapMessage {
                id,
                op: concrete(key, ctr, dn),
                controls: vec![],
            }
            .to_bytes();
            assert_eq!(out, want, "id {id} key {key}");
            // And it decodes.
            LdapMessage::decode(&out, &DecodeLimits::default()).unwrap();
        }
    }

    #[test]
    fn search_template_matches_proto_encoding() {
        let k = KEY.to_string();
        check_same(
            search(
                &format!("(&(objectClass=person)(uid=user.{k}))"),
                "ou=People,dc=example,dc=com",
            ),
            |key, _, _| {
                search(
                    &format!("(&(objectClass=person)(uid=user.{key}))"),
                    "ou=People,dc=example,dc=com",
                )
            },
        );
        // Key in the base DN (a base-scope read) and twice in a substring filter.
        check_same(
            search(
                &format!("(cn=*{k}*{k})"),
                &format!("uid=user.{k},ou=People,dc=example,dc=com"),
            ),
            |key, _, _| {
                search(
                    &format!("(cn=*{key}*{key})"),
                    &format!("uid=user.{key},ou=People,dc=example,dc=com"),
                )
            },
        );
        // No variable at all: the whole op is one literal.
        check_same(search("(objectClass=*)", "dc=example,dc=com"), |_, _, _| {
            search("(objectClass=*)", "dc=example,dc=com")
        });
    }

    #[test]
    fn bind_modify_add_templates_match_proto_encoding() {
        let bind = |dn: &str| {
            ProtocolOp::BindRequest(BindRequest {
                version: 3,
                name: dn.into(),
                auth: BindAuth::Simple(b"secret".to_vec()),
            })
        };
        check_same(bind(&DN.to_string()), |_, _, dn| bind(dn));
        let modify = |dn: &str, v: &str| {
            ProtocolOp::ModifyRequest(ModifyRequest {
                dn: dn.into(),
                changes: vec![Change {
                    op: ModOp::Replace,
                    attr: PartialAttribute {
                        name: "description".into(),
                        values: vec![format!("pando bench {v}").into_bytes()],
                    },
                }],
            })
        };
        check_same(
            modify(&format!("uid=user.{KEY},ou=People"), &COUNTER.to_string()),
            |key, ctr, _| modify(&format!("uid=user.{key},ou=People"), ctr),
        );
        let add = |key: &str| {
            let pa = |n: &str, v: &[&str]| PartialAttribute {
                name: n.into(),
                values: v.iter().map(|s| s.as_bytes().to_vec()).collect(),
            };
            ProtocolOp::AddRequest(AddRequest {
                dn: format!("uid=bench.{key},ou=People,dc=example,dc=com"),
                attrs: vec![
                    pa(
                        "objectClass",
                        &["top", "person", "organizationalPerson", "inetOrgPerson"],
                    ),
                    pa("uid", &[&format!("bench.{key}")]),
                    pa("cn", &[&format!("Bench {key}")]),
                    pa("sn", &["Bench"]),
                ],
            })
        };
        check_same(add(&KEY.to_string()), |key, _, _| add(key));
        check_same(
            ProtocolOp::DelRequest(format!("uid=bench.{KEY},dc=x")),
            |key, _, _| ProtocolOp::DelRequest(format!("uid=bench.{key},dc=x")),
        );
    }

    #[test]
    fn only_elements_with_variables_stay_structured() {
        let t = MessageTemplate::compile(search(
            &format!("(uid=user.{KEY})"),
            "ou=People,dc=example,dc=com",
        ))
        .unwrap();
        // [MsgId, SearchRequest]; inside the SearchRequest: the literal run
        // (base..typesOnly), the filter, then the attribute list (literal).
        let [Node::MsgId, Node::Cons { children, .. }] = t.top.as_slice() else {
            panic!("{:?}", t.top)
        };
        assert!(matches!(
            children.as_slice(),
            [Node::Lit(_), Node::Cons { .. }, Node::Lit(_)]
        ));
    }
}
