"""The dashboard's JavaScript signer (dashboard/sign.js, run by node with its
WebCrypto) and the Python verifier agree: the same canonical string for
awkward paths, queries and bodies, and signatures the server's Verifier
accepts (and refuses once anything is changed)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from support import require

from ledgermq.webadmin.app import DASHBOARD_DIR
from ledgermq.webadmin.signing import (
    SignatureError,
    StaticKeyStore,
    Verifier,
    canonical_request,
)
from ledgermq.wire.auth import Principal

SECRET = "0123456789abcdef0123456789abcdef"
TS = 1_700_000_000_000
NONCE = "00112233445566778899aabbccddeeff"
# (method, URL as the browser's URL parser gives it, body)
CASES = [
    ("GET", "http://127.0.0.1:9877/api/v1/cluster", None),
    ("GET", "http://h/api/v1/topics/A%7Cb%25c", None),
    ("GET", "http://h/api/v1/topics/A|b%25c", None),
    ("GET", "http://h/api/v1/messages?topic=T&key=a+b%20c&limit=5&key=%C3%A9!*'()", None),
    ("GET", "http://h/api/v1/messages?z=1&a=&b&a=2", None),
    ("GET", "http://h/api/v1/consumer-groups/%C3%A9t%C3%A9", None),
    ("POST", "http://h/api/v1/consumer-groups/cg/reset-offsets",
     '{"topic": "T", "offset": 3, "note": "caf\u00e9 \u2603"}'),
    ("DELETE", "http://h/api/v1/topics/Orders", None),
]

_SCRIPT = """
const sign = require(process.argv[1]);
const cases = JSON.parse(process.argv[2]);
(async () => {
  const out = [];
  for (const [method, url, body] of cases) {
    out.push({canonical: await sign.lmqCanonical(method, url, body, %(ts)d, "%(nonce)s"),
              header: await sign.lmqAuthorization("dash", "%(secret)s", method, url, body,
                                                  %(ts)d, "%(nonce)s")});
  }
  console.log(JSON.stringify(out));
})();
"""


def test_javascript_signatures_verify_in_python() -> None:
    node = shutil.which("node")
    require(node is not None, "node (Debian package 'nodejs') to run the dashboard's signer")
    script = _SCRIPT % {"ts": TS, "nonce": NONCE, "secret": SECRET}
    done = subprocess.run([node, "-e", script, str(DASHBOARD_DIR / "sign.js"),
                           json.dumps(CASES)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    keys = StaticKeyStore({"dash": (SECRET.encode(), Principal("dash", admin=True))})
    for (method, url, body), result in zip(CASES, results, strict=True):
        path, _, query = url.split("/", 3)[3].partition("?")
        path = "/" + path
        raw = (body or "").encode()
        assert result["canonical"] == canonical_request(method, path, query, TS, NONCE, raw)
        verifier = Verifier(keys, clock=lambda: TS)
        assert verifier.verify(result["header"], method, path, query, raw).name == "dash"
        with pytest.raises(SignatureError):
            Verifier(keys, clock=lambda: TS).verify(result["header"], method, path + "x",
                                                    query, raw)
        with pytest.raises(SignatureError):
            Verifier(keys, clock=lambda: TS).verify(result["header"], method, path, query,
                                                    raw + b" ")
