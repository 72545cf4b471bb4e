"""scripts/bench-commit-pages' two parsers: the store file's pages mapped to
the databases holding them (on a store `pando import` made), and commits
read from strace's output."""
import importlib.machinery
import importlib.util
import subprocess

from conftest import PANDO_BIN, REPO, ldif_entry, person_attrs


def script():
    path = str(REPO / "scripts" / "bench-commit-pages")
    loader = importlib.machinery.SourceFileLoader("bench_commit_pages", path)
    spec = importlib.util.spec_from_loader("bench_commit_pages", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_every_database_of_an_imported_store_owns_its_pages(tmp_path):
    users = "\n".join(ldif_entry(f"uid=user{i},ou=People,dc=example,dc=com", person_attrs(f"user{i}", i))
                    for i in range(2000))
    ldif = tmp_path / "users.ldif"
    ldif.write_text(
        "dn: dc=example,dc=com\nobjectClass: domain\ndc: example\n\n"
        "dn: ou=People,dc=example,dc=com\nobjectClass: organizationalUnit\nou: People\n\n" + users)
    store = tmp_path / "store"
    subprocess.run([PANDO_BIN, "import", "--data-dir", str(store), "-f", str(ldif)],
                   check=True, capture_output=True, timeout=120)
    m = script()
    data = m.snapshot(str(store / "db" / "data.mdb"))
    assert len(data) % m.PS == 0 and len(data) > 2 * m.PS
    owners = m.page_owners(data)
    names = set(owners.values())
    for db in ("(main)", "id2entry", "dn2id", "ix:uid:eq", "ix:mail:eq", "meta"):
        assert db in names, (db, sorted(names))
    # 2,002 entries do not fit one page: id2entry has leaves under a branch page
    # (the page-number decoding of branch nodes is exercised).
    assert sum(1 for n in owners.values() if n == "id2entry") > 2
    # No page is claimed beyond the file's used part, nor the two meta pages.
    assert all(1 < p < len(data) // m.PS for p in owners)


def test_commits_are_the_store_writes_between_two_syncs(tmp_path):
    trace = tmp_path / "t.strace"
    trace.write_text(
        '101 pwrite64(13, "\\0\\0"..., 4096, 40960) = 4096\n'
        '101 pwritev(13, [{iov_base="..", iov_len=4096}, {iov_base="..", iov_len=4096}], 2, 81920) = 8192\n'
        '101 pwrite64(7, "x"..., 4096, 0) = 4096\n'
        '101 fdatasync(13)                = 0\n'
        '101 pwrite64(14, "\\0"..., 120, 4128) = 120\n'
        '102 pwrite64(13, "\\0"..., 4096, 12288 <unfinished ...>\n'
        '101 pwrite64(13, "\\0"..., 4096, 16384) = 4096\n'
        '101 fsync(14)                    = 0\n'
        '101 pwrite64(13, "\\0"..., 4096, 20480) = 4096\n')
    done, pending = script().commits(str(trace), [13, 14])
    # The page of another file (fd 7), the 120-byte meta write and an
    # unfinished call are not pages written; adjacent pages in one call are two.
    assert done == [[10, 20, 21], [4]]
    assert pending == [5]
