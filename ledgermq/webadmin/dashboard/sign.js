// Signs admin API requests in the browser (WebCrypto HMAC-SHA256), exactly as
// ledgermq/webadmin/signing.py does: the same canonical string, the same MAC
// (ledgermq.wire.auth.request_signature: HMAC over a domain tag, then the
// string's length as 4 big-endian bytes, then the string). The secret never
// leaves the page. Also loaded by node in tests/ops/test_dashboard_signing.py.
"use strict";

const LMQ_SCHEME = "LMQ-HMAC-SHA256";
const LMQ_DOMAIN = "ledgermq-auth-v1 http\u0000";

// Percent-encode everything but RFC 3986's unreserved characters (Python's
// quote(text, safe="")): encodeURIComponent also keeps !'()*.
function lmqEnc(text) {
  return encodeURIComponent(text).replace(/[!'()*]/g,
    (c) => "%" + c.charCodeAt(0).toString(16).toUpperCase());
}

function lmqDecode(text) {
  try {
    return decodeURIComponent(text);
  } catch (err) {
    return text;  // not valid percent-encoding: Python's unquote leaves it as is
  }
}

function lmqCanonicalPath(path) {
  return path.split("/").map((segment) => lmqEnc(lmqDecode(segment))).join("/");
}

function lmqCanonicalQuery(search) {
  const pairs = [];
  for (const [name, value] of new URLSearchParams(search)) {
    pairs.push(`${lmqEnc(name)}=${lmqEnc(value)}`);
  }
  return pairs.sort().join("&");  // ASCII only by now: same order as Python's sorted()
}

function lmqHex(buffer) {
  return [...new Uint8Array(buffer)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

async function lmqCanonical(method, url, body, timestampMs, nonce) {
  const u = new URL(url);
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(body || ""));
  return [LMQ_SCHEME, method.toUpperCase(), lmqCanonicalPath(u.pathname),
    lmqCanonicalQuery(u.search), String(timestampMs), nonce, lmqHex(digest)].join("\n");
}

// The Authorization header for `method url` with `body` (a string or null).
async function lmqAuthorization(accessKey, secret, method, url, body, timestampMs, nonce) {
  const ts = timestampMs ?? Date.now();
  const n = nonce ?? lmqHex(crypto.getRandomValues(new Uint8Array(16)));
  const text = new TextEncoder().encode(await lmqCanonical(method, url, body, ts, n));
  const domain = new TextEncoder().encode(LMQ_DOMAIN);
  const message = new Uint8Array(domain.length + 4 + text.length);
  message.set(domain, 0);
  new DataView(message.buffer).setUint32(domain.length, text.length, false);
  message.set(text, domain.length + 4);
  const key = await crypto.subtle.importKey("raw", new TextEncoder().encode(secret),
    { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const signature = lmqHex(await crypto.subtle.sign("HMAC", key, message));
  return `${LMQ_SCHEME} Credential=${accessKey}, Timestamp=${ts}, Nonce=${n}, ` +
    `Signature=${signature}`;
}

if (typeof module !== "undefined") {
  module.exports = { lmqAuthorization, lmqCanonical, lmqCanonicalPath, lmqCanonicalQuery };
}
