"""Minimal hand-written BER / LDAPv3 encoder and decoder for raw-socket tests.

Only what the integration tests need: building requests (possibly malformed
on purpose) and decoding responses.  Written for these tests from RFC 4511 /
X.690; deliberately independent of the server's own codec.
"""

import socket
import time

# ---------------------------------------------------------------- encoding


def enc_len(n):
    if n < 0x80:
        return bytes([n])
    b = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(b)]) + b


def tlv(tag, content):
    return bytes([tag]) + enc_len(len(content)) + content


def int_bytes(v):
    """Minimal two's complement content octets of an INTEGER."""
    n = 1
    while True:
        try:
            return v.to_bytes(n, "big", signed=True)
        except OverflowError:
            n += 1


def integer(v, tag=0x02):
    return tlv(tag, int_bytes(v))


def enum(v):
    return integer(v, tag=0x0A)


def boolean(b, tag=0x01):
    return tlv(tag, b"\xff" if b else b"\x00")


def octets(s, tag=0x04):
    if isinstance(s, str):
        s = s.encode("utf-8")
    return tlv(tag, s)


def seq(*parts, tag=0x30):
    return tlv(tag, b"".join(parts))


def set_(*parts):
    return tlv(0x31, b"".join(parts))


# ---------------------------------------------------------------- filters

def f_and(*fs):
    return seq(*fs, tag=0xA0)


def f_or(*fs):
    return seq(*fs, tag=0xA1)


def f_not(f):
    return tlv(0xA2, f)


def f_eq(attr, value):
    return seq(octets(attr), octets(value), tag=0xA3)


def f_present(attr):
    return octets(attr, tag=0x87)


def f_substr(attr, initial=None, any_=(), final=None):
    parts = []
    if initial is not None:
        parts.append(octets(initial, tag=0x80))
    for a in any_:
        parts.append(octets(a, tag=0x81))
    if final is not None:
        parts.append(octets(final, tag=0x82))
    return seq(octets(attr), seq(*parts), tag=0xA4)


# ---------------------------------------------------------------- requests

SCOPE_BASE, SCOPE_ONE, SCOPE_SUB = 0, 1, 2


def control(oid, critical=False, value=None):
    parts = [octets(oid)]
    if critical:
        parts.append(boolean(True))
    if value is not None:
        parts.append(octets(value))
    return seq(*parts)


def message(msgid, op, controls=None):
    parts = [integer(msgid), op]
    if controls:
        parts.append(seq(*controls, tag=0xA0))
    return seq(*parts)


def bind_op(dn="", password="", version=3):
    return tlv(0x60, integer(version) + octets(dn) + octets(password, tag=0x80))


def search_op(base, scope=SCOPE_SUB, filt=None, attrs=(), size=0, timelimit=0,
              types_only=False, deref=0):
    if filt is None:
        filt = f_present("objectClass")
    return tlv(0x63, octets(base) + enum(scope) + enum(deref) + integer(size)
               + integer(timelimit) + boolean(types_only) + filt
               + seq(*[octets(a) for a in attrs]))


def add_op(dn, attrs):
    """attrs: dict name -> list of values (str or bytes)."""
    alist = [seq(octets(a), set_(*[octets(v) for v in vals])) for a, vals in attrs.items()]
    return tlv(0x68, octets(dn) + seq(*alist))


def abandon_op(msgid):
    return tlv(0x50, int_bytes(msgid))


def extended_op(oid, value=None):
    c = octets(oid, tag=0x80)
    if value is not None:
        c += octets(value, tag=0x81)
    return tlv(0x77, c)


def unbind_op():
    return b"\x42\x00"


WHOAMI_OID = "1.3.6.1.4.1.4203.1.11.3"
NOTICE_OF_DISCONNECTION = "1.3.6.1.4.1.1466.20036"

# ---------------------------------------------------------------- decoding


class Incomplete(Exception):
    pass


def read_tlv(buf, pos):
    """Return (tag, content_start, content_end). Raises Incomplete."""
    if pos + 2 > len(buf):
        raise Incomplete()
    tag = buf[pos]
    l0 = buf[pos + 1]
    p = pos + 2
    if l0 & 0x80:
        n = l0 & 0x7F
        if n == 0:
            raise ValueError("indefinite length in a server response")
        if p + n > len(buf):
            raise Incomplete()
        length = int.from_bytes(buf[p:p + n], "big")
        p += n
    else:
        length = l0
    if p + length > len(buf):
        raise Incomplete()
    return tag, p, p + length


def children(buf, start, end):
    out = []
    p = start
    while p < end:
        tag, s, e = read_tlv(buf, p)
        out.append((tag, buf[s:e]))
        p = e
    return out


RESULT_OPS = {0x61: "bind", 0x65: "searchDone", 0x67: "modify", 0x69: "add",
              0x6B: "delete", 0x6D: "modDN", 0x6F: "compare", 0x78: "extended"}


def decode_message(raw):
    """Decode one LDAPMessage (bytes) into a dict."""
    tag, s, e = read_tlv(raw, 0)
    assert tag == 0x30, "LDAPMessage is not a SEQUENCE: tag %#x" % tag
    parts = children(raw, s, e)
    assert parts[0][0] == 0x02, "messageID is not an INTEGER"
    msg = {"id": int.from_bytes(parts[0][1], "big", signed=True)}
    optag, body = parts[1]
    msg["tag"] = optag
    msg["op"] = RESULT_OPS.get(optag, {0x64: "entry", 0x73: "reference"}.get(optag, hex(optag)))
    msg["controls"] = parts[2][1] if len(parts) > 2 else None
    if optag in RESULT_OPS:
        fields = children(body, 0, len(body))
        msg["code"] = int.from_bytes(fields[0][1], "big")
        msg["matched"] = fields[1][1].decode("utf-8", "replace")
        msg["diag"] = fields[2][1].decode("utf-8", "replace")
        for ftag, fval in fields[3:]:
            if ftag == 0x8A:
                msg["name"] = fval.decode()
            elif ftag == 0x8B:
                msg["value"] = fval
            elif ftag == 0x87:
                msg["sasl"] = fval
    elif optag == 0x79:
        msg["op"] = "intermediate"
        for ftag, fval in children(body, 0, len(body)):
            if ftag == 0x80:
                msg["name"] = fval.decode()
            elif ftag == 0x81:
                msg["value"] = fval
    elif optag == 0x64:
        fields = children(body, 0, len(body))
        msg["dn"] = fields[0][1].decode("utf-8", "replace")
        attrs = {}
        for _, a in children(fields[1][1], 0, len(fields[1][1])):
            ap = children(a, 0, len(a))
            name = ap[0][1].decode()
            attrs[name] = [v for _, v in children(ap[1][1], 0, len(ap[1][1]))]
        msg["attrs"] = attrs
    return msg


class Conn:
    """A raw LDAP connection: send bytes, receive decoded messages."""

    def __init__(self, host, port, timeout=10.0, rcvbuf=None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self.buf = b""
        self.eof = False

    def send(self, data):
        self.sock.sendall(data)

    def recv_msg(self, timeout=10.0):
        """Next message as a dict; None at EOF. Raises socket.timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                _, _, e = read_tlv(self.buf, 0)
                raw, self.buf = self.buf[:e], self.buf[e:]
                return decode_message(raw)
            except Incomplete:
                pass
            if self.eof:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("no complete message within %.1fs" % timeout)
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 16)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.eof = True
            self.buf += chunk

    def drain(self, timeout=10.0, limit=100000):
        """Read messages until EOF (or timeout). Returns (messages, got_eof)."""
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < limit:
            left = deadline - time.monotonic()
            if left <= 0:
                return out, False
            try:
                m = self.recv_msg(timeout=left)
            except socket.timeout:
                return out, False
            if m is None:
                return out, True
            out.append(m)
        return out, False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


def simple_bind(conn, dn, password, msgid=1):
    conn.send(message(msgid, bind_op(dn, password)))
    r = conn.recv_msg()
    assert r is not None and r["op"] == "bind", "no bind response: %r" % (r,)
    return r["code"]
