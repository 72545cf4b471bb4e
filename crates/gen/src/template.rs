//! Template parsing: the MakeLDIF text is compiled once into branches and
//! templates whose attribute lines are lists of [`Piece`]s, so generation is
//! a loop over prepared pieces with no string parsing per entry.
//!
//! Within one entry, lines are evaluated in dependency order (a line that
//! copies `{cn}` runs after every `cn` line; `<DN>` runs after the RDN
//! attributes; `<ifpresent:x>` after the `x` lines) and written in template
//! order. That lets `{attr}` refer to a line further down and keeps
//! `extends` free of ordering traps; a cycle is a template error.

use std::collections::HashMap;

use crate::data;
use crate::GenError;

/// Longest value a `<random:...>` tag may be asked to produce.
const MAX_RANDOM_LEN: usize = 1 << 16;

pub(crate) struct Compiled {
    /// Branch entries, ancestors before descendants (stable by depth).
    pub branches: Vec<Branch>,
    pub templates: Vec<Tmpl>,
    /// Initial value of each `<sequential>` / sequential `<file>` counter.
    pub counter_starts: Vec<i64>,
}

pub(crate) struct Branch {
    pub dn: String,
    pub parent: String,
    pub body: Body,
    pub subs: Vec<Sub>,
    /// Number of RDN components; sorting on it puts parents first.
    pub depth: usize,
}

#[derive(Clone, Copy)]
pub(crate) struct Sub {
    pub template: usize,
    pub count: u64,
}

pub(crate) struct Tmpl {
    pub name: String,
    /// Line of `template:`, for errors about the template as a whole.
    pub line: usize,
    /// Slots of the RDN attributes, in `rdnAttr` order.
    pub rdn: Vec<usize>,
    pub rdn_names: Vec<String>,
    pub body: Body,
    pub subs: Vec<Sub>,
    /// Counters of `<sequential:N:true>` tags: reset for every new parent.
    pub resets: Vec<usize>,
}

pub(crate) struct Body {
    /// In template (= output) order.
    pub lines: Vec<Line>,
    /// Indexes into `lines`, dependencies first.
    pub order: Vec<usize>,
    /// For each slot (distinct attribute), its lines in template order.
    pub slot_lines: Vec<Vec<usize>>,
}

pub(crate) struct Line {
    pub name: String,
    pub pieces: Vec<Piece>,
    pub line: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum DnKind {
    Full,
    Underscore,
    Parent,
    UnderscoreParent,
    Rdn,
}

pub(crate) enum Piece {
    Text(Box<[u8]>),
    /// `{attr}` / `{attr:N}`: first value of another attribute, or its
    /// first N characters.
    Ref {
        slot: usize,
        chars: Option<usize>,
    },
    Pick(&'static [&'static str]),
    PickSeq {
        list: &'static [&'static str],
        counter: usize,
    },
    Seq {
        counter: usize,
    },
    Chars {
        set: Box<[u8]>,
        min: usize,
        max: usize,
    },
    Number {
        lo: i64,
        hi: i64,
        width: usize,
    },
    Telephone,
    Month(Option<usize>),
    /// Items with cumulative weights (last = total).
    List {
        items: Vec<Box<[u8]>>,
        cum: Vec<u64>,
    },
    Guid,
    Dn {
        kind: DnKind,
        n: i32,
    },
    /// Keep the line with this probability (0..=1).
    Presence(f64),
    /// Keep the line only if `slot` has a value (equal to `value` if given)
    /// (`want` true), or only if it has not (`want` false).
    IfPresent {
        slot: usize,
        value: Option<Box<[u8]>>,
        want: bool,
    },
}

/// One `attr: value` line before compilation.
#[derive(Clone)]
struct RawAttr {
    name: String,
    value: String,
    line: usize,
}

struct RawSub {
    name: String,
    count: String,
    line: usize,
}

struct RawBranch {
    dn: String,
    line: usize,
    attrs: Vec<RawAttr>,
    subs: Vec<RawSub>,
}

struct RawTemplate {
    name: String,
    line: usize,
    extends: Option<(String, usize)>,
    rdn: Option<(Vec<String>, usize)>,
    attrs: Vec<RawAttr>,
    subs: Vec<RawSub>,
}

enum Block {
    Branch(RawBranch),
    Template(RawTemplate),
}

/// A template after `extends` is applied.
#[derive(Clone)]
struct Resolved {
    rdn: Option<(Vec<String>, usize)>,
    attrs: Vec<RawAttr>,
    subs: Vec<(String, String, usize)>,
}

struct Ctx<'a> {
    origin: &'a str,
}

impl Ctx<'_> {
    fn err(&self, line: usize, message: impl Into<String>) -> GenError {
        GenError::Template {
            origin: self.origin.to_string(),
            line,
            message: message.into(),
        }
    }
}

/// Same character set pando-ldif's writer accepts for attribute
/// descriptions (so the writer can never refuse a compiled template).
pub(crate) fn valid_attr_name(name: &str) -> bool {
    let b = name.as_bytes();
    b.first().is_some_and(|c| c.is_ascii_alphanumeric())
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b';' || c == b'.')
}

/// `define` keyword at the start of a line (any case), followed by blank.
fn define_rest(line: &str) -> Option<&str> {
    let t = line.trim_start();
    let head = t.get(..6)?;
    let rest = &t[6..];
    (head.eq_ignore_ascii_case("define") && rest.starts_with([' ', '\t'])).then_some(rest)
}

/// Replaces `[name]` with the define's value; unknown names stay literal
/// (brackets are legal in values).
fn substitute(text: &str, defines: &[(String, String)]) -> String {
    if !text.contains('[') || defines.is_empty() {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find(']') {
            Some(close) => {
                let name = &after[..close];
                match defines.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)) {
                    Some((_, v)) => out.push_str(v),
                    None => {
                        out.push('[');
                        out.push_str(name);
                        out.push(']');
                    }
                }
                rest = &after[close + 1..];
            }
            None => {
                out.push_str(&rest[open..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

pub(crate) fn compile(
    text: &str,
    origin: &str,
    overrides: &[(String, String)],
) -> Result<Compiled, GenError> {
    let cx = Ctx { origin };
    let lines: Vec<&str> = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    let defines = defines(&cx, &lines, overrides)?;
    let blocks = blocks(&cx, &lines, &defines)?;
    let mut raw_branches = Vec::new();
    let mut raw_templates = Vec::new();
    for b in blocks {
        match b {
            Block::Branch(b) => raw_branches.push(b),
            Block::Template(t) => raw_templates.push(t),
        }
    }
    if raw_branches.is_empty() {
        return Err(cx.err(
            text.lines().count().max(1),
            "the template defines no branch:",
        ));
    }

    let mut by_name: HashMap<String, usize> = HashMap::new();
    for (i, t) in raw_templates.iter().enumerate() {
        if by_name.insert(t.name.to_ascii_lowercase(), i).is_some() {
            return Err(cx.err(t.line, format!("template {} is defined twice", t.name)));
        }
    }

    // Apply `extends`.
    let mut resolved: Vec<Option<Resolved>> = vec![None; raw_templates.len()];
    for i in 0..raw_templates.len() {
        resolve(
            &cx,
            i,
            &raw_templates,
            &by_name,
            &mut resolved,
            &mut Vec::new(),
        )?;
    }

    let mut counter_starts: Vec<i64> = Vec::new();
    let (templates, rdn_errors) =
        compile_templates(&cx, &raw_templates, resolved, &by_name, &mut counter_starts)?;
    check_subordinate_cycles(&cx, &templates)?;
    let mut branches = raw_branches
        .iter()
        .map(|rb| compile_branch(&cx, rb, &by_name, &mut counter_starts))
        .collect::<Result<Vec<Branch>, GenError>>()?;
    branches.sort_by_key(|b| b.depth);
    let used = branches
        .iter()
        .flat_map(|b| b.subs.iter())
        .chain(templates.iter().flat_map(|t| t.subs.iter()));
    for s in used {
        if let Some((line, msg)) = &rdn_errors[s.template] {
            return Err(cx.err(*line, msg.clone()));
        }
    }

    Ok(Compiled {
        branches,
        templates,
        counter_starts,
    })
}

/// Pass 1: the template's defines, with `overrides` (which win); a
/// define may use earlier ones.
fn defines(
    cx: &Ctx,
    lines: &[&str],
    overrides: &[(String, String)],
) -> Result<Vec<(String, String)>, GenError> {
    let mut defines: Vec<(String, String)> = Vec::new();
    for (name, value) in overrides {
        match defines
            .iter_mut()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
        {
            Some(d) => d.1 = value.clone(),
            None => defines.push((name.clone(), value.clone())),
        }
    }
    let n_overrides = defines.len();
    let mut defined = vec![false; n_overrides];
    for (i, raw) in lines.iter().enumerate() {
        let Some(rest) = define_rest(raw) else {
            continue;
        };
        let ln = i + 1;
        let Some((name, value)) = rest.split_once('=') else {
            return Err(cx.err(ln, "define needs the form `define name=value`"));
        };
        let name = name.trim();
        if name.is_empty() || name.contains(['[', ']', ' ', '\t']) {
            return Err(cx.err(ln, format!("invalid define name {name:?}")));
        }
        if let Some(pos) = defines
            .iter()
            .position(|(n, _)| n.eq_ignore_ascii_case(name))
        {
            if pos < n_overrides {
                defined[pos] = true;
                continue;
            }
            return Err(cx.err(ln, format!("{name} is defined twice")));
        }
        let value = substitute(value.trim(), &defines);
        defines.push((name.to_string(), value));
    }
    // An override the template neither defines nor uses would change
    // nothing: a misspelt or foreign name (another template's), said so.
    let unused = defines[..n_overrides]
        .iter()
        .zip(&defined)
        .find(|((name, _), d)| !**d && !lines.iter().any(|l| uses(l, name)));
    if let Some(((name, _), _)) = unused {
        return Err(GenError::UnknownDefine {
            origin: cx.origin.to_string(),
            name: name.clone(),
            known: (defines.iter().enumerate())
                .filter(|(i, _)| *i >= n_overrides || defined[*i])
                .map(|(_, (n, _))| n.clone())
                .collect(),
        });
    }
    Ok(defines)
}

/// Whether `line` refers to define `name` (`[name]`, any case).
fn uses(line: &str, name: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    lower.contains(&format!("[{}]", name.to_ascii_lowercase()))
}

/// Pass 2: the branch and template blocks, defines substituted.
fn blocks(cx: &Ctx, lines: &[&str], defines: &[(String, String)]) -> Result<Vec<Block>, GenError> {
    let mut blocks: Vec<Block> = Vec::new();
    let mut cur: Option<Block> = None;
    for (i, raw) in lines.iter().enumerate() {
        let ln = i + 1;
        if raw.trim().is_empty() {
            if let Some(b) = cur.take() {
                blocks.push(b);
            }
            continue;
        }
        if raw.trim_start().starts_with('#') {
            continue;
        }
        if define_rest(raw).is_some() {
            if cur.is_some() {
                return Err(cx.err(ln, "define inside a branch or template block"));
            }
            continue;
        }
        let line = substitute(raw, defines);
        let Some((key, value)) = line.split_once(':') else {
            return Err(cx.err(ln, format!("expected `name: value`, found {:?}", line)));
        };
        let key = key.trim();
        let value = value.trim();
        let lkey = key.to_ascii_lowercase();
        match lkey.as_str() {
            "branch" | "template" => {
                if cur.is_some() {
                    return Err(cx.err(
                        ln,
                        format!("{key}: must start a new block (a blank line must come before it)"),
                    ));
                }
                if value.is_empty() {
                    return Err(cx.err(ln, format!("{key}: needs a value")));
                }
                cur = Some(if lkey == "branch" {
                    Block::Branch(RawBranch {
                        dn: value.to_string(),
                        line: ln,
                        attrs: Vec::new(),
                        subs: Vec::new(),
                    })
                } else {
                    Block::Template(RawTemplate {
                        name: value.to_string(),
                        line: ln,
                        extends: None,
                        rdn: None,
                        attrs: Vec::new(),
                        subs: Vec::new(),
                    })
                });
            }
            _ => {
                let Some(block) = cur.as_mut() else {
                    return Err(cx.err(ln, format!("`{key}:` outside a branch or template block")));
                };
                block_line(cx, ln, key, value, block)?;
            }
        }
    }
    if let Some(b) = cur.take() {
        blocks.push(b);
    }
    Ok(blocks)
}

/// One `name: value` line of a branch or template block (`ln`: its line
/// number): a subordinate template, `extends`, `rdnAttr`, or an attribute.
fn block_line(
    cx: &Ctx,
    ln: usize,
    key: &str,
    value: &str,
    block: &mut Block,
) -> Result<(), GenError> {
    let lkey = key.to_ascii_lowercase();
    match (lkey.as_str(), block) {
        ("subordinatetemplate", Block::Branch(RawBranch { subs, .. }))
        | ("subordinatetemplate", Block::Template(RawTemplate { subs, .. })) => {
            let Some((name, count)) = value.rsplit_once(':') else {
                return Err(cx.err(ln, "subordinateTemplate needs the form TEMPLATE:COUNT"));
            };
            subs.push(RawSub {
                name: name.trim().to_string(),
                count: count.trim().to_string(),
                line: ln,
            });
        }
        ("extends", Block::Template(t)) => {
            if t.extends.is_some() {
                return Err(cx.err(ln, "more than one extends:"));
            }
            t.extends = Some((value.to_string(), ln));
        }
        ("rdnattr", Block::Template(t)) => {
            if t.rdn.is_some() {
                return Err(cx.err(ln, "more than one rdnAttr:"));
            }
            let names: Vec<String> = value.split('+').map(|s| s.trim().to_string()).collect();
            if let Some(bad) = names.iter().find(|n| !valid_attr_name(n)) {
                return Err(cx.err(ln, format!("invalid rdnAttr {bad:?}")));
            }
            t.rdn = Some((names, ln));
        }
        ("extends" | "rdnattr", Block::Branch(_)) => {
            return Err(cx.err(ln, format!("{key}: is only allowed in a template")));
        }
        (_, Block::Branch(RawBranch { attrs, .. }))
        | (_, Block::Template(RawTemplate { attrs, .. })) => {
            if !valid_attr_name(key) {
                return Err(cx.err(ln, format!("invalid attribute name {key:?}")));
            }
            if key.contains(';') && key.ends_with(';') {
                return Err(cx.err(ln, format!("invalid attribute name {key:?}")));
            }
            attrs.push(RawAttr {
                name: key.to_string(),
                value: value.to_string(),
                line: ln,
            });
        }
    }
    Ok(())
}

/// Every template compiled (`resolved`: after `extends`), with the rdnAttr
/// error each would raise once something uses it.
#[allow(clippy::type_complexity)]
fn compile_templates(
    cx: &Ctx,
    raw_templates: &[RawTemplate],
    mut resolved: Vec<Option<Resolved>>,
    by_name: &HashMap<String, usize>,
    counter_starts: &mut Vec<i64>,
) -> Result<(Vec<Tmpl>, Vec<Option<(usize, String)>>), GenError> {
    let mut templates = Vec::with_capacity(raw_templates.len());
    let mut rdn_errors: Vec<Option<(usize, String)>> = Vec::with_capacity(raw_templates.len());
    for (i, rt) in raw_templates.iter().enumerate() {
        let Some(r) = resolved[i].take() else {
            return Err(cx.err(rt.line, "internal: template not resolved"));
        };
        // A template that is only extended (never instantiated) may lack a
        // usable rdnAttr; that is an error only once something uses it.
        let (rdn_names, rdn_line) = r.rdn.unwrap_or_default();
        let mut rdn_error = None;
        if rdn_names.is_empty() {
            rdn_error = Some((rt.line, format!("template {} has no rdnAttr:", rt.name)));
        }
        let mut resets = Vec::new();
        let (body, slots) = compile_body(cx, &r.attrs, &rdn_names, counter_starts, &mut resets)?;
        let mut rdn = Vec::with_capacity(rdn_names.len());
        for n in &rdn_names {
            match slots.get(&n.to_ascii_lowercase()) {
                Some(&s) => rdn.push(s),
                None => {
                    rdn_error.get_or_insert((
                        rdn_line,
                        format!("rdnAttr {n} has no attribute line in template {}", rt.name),
                    ));
                }
            }
        }
        rdn_errors.push(rdn_error);
        let mut subs = Vec::new();
        for (name, count, line) in &r.subs {
            subs.push(sub(cx, by_name, name, count, *line)?);
        }
        templates.push(Tmpl {
            name: rt.name.clone(),
            line: rt.line,
            rdn,
            rdn_names,
            body,
            subs,
            resets,
        });
    }
    Ok((templates, rdn_errors))
}

/// One branch compiled: MakeLDIF fills in objectClass and the RDN
/// values a branch does not give.
fn compile_branch(
    cx: &Ctx,
    rb: &RawBranch,
    by_name: &HashMap<String, usize>,
    counter_starts: &mut Vec<i64>,
) -> Result<Branch, GenError> {
    let comps = split_dn(&rb.dn);
    let first = comps.first().map(|s| s.trim()).unwrap_or("");
    let ava = parse_rdn(first).ok_or_else(|| cx.err(rb.line, format!("invalid DN {:?}", rb.dn)))?;
    if comps.iter().any(|c| parse_rdn(c.trim()).is_none()) {
        return Err(cx.err(rb.line, format!("invalid DN {:?}", rb.dn)));
    }
    let mut attrs = Vec::new();
    let has = |n: &str| rb.attrs.iter().any(|a| a.name.eq_ignore_ascii_case(n));
    if !has("objectClass") {
        let class = match ava[0].0.to_ascii_lowercase().as_str() {
            "dc" => "domain",
            "o" => "organization",
            "ou" => "organizationalUnit",
            "c" => "country",
            "l" => "locality",
            _ => "untypedObject",
        };
        for oc in ["top", class] {
            attrs.push(RawAttr {
                name: "objectClass".into(),
                value: escape_template_text(oc),
                line: rb.line,
            });
        }
    }
    for (name, value) in &ava {
        if !valid_attr_name(name) {
            return Err(cx.err(rb.line, format!("invalid attribute {name:?} in DN")));
        }
        if !has(name) {
            attrs.push(RawAttr {
                name: name.clone(),
                value: escape_template_text(value),
                line: rb.line,
            });
        }
    }
    attrs.extend(rb.attrs.iter().cloned());
    let mut resets = Vec::new();
    let (body, _) = compile_body(cx, &attrs, &[], counter_starts, &mut resets)?;
    let mut subs = Vec::new();
    for s in &rb.subs {
        subs.push(sub(cx, by_name, &s.name, &s.count, s.line)?);
    }
    let parent = match comps.len() {
        0 | 1 => String::new(),
        _ => comps[1..].join(","),
    };
    Ok(Branch {
        dn: rb.dn.clone(),
        parent,
        body,
        subs,
        depth: comps.len(),
    })
}

/// A subordinate template reference: the template named `name` and the
/// number of entries, `count` (after defines).
fn sub(
    cx: &Ctx,
    by_name: &HashMap<String, usize>,
    name: &str,
    count: &str,
    line: usize,
) -> Result<Sub, GenError> {
    let template = by_name
        .get(&name.to_ascii_lowercase())
        .copied()
        .ok_or_else(|| cx.err(line, format!("no template named {name:?}")))?;
    let count = count.parse::<u64>().map_err(|_| {
        cx.err(
            line,
            format!("subordinateTemplate count {count:?} is not a number (undefined [define]?)"),
        )
    })?;
    Ok(Sub { template, count })
}

/// Makes literal text safe to run through the tag parser.
fn escape_template_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '<' | '>' | '{' | '}') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn resolve(
    cx: &Ctx,
    i: usize,
    raw: &[RawTemplate],
    by_name: &HashMap<String, usize>,
    done: &mut Vec<Option<Resolved>>,
    visiting: &mut Vec<usize>,
) -> Result<(), GenError> {
    if done[i].is_some() {
        return Ok(());
    }
    let t = &raw[i];
    let own_subs: Vec<(String, String, usize)> = t
        .subs
        .iter()
        .map(|s| (s.name.clone(), s.count.clone(), s.line))
        .collect();
    let Some((parent_name, line)) = &t.extends else {
        done[i] = Some(Resolved {
            rdn: t.rdn.clone(),
            attrs: t.attrs.clone(),
            subs: own_subs,
        });
        return Ok(());
    };
    let Some(&p) = by_name.get(&parent_name.to_ascii_lowercase()) else {
        return Err(cx.err(*line, format!("extends unknown template {parent_name:?}")));
    };
    if p == i || visiting.contains(&p) {
        return Err(cx.err(
            *line,
            format!("extends cycle through template {parent_name}"),
        ));
    }
    visiting.push(i);
    resolve(cx, p, raw, by_name, done, visiting)?;
    visiting.pop();
    let Some(parent) = done[p].clone() else {
        return Err(cx.err(*line, "internal: parent template not resolved"));
    };
    // Child lines replace the parent's lines of the same attribute, in the
    // parent's position; new attributes follow. objectClass is the
    // exception: the child's classes are added after the parent's.
    let mut attrs = Vec::with_capacity(parent.attrs.len() + t.attrs.len());
    let mut placed: Vec<String> = Vec::new();
    let is_oc = |n: &str| n.eq_ignore_ascii_case("objectClass");
    let last_parent_oc = parent.attrs.iter().rposition(|a| is_oc(&a.name));
    for (pi, pa) in parent.attrs.iter().enumerate() {
        let lname = pa.name.to_ascii_lowercase();
        if is_oc(&lname) {
            attrs.push(pa.clone());
            if Some(pi) == last_parent_oc {
                let known = |v: &str| {
                    parent
                        .attrs
                        .iter()
                        .any(|p| is_oc(&p.name) && p.value.eq_ignore_ascii_case(v))
                };
                attrs.extend(
                    t.attrs
                        .iter()
                        .filter(|a| is_oc(&a.name) && !known(&a.value))
                        .cloned(),
                );
                placed.push(lname);
            }
        } else if t.attrs.iter().any(|a| a.name.eq_ignore_ascii_case(&lname)) {
            if !placed.contains(&lname) {
                attrs.extend(
                    t.attrs
                        .iter()
                        .filter(|a| a.name.eq_ignore_ascii_case(&lname))
                        .cloned(),
                );
                placed.push(lname);
            }
        } else {
            attrs.push(pa.clone());
        }
    }
    for a in &t.attrs {
        if !placed.contains(&a.name.to_ascii_lowercase()) {
            attrs.push(a.clone());
        }
    }
    done[i] = Some(Resolved {
        rdn: t.rdn.clone().or(parent.rdn),
        attrs,
        subs: if own_subs.is_empty() {
            parent.subs
        } else {
            own_subs
        },
    });
    Ok(())
}

/// A template that (transitively) contains itself would never finish.
fn check_subordinate_cycles(cx: &Ctx, templates: &[Tmpl]) -> Result<(), GenError> {
    // 0 = unvisited, 1 = on the path, 2 = finished.
    let mut state = vec![0u8; templates.len()];
    for start in 0..templates.len() {
        if state[start] != 0 {
            continue;
        }
        let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
        state[start] = 1;
        while let Some(&mut (t, ref mut next)) = stack.last_mut() {
            if let Some(sub) = templates[t].subs.get(*next) {
                *next += 1;
                let s = sub.template;
                if sub.count == 0 {
                    continue;
                }
                match state[s] {
                    0 => {
                        state[s] = 1;
                        stack.push((s, 0));
                    }
                    1 => {
                        return Err(cx.err(
                            templates[t].line,
                            format!(
                                "template {} contains itself through subordinateTemplate {}",
                                templates[s].name, templates[t].name
                            ),
                        ))
                    }
                    _ => {}
                }
            } else {
                state[t] = 2;
                stack.pop();
            }
        }
    }
    Ok(())
}

/// Compiles attribute lines; returns the body and the name -> slot map.
fn compile_body(
    cx: &Ctx,
    attrs: &[RawAttr],
    rdn: &[String],
    counters: &mut Vec<i64>,
    resets: &mut Vec<usize>,
) -> Result<(Body, HashMap<String, usize>), GenError> {
    let mut slots: HashMap<String, usize> = HashMap::new();
    let mut line_slot = Vec::with_capacity(attrs.len());
    for a in attrs {
        let n = slots.len();
        let s = *slots.entry(a.name.to_ascii_lowercase()).or_insert(n);
        line_slot.push(s);
    }
    let mut slot_lines = vec![Vec::new(); slots.len()];
    for (i, &s) in line_slot.iter().enumerate() {
        slot_lines[s].push(i);
    }
    let rdn_slots: Vec<usize> = rdn
        .iter()
        .filter_map(|n| slots.get(&n.to_ascii_lowercase()).copied())
        .collect();

    let mut lines = Vec::with_capacity(attrs.len());
    let mut deps: Vec<Vec<usize>> = Vec::with_capacity(attrs.len());
    for a in attrs {
        let mut dep_slots = Vec::new();
        let pieces = parse_value(&a.value, &slots, counters, resets, &mut dep_slots)
            .map_err(|m| cx.err(a.line, m))?;
        if pieces
            .iter()
            .any(|p| matches!(p, Piece::Dn { kind, .. } if *kind != DnKind::Parent && *kind != DnKind::UnderscoreParent))
        {
            dep_slots.extend_from_slice(&rdn_slots);
        }
        deps.push(dep_slots);
        lines.push(Line {
            name: a.name.clone(),
            pieces,
            line: a.line,
        });
    }

    // Stable topological order: repeatedly take the first line whose
    // dependencies (all other lines of the slots it reads) are done.
    let n = lines.len();
    let mut done = vec![false; n];
    let mut order = Vec::with_capacity(n);
    while order.len() < n {
        let mut progressed = false;
        for i in 0..n {
            if done[i] {
                continue;
            }
            let ready = deps[i]
                .iter()
                .all(|&s| slot_lines[s].iter().all(|&j| j == i || done[j]));
            if ready {
                done[i] = true;
                order.push(i);
                progressed = true;
            }
        }
        if !progressed {
            let stuck = (0..n).find(|&i| !done[i]).unwrap_or(0);
            return Err(cx.err(
                lines.get(stuck).map_or(0, |l| l.line),
                format!(
                    "{} depends on itself through {{attr}} / <ifpresent> / <DN> references",
                    lines.get(stuck).map_or("?", |l| l.name.as_str())
                ),
            ));
        }
    }
    Ok((
        Body {
            lines,
            order,
            slot_lines,
        },
        slots,
    ))
}

fn push_text(pieces: &mut Vec<Piece>, text: &mut Vec<u8>) {
    if !text.is_empty() {
        pieces.push(Piece::Text(std::mem::take(text).into_boxed_slice()));
    }
}

/// Splits a value into literal text, `<tags>` and `{refs}`. `\<`, `\>`,
/// `\{`, `\}` are literal characters; any other backslash is literal too.
fn parse_value(
    value: &str,
    slots: &HashMap<String, usize>,
    counters: &mut Vec<i64>,
    resets: &mut Vec<usize>,
    deps: &mut Vec<usize>,
) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text: Vec<u8> = Vec::new();
    let b = value.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' if matches!(b.get(i + 1), Some(b'<' | b'>' | b'{' | b'}')) => {
                text.push(b[i + 1]);
                i += 2;
            }
            b'<' => {
                let Some(len) = value[i + 1..].find('>') else {
                    return Err(format!("unterminated tag in {value:?}"));
                };
                let tag = &value[i + 1..i + 1 + len];
                push_text(&mut pieces, &mut text);
                pieces.push(parse_tag(tag, slots, counters, resets, deps)?);
                i += len + 2;
            }
            b'{' => {
                let Some(len) = value[i + 1..].find('}') else {
                    return Err(format!("unterminated {{attr}} reference in {value:?}"));
                };
                let inner = &value[i + 1..i + 1 + len];
                let (name, chars) = match inner.split_once(':') {
                    Some((n, c)) => (
                        n.trim(),
                        Some(
                            c.trim()
                                .parse::<usize>()
                                .map_err(|_| format!("bad length in {{{inner}}}"))?,
                        ),
                    ),
                    None => (inner.trim(), None),
                };
                let Some(&slot) = slots.get(&name.to_ascii_lowercase()) else {
                    return Err(format!(
                        "{{{name}}} refers to an attribute this template does not generate"
                    ));
                };
                deps.push(slot);
                push_text(&mut pieces, &mut text);
                pieces.push(Piece::Ref { slot, chars });
                i += len + 2;
            }
            c => {
                text.push(c);
                i += 1;
            }
        }
    }
    push_text(&mut pieces, &mut text);
    Ok(pieces)
}

fn parse_int<T: std::str::FromStr>(s: &str, what: &str, tag: &str) -> Result<T, String> {
    s.trim()
        .parse::<T>()
        .map_err(|_| format!("bad {what} {s:?} in <{tag}>"))
}

fn check_len(n: usize, tag: &str) -> Result<usize, String> {
    if n > MAX_RANDOM_LEN {
        Err(format!(
            "length {n} in <{tag}> is over the limit {MAX_RANDOM_LEN}"
        ))
    } else {
        Ok(n)
    }
}

fn no_args(args: &[&str], tag: &str) -> Result<(), String> {
    if args.is_empty() {
        Ok(())
    } else {
        Err(format!("<{tag}> takes no arguments"))
    }
}

fn parse_tag(
    tag: &str,
    slots: &HashMap<String, usize>,
    counters: &mut Vec<i64>,
    resets: &mut Vec<usize>,
    deps: &mut Vec<usize>,
) -> Result<Piece, String> {
    let parts: Vec<&str> = tag.split(':').collect();
    let name = parts[0].trim().to_ascii_lowercase();
    let args = &parts[1..];
    let slot_of = |attr: &str| -> Result<usize, String> {
        slots
            .get(&attr.trim().to_ascii_lowercase())
            .copied()
            .ok_or_else(|| format!("<{tag}> names an attribute this template does not generate"))
    };
    Ok(match name.as_str() {
        "first" => {
            no_args(args, tag)?;
            Piece::Pick(data::FIRST_NAMES)
        }
        "last" => {
            no_args(args, tag)?;
            Piece::Pick(data::LAST_NAMES)
        }
        "sequential" => parse_sequential(args, tag, counters, resets)?,
        "random" => parse_random(args, tag)?,
        "presence" => {
            let [p] = args else {
                return Err(format!("<{tag}>: use <presence:PERCENT>"));
            };
            let p: f64 = parse_int(p, "percentage", tag)?;
            if !(0.0..=100.0).contains(&p) {
                return Err(format!("percentage in <{tag}> must be 0..100"));
            }
            Piece::Presence(p / 100.0)
        }
        "ifpresent" | "ifabsent" => {
            if args.is_empty() {
                return Err(format!("<{tag}>: use <{name}:ATTR[:VALUE]>"));
            }
            let slot = slot_of(args[0])?;
            deps.push(slot);
            let value =
                (args.len() > 1).then(|| args[1..].join(":").into_bytes().into_boxed_slice());
            Piece::IfPresent {
                slot,
                value,
                want: name == "ifpresent",
            }
        }
        "list" => parse_list(args, tag)?,
        "file" => parse_file(args, tag, counters)?,
        "guid" => {
            no_args(args, tag)?;
            Piece::Guid
        }
        "dn" | "underscoredn" => {
            let n = match args {
                [] => 0,
                [n] => parse_int::<i32>(n, "component count", tag)?,
                _ => return Err(format!("<{tag}>: use <{name}[:N]>")),
            };
            let kind = if name == "dn" {
                DnKind::Full
            } else {
                DnKind::Underscore
            };
            Piece::Dn { kind, n }
        }
        "parentdn" | "underscoreparentdn" | "rdn" => {
            no_args(args, tag)?;
            let kind = match name.as_str() {
                "parentdn" => DnKind::Parent,
                "underscoreparentdn" => DnKind::UnderscoreParent,
                _ => DnKind::Rdn,
            };
            Piece::Dn { kind, n: 0 }
        }
        _ => return Err(format!("unknown tag <{tag}>")),
    })
}

/// `<sequential[:start[:reset]]>`: a counter of its own, reset for each
/// new parent when `reset` is true.
fn parse_sequential(
    args: &[&str],
    tag: &str,
    counters: &mut Vec<i64>,
    resets: &mut Vec<usize>,
) -> Result<Piece, String> {
    if args.len() > 2 {
        return Err(format!("<{tag}>: use <sequential[:start[:reset]]>"));
    }
    let start = match args.first() {
        Some(s) => parse_int::<i64>(s, "start", tag)?,
        None => 0,
    };
    let reset = match args.get(1).map(|s| s.trim().to_ascii_lowercase()) {
        None => false,
        Some(s) if s == "true" => true,
        Some(s) if s == "false" => false,
        Some(s) => return Err(format!("bad reset flag {s:?} in <{tag}> (true/false)")),
    };
    let counter = counters.len();
    counters.push(start);
    if reset {
        resets.push(counter);
    }
    Ok(Piece::Seq { counter })
}

/// `<list:A[;weight]:B[;weight]...>`: one item, drawn by weight.
fn parse_list(args: &[&str], tag: &str) -> Result<Piece, String> {
    if args.is_empty() {
        return Err(format!("<{tag}> needs at least one item"));
    }
    let mut items = Vec::with_capacity(args.len());
    let mut cum = Vec::with_capacity(args.len());
    let mut total: u64 = 0;
    for item in args {
        let (text, weight) = match item.rsplit_once(';') {
            Some((t, w)) => {
                let w: u64 = parse_int(w, "weight", tag)?;
                if w == 0 {
                    return Err(format!("weight 0 in <{tag}>"));
                }
                (t, w)
            }
            None => (*item, 1),
        };
        total = total
            .checked_add(weight)
            .ok_or_else(|| format!("weights in <{tag}> overflow"))?;
        items.push(text.as_bytes().to_vec().into_boxed_slice());
        cum.push(total);
    }
    Ok(Piece::List { items, cum })
}

/// `<file:LIST[:random|sequential]>`: an item of a built-in list (files
/// are not read).
fn parse_file(args: &[&str], tag: &str, counters: &mut Vec<i64>) -> Result<Piece, String> {
    let Some(file) = args.first() else {
        return Err(format!("<{tag}> needs a list name"));
    };
    let Some(list) = data::named_list(file.trim()) else {
        return Err(format!(
            "<{tag}>: reading files is not supported; built-in lists are \
             first.names, last.names, cities, states, streets, months \
             (or use <list:...>)"
        ));
    };
    Ok(match args.get(1).map(|s| s.trim().to_ascii_lowercase()) {
        None => Piece::Pick(list),
        Some(m) if m == "random" => Piece::Pick(list),
        Some(m) if m == "sequential" => {
            let counter = counters.len();
            counters.push(0);
            Piece::PickSeq { list, counter }
        }
        Some(m) => return Err(format!("bad mode {m:?} in <{tag}> (random/sequential)")),
    })
}

fn parse_random(args: &[&str], tag: &str) -> Result<Piece, String> {
    let Some(kind) = args.first() else {
        return Err(format!("<{tag}> needs a type (alpha, numeric, ...)"));
    };
    let kind = kind.trim().to_ascii_lowercase();
    let rest = &args[1..];
    let set: &[u8] = match kind.as_str() {
        "alpha" => b"abcdefghijklmnopqrstuvwxyz",
        "numeric" => b"0123456789",
        "alphanumeric" => b"abcdefghijklmnopqrstuvwxyz0123456789",
        "hex" => b"0123456789abcdef",
        "base64" => b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
        "telephone" => {
            no_args(rest, tag)?;
            return Ok(Piece::Telephone);
        }
        "month" => {
            return match rest {
                [] => Ok(Piece::Month(None)),
                [n] => Ok(Piece::Month(Some(parse_int(n, "length", tag)?))),
                _ => Err(format!("<{tag}>: use <random:month[:N]>")),
            };
        }
        "chars" => {
            let Some((chars, lens)) = rest.split_first() else {
                return Err(format!("<{tag}>: use <random:chars:CHARS:N[:MAX]>"));
            };
            if chars.is_empty() || !chars.is_ascii() {
                return Err(format!(
                    "<{tag}>: the character set must be non-empty ASCII"
                ));
            }
            let (min, max) = lengths(lens, tag)?;
            return Ok(Piece::Chars {
                set: chars.as_bytes().to_vec().into_boxed_slice(),
                min,
                max,
            });
        }
        _ => return Err(format!("unknown random type in <{tag}>")),
    };
    if kind == "numeric" && rest.len() >= 2 {
        let lo: i64 = parse_int(rest[0], "minimum", tag)?;
        let hi: i64 = parse_int(rest[1], "maximum", tag)?;
        if lo > hi {
            return Err(format!("minimum above maximum in <{tag}>"));
        }
        let width = match rest.get(2) {
            None => 0,
            Some(f) if rest.len() == 3 && !f.is_empty() && f.bytes().all(|c| c == b'0') => {
                check_len(f.len(), tag)?
            }
            Some(_) => {
                return Err(format!(
                    "<{tag}>: the format must be zeros giving the width, e.g. 00000"
                ))
            }
        };
        return Ok(Piece::Number { lo, hi, width });
    }
    let (min, max) = lengths(rest, tag)?;
    Ok(Piece::Chars {
        set: set.to_vec().into_boxed_slice(),
        min,
        max,
    })
}

fn lengths(args: &[&str], tag: &str) -> Result<(usize, usize), String> {
    match args {
        [n] => {
            let n = check_len(parse_int(n, "length", tag)?, tag)?;
            Ok((n, n))
        }
        [a, b] => {
            let a = check_len(parse_int(a, "length", tag)?, tag)?;
            let b = check_len(parse_int(b, "length", tag)?, tag)?;
            if a > b {
                return Err(format!("minimum above maximum in <{tag}>"));
            }
            Ok((a, b))
        }
        _ => Err(format!("<{tag}> needs a length (N or MIN:MAX)")),
    }
}

/// Splits a DN string into RDN strings at unescaped commas (backslash
/// escapes and quoted values respected).
pub(crate) fn split_dn(dn: &str) -> Vec<&str> {
    let mut out = Vec::new();
    if dn.trim().is_empty() {
        return out;
    }
    let b = dn.as_bytes();
    let (mut start, mut i, mut quoted) = (0, 0, false);
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'"' => quoted = !quoted,
            b',' | b';' if !quoted => {
                out.push(&dn[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    out.push(&dn[start.min(dn.len())..]);
    out
}

/// Parses one RDN into (type, unescaped value) pairs; None if malformed.
fn parse_rdn(rdn: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let b = rdn.as_bytes();
    let mut start = 0;
    let mut i = 0;
    let mut parts = Vec::new();
    while i <= b.len() {
        if i == b.len() || b[i] == b'+' {
            parts.push(&rdn[start..i]);
            start = i + 1;
        } else if b[i] == b'\\' {
            i += 1;
        }
        i += 1;
    }
    for p in parts {
        let (t, v) = p.split_once('=')?;
        let t = t.trim();
        if t.is_empty() {
            return None;
        }
        out.push((t.to_string(), unescape_dn_value(v.trim())?));
    }
    (!out.is_empty()).then_some(out)
}

fn unescape_dn_value(v: &str) -> Option<String> {
    let v = v
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(v);
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' {
            let next = *b.get(i + 1)?;
            let hex = |c: u8| (c as char).to_digit(16);
            match (hex(next), b.get(i + 2).and_then(|&c| hex(c))) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                }
                _ => {
                    out.push(next);
                    i += 2;
                }
            }
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_of(text: &str) -> String {
        match compile(text, "t.template", &[]) {
            Ok(_) => panic!("expected an error for {text:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn substitution_of_defines() {
        let d = vec![("a".to_string(), "X".to_string())];
        assert_eq!(substitute("[a]-[A]-[b]-[", &d), "X-X-[b]-[");
    }

    #[test]
    fn parse_errors_name_file_and_line() {
        let cases = [
            (
                "branch: dc=x\n\ntemplate: p\nrdnAttr: uid\nuid: <bogus>\n",
                5,
                "unknown tag",
            ),
            ("branch: dc=x\nfoo\n", 2, "expected"),
            ("uid: x\n", 1, "outside"),
            (
                "branch: dc=x\nsubordinateTemplate: nope:3\n",
                2,
                "no template",
            ),
            (
                "branch: dc=x\nsubordinateTemplate: p:[n]\n\ntemplate: p\nrdnAttr: cn\ncn: a\n",
                2,
                "not a number",
            ),
            (
                "branch: dc=x\nsubordinateTemplate: p:1\n\ntemplate: p\nuid: a\n",
                4,
                "no rdnAttr",
            ),
            (
                "branch: dc=x\nsubordinateTemplate: p:1\n\ntemplate: p\nrdnAttr: cn\nsn: a\n",
                5,
                "rdnAttr cn",
            ),
            (
                "branch: dc=x\n\ntemplate: p\nrdnAttr: cn\ncn: {sn}\n",
                5,
                "does not generate",
            ),
            (
                "branch: dc=x\n\ntemplate: p\nrdnAttr: cn\ncn: <random:numeric\n",
                5,
                "unterminated",
            ),
            (
                "branch: dc=x\n\ntemplate: p\nrdnAttr: cn\ncn: {sn\n",
                5,
                "unterminated",
            ),
            (
                "branch: dc=x\n\ntemplate: p\nrdnAttr: cn\ncn: <presence:101>\n",
                5,
                "0..100",
            ),
            (
                "branch: dc=x\n\ntemplate: p\nrdnAttr: cn\ncn: <file:/etc/passwd>\n",
                5,
                "not supported",
            ),
            (
                "branch: dc=x\n\ntemplate: p\nrdnAttr: cn\ncn: <list:a;x>\n",
                5,
                "weight",
            ),
            (
                "branch: dc=x\n\ntemplate: p\nrdnAttr: cn\ncn: <random:numeric:9:1>\n",
                5,
                "minimum",
            ),
            (
                "branch: dc=x\n\ntemplate: p\nrdnAttr: cn\ncn: {sn}\nsn: {cn}\n",
                5,
                "depends on itself",
            ),
            (
                "branch: dc=x\n\ntemplate: p\nextends: q\nrdnAttr: cn\ncn: a\n",
                4,
                "unknown template",
            ),
            (
                "branch: dc=x\n\ntemplate: p\nextends: p\nrdnAttr: cn\ncn: a\n",
                4,
                "cycle",
            ),
            (
                "branch: dc=x\n\ntemplate: p\nrdnAttr: cn\nsubordinateTemplate: p:2\ncn: a\n",
                3,
                "contains itself",
            ),
            ("define a=1\ndefine a=2\nbranch: dc=x\n", 2, "twice"),
            ("branch: dc=x\ntemplate: p\n", 2, "blank line"),
            ("branch: dc=x\nbad name: v\n", 2, "invalid attribute"),
            ("branch: =x\n", 1, "invalid DN"),
            ("# nothing\n", 1, "no branch"),
        ];
        for (text, line, needle) in cases {
            let e = err_of(text);
            assert!(
                e.starts_with(&format!("t.template:{line}: ")) && e.contains(needle),
                "{text:?} gave {e:?}"
            );
        }
    }

    #[test]
    fn extends_replaces_in_place_and_inherits() {
        let c = compile(
            "branch: dc=x\nsubordinateTemplate: child:1\n\n\
             template: base\nrdnAttr: uid\nsubordinateTemplate: leaf:2\nobjectClass: top\nuid: a\ncn: base\nsn: s\n\n\
             template: child\nextends: base\nobjectClass: TOP\nobjectClass: extra\ncn: one\ncn: two\nmail: m\n\n\
             template: leaf\nrdnAttr: cn\ncn: l\n",
            "t",
            &[],
        )
        .expect("compiles");
        let child = &c.templates[1];
        let names: Vec<&str> = child.body.lines.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "objectClass",
                "objectClass",
                "uid",
                "cn",
                "cn",
                "sn",
                "mail"
            ]
        );
        assert_eq!(child.rdn_names, ["uid"]);
        assert_eq!(child.subs.len(), 1);
        assert_eq!(child.subs[0].count, 2);
    }

    #[test]
    fn dn_helpers() {
        assert_eq!(split_dn(r"cn=a\,b,dc=x"), vec![r"cn=a\,b", "dc=x"]);
        assert_eq!(split_dn(""), Vec::<&str>::new());
        assert_eq!(
            parse_rdn(r"cn=a\2Cb+sn=\+z"),
            Some(vec![
                ("cn".to_string(), "a,b".to_string()),
                ("sn".to_string(), "+z".to_string())
            ])
        );
        assert_eq!(parse_rdn("nope"), None);
    }
}
