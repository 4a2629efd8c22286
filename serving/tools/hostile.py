"""Hypothesis strategies for request bodies a JSON encoder would never write.

Bodies are built as bytes, so a value can be anything that reaches the server's parser: JSON
text with unpaired surrogate escapes, nesting thousands deep, integers past 64 bits (and past
Python's 4,300-digit conversion limit), denormal and out-of-range floats, NaN/Infinity
literals, raw bytes that are not UTF-8. Each body is a plausible request with one field
(or an unknown one) replaced by such a value.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

FIELDS = ("model", "prompt", "stop", "seed", "temperature", "top_p", "top_k", "max_tokens", "n",
          "stream", "stop_token_ids", "logit_bias", "presence_penalty", "response_format", "unknown_field")
CHAT_FIELDS = FIELDS[:1] + FIELDS[2:] + ("messages", "content")
FLOAT_TEXTS = ("5e-324", "1e-310", "1e-45", "2.2250738585072014e-308", "1e-400", "1e400", "-0.0",
               "1e-300", "NaN", "Infinity", "-Infinity", "0.99999999999999999999")


def _escape(code: int) -> bytes:
    return b"\\u%04x" % code


@st.composite
def surrogate_strings(draw) -> bytes:
    """A JSON string literal holding an unpaired surrogate escape (alone, or among text)."""
    before = draw(st.text(max_size=6)).encode("utf-8", "surrogatepass")
    lone = _escape(draw(st.integers(0xD800, 0xDFFF)))
    after = draw(st.text(max_size=6)).encode("utf-8", "surrogatepass")
    return b'"' + _json_inner(before) + lone + _json_inner(after) + b'"'


def _json_inner(raw: bytes) -> bytes:
    return json.dumps(raw.decode("utf-8", "surrogatepass"), ensure_ascii=True)[1:-1].encode()


@st.composite
def deep_nesting(draw) -> bytes:
    depth = draw(st.one_of(st.integers(1, 64), st.integers(900, 1100), st.integers(2000, 20000)))
    opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
    return opener * depth + b"1" + closer * depth


def huge_integers() -> st.SearchStrategy[bytes]:
    edges = st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 2**1000])
    around = st.integers(-(2**70), 2**70)
    digits = st.integers(4200, 5000).map(lambda n: b"1" + b"0" * n)        # beyond int() parsing limits
    return st.one_of(edges.map(lambda v: str(v).encode()), around.map(lambda v: str(v).encode()), digits)


def odd_floats() -> st.SearchStrategy[bytes]:
    return st.one_of(st.sampled_from(FLOAT_TEXTS).map(str.encode),
                     st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=True).map(lambda f: repr(f).encode()))


def invalid_utf8() -> st.SearchStrategy[bytes]:
    raw = st.sampled_from([b"\xff", b"\xfe\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"])
    return st.tuples(st.text(max_size=4), raw).map(lambda t: b'"' + t[0].encode() + t[1] + b'"')


def hostile_values() -> st.SearchStrategy[bytes]:
    return st.one_of(surrogate_strings(), deep_nesting(), huge_integers(), odd_floats(), invalid_utf8(),
                     st.sampled_from([b"null", b"true", b"[]", b"{}", b'""', b'[""]', b"[-1]"]))


@st.composite
def hostile_bodies(draw) -> tuple[str, bytes]:
    """(path, body bytes): a small valid request with one field replaced by a hostile value."""
    chat = draw(st.booleans())
    fields = {"max_tokens": b"3", "temperature": b"0"}
    fields["messages" if chat else "prompt"] = (b'[{"role": "user", "content": "hi"}]' if chat else b'"hi"')
    name = draw(st.sampled_from(CHAT_FIELDS if chat else FIELDS))
    value = draw(hostile_values())
    if name == "content":                  # inside the message, not at the top level
        fields["messages"] = b'[{"role": "user", "content": ' + value + b"}]"
    else:
        fields[name] = value
    body = b"{" + b", ".join(b'"' + k.encode() + b'": ' + v for k, v in fields.items()) + b"}"
    return ("/v1/chat/completions" if chat else "/v1/completions"), body
