"""The code's structure, held by the suite (issue 38): which crate may
depend on which (the arrows docs/design.md allows), and how large a circle
of imports each crate may hold. A new forbidden arrow fails at once; a
circle larger than the ceiling recorded here fails, so circles only shrink:
lower a ceiling when a restructuring makes its circle smaller.

Imports are read from `use crate::…` and `super::…` paths in non-test
code (a `#[cfg(test)]` module to the end of its file, `tests.rs` and
`tests/` are left out); `crate::a::b` counts as an import of the longest
module file it names."""

import re
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

CRATES = Path(__file__).resolve().parents[2] / "crates"

# Which workspace crates each crate may depend on (normal dependencies):
# the layers from the bottom up. Nothing below may name what is above it.
ALLOWED = {
    "pando-proto": set(),
    "pando-model": {"pando-proto"},
    "pando-ldif": {"pando-proto"},
    "pando-password": set(),
    "pando-store": {"pando-model", "pando-proto", "pando-ldif"},
    "pando-config": {"pando-proto", "pando-model", "pando-store", "pando-password"},
    "pando-access": {"pando-proto", "pando-model", "pando-store", "pando-config"},
    "pando-observe": {"pando-proto", "pando-model", "pando-ldif", "pando-store", "pando-config"},
    "pando-client": {"pando-proto", "pando-config"},
    # The HTTP of the metrics endpoint and the dashboards: nothing of Pando's.
    "pando-web": set(),
    "pando-ops": {"pando-proto", "pando-model", "pando-store", "pando-password", "pando-config", "pando-access",
                  "pando-observe"},
    "pando-overlays": {"pando-proto", "pando-model", "pando-ldif", "pando-store", "pando-password", "pando-config",
                       "pando-access", "pando-observe", "pando-client", "pando-ops"},
    "pando-gen": {"pando-ldif"},
    "pando-bench": {"pando-proto"},
    "pando-server": {"pando-proto", "pando-model", "pando-ldif", "pando-store", "pando-password", "pando-config",
                     "pando-access", "pando-observe", "pando-client", "pando-ops", "pando-overlays", "pando-web"},
    "pando-migrate": {"pando-proto", "pando-model", "pando-ldif", "pando-password", "pando-config", "pando-server"},
    # The proxy speaks LDAP to servers: the codec and the client only (and
    # HTTP for its dashboard).
    "pando-proxy": {"pando-proto", "pando-client", "pando-web"},
    "pando": {"pando-proto", "pando-model", "pando-ldif", "pando-store", "pando-password", "pando-config", "pando-access", "pando-observe", "pando-client", "pando-server",
              "pando-gen", "pando-bench", "pando-migrate", "pando-proxy"},
}

# Most files in one circle of imports, per crate directory (issue 38's
# goal is 3 everywhere; the operations' is where the redesign goes on).
CEILING = {
    "server": 3,
    "ops": 3,
    "migrate": 2,
    "model": 3,
    "store": 2,
}
DEFAULT_CEILING = 1

# Functions longer than this many lines (non-test code, declaration to
# closing brace) are counted; their number may only go down (issue 38:
# none outside declarative tables).
LONG_FUNCTION = 100
LONG_FUNCTIONS_CEILING = 0


def code_of(text):
    i = text.find("#[cfg(test)]")
    return text if i < 0 else text[:i]


def module_of(src, path):
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def modules(src):
    out = {}
    for p in src.rglob("*.rs"):
        if p.name == "tests.rs" or "tests" in p.relative_to(src).parts[:-1]:
            continue
        out[module_of(src, p)] = code_of(p.read_text(errors="replace"))
    return out


def imports(mods):
    edges = defaultdict(set)
    for m, text in mods.items():
        for path in re.findall(r"\b(crate(?:::\w+)+|super(?:::\w+)+)", text):
            parts = path.split("::")
            if parts[0] == "crate":
                base, rest = [], parts[1:]
            else:
                base, rest = list(m), parts
                while rest and rest[0] == "super":
                    base, rest = base[:-1], rest[1:]
            for k in range(len(rest), -1, -1):
                target = tuple(base + rest[:k])
                if target in mods:
                    if target not in (m, ()):
                        edges[m].add(target)
                    break
    return edges


def largest_circle(nodes, edges):
    """Tarjan's strongly connected components; the largest one."""
    sys.setrecursionlimit(100000)
    index, low, stack, on, best = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > len(best):
                best[:] = comp

    for v in nodes:
        if v not in index:
            visit(v)
    return sorted("/".join(c) or "lib" for c in best)


def test_crates_depend_only_downwards():
    wrong = []
    for toml in sorted(CRATES.glob("*/Cargo.toml")):
        meta = tomllib.loads(toml.read_text())
        name = meta["package"]["name"]
        deps = {d for d in meta.get("dependencies", {}) if d.startswith("pando")}
        assert name in ALLOWED, "%s is not in test_structure.ALLOWED: say what it may depend on" % name
        for d in sorted(deps - ALLOWED[name]):
            wrong.append("%s -> %s" % (name, d))
    assert not wrong, "dependencies against the layers (docs/design.md): " + ", ".join(wrong)


def test_no_circle_of_imports_grows():
    grown = []
    for src in sorted(CRATES.glob("*/src")):
        crate = src.parent.name
        mods = modules(src)
        circle = largest_circle(list(mods), imports(mods))
        size = len(circle) if len(circle) > 1 else 1
        ceiling = CEILING.get(crate, DEFAULT_CEILING)
        if size > ceiling:
            grown.append("%s: %d files (ceiling %d): %s" % (crate, size, ceiling, ", ".join(circle)))
    assert not grown, "a circle of imports grew:\n" + "\n".join(grown)


FN_START = re.compile(r"\s*(pub(\([^)]*\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)")


def long_functions(path, limit=LONG_FUNCTION):
    """(name, lines) of each function in `path` longer than `limit` lines,
    braces counted outside strings, characters and comments."""
    lines = code_of(path.read_text(errors="replace")).split("\n")
    out = []
    for i, line in enumerate(lines):
        m = FN_START.match(line)
        if not m or line.rstrip().endswith(";"):
            continue
        depth, started = 0, False
        for j in range(i, len(lines)):
            s = re.sub(r'"(\\.|[^"\\])*"', '""', lines[j])
            s = re.sub(r"'(\\.|[^'\\])'", "''", s).split("//")[0]
            for ch in s:
                if ch == "{":
                    depth, started = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if started and depth <= 0:
                break
        if j - i + 1 > limit:
            out.append((m.group(6), j - i + 1))
    return out


def test_long_functions_only_go_down():
    found = []
    for src in sorted(CRATES.glob("*/src")):
        for p in sorted(src.rglob("*.rs")):
            if p.name == "tests.rs" or "tests" in p.relative_to(src).parts[:-1]:
                continue
            found += ["%s %s (%d lines)" % (p.relative_to(CRATES), n, k) for n, k in long_functions(p)]
    assert len(found) <= LONG_FUNCTIONS_CEILING, (
        "%d functions over %d lines (ceiling %d): split the new ones\n%s"
        % (len(found), LONG_FUNCTION, LONG_FUNCTIONS_CEILING, "\n".join(found)))


def test_the_length_measure(tmp_path):
    p = tmp_path / "a.rs"
    body = "    let s = \"{\";\n" * 101
    p.write_text("pub fn long() {\n" + body + "}\nfn short() { }\n")
    assert long_functions(p) == [("long", 103)]


def test_the_checker_sees_a_circle(tmp_path):
    """The measure itself: two modules naming each other are a circle of
    two; a third named by one of them is outside it."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "lib.rs").write_text("mod a;\nmod b;\nmod c;\n")
    (src / "a.rs").write_text("use crate::b::B;\nuse super::c;\n")
    (src / "b.rs").write_text("pub struct B;\nfn f() { crate::a::g() }\n#[cfg(test)]\nmod t { use crate::c; }\n")
    (src / "c.rs").write_text("pub fn c() {}\n")
    mods = modules(src)
    assert largest_circle(list(mods), imports(mods)) == ["a", "b"]


ITEM = re.compile(r"(pub(\([^)]*\))?\s+)?(async\s+|unsafe\s+|const\s+)*(fn|impl|struct|enum|trait|type|const|static|use|mod|macro_rules!)\b")


def code_after_tests(text):
    """Top-level items after the first `#[cfg(test)]` that are not test
    items themselves: the measures above stop reading a file there, so
    such code would be hidden from them."""
    i = text.find("#[cfg(test)]")
    if i < 0:
        return []
    lines = text[i:].split("\n")
    hidden = []
    for n, line in enumerate(lines):
        if not ITEM.match(line):
            continue
        k = n - 1
        while k >= 0 and (lines[k].startswith("#[") or lines[k].startswith("//")):
            if lines[k].startswith("#[cfg(test)]"):
                break
            k -= 1
        if k < 0 or not lines[k].startswith("#[cfg(test)]"):
            hidden.append(line.strip()[:60])
    return hidden


def test_test_code_comes_last():
    """Every file's code comes before its tests, so nothing escapes the
    circle and length measures."""
    wrong = []
    for src in sorted(CRATES.glob("*/src")):
        for p in sorted(src.rglob("*.rs")):
            for item in code_after_tests(p.read_text(errors="replace")):
                wrong.append("%s: %s" % (p.relative_to(CRATES), item))
    assert not wrong, "code after a #[cfg(test)] item (move the tests to the end):\n" + "\n".join(wrong)


def test_the_hidden_code_check():
    assert code_after_tests("fn a() {}\n#[cfg(test)]\nmod tests {\n    fn t() {}\n}\n") == []
    assert code_after_tests("#[cfg(test)]\nmod t;\n#[cfg(test)]\n#[allow(x)]\nmod u;\n") == []
    assert code_after_tests("#[cfg(test)]\nmod t;\npub fn hidden() {}\n") == ["pub fn hidden() {}"]
