"""The analysis tables as docs/tables.md documents them, read in place by
chDB (ClickHouse in process): every table and column with its type, a
fleet glob over several runs, and the documented example queries agreeing
with `deepspan analyze` (its printed table and requests.json)."""

import json
import re
import subprocess
from collections import defaultdict
from pathlib import Path

import chdb
import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "tables.md"
# Tables with rows only where the run had them: no process of this test's
# run ran in a container, and no request of it may name its connection.
MAY_BE_EMPTY = {"containers", "queue_path"}


def documented_tables():
    """{table: [(column, type)]} from the `### table` sections."""
    text = DOC.read_text()
    tables = {}
    for section in re.split(r"^### ", text, flags=re.M)[1:]:
        name, _, body = section.partition("\n")
        rows = re.findall(r"^\| ([a-z0-9_]+) \| ([A-Za-z0-9()]+) \|", body, flags=re.M)
        rows = [r for r in rows if r != ("column", "type")]
        assert rows, f"docs/tables.md: no columns under ### {name}"
        tables[name.strip()] = rows
    return tables


def example_queries():
    text = DOC.read_text().split("## Example queries", 1)[1].split("## The fleet path", 1)[0]
    return re.findall(r"```sql\n(.*?)```", text, flags=re.S)


def query(sql):
    """Rows of a query as dicts (64-bit integers as ClickHouse quotes them)."""
    result = chdb.query(sql, "JSONEachRow")
    return [json.loads(line) for line in str(result).splitlines() if line.strip()]


def test_the_contract_names_its_version_and_tables():
    text = DOC.read_text()
    assert re.search(r"\*\*Version: 1\.\*\*", text)
    assert list(documented_tables()) == [
        "thread_states", "syscalls", "requests", "critical_path", "queue_path",
        "request_summary", "request_syscalls", "diagnoses", "operation_summary",
        "containers",
    ]
    assert len(example_queries()) == 3


def test_every_table_starts_with_the_documented_columns_and_types(run):
    analysis = run / "analysis"
    tables = documented_tables()
    on_disk = sorted(p.stem for p in analysis.glob("*.parquet"))
    assert on_disk == sorted(tables), "tables on disk and in docs/tables.md differ"
    version = json.loads((analysis / "requests.json").read_text())["format_version"]
    assert version == 1, "docs/tables.md documents version 1"
    for table, columns in tables.items():
        described = [
            (r["name"], r["type"])
            for r in query(f"DESCRIBE file('{analysis}/{table}.parquet', Parquet)")
        ]
        assert described[: len(columns)] == columns, (
            f"{table}: docs/tables.md says {columns}, the file has {described}: "
            "a layout may only add columns at the end"
        )
        # Added columns are allowed by the contract, but this checkout must
        # document what it writes.
        assert len(described) == len(columns), f"{table}: not in docs/tables.md: {described[len(columns):]}"
        rows = query(f"SELECT count() AS n FROM file('{analysis}/{table}.parquet', Parquet)")
        assert int(rows[0]["n"]) > 0 or table in MAY_BE_EMPTY, f"{table} is empty"


def test_a_glob_over_a_fleet_of_runs_reads_each_table_from_every_run(run, tmp_path):
    # Two "hosts" holding the same run: a glob reads both, `_path` tells them apart.
    for host in ("host-a", "host-b"):
        (tmp_path / host).mkdir()
        (tmp_path / host / "analysis").symlink_to(run / "analysis")
    for table in documented_tables():
        one = query(f"SELECT count() AS n FROM file('{run}/analysis/{table}.parquet', Parquet)")
        if int(one[0]["n"]) == 0 and table in MAY_BE_EMPTY:
            continue
        rows = query(
            f"SELECT _path AS path, count() AS n "
            f"FROM file('{tmp_path}/*/analysis/{table}.parquet', Parquet) GROUP BY path ORDER BY path"
        )
        assert [int(r["n"]) for r in rows] == [int(one[0]["n"])] * 2, table
        assert [Path(r["path"]).parts[-3] for r in rows] == ["host-a", "host-b"]


def sql(index, run):
    return example_queries()[index].replace("{run}", str(run))


ANALYZE_LINE = re.compile(
    r"^\s*[\d.]+ \S+ (?P<mark>[! ]) (?P<span>[0-9a-f]{16})  .{20}  (?P<cause>\S+)(?: (?P<pct>[\d.]+) %)?\s*$"
)


def test_slowest_requests_and_causes_match_deepspan_analyze(deepspan, run):
    printed = subprocess.run(
        [str(deepspan), "analyze", str(run), "--top", "10"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert printed[0].startswith("Slowest requests (10 of"), printed[0]
    lines = printed[2:]
    expected = []
    for i, line in enumerate(lines):
        m = ANALYZE_LINE.match(line)
        if m:
            headline = lines[i + 1].strip() if m["pct"] is not None else None
            expected.append((m["span"], m["mark"] == "!", m["cause"], m["pct"], headline))
    assert len(expected) == 10, "\n".join(printed)
    rows = query(sql(0, run))
    got = [
        (r["span_id"], bool(r["anomalous"]), r["cause"] or "-", r["share_pct"], r["headline"])
        for r in rows
    ]
    assert [g[:3] for g in got] == [e[:3] for e in expected]
    for g, e in zip(got, expected):
        if e[3] is not None:
            # analyze prints one decimal, the query rounds to a whole per cent.
            assert abs(float(g[3]) - float(e[3])) <= 1, (g, e)
            assert g[4] == e[4] or e[4].endswith("…") and g[4].startswith(e[4][:-1]), (g, e)
    # The first cause is the run's diagnosis: the row lock, found through its backend.
    assert "blocked_by_request" in {g[2] for g in got}


def requests_json(run):
    return json.loads((run / "analysis" / "requests.json").read_text())["requests"]


def test_top_culprits_per_service_match_the_diagnoses_of_requests_json(run):
    totals = defaultdict(lambda: [0, 0])
    for r in requests_json(run):
        if not r["anomalous"] or not r["diagnosis"]:
            continue
        for c in r["diagnosis"]["culprits"]:
            if c.get("comm"):
                name = c["comm"]
            elif c.get("service") or c.get("operation"):
                name = f"[{c.get('service', '')}] {c.get('operation', '')}"
            else:
                name = c.get("name", "")
            key = (r["service"], c["kind"], name, c.get("pid"))
            totals[key][0] += 1
            totals[key][1] += c["ns"]
    ordered = sorted(
        totals.items(),
        key=lambda kv: (kv[0][0], -kv[1][1], kv[0][2], -1 if kv[0][3] is None else kv[0][3]),
    )
    per_service = defaultdict(list)
    for key, (count, ns) in ordered:
        if len(per_service[key[0]]) < 3:
            per_service[key[0]].append((*key, count, ns))
    want = [row for service in sorted(per_service) for row in per_service[service]]
    got = [
        (r["service"], r["kind"], r["culprit"], None if r["pid"] is None else int(r["pid"]),
         int(r["requests"]), int(r["ns"]))
        for r in query(sql(1, run))
    ]
    assert want, "no anomalous request with culprits in the run"
    assert got == want


def test_causes_per_operation_over_time_match_requests_json(run):
    requests = requests_json(run)
    t0 = min(r["start_ns"] for r in requests)
    buckets = defaultdict(lambda: [0, 0])
    for r in requests:
        cause = (r["diagnosis"] or {}).get("cause") or "none"
        key = (r["service"], r["operation"], (r["start_ns"] - t0) // 1_000_000_000, cause)
        buckets[key][0] += 1
        buckets[key][1] += r["duration_ns"]
    want = sorted((*k, n, d) for k, (n, d) in buckets.items())
    got = [
        (r["service"], r["operation"], int(r["second"]), r["cause"], int(r["requests"]), int(r["duration_ns"]))
        for r in query(sql(2, run))
    ]
    assert got == want
    assert any(row[3] == "blocked_by_request" for row in got)
