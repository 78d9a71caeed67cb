"""The deepspan-dcpt-path wire format: shared vectors (also read by the Rust
decoder), the size bound and its truncation marker, escaping."""

import json
import pathlib

import pytest

from deepspan_otel.dcpt import (
    MAX_HEADER_BYTES,
    MAX_NAME_BYTES,
    CriticalPath,
    DcptError,
    Hop,
    decode,
    encode,
    encode_hop,
)

VECTORS = json.loads((pathlib.Path(__file__).parent / "dcpt_vectors.json").read_text(encoding="utf-8"))


def expected_hop(v):
    return Hop(v["service"], v["operation"], v["self_us"], v["total_us"], v.get("cause"), v.get("cause_us"))


@pytest.mark.parametrize("case", VECTORS["valid"], ids=lambda c: c["name"])
def test_valid_vectors(case):
    path = decode(case["value"])
    assert path == CriticalPath(tuple(expected_hop(h) for h in case["hops"]), case["dropped"])
    if case["canonical"]:
        assert encode(path) == case["value"]
    # Whatever the input's spelling, encoding is a fixed point.
    assert decode(encode(path)) == path


@pytest.mark.parametrize("case", VECTORS["invalid"], ids=lambda c: c["name"])
def test_invalid_vectors_fail_at_their_offset(case):
    with pytest.raises(DcptError) as err:
        decode(case["value"])
    assert err.value.offset == case["error_offset"], str(err.value)
    assert f"at byte {case['error_offset']}" in str(err.value)


def chain(n, name_len=10):
    return CriticalPath(
        tuple(Hop(f"s{i:04d}".ljust(name_len, "x"), "GET /step", 100, 100 * (n - i)) for i in range(n))
    )


def test_a_long_path_is_cut_at_the_deep_end_with_a_marker_counting_the_missing_hops():
    path = chain(1000)
    value = encode(path)
    assert len(value) <= MAX_HEADER_BYTES
    back = decode(value)
    kept = len(back.hops)
    assert 50 < kept < 1000
    assert back.hops == path.hops[:kept]
    assert back.dropped == 1000 - kept
    assert value.endswith(f";+{1000 - kept}")
    # The bound is used, not just respected: one hop more does not fit.
    assert len(encode(CriticalPath(path.hops[: kept + 1], back.dropped - 1), limit=10**9)) > MAX_HEADER_BYTES


def test_a_cut_path_cut_again_adds_up_the_dropped_hops():
    first = decode(encode(chain(300)))
    longer = CriticalPath((Hop("front", "GET /", 5, 10**6), *first.hops), first.dropped)
    again = decode(encode(longer))
    assert len(again.hops) + again.dropped == 301
    assert again.hops[0].service == "front"


def test_names_are_cut_so_one_hop_always_fits():
    huge = "é" * 5000  # 2 bytes each: the cut must fall on a character boundary.
    hop = Hop(huge, huge + "\U0001F600", 1, 2, huge, 3)
    text = encode_hop(hop)
    back = decode("1;" + text).hops[0]
    assert back.service == "é" * (MAX_NAME_BYTES // 2)
    assert back.operation == back.service and back.cause == back.service
    path = CriticalPath((hop, hop, hop))
    value = encode(path)
    assert len(value) <= MAX_HEADER_BYTES
    assert decode(value).dropped == 1


def test_undecodable_names_still_give_a_valid_value():
    hop = Hop("svc\udcff", "GET /\ud800x", 1, 2)
    back = decode(encode(CriticalPath((hop,)))).hops[0]
    assert (back.service, back.operation) == ("svc?", "GET /?x")


def test_the_value_is_a_header_safe_token_list_without_commas():
    path = CriticalPath((Hop("a b,c;d:e+f%g\r\n\x00", "GET /x?y=1&z", 1, 2),))
    value = encode(path)
    assert all(33 <= ord(c) < 127 for c in value)
    assert "," not in value and " " not in value
    assert decode(value) == path


def test_bytes_are_accepted_and_non_ascii_bytes_rejected_at_their_offset():
    assert decode(b"1;a:b:1:2").hops[0].service == "a"
    with pytest.raises(DcptError) as err:
        decode(b"1;a:\xff:1:2")
    assert err.value.offset == 4
