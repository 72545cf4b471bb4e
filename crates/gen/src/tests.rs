use super::*;
use pando_ldif::{LdifReader, ReaderOptions, Record};

fn opts(seed: u64, defines: &[(&str, &str)]) -> Options {
    Options {
        seed,
        defines: defines
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
        wrap: None,
    }
}

fn run(text: &str, o: &Options) -> (Vec<u8>, Stats) {
    let t = Template::parse(text, "test.template").unwrap_or_else(|e| panic!("{e}"));
    let mut out = Vec::new();
    let stats = generate(&t, o, &mut out).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(stats.bytes, out.len() as u64);
    (out, stats)
}

type Entry = (String, Vec<(String, String)>);

fn read_back(ldif: &[u8]) -> Vec<Entry> {
    let mut out = Vec::new();
    for rec in LdifReader::new(ldif, ReaderOptions::default()) {
        match rec {
            Ok(Record::Content { dn, attrs, .. }) => out.push((
                dn,
                attrs
                    .into_iter()
                    .map(|(n, v)| (n, String::from_utf8(v).expect("utf-8 value")))
                    .collect(),
            )),
            other => panic!("unexpected record {other:?}"),
        }
    }
    out
}

fn values<'a>(e: &'a Entry, attr: &str) -> Vec<&'a str> {
    e.1.iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(attr))
        .map(|(_, v)| v.as_str())
        .collect()
}

/// Entries of a one-template file: `lines` are the template's body.
fn entries_of(lines: &str, count: u64, seed: u64) -> Vec<Entry> {
    let text = format!(
        "branch: dc=x\nsubordinateTemplate: t:{count}\n\ntemplate: t\nrdnAttr: cn\ncn: e<sequential>\n{lines}\n"
    );
    let (out, stats) = run(&text, &opts(seed, &[]));
    let entries = read_back(&out);
    assert_eq!(entries.len() as u64, stats.entries);
    assert_eq!(stats.entries, count + 1);
    entries.into_iter().skip(1).collect()
}

fn one(lines: &str) -> Entry {
    entries_of(lines, 1, 1).remove(0)
}

#[test]
fn builtin_templates_parse_and_read_back() {
    for name in ["example", "telco"] {
        let text = builtin(name).expect("builtin");
        let t = Template::parse(text, name).unwrap_or_else(|e| panic!("{e}"));
        // Each template's own sizes (another's would be refused).
        let sizes: Vec<(&str, &str)> = [
            ("numusers", "50"),
            ("numsubscribers", "40"),
            ("numgroups", "5"),
        ]
        .into_iter()
        .filter(|(n, _)| text.contains(&format!("define {n}=")))
        .collect();
        let o = opts(3, &sizes);
        let mut out = Vec::new();
        let stats = generate(&t, &o, &mut out).unwrap_or_else(|e| panic!("{e}"));
        let entries = read_back(&out);
        assert_eq!(entries.len() as u64, stats.entries, "{name}");
        // DNs unique, every parent written before its children.
        let all: std::collections::HashSet<String> =
            entries.iter().map(|e| e.0.to_ascii_lowercase()).collect();
        assert_eq!(all.len(), entries.len(), "{name}: duplicate DN");
        let mut seen = std::collections::HashSet::new();
        for (dn, attrs) in &entries {
            if let Some((_, parent)) = dn.split_once(',') {
                let parent = parent.to_ascii_lowercase();
                assert!(
                    !all.contains(&parent) || seen.contains(&parent),
                    "{name}: {dn} before its parent"
                );
            }
            seen.insert(dn.to_ascii_lowercase());
            // No attribute repeats a value.
            let mut vals: Vec<(String, &String)> = attrs
                .iter()
                .map(|(n, v)| (n.to_ascii_lowercase(), v))
                .collect();
            vals.sort();
            let n = vals.len();
            vals.dedup();
            assert_eq!(vals.len(), n, "{name}: duplicate value in {dn}");
        }
    }
    assert!(builtin("nope").is_none());
}

#[test]
fn example_entries_look_right() {
    let (out, stats) = run(
        builtin("example").unwrap_or_default(),
        &opts(0, &[("numusers", "3")]),
    );
    assert_eq!(stats.entries, 5);
    let e = read_back(&out);
    assert_eq!(e[0].0, "dc=example,dc=com");
    assert_eq!(values(&e[0], "objectClass"), ["top", "domain"]);
    assert_eq!(values(&e[0], "dc"), ["example"]);
    assert_eq!(e[1].0, "ou=People,dc=example,dc=com");
    assert_eq!(values(&e[1], "objectClass"), ["top", "organizationalUnit"]);
    assert_eq!(e[2].0, "uid=user.0,ou=People,dc=example,dc=com");
    assert_eq!(e[4].0, "uid=user.2,ou=People,dc=example,dc=com");
    let p = &e[2];
    let given = values(p, "givenName")[0];
    let sn = values(p, "sn")[0];
    assert_eq!(values(p, "cn"), [format!("{given} {sn}").as_str()]);
    assert_eq!(values(p, "mail"), ["user.0@example.com"]);
    let initials = values(p, "initials")[0];
    assert_eq!(initials.len(), 3);
    assert!(initials.starts_with(&given[..1]) && initials.ends_with(&sn[..1]));
    let street = values(p, "street")[0];
    assert!(street.ends_with(" Street") && street.as_bytes()[..5].iter().all(u8::is_ascii_digit));
    assert_eq!(values(p, "st")[0].len(), 2);
    let pa = values(p, "postalAddress")[0];
    assert!(pa.starts_with(&format!("{given} {sn}${street}$")), "{pa}");
    assert_eq!(
        values(p, "description"),
        [format!("This is the description for {given} {sn}.").as_str()]
    );
    assert_eq!(p.1.len(), 22);
}

#[test]
fn deterministic_for_seed_and_defines() {
    let text = builtin("telco").unwrap_or_default();
    let o = opts(42, &[("numsubscribers", "30"), ("numgroups", "3")]);
    let (a, _) = run(text, &o);
    let (b, _) = run(text, &o);
    assert_eq!(a, b);
    let (c, _) = run(
        text,
        &opts(43, &[("numsubscribers", "30"), ("numgroups", "3")]),
    );
    assert_ne!(a, c);
    // Wrapping changes the layout, not the content.
    let mut wrapped = o.clone();
    wrapped.wrap = Some(30);
    let (w, _) = run(text, &wrapped);
    assert!(w.split(|&b| b == b'\n').all(|l| l.len() <= 30));
    assert_eq!(read_back(&a), read_back(&w));
}

#[test]
fn branch_and_subordinate_structure() {
    let text = builtin("telco").unwrap_or_default();
    let o = opts(
        1,
        &[
            ("numsubscribers", "20"),
            ("devicespersub", "3"),
            ("numgroups", "5"),
        ],
    );
    let t = Template::parse(text, "telco").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.entry_count(), 4 + 10_000 + 10_000 * 2 + 50 + 10);
    let (out, stats) = run(text, &o);
    assert_eq!(stats.entries, 4 + 20 + 60 + 5 + 10);
    let e = read_back(&out);
    let under = |suffix: &str, depth: usize| {
        e.iter()
            .filter(|(dn, _)| dn.ends_with(suffix) && dn.split(',').count() == depth)
            .count()
    };
    assert_eq!(under("ou=Subscribers,o=telco,c=us", 4), 20);
    assert_eq!(under("ou=Subscribers,o=telco,c=us", 5), 60);
    assert_eq!(under("ou=Groups,o=telco,c=us", 4), 5);
    assert_eq!(under("ou=Devices,o=telco,c=us", 4), 10);
    // Devices: reset counter per subscriber, owner is the parent.
    let sub = &e[2];
    assert_eq!(sub.0, "uid=sub100000,ou=Subscribers,o=telco,c=us");
    for (i, dev) in e[3..6].iter().enumerate() {
        assert_eq!(dev.0, format!("cn=dev{},{}", i + 1, sub.0));
        assert_eq!(values(dev, "owner"), [sub.0.as_str()]);
    }
    assert_eq!(e[6].0, "uid=sub100001,ou=Subscribers,o=telco,c=us");
    assert_eq!(e[7].0, "cn=dev1,uid=sub100001,ou=Subscribers,o=telco,c=us");
    assert!(e
        .iter()
        .filter(|(dn, _)| dn.starts_with("uid="))
        .all(|s| values(s, "objectClass").len() == 6 && s.1.len() >= 35));
}

#[test]
fn attribute_references() {
    let e = one("sn: Smithson\ngivenName: Anna\nfull: {givenName} {sn}\nshort: {sn:3}\nfwd: ({later})\nlater: L\nmissing: x{absent}y\nabsent: <presence:0>z");
    assert_eq!(values(&e, "full"), ["Anna Smithson"]);
    assert_eq!(values(&e, "short"), ["Smi"]);
    assert_eq!(values(&e, "fwd"), ["(L)"]);
    assert_eq!(values(&e, "missing"), ["xy"]);
    assert!(values(&e, "absent").is_empty());
    // Output keeps template order.
    let names: Vec<&str> = e.1.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "cn",
            "sn",
            "givenName",
            "full",
            "short",
            "fwd",
            "later",
            "missing"
        ]
    );
}

#[test]
fn random_tags() {
    for e in entries_of(
        "a: <random:numeric:5>\nb: <random:alpha:3:6>\nc: <random:alphanumeric:8>\n\
         d: <random:hex:4>\nf: <random:numeric:10:20>\ng: <random:numeric:1:99:000>\n\
         h: <random:telephone>\ni: <random:month>\nj: <random:month:3>\n\
         k: <random:chars:xy:4>\nm: <random:base64:6>",
        200,
        5,
    ) {
        let v = |a: &str| values(&e, a)[0].to_string();
        let a = v("a");
        assert!(a.len() == 5 && a.bytes().all(|c| c.is_ascii_digit()), "{a}");
        let b = v("b");
        assert!((3..=6).contains(&b.len()) && b.bytes().all(|c| c.is_ascii_lowercase()));
        let c = v("c");
        assert!(
            c.len() == 8
                && c.bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        assert!(v("d").len() == 4 && v("d").bytes().all(|c| c.is_ascii_hexdigit()));
        let f: i64 = v("f").parse().unwrap_or(-1);
        assert!((10..=20).contains(&f));
        let g = v("g");
        assert_eq!(g.len(), 3);
        assert!((1..=99).contains(&g.parse::<i64>().unwrap_or(0)));
        let h = v("h");
        let hb = h.as_bytes();
        assert!(
            h.len() == 15 && h.starts_with("+1 ") && hb[6] == b' ' && hb[10] == b' ',
            "{h}"
        );
        assert!(data::MONTHS.contains(&v("i").as_str()));
        assert!(data::MONTHS.iter().any(|m| m[..3] == v("j")));
        assert!(v("k").len() == 4 && v("k").bytes().all(|c| c == b'x' || c == b'y'));
        assert_eq!(v("m").len(), 6);
    }
}

#[test]
fn names_lists_guid_and_file_lists() {
    let entries = entries_of(
        "givenName: <first>\nsn: <last>\nl: <file:cities>\nst: <file:states:sequential>\nu: <guid>",
        60,
        9,
    );
    for (i, e) in entries.iter().enumerate() {
        assert!(data::FIRST_NAMES.contains(&values(e, "givenName")[0]));
        assert!(data::LAST_NAMES.contains(&values(e, "sn")[0]));
        assert!(data::CITIES.contains(&values(e, "l")[0]));
        assert_eq!(values(e, "st")[0], data::STATES[i % data::STATES.len()]);
        let g = values(e, "u")[0];
        let parts: Vec<usize> = g.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{g}");
        assert_eq!(&g[14..15], "4");
    }
    let guids: std::collections::HashSet<&str> =
        entries.iter().map(|e| values(e, "u")[0]).collect();
    assert_eq!(guids.len(), entries.len());
}

#[test]
fn sequential_and_lists() {
    let entries = entries_of(
        "n: <sequential:10>\nw: <list:a;3:b;1>\ns: <list:only>",
        4000,
        2,
    );
    let mut a = 0;
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e.0, format!("cn=e{i},dc=x"));
        assert_eq!(values(e, "n"), [(10 + i).to_string().as_str()]);
        assert_eq!(values(e, "s"), ["only"]);
        match values(e, "w")[0] {
            "a" => a += 1,
            "b" => {}
            other => panic!("{other}"),
        }
    }
    // Weight 3:1 -> about 3000 of 4000.
    assert!((2800..=3200).contains(&a), "{a}");
}

#[test]
fn presence_probability_is_roughly_right() {
    let entries = entries_of(
        "p: <presence:30>yes\nq: <presence:100>all\nr: <presence:0>none",
        10_000,
        11,
    );
    let n = entries
        .iter()
        .filter(|e| !values(e, "p").is_empty())
        .count();
    assert!((2750..=3250).contains(&n), "{n}");
    assert!(entries.iter().all(|e| values(e, "q") == ["all"]));
    assert!(entries.iter().all(|e| values(e, "r").is_empty()));
}

#[test]
fn ifpresent_and_ifabsent() {
    for e in entries_of(
        "x: <list:on:off>\nhome: <presence:50>h\nyes: <ifpresent:home>has\nno: <ifabsent:home>lacks\n\
         on: <ifpresent:x:on>X is on\nnoton: <ifabsent:x:on>X is not on",
        200,
        4,
    ) {
        let has = !values(&e, "home").is_empty();
        assert_eq!(values(&e, "yes").len(), has as usize);
        assert_eq!(values(&e, "no").len(), !has as usize);
        let on = values(&e, "x")[0] == "on";
        assert_eq!(values(&e, "on").len(), on as usize);
        assert_eq!(values(&e, "noton").len(), !on as usize);
    }
}

#[test]
fn dn_tags() {
    let text = "branch: dc=example,dc=com\n\nbranch: ou=People,dc=example,dc=com\nsubordinateTemplate: p:1\n\n\
                template: p\nrdnAttr: uid\nuid: u1\nfull: <DN>\nfirst2: <DN:2>\nlast1: <DN:-1>\n\
                parent: <ParentDN>\nunder: <underscoreDN>\nuparent: <underscoreParentDN>\nrdn: <RDN>\n";
    let (out, _) = run(text, &opts(0, &[]));
    let e = read_back(&out);
    let p = &e[2];
    assert_eq!(p.0, "uid=u1,ou=People,dc=example,dc=com");
    assert_eq!(values(p, "full"), [p.0.as_str()]);
    assert_eq!(values(p, "first2"), ["uid=u1,ou=People"]);
    assert_eq!(values(p, "last1"), ["dc=com"]);
    assert_eq!(values(p, "parent"), ["ou=People,dc=example,dc=com"]);
    assert_eq!(values(p, "under"), ["uid=u1_ou=People_dc=example_dc=com"]);
    assert_eq!(values(p, "uparent"), ["ou=People_dc=example_dc=com"]);
    assert_eq!(values(p, "rdn"), ["uid=u1"]);
}

#[test]
fn multi_valued_rdn_and_dn_escaping() {
    let text = "branch: o=x\nsubordinateTemplate: p:1\n\ntemplate: p\nrdnAttr: cn+sn\n\
                cn: Smith, John\nsn: <list:a+b>\ndescription: \u{e9}t\u{e9}\nlead: \\< not a tag\n";
    let (out, _) = run(text, &opts(0, &[]));
    let s = String::from_utf8(out.clone()).unwrap_or_default();
    assert!(s.contains("dn: cn=Smith\\, John+sn=a\\+b,o=x\n"), "{s}");
    assert!(s.contains("description:: w6l0w6k=\n"), "{s}");
    assert!(s.contains("lead:: PCBub3QgYSB0YWc=\n"), "{s}");
    let e = read_back(&out);
    assert_eq!(values(&e[1], "description"), ["\u{e9}t\u{e9}"]);
    assert_eq!(values(&e[1], "lead"), ["< not a tag"]);
}

#[test]
fn defines_and_overrides() {
    let text = "define base=dc=a\ndefine n=2\ndefine ou=ou=P,[base]\nbranch: [base]\n\n\
                branch: [ou]\nsubordinateTemplate: t:[n]\n\ntemplate: t\nrdnAttr: cn\ncn: c<sequential>\nx: [base]-[unknown]\n";
    let (out, stats) = run(text, &opts(0, &[]));
    assert_eq!(stats.entries, 4);
    let e = read_back(&out);
    assert_eq!(e[1].0, "ou=P,dc=a");
    assert_eq!(values(&e[2], "x"), ["dc=a-[unknown]"]);
    let (out, stats) = run(text, &opts(0, &[("N", "5"), ("base", "dc=b")]));
    assert_eq!(stats.entries, 7);
    let e = read_back(&out);
    assert_eq!(e[1].0, "ou=P,dc=b");
    // A bad override is reported against the template line that uses it.
    let t = Template::parse(text, "f.template").unwrap_or_else(|e| panic!("{e}"));
    let err = generate(&t, &opts(0, &[("n", "lots")]), &mut Vec::new())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.starts_with("f.template:7: "), "{err}");
}

#[test]
fn an_override_the_template_neither_defines_nor_uses_is_an_error() {
    let text = "define base=dc=a\ndefine n=2\nbranch: [base]\nsubordinateTemplate: t:[n]\n\n\
                template: t\nrdnAttr: cn\ncn: c<sequential>\nx: [extra]\n";
    let t = Template::parse(text, "f.template").unwrap_or_else(|e| panic!("{e}"));
    let err = generate(&t, &opts(0, &[("numusers", "10")]), &mut Vec::new())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert_eq!(
        err,
        "-D numusers: f.template neither defines nor uses it (its defines: base, n)"
    );
    // Overriding a define, or giving one the template only uses, is fine.
    let (out, stats) = run(text, &opts(0, &[("N", "3"), ("Extra", "e")]));
    assert_eq!(stats.entries, 4);
    assert_eq!(values(&read_back(&out)[1], "x"), ["e"]);
}

#[test]
fn runtime_error_when_rdn_attribute_is_left_out() {
    let text = "branch: dc=x\nsubordinateTemplate: t:50\n\ntemplate: t\nrdnAttr: cn\ncn: <presence:50>c<sequential>\n";
    let t = Template::parse(text, "r.template").unwrap_or_else(|e| panic!("{e}"));
    let err = generate(&t, &opts(0, &[]), &mut Vec::new())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.starts_with("r.template:4: ") && err.contains("RDN attribute cn"),
        "{err}"
    );
}

#[test]
fn branches_written_parents_first_and_comments_ignored() {
    let text =
        "# comment\nbranch: ou=A,dc=x\n  # indented comment\ndescription: a\n\n\n\nbranch: dc=x\n";
    let (out, _) = run(text, &opts(0, &[]));
    let e = read_back(&out);
    assert_eq!(e[0].0, "dc=x");
    assert_eq!(e[1].0, "ou=A,dc=x");
    assert_eq!(values(&e[1], "description"), ["a"]);
}

#[test]
fn abstract_base_template_needs_no_rdn() {
    let text = "branch: dc=x\nsubordinateTemplate: c:1\n\ntemplate: base\nsn: s\n\ntemplate: c\nextends: base\nrdnAttr: cn\ncn: {sn}-1\n";
    let (out, _) = run(text, &opts(0, &[]));
    let e = read_back(&out);
    assert_eq!(e[1].0, "cn=s-1,dc=x");
}

#[test]
fn helpers() {
    let mut v = Vec::new();
    push_int(&mut v, -42, 5);
    push_int(&mut v, 7, 0);
    push_int(&mut v, i64::MIN, 0);
    assert_eq!(String::from_utf8_lossy(&v), "-000427-9223372036854775808");
    // Values that are not SAFE-STRINGs go out base64-encoded (the line
    // writer is pando_ldif's).
    let (mut b, mut scratch) = (Vec::new(), Vec::new());
    put_line(&mut b, &mut scratch, b"x", b" any carnal pleas", None);
    assert_eq!(b, b"x:: IGFueSBjYXJuYWwgcGxlYXM=\n");
    assert_eq!(char_prefix_end("h\u{e9}llo".as_bytes(), 2), 3);
    let mut d = Vec::new();
    escape_dn_value(&mut d, b"#a b ");
    assert_eq!(d, b"\\#a b\\ ");
}
