"""The deepspan-dcpt-path wire format: shared vectors (also read by the Rust
decoder), the size bound and its truncation marker, escaping."""

import dataclasses
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
    format_path,
)

VECTORS = json.loads((pathlib.Path(__file__).parent / "dcpt_vectors.json").read_text(encoding="utf-8"))


def expected_hop(v):
    return Hop(
        v["service"], v["operation"], v["self_us"], v["total_us"], v.get("cause"), v.get("cause_us"),
        v["depth"], v.get("call_us"),
    )


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
        tuple(
            Hop(f"s{i:04d}".ljust(name_len, "x"), "GET /step", 100, 100 * (n - i), depth=i,
                call_us=100 * (n - i) + 5 if i else None)
            for i in range(n)
        )
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
    deeper = (dataclasses.replace(h, depth=h.depth + 1) for h in first.hops)
    longer = CriticalPath((Hop("front", "GET /", 5, 10**6), *deeper), first.dropped)
    again = decode(encode(longer))
    assert len(again.hops) + again.dropped == 301
    assert again.hops[0].service == "front"


def test_names_are_cut_so_one_hop_always_fits():
    huge = "é" * 5000  # 2 bytes each: the cut must fall on a character boundary.
    hop = Hop(huge, huge + "\U0001F600", 1, 2, huge, 3)
    text = encode_hop(hop)
    back = decode("2;" + text).hops[0]
    assert back.service == "é" * (MAX_NAME_BYTES // 2)
    assert back.operation == back.service and back.cause == back.service
    path = CriticalPath((hop, dataclasses.replace(hop, depth=1), dataclasses.replace(hop, depth=2)))
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
    assert decode(b"2;a:b:1:2").hops[0].service == "a"
    with pytest.raises(DcptError) as err:
        decode(b"2;a:\xff:1:2")
    assert err.value.offset == 4


def test_a_tree_cut_to_the_bound_is_a_prefix_of_its_hops():
    calls = [Hop(f"callee-{i:03d}", "GET /" + "x" * 40, 10, 20, depth=1 + i % 3, call_us=25) for i in range(300)]
    path = CriticalPath((Hop("front", "GET /", 5, 10**6), *calls))
    back = decode(encode(path))
    kept = len(back.hops)
    assert 10 < kept < 301 and back.hops == path.hops[:kept] and back.dropped == 301 - kept


def test_depths_that_are_not_a_preorder_are_refused_when_encoding():
    root = Hop("a", "x", 1, 2)
    for depths in ([1], [0, 2], [0, 1, 0]):
        hops = tuple(dataclasses.replace(root, depth=d) for d in depths)
        with pytest.raises(ValueError, match="not a preorder"):
            encode(CriticalPath(hops))


def test_wire_time_is_what_the_caller_waited_beyond_the_callees_total():
    tree = decode("2;front:GET%20/:100:1000;300@a:x:250:250;1^600@b:y:500:550")
    assert [tree.wire_us(i) for i in range(3)] == [None, 50, 50]
    # Version 1 has no call times: a lone child's wire time comes from its caller's.
    chain_v1 = decode("1;front:GET%20/:100:1000;a:x:800:850")
    assert [chain_v1.wire_us(i) for i in range(2)] == [None, 50]
    # A callee reporting more than its caller waited (clocks that jumped): unknown.
    assert decode("2;front:GET%20/:100:1000;300@a:x:250:400").wire_us(1) is None


def test_the_human_form_shows_calls_made_in_turn_in_brackets():
    path = decode("2;a:x:5:100;50@b:y:9:49;40@c:z:39:39;2^45@d:w:45:45;+2")
    assert format_path(path) == "a x 5/100µs -> [b y 9/49µs -> c z 39/39µs; d w 45/45µs] (+2 hops dropped)"
    # A chain as deep as a value can hold is printed without recursion.
    deep = decode("1;" + ";".join(["a:b:0:0"] * 2000))
    assert format_path(deep).count(" -> ") == 1999
