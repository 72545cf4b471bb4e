"""TLS: ldaps:// listeners, StartTLS, client certificates and SASL EXTERNAL,
certificate reload on SIGHUP, --tls-self-signed, and the per-address
connection limit.

A throwaway CA, server certificates for 127.0.0.1/localhost and client
certificates are made with the openssl command in a temporary directory.
"""

import hashlib
import os
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import time
from pathlib import Path

import pytest

import ber
from conftest import ADMIN_DN, PANDO_BIN, PEOPLE, PUBLIC_READ, SUFFIX, free_port, have, make_server

pytestmark = pytest.mark.skipif(not (have("ldapsearch") and have("openssl")),
                                reason="ldap-utils or openssl not installed")

START_TLS = "1.3.6.1.4.1.1466.20037"
OPERATIONS_ERROR, PROTOCOL_ERROR, CONFIDENTIALITY_REQUIRED = 1, 2, 13
INAPPROPRIATE_AUTHENTICATION, BUSY = 48, 51


# ------------------------------------------------------------------ PKI


def openssl(*args):
    r = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, "openssl %s failed: %s" % (" ".join(map(str, args)), r.stderr)


class Pki:
    """A CA and certificates it issued (EC P-256 keys: quick to make)."""

    def __init__(self, d):
        self.dir = Path(d)
        self.ca = self.dir / "ca.pem"
        self.ca_key = self.dir / "ca.key"
        openssl("req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-nodes", "-keyout", self.ca_key, "-out", self.ca, "-days", "2",
                "-subj", "/O=Pando Test/CN=Pando Test CA",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def issue(self, name, subject, server=False):
        """(cert, key) paths for a new certificate signed by the CA."""
        cert, key, csr = (self.dir / (name + ext) for ext in (".pem", ".key", ".csr"))
        ext = self.dir / (name + ".ext")
        lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature"]
        if server:
            lines += ["extendedKeyUsage=serverAuth",
                      "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1"]
        else:
            lines += ["extendedKeyUsage=clientAuth"]
        ext.write_text("\n".join(lines) + "\n")
        openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", key, "-out", csr, "-subj", subject)
        openssl("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key,
                "-CAcreateserial", "-days", "2", "-out", cert, "-extfile", ext)
        return cert, key


def fingerprint_of_pem(path):
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(Path(path).read_text())).hexdigest()


def presented_fingerprint(port):
    """SHA-256 of the certificate the server presents to a new connection."""
    pem = ssl.get_server_certificate(("127.0.0.1", port), timeout=10)
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    p = Pki(tmp_path_factory.mktemp("pki"))
    p.server = p.issue("server", "/O=Pando Test/CN=localhost", server=True)
    p.server2 = p.issue("server2", "/O=Pando Test/CN=localhost renewed", server=True)
    # LDAP order: cn=alice,ou=People,dc=example,dc=com
    p.alice = p.issue("alice", "/DC=com/DC=example/OU=People/CN=alice")
    p.bob = p.issue("bob", "/DC=com/DC=example/OU=Staff/CN=bob")
    p.agent = p.issue("agent", "/O=Example/CN=backup, agent")
    return p


# ------------------------------------------------------------------ clients


def tool(srv, name, *args, url=None, ca=None, cert=None, reqcert=None, timeout=30):
    """Run an ldap-utils tool with the TLS settings in the environment;
    returns (rc, stdout, stderr)."""
    env = dict(os.environ)
    for k in ("LDAPTLS_CACERT", "LDAPTLS_CERT", "LDAPTLS_KEY", "LDAPTLS_REQCERT"):
        env.pop(k, None)
    if ca:
        env["LDAPTLS_CACERT"] = str(ca)
    if cert:
        env["LDAPTLS_CERT"], env["LDAPTLS_KEY"] = str(cert[0]), str(cert[1])
    if reqcert:
        env["LDAPTLS_REQCERT"] = reqcert
    cmd = [name, "-H", url or srv.url, "-o", "nettimeout=10", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return r.returncode, r.stdout, r.stderr


def client_context(ca=None, cert=None, max_version=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if ca:
        ctx.load_verify_locations(str(ca))
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    if max_version:
        ctx.maximum_version = max_version
    return ctx


def tls_conn(port, ctx, timeout=10.0):
    """A raw LDAP connection over TLS from the first byte."""
    c = ber.Conn("127.0.0.1", port, timeout=timeout)
    c.sock = ctx.wrap_socket(c.sock, server_hostname="127.0.0.1")
    return c


def whoami(c, msgid):
    c.send(ber.message(msgid, ber.extended_op(ber.WHOAMI_OID)))
    return c.recv_msg()


def start_tls(c, msgid):
    c.send(ber.message(msgid, ber.extended_op(START_TLS)))
    r = c.recv_msg()
    assert r is not None and r["op"] == "extended", "no StartTLS response: %r" % (r,)
    return r


def external_bind_op():
    # BindRequest: version 3, name "", sasl [3] { mechanism "EXTERNAL" }
    return ber.tlv(0x60, ber.integer(3) + ber.octets("") + ber.tlv(0xA3, ber.octets("EXTERNAL")))


def root_dse(srv, url=None, **kw):
    rc, out, err = tool(srv, "ldapsearch", "-x", "-LLL", "-b", "", "-s", "base",
                        "supportedExtension", "supportedSASLMechanisms", url=url, **kw)
    assert rc == 0, err
    return out


# ------------------------------------------------------------------ servers


@pytest.fixture(scope="module")
def tls_srv(tmp_path_factory, pki):
    """ldap://, ldaps:// and ldapi://; client certificates requested;
    password binds only over TLS; ou=Staff certificates mapped to ou=People."""
    base = tmp_path_factory.mktemp("tls-files")
    cert, key = base / "cert.pem", base / "key.pem"
    shutil.copy(pki.server[0], cert)
    shutil.copy(pki.server[1], key)
    config = """
[tls]
cert_file = "%s"
key_file = "%s"
ca_file = "%s"
client_certs = "request"

[auth]
require_secure_binds = true

[[auth.external_map]]
pattern = "cn=([^,]+),ou=staff,dc=example,dc=com"
dn = "uid=$1,ou=People,dc=example,dc=com"
""" % (cert, key, pki.ca)
    s = make_server(tmp_path_factory, "tls", config=config + PUBLIC_READ, ldaps=True)
    s.cert_file, s.key_file = cert, key
    yield s
    s.stop_and_verify()


@pytest.fixture(scope="module")
def plain_srv(tmp_path_factory):
    """No [tls]; at most 3 connections per address."""
    s = make_server(tmp_path_factory, "notls", config="[limits]\nmax_connections_per_ip = 3\n" + PUBLIC_READ)
    yield s
    s.stop_and_verify()


@pytest.fixture(scope="module")
def strict_srv(tmp_path_factory, pki):
    """Client certificates required, TLS 1.3 only."""
    config = """
[tls]
cert_file = "%s"
key_file = "%s"
ca_file = "%s"
client_certs = "require"
min_version = "1.3"
""" % (pki.server[0], pki.server[1], pki.ca)
    s = make_server(tmp_path_factory, "strict", config=config + PUBLIC_READ, ldaps=True)
    yield s
    s.stop_and_verify()


# ------------------------------------------------------------------ ldaps and StartTLS


def test_ldapsearch_starttls_and_ldaps(tls_srv, pki):
    rc, out, err = tool(tls_srv, "ldapsearch", "-x", "-ZZ", "-LLL", "-b", PEOPLE, "(uid=alice)", "uid",
                        ca=pki.ca)
    assert rc == 0, err
    assert "uid: alice" in out
    rc, out, err = tool(tls_srv, "ldapsearch", "-x", "-LLL", "-b", PEOPLE, "(uid=bob)", "uid",
                        url=tls_srv.ldaps_url, ca=pki.ca)
    assert rc == 0, err
    assert "uid: bob" in out
    # The certificate is checked by the client: trusting something else fails.
    rc, _, err = tool(tls_srv, "ldapsearch", "-x", "-ZZ", "-b", "", "-s", "base", ca=pki.alice[0])
    assert rc != 0


def test_root_dse_lists_starttls_and_external(tls_srv, plain_srv):
    out = root_dse(tls_srv)
    assert "supportedExtension: " + START_TLS in out
    assert "supportedSASLMechanisms: EXTERNAL" in out
    out = root_dse(plain_srv)
    assert START_TLS not in out
    assert "supportedSASLMechanisms: EXTERNAL" in out


def test_ldap3_ldaps_and_start_tls(tls_srv, pki):
    import ldap3
    tls = ldap3.Tls(ca_certs_file=str(pki.ca), validate=ssl.CERT_REQUIRED)
    server = ldap3.Server("127.0.0.1", port=tls_srv.ldaps_port, use_ssl=True, tls=tls,
                          get_info=ldap3.NONE, connect_timeout=10)
    c = ldap3.Connection(server, ADMIN_DN, tls_srv.admin_pw, receive_timeout=30)
    assert c.bind(), c.result
    assert c.search(PEOPLE, "(uid=carol)", attributes=["uid"])
    assert [e.uid.value for e in c.entries] == ["carol"]
    assert c.extend.standard.who_am_i() == "dn:" + ADMIN_DN
    c.unbind()

    server = ldap3.Server("127.0.0.1", port=tls_srv.port, tls=tls, get_info=ldap3.NONE,
                          connect_timeout=10)
    c = ldap3.Connection(server, ADMIN_DN, tls_srv.admin_pw, receive_timeout=30)
    c.open()
    assert c.start_tls(), c.result
    assert c.bind(), c.result
    assert c.search(PEOPLE, "(uid=dave)", attributes=["uid"])
    assert [e.uid.value for e in c.entries] == ["dave"]
    c.unbind()


def test_starttls_refusals(tls_srv, pki):
    ctx = client_context(ca=pki.ca)
    # Already TLS (ldaps): operationsError, and the connection goes on.
    with tls_conn(tls_srv.ldaps_port, ctx) as c:
        r = start_tls(c, 1)
        assert r["code"] == OPERATIONS_ERROR, r
        assert r.get("name") == START_TLS
        assert whoami(c, 2)["code"] == 0
    # StartTLS, then StartTLS again over the new TLS layer.
    with tls_srv.raw() as c:
        r = start_tls(c, 1)
        assert r["code"] == 0 and r.get("name") == START_TLS, r
        c.sock = ctx.wrap_socket(c.sock, server_hostname="127.0.0.1")
        assert start_tls(c, 2)["code"] == OPERATIONS_ERROR
        assert whoami(c, 3)["code"] == 0
    # With another operation pipelined ahead of it: operationsError, and
    # the connection stays usable in clear.
    with tls_srv.raw() as c:
        c.send(ber.message(1, ber.search_op(SUFFIX, filt=ber.f_present("objectClass"), attrs=["1.1"]))
               + ber.message(2, ber.extended_op(START_TLS)))
        codes = {}
        while 2 not in codes or 1 not in codes:
            m = c.recv_msg()
            assert m is not None
            if m["op"] in ("searchDone", "extended"):
                codes[m["id"]] = m["code"]
        assert codes == {1: 0, 2: OPERATIONS_ERROR}
        assert whoami(c, 3)["code"] == 0


def test_starttls_without_certificate(plain_srv):
    with plain_srv.raw() as c:
        r = start_tls(c, 1)
        assert r["code"] == PROTOCOL_ERROR, r
        assert "certificate" in r["diag"]
        assert whoami(c, 2)["code"] == 0
    rc, _, err = tool(plain_srv, "ldapwhoami", "-x", "-ZZ")
    assert rc != 0 and "Protocol error" in err, err


def test_require_secure_binds(tls_srv, pki):
    creds = ("-x", "-D", ADMIN_DN, "-w", tls_srv.admin_pw)
    rc, out, err = tool(tls_srv, "ldapwhoami", *creds)
    assert rc == CONFIDENTIALITY_REQUIRED, (rc, out, err)
    assert "Confidentiality required" in err
    rc, out, err = tool(tls_srv, "ldapwhoami", *creds, "-ZZ", ca=pki.ca)
    assert rc == 0, err
    assert out.strip() == "dn:" + ADMIN_DN
    # Anonymous operations need no TLS.
    rc, out, err = tool(tls_srv, "ldapwhoami", "-x")
    assert rc == 0 and out.strip() == "anonymous", (out, err)


# ------------------------------------------------------------------ client certificates


def test_sasl_external_with_client_certificates(tls_srv, pki):
    def external(cert, *extra, url=None):
        return tool(tls_srv, "ldapwhoami", "-Y", "EXTERNAL", "-Q", *extra,
                    url=url or tls_srv.ldaps_url, ca=pki.ca, cert=cert)

    # Unmapped: the subject itself, in LDAP order.
    rc, out, err = external(pki.alice)
    assert rc == 0, err
    assert out.strip() == "dn:cn=alice,ou=People,dc=example,dc=com"
    # Escaped per RFC 4514.
    rc, out, err = external(pki.agent)
    assert rc == 0, err
    assert out.strip() == "dn:cn=backup\\, agent,o=Example"
    # Mapped by [[auth.external_map]] to the user entry; over StartTLS too.
    rc, out, err = external(pki.bob)
    assert rc == 0, err
    assert out.strip() == "dn:uid=bob,ou=People,dc=example,dc=com"
    rc, out, err = external(pki.bob, "-ZZ", url=tls_srv.url)
    assert rc == 0, err
    assert out.strip() == "dn:uid=bob,ou=People,dc=example,dc=com"
    # No certificate (client_certs = "request"): TLS works, EXTERNAL does
    # not (libldap will not even try it, hence a raw bind).
    with tls_conn(tls_srv.ldaps_port, client_context(ca=pki.ca)) as c:
        c.send(ber.message(1, external_bind_op()))
        r = c.recv_msg()
        assert r["op"] == "bind" and r["code"] == INAPPROPRIATE_AUTHENTICATION, r
        assert whoami(c, 2)["value"] == b""


def test_client_certificate_required(strict_srv, pki):
    rc, out, err = tool(strict_srv, "ldapwhoami", "-Y", "EXTERNAL", "-Q",
                        url=strict_srv.ldaps_url, ca=pki.ca, cert=pki.alice)
    assert rc == 0, err
    assert out.strip() == "dn:cn=alice,ou=People,dc=example,dc=com"
    rc, out, err = tool(strict_srv, "ldapwhoami", "-x", url=strict_srv.ldaps_url, ca=pki.ca)
    assert rc != 0, out
    # The same from Python: the handshake (or the first read, since TLS 1.3
    # clients finish before the server has checked them) fails.
    with pytest.raises((ssl.SSLError, ConnectionError, AssertionError, OSError)):
        with tls_conn(strict_srv.ldaps_port, client_context(ca=pki.ca)) as c:
            r = whoami(c, 1)
            assert r is not None, "closed"
    with tls_conn(strict_srv.ldaps_port, client_context(ca=pki.ca, cert=pki.alice)) as c:
        assert c.sock.version() == "TLSv1.3"
        assert whoami(c, 1)["code"] == 0


def test_min_version(strict_srv, tls_srv, pki):
    tls12 = client_context(ca=pki.ca, cert=pki.alice, max_version=ssl.TLSVersion.TLSv1_2)
    with pytest.raises(ssl.SSLError) as e:
        tls_conn(strict_srv.ldaps_port, tls12)
    assert "VERSION" in str(e.value).upper(), e.value
    # The default minimum (1.2) lets the same client in.
    with tls_conn(tls_srv.ldaps_port, tls12) as c:
        assert c.sock.version() == "TLSv1.2"
        assert whoami(c, 1)["code"] == 0


# ------------------------------------------------------------------ reload


def test_certificate_reload_on_sighup(tls_srv, pki):
    import ldap3
    old_fp, new_fp = fingerprint_of_pem(pki.server[0]), fingerprint_of_pem(pki.server2[0])
    assert presented_fingerprint(tls_srv.ldaps_port) == old_fp
    tls = ldap3.Tls(ca_certs_file=str(pki.ca), validate=ssl.CERT_REQUIRED)
    server = ldap3.Server("127.0.0.1", port=tls_srv.ldaps_port, use_ssl=True, tls=tls,
                          get_info=ldap3.NONE, connect_timeout=10)
    old = ldap3.Connection(server, ADMIN_DN, tls_srv.admin_pw, receive_timeout=30)
    assert old.bind(), old.result

    # Renewed certificate and key under the same names.
    for src, dst in ((pki.server2[1], tls_srv.key_file), (pki.server2[0], tls_srv.cert_file)):
        shutil.copy(src, str(dst) + ".new")
        os.replace(str(dst) + ".new", dst)
    tls_srv.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while presented_fingerprint(tls_srv.ldaps_port) != new_fp:
        assert time.monotonic() < deadline, "new certificate not presented:\n" + tls_srv.logs()
        time.sleep(0.1)
    # StartTLS uses it too, and clients still verify it.
    rc, _, err = tool(tls_srv, "ldapwhoami", "-x", "-ZZ", ca=pki.ca)
    assert rc == 0, err
    # The connection made before the reload goes on.
    assert old.search(PEOPLE, "(uid=erin)", attributes=["uid"])
    assert [e.uid.value for e in old.entries] == ["erin"]

    # A broken key: the reload is refused with a reason and the renewed
    # certificate stays in use.
    Path(tls_srv.key_file).write_text("not a key\n")
    tls_srv.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "TLS files not reloaded" not in tls_srv.logs(tail=100000):
        assert time.monotonic() < deadline, tls_srv.logs()
        time.sleep(0.1)
    assert "tls.key_file" in tls_srv.logs(tail=100000)
    assert presented_fingerprint(tls_srv.ldaps_port) == new_fp
    assert old.search(PEOPLE, "(uid=frank)", attributes=["uid"])
    old.unbind()
    shutil.copy(pki.server2[1], tls_srv.key_file)


# ------------------------------------------------------------------ --tls-self-signed


def test_tls_self_signed(tmp_path_factory):
    srv = make_server(tmp_path_factory, "selfsigned", demo=False, ldaps=True, args=["--tls-self-signed"])
    try:
        d = srv.data_dir / "tls"
        mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
        assert mode(d) == 0o700
        assert mode(d / "key.pem") == 0o600
        assert mode(d / "cert.pem") == 0o644
        assert "generated a self-signed certificate" in srv.logs()
        fp = fingerprint_of_pem(d / "cert.pem")
        assert presented_fingerprint(srv.ldaps_port) == fp
        rc, out, err = tool(srv, "ldapsearch", "-x", "-LLL", "-b", SUFFIX, "-s", "base", "dn",
                            url=srv.ldaps_url, reqcert="never")
        assert rc == 0 and "dn: " + SUFFIX in out, err
        rc, _, err = tool(srv, "ldapwhoami", "-x", "-ZZ", reqcert="never")
        assert rc == 0, err
    finally:
        srv.stop_and_verify()
    # The next start reuses it.
    srv.start()
    try:
        assert "generated at an earlier start" in srv.logs()
        assert presented_fingerprint(srv.ldaps_port) == fp
    finally:
        srv.stop_and_verify()


def test_ldaps_needs_a_certificate(tmp_path):
    port = free_port()
    r = subprocess.run([PANDO_BIN, "serve", "--data-dir", str(tmp_path / "data"),
                        "--listen", "ldaps://127.0.0.1:%d" % port],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "tls.cert_file" in r.stderr and "--tls-self-signed" in r.stderr, r.stderr


# ------------------------------------------------------------------ per-address limit


def test_connections_per_ip(plain_srv):
    def accepted(c, msgid=1):
        r = whoami(c, msgid)
        return r is not None and r["op"] == "extended" and r["code"] == 0 and "name" not in r

    # Connections from earlier tests may take a moment to be counted out.
    deadline = time.monotonic() + 10
    while True:
        held = [plain_srv.raw() for _ in range(3)]
        if all(accepted(c) for c in held):
            break
        for c in held:
            c.close()
        assert time.monotonic() < deadline, "3 connections were not accepted"
        time.sleep(0.2)
    try:
        with plain_srv.raw() as c4:
            m = c4.recv_msg()
            assert m is not None, "4th connection closed without a notice"
            assert m["id"] == 0 and m.get("name") == ber.NOTICE_OF_DISCONNECTION, m
            assert m["code"] == BUSY
            assert c4.recv_msg() is None
        # ldapi is not counted.
        rc, out, err = tool(plain_srv, "ldapwhoami", "-Y", "EXTERNAL", "-Q", url=plain_srv.ldapi_url)
        assert rc == 0, err
        held.pop().close()
        deadline = time.monotonic() + 10
        while True:
            with plain_srv.raw() as c:
                if accepted(c):
                    break
            assert time.monotonic() < deadline, "no connection accepted after one closed"
            time.sleep(0.1)
    finally:
        for c in held:
            c.close()


def test_tls_settings_change_over_cn_config(tmp_path, pki):
    """Client certificates and the minimum version, changed over ldapi
    while serving: new connections get the new settings."""
    from conftest import Pando
    config = '[tls]\ncert_file = "%s"\nkey_file = "%s"\nca_file = "%s"\nclient_certs = "request"\n' % (
        pki.server[0], pki.server[1], pki.ca)
    srv = Pando(tmp_path, demo=True, config=config + PUBLIC_READ, ldaps=True).start()

    def change(attr, value):
        r = subprocess.run(["ldapmodify", "-Q", "-Y", "EXTERNAL", "-H", srv.ldapi_url],
                           input="dn: cn=config\nchangetype: modify\nreplace: %s\n%s: %s\n" % (attr, attr, value),
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr

    tls12 = client_context(ca=pki.ca, cert=pki.alice, max_version=ssl.TLSVersion.TLSv1_2)
    with tls_conn(srv.ldaps_port, tls12) as c:
        assert whoami(c, 1)["code"] == 0
    change("pandoTlsMinVersion", "1.3")
    with pytest.raises(ssl.SSLError):
        tls_conn(srv.ldaps_port, tls12)
    change("pandoTlsClientCerts", "require")
    rc, out, err = tool(srv, "ldapwhoami", "-x", url=srv.ldaps_url, ca=pki.ca)
    assert rc != 0, out
    rc, out, err = tool(srv, "ldapwhoami", "-Y", "EXTERNAL", "-Q", url=srv.ldaps_url, ca=pki.ca, cert=pki.alice)
    assert rc == 0 and out.strip() == "dn:cn=alice,ou=People,dc=example,dc=com", err
    change("pandoTlsClientCerts", "request")
    rc, out, err = tool(srv, "ldapwhoami", "-x", url=srv.ldaps_url, ca=pki.ca)
    assert rc == 0, err
    srv.stop_and_verify()
