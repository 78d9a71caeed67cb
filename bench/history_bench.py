#!/usr/bin/env python3
"""The state history against PostgreSQL holding the same intervals, measured
as Montplaisir et al. 2013 measure their state history tree: build time,
size on disk and query latency, for each run folder given.

Per run: `crates/store/examples/history_bench` rebuilds the history from
the run's `thread_states.parquet` (timed), writes the intervals as COPY
text, picks queries from a fixed seed and answers them from the rebuilt
history, checked lane by lane against the run's `state_history.bin` (a
History opened per query, and one opened once). This
script then starts a private PostgreSQL cluster (initdb into a temporary
folder, listening only on a Unix socket there, run as the `postgres` user
when started as root; stopped and removed on success, error, SIGINT and
SIGTERM), loads the intervals with COPY, derives each CPU's running slices
from them in SQL the way deepspan does, and asks the same queries under
three index set-ups:

- `plain`: B-trees on (tid, start_ns) and (tid, end_ns) (CPUs alike) and
  the obvious overlap predicate (`end_ns > from AND start_ns < to`);
- `lane-aware`: the (tid, start_ns) B-tree only, and queries that use what
  the history's layout uses: a lane's intervals do not overlap, so at most
  one starting before `from` reaches into the window;
- `gist`: a GiST index on (tid, int8range(start_ns, end_ns, '[]'))
  (btree_gist), the range-overlap operator, the exact predicate as recheck.

Every answer (row count and sum of starts) must equal deepspan's; a
mismatch is printed and makes the script exit 1. Latencies are measured
with a warm cache: the history file read once before; the table and its
indexes loaded with pg_prewarm and the first queries of each kind run
unmeasured. PostgreSQL's are measured in this client through psycopg 3
(prepared statements over the Unix socket), so they include a round trip
that deepspan's in-process calls do not have; each side aggregates its
answer where it reads it, so neither hands the rows to a client.

The cluster runs with fsync=off, synchronous_commit=off,
full_page_writes=off and wal_level=minimal (the table is created in COPY's
transaction, so the load writes no WAL): deepspan's build does not fsync
either. shared_buffers=4GB and maintenance_work_mem=1GB, as a DBA would
give a bulk load on a 23 GB machine.

Needs psycopg 3 (`python3 -m venv V && V/bin/pip install 'psycopg[binary]'`,
then `V/bin/python bench/history_bench.py RUN…`), PostgreSQL 15's server
binaries (`--pg-bin`, default /usr/lib/postgresql/15/bin) and the example,
built with `cargo build --release -p deepspan-store --example history_bench`.
Timings only: this is never a test.
"""

import argparse
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import psycopg
    from psycopg import errors as pg_errors
except ImportError:
    sys.exit(
        "history_bench.py: error: psycopg 3 is not installed for "
        f"{sys.executable}: python3 -m venv V && V/bin/pip install 'psycopg[binary]', "
        "then run this script with V/bin/python"
    )

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
EXAMPLE = TARGET / "release" / "examples" / "history_bench"
KINDS = ["state_at", "thread_1ms", "thread_100ms", "thread_10s", "cpu_10ms"]
SETUPS = ["plain", "lane-aware", "gist"]
# Queries of each kind run unmeasured first: the prepared statement's plan
# settles after five executions (PostgreSQL's custom-plan trials).
WARMUP_QUERIES = 10

SCHEMA = """
CREATE TABLE intervals (
    tid int4 NOT NULL, start_ns int8 NOT NULL, end_ns int8 NOT NULL,
    state text NOT NULL, cpu int4, waker int4, syscall text, detail text)
"""

# Each CPU's lane as deepspan makes it (`tables::exclusive`): its threads'
# RUNNING intervals by (start, end), each started no earlier than the
# latest end before it, and dropped when nothing is left.
CPU_SLICES = """
CREATE TABLE cpu_slices AS
SELECT cpu, tid, greatest(start_ns, coalesce(previous_end, start_ns)) AS start_ns, end_ns
FROM (SELECT cpu, tid, start_ns, end_ns,
             max(end_ns) OVER (PARTITION BY cpu ORDER BY start_ns, end_ns
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS previous_end
      FROM intervals WHERE state = 'RUNNING' AND cpu >= 0) running
WHERE greatest(start_ns, coalesce(previous_end, start_ns)) < end_ns
"""

ANSWER = "SELECT count(*), coalesce(sum(start_ns), 0) FROM "

# Parameters: state_at (id, t); windows (id, from, to). Each query names its
# parameters by position through %(name)s so one dict serves them all.
QUERIES = {
    "plain": {
        "state_at": ANSWER + "intervals WHERE tid = %(id)s::int4 AND start_ns <= %(t)s::int8 AND end_ns > %(t)s::int8",
        "thread": ANSWER + "intervals WHERE tid = %(id)s::int4 AND end_ns > %(from)s::int8 AND start_ns < %(to)s::int8",
        "cpu": ANSWER + "cpu_slices WHERE cpu = %(id)s::int4 AND end_ns > %(from)s::int8 AND start_ns < %(to)s::int8",
    },
    # A lane's intervals are in order and do not overlap: the interval that
    # holds t is the last one starting at or before t (the longer of two
    # starting together: one may be empty), if it ends after t; a window's
    # are those starting inside it, and that one interval before it.
    "lane-aware": {
        "state_at": ANSWER
        + "(SELECT start_ns, end_ns FROM intervals WHERE tid = %(id)s::int4 AND start_ns <= %(t)s::int8"
        " ORDER BY start_ns DESC, end_ns DESC LIMIT 1) held WHERE end_ns > %(t)s::int8",
        "thread": ANSWER
        + "((SELECT start_ns, end_ns FROM intervals WHERE tid = %(id)s::int4 AND start_ns < %(from)s::int8"
        " ORDER BY start_ns DESC, end_ns DESC LIMIT 1) UNION ALL"
        " (SELECT start_ns, end_ns FROM intervals WHERE tid = %(id)s::int4"
        " AND start_ns >= %(from)s::int8 AND start_ns < %(to)s::int8)) overlapping WHERE end_ns > %(from)s::int8",
        "cpu": ANSWER
        + "((SELECT start_ns, end_ns FROM cpu_slices WHERE cpu = %(id)s::int4 AND start_ns < %(from)s::int8"
        " ORDER BY start_ns DESC, end_ns DESC LIMIT 1) UNION ALL"
        " (SELECT start_ns, end_ns FROM cpu_slices WHERE cpu = %(id)s::int4"
        " AND start_ns >= %(from)s::int8 AND start_ns < %(to)s::int8)) overlapping WHERE end_ns > %(from)s::int8",
    },
    # The index holds closed ranges: an empty interval [s, s) is an empty
    # int8range, which overlaps nothing, yet deepspan returns it when s is
    # inside the window. The exact predicate follows as a recheck.
    "gist": {
        "state_at": ANSWER
        + "intervals WHERE tid = %(id)s::int4 AND int8range(start_ns, end_ns, '[]') @> %(t)s::int8"
        " AND start_ns <= %(t)s::int8 AND end_ns > %(t)s::int8",
        "thread": ANSWER
        + "intervals WHERE tid = %(id)s::int4 AND int8range(start_ns, end_ns, '[]') && int8range(%(from)s::int8, %(to)s::int8, '[]')"
        " AND end_ns > %(from)s::int8 AND start_ns < %(to)s::int8",
        "cpu": ANSWER
        + "cpu_slices WHERE cpu = %(id)s::int4 AND int8range(start_ns, end_ns, '[]') && int8range(%(from)s::int8, %(to)s::int8, '[]')"
        " AND end_ns > %(from)s::int8 AND start_ns < %(to)s::int8",
    },
}

INDEXES = {
    "intervals_tid_start": "CREATE INDEX intervals_tid_start ON intervals (tid, start_ns)",
    "intervals_tid_end": "CREATE INDEX intervals_tid_end ON intervals (tid, end_ns)",
    "cpu_slices_cpu_start": "CREATE INDEX cpu_slices_cpu_start ON cpu_slices (cpu, start_ns)",
    "cpu_slices_cpu_end": "CREATE INDEX cpu_slices_cpu_end ON cpu_slices (cpu, end_ns)",
    "intervals_gist": "CREATE INDEX intervals_gist ON intervals USING gist (tid, int8range(start_ns, end_ns, '[]'))",
    "cpu_slices_gist": "CREATE INDEX cpu_slices_gist ON cpu_slices USING gist (cpu, int8range(start_ns, end_ns, '[]'))",
}
SETUP_INDEXES = {
    "plain": ["intervals_tid_start", "intervals_tid_end", "cpu_slices_cpu_start", "cpu_slices_cpu_end"],
    "lane-aware": ["intervals_tid_start", "cpu_slices_cpu_start"],
    "gist": ["intervals_gist", "cpu_slices_gist"],
}

SERVER_SETTINGS = {
    "listen_addresses": "''",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "wal_level": "minimal",
    "max_wal_senders": "0",
    "max_wal_size": "16GB",
    "shared_buffers": "4GB",
    "maintenance_work_mem": "1GB",
}


class Stop(Exception):
    """SIGTERM, turned into an exception so that `finally` removes the cluster."""


def on_sigterm(_signum, _frame):
    raise Stop("SIGTERM")


class Cluster:
    """A private PostgreSQL cluster in a temporary folder."""

    def __init__(self, pg_bin: Path, parent: Path):
        self.pg_bin = pg_bin
        for tool in ("initdb", "pg_ctl", "postgres"):
            if not (pg_bin / tool).is_file():
                sys.exit(f"history_bench.py: error: {pg_bin / tool} not found (--pg-bin)")
        self.dir = Path(tempfile.mkdtemp(prefix="history-bench-pg-", dir=parent))
        self.data = self.dir / "data"
        # The server refuses to run as root.
        self.user = None
        if os.geteuid() == 0:
            try:
                self.user = pwd.getpwnam("postgres")
            except KeyError:
                sys.exit("history_bench.py: error: run as root, this needs a `postgres` user to run the server as")
            os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        self.started = False

    def _run(self, *args: str):
        command = list(args)
        if self.user is not None:
            command = ["runuser", "-u", self.user.pw_name, "--"] + command
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")

    def start(self):
        self._run(str(self.pg_bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
                  "-E", "UTF8", "--locale=C", "--no-sync")
        options = " ".join(f"-c {k}={v}" for k, v in SERVER_SETTINGS.items())
        options += f" -c unix_socket_directories='{self.dir}'"
        self.started = True
        self._run(str(self.pg_bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "server.log"),
                  "-o", options, "-w", "-t", "120", "start")

    def connect(self):
        return psycopg.connect(host=str(self.dir), dbname="postgres", user="postgres", autocommit=True)

    def remove(self):
        if self.started:
            try:
                self._run(str(self.pg_bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
            except RuntimeError as e:
                print(f"history_bench.py: warning: stopping the cluster: {e}", file=sys.stderr)
        shutil.rmtree(self.dir, ignore_errors=True)


def timed(conn, sql: str) -> float:
    clock = time.perf_counter()
    conn.execute(sql)
    return time.perf_counter() - clock


def read_queries(path: Path) -> list:
    queries = []
    with open(path) as f:
        header = f.readline().rstrip("\n").split("\t")
        for line in f:
            row = dict(zip(header, line.rstrip("\n").split("\t")))
            queries.append({
                "kind": row["kind"],
                "id": int(row["id"]),
                "from": int(row["from_ns"]),
                "to": int(row["to_ns"]),
                "rows": int(row["rows"]),
                "start_sum": int(row["start_sum_ns"]),
            })
    return queries


def percentile(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[round((len(ordered) - 1) * q)]


def ask(conn, setup: str, queries: list, budget_s: float, mismatches: list) -> dict:
    """Each kind's queries under one index set-up, until done or out of
    budget: p50 and p99 in seconds, and how many ran."""
    figures = {}
    for kind in KINDS:
        of_kind = [q for q in queries if q["kind"] == kind]
        sql = QUERIES[setup]["state_at" if kind == "state_at" else kind.split("_")[0]]
        latencies = []
        started = time.perf_counter()
        timed_out = False
        for i, q in enumerate(of_kind):
            params = {"id": q["id"], "t": q["from"], "from": q["from"], "to": q["to"]}
            clock = time.perf_counter()
            try:
                rows, start_sum = conn.execute(sql, params, prepare=True).fetchone()
            except pg_errors.QueryCanceled:
                timed_out = True
                break
            elapsed = time.perf_counter() - clock
            if (rows, int(start_sum)) != (q["rows"], q["start_sum"]):
                mismatches.append(
                    f"{setup} {kind} id={q['id']} [{q['from']}, {q['to']}): PostgreSQL {rows} rows "
                    f"(starts summing to {start_sum}), deepspan {q['rows']} ({q['start_sum']})"
                )
            if i >= WARMUP_QUERIES or len(of_kind) <= WARMUP_QUERIES:
                latencies.append(elapsed)
            if time.perf_counter() - started > budget_s:
                break
        figures[kind] = {
            "n": len(latencies),
            "asked": len(of_kind),
            "timed_out": timed_out,
            "p50_s": percentile(latencies, 0.5) if latencies else None,
            "p99_s": percentile(latencies, 0.99) if latencies else None,
        }
        print(f"  {setup:10} {kind:12} {fmt_pair(figures[kind])}  ({len(latencies)} of {len(of_kind)})",
              file=sys.stderr)
    return figures


def postgres_side(cluster: Cluster, work: Path, deepspan: dict, queries: list, budget_s: float,
                  setup_names: list, mismatches: list) -> dict:
    conn = cluster.connect()
    conn.execute("CREATE EXTENSION btree_gist")
    conn.execute("CREATE EXTENSION pg_prewarm")
    tsv = work / "intervals.tsv"
    clock = time.perf_counter()
    # One transaction: with wal_level=minimal a table made in COPY's own
    # transaction is loaded without WAL.
    with conn.transaction():
        conn.execute(SCHEMA)
        conn.execute(f"COPY intervals FROM '{tsv}'")
    load_s = time.perf_counter() - clock
    cpu_s = timed(conn, CPU_SLICES)
    (cpu_slices,) = conn.execute("SELECT count(*) FROM cpu_slices").fetchone()
    if cpu_slices != deepspan["cpu_slices"]:
        mismatches.append(f"cpu_slices: PostgreSQL derived {cpu_slices} CPU slices, deepspan {deepspan['cpu_slices']}")
    (rows,) = conn.execute("SELECT count(*) FROM intervals").fetchone()
    if rows != deepspan["intervals"]:
        mismatches.append(f"intervals: PostgreSQL loaded {rows} rows, deepspan wrote {deepspan['intervals']}")
    print(f"  loaded {rows} intervals in {load_s:.1f} s, {cpu_slices} CPU slices in {cpu_s:.1f} s", file=sys.stderr)
    table_bytes = sum(conn.execute(f"SELECT pg_total_relation_size('{t}')").fetchone()[0]
                      for t in ("intervals", "cpu_slices"))
    conn.execute(f"SET statement_timeout = {int(budget_s * 1000)}")

    index_s = {}
    setups = {}
    built = set()
    for setup in setup_names:
        wanted = SETUP_INDEXES[setup]
        for name in sorted(built - set(wanted)):
            conn.execute(f"DROP INDEX {name}")
            built.discard(name)
        conn.execute("SET statement_timeout = 0")
        for name in wanted:
            if name not in built:
                index_s[name] = timed(conn, INDEXES[name])
                built.add(name)
        analyze_s = timed(conn, "VACUUM ANALYZE intervals") + timed(conn, "VACUUM ANALYZE cpu_slices")
        for relation in ["intervals", "cpu_slices"] + wanted:
            conn.execute(f"SELECT pg_prewarm('{relation}')")
        conn.execute(f"SET statement_timeout = {int(budget_s * 1000)}")
        size = sum(conn.execute(f"SELECT pg_total_relation_size('{t}')").fetchone()[0]
                   for t in ("intervals", "cpu_slices"))
        setups[setup] = {
            "indexes": wanted,
            "index_s": sum(index_s[n] for n in wanted),
            "analyze_s": analyze_s,
            "bytes": size,
            "queries": ask(conn, setup, queries, budget_s, mismatches),
        }
        print(f"  {setup}: indexes {setups[setup]['index_s']:.1f} s, {size / 1e6:.0f} MB", file=sys.stderr)
    conn.close()
    return {
        "load_s": load_s,
        "cpu_slices_s": cpu_s,
        "table_bytes": table_bytes,
        "index_s": index_s,
        "setups": setups,
    }


def fmt_s(s) -> str:
    if s is None:
        return "–"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs" if s >= 10e-6 else f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms" if s < 10e-3 else f"{s * 1e3:.0f} ms"
    return f"{s:.2f} s"


def fmt_pair(f: dict) -> str:
    text = f"{fmt_s(f['p50_s'])} / {fmt_s(f['p99_s'])}"
    if f.get("asked") and f["n"] < f["asked"] - WARMUP_QUERIES:
        text += f" (n={f['n']}{', timed out' if f.get('timed_out') else ''})"
    return text


def markdown(results: list) -> str:
    lines = [
        "| trace | intervals (CPU slices) | deepspan build s | deepspan MB | PG load s | PG CPU lanes s "
        "| PG index s: plain / lane-aware / gist | PG MB: plain / lane-aware / gist | PG MB ÷ deepspan MB (lane-aware) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        d, p = r["deepspan"], r["postgres"]
        s = p["setups"]
        mb = lambda b: f"{b / 1e6:.0f}" if b >= 10e6 else f"{b / 1e6:.1f}"
        lines.append(
            f"| {d['trace_bytes'] / 1e6:.0f} MB | {d['intervals'] / 1e6:.2f} M ({d['cpu_slices'] / 1e6:.2f} M) "
            f"| {d['build_s']:.2f} | {mb(d['history_bytes'])} | {p['load_s']:.1f} | {p['cpu_slices_s']:.1f} "
            f"| {' / '.join(format(s[x]['index_s'], '.1f') if x in s else '–' for x in SETUPS)} "
            f"| {' / '.join(mb(s[x]['bytes']) if x in s else '–' for x in SETUPS)} "
            f"| {format(s['lane-aware']['bytes'] / d['history_bytes'], '.1f') if 'lane-aware' in s else '–'} |"
        )
    lines += [
        "",
        "p50 / p99 per query kind (warm unless said):",
        "",
        "| trace | query | rows (mean) | deepspan, History per query | deepspan warm | PG plain | PG lane-aware "
        "| PG gist | best PG p50 ÷ deepspan warm p50 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        d, p = r["deepspan"], r["postgres"]
        for kind in KINDS:
            dk = d["queries"][kind]
            missing = {"n": 0, "p50_s": None, "p99_s": None}
            pg = [p["setups"][x]["queries"][kind] if x in p["setups"] else missing for x in SETUPS]
            best = min((f["p50_s"] for f in pg if f["p50_s"] is not None), default=None)
            ratio = f"{best / dk['warm']['p50_s']:.1f}" if best is not None else "–"
            lines.append(
                f"| {d['trace_bytes'] / 1e6:.0f} MB | {kind} | {dk['rows_mean']:.0f} "
                f"| {fmt_pair(dk['fresh'])} | {fmt_pair(dk['warm'])} | "
                + " | ".join(fmt_pair(f) for f in pg)
                + f" | {ratio} |"
            )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders, each analysed by `deepspan analyze`")
    parser.add_argument("--queries", type=int, default=500, help="queries of each kind (default 500)")
    parser.add_argument("--long-queries", type=int, default=50, help="queries of 10 s windows (default 50)")
    parser.add_argument("--seed", type=int, default=20130)
    parser.add_argument("--budget", type=float, default=30.0,
                        help="seconds of PostgreSQL queries per kind and index set-up; also each query's timeout")
    parser.add_argument("--work", type=Path, help="keep each run's files under WORK/RUN_NAME (default: a temporary folder, removed)")
    parser.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()),
                        help="where the cluster and the temporary files go")
    parser.add_argument("--pg-bin", type=Path, default=Path("/usr/lib/postgresql/15/bin"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "history_bench.json")
    parser.add_argument("--setups", default=",".join(SETUPS),
                        help=f"index set-ups to measure, of {','.join(SETUPS)} (gist builds slowly: "
                        "about a minute per million intervals here)")
    args = parser.parse_args()
    setups = [s for s in args.setups.split(",") if s]
    unknown = [s for s in setups if s not in SETUPS]
    if unknown or not setups:
        sys.exit(f"history_bench.py: error: --setups: unknown {unknown}, expected some of {','.join(SETUPS)}")
    if not EXAMPLE.is_file():
        sys.exit(f"history_bench.py: error: {EXAMPLE} not found: "
                 "cargo build --release -p deepspan-store --example history_bench")
    signal.signal(signal.SIGTERM, on_sigterm)

    results = []
    mismatches = []
    for run in args.runs:
        print(f"history_bench.py: {run}", file=sys.stderr)
        scratch = None
        if args.work:
            work = args.work / run.resolve().name
        else:
            scratch = Path(tempfile.mkdtemp(prefix="history-bench-", dir=args.tmp))
            work = scratch
        cluster = None
        try:
            work.mkdir(parents=True, exist_ok=True)
            # The server reads intervals.tsv itself (COPY FROM a file).
            os.chmod(work, 0o755)
            subprocess.run([str(EXAMPLE), str(run), str(work), "--queries", str(args.queries),
                            "--long-queries", str(args.long_queries), "--seed", str(args.seed)], check=True)
            deepspan = json.loads((work / "deepspan.json").read_text())
            queries = read_queries(work / "queries.tsv")
            cluster = Cluster(args.pg_bin, args.tmp)
            cluster.start()
            postgres = postgres_side(cluster, work, deepspan, queries, args.budget, setups, mismatches)
            results.append({"run": str(run), "deepspan": deepspan, "postgres": postgres})
        except subprocess.CalledProcessError as e:
            sys.exit(f"history_bench.py: error: {' '.join(map(str, e.cmd))} exited with {e.returncode}")
        finally:
            if cluster is not None:
                cluster.remove()
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"results": results, "mismatches": mismatches}, indent=1))
    print(markdown(results))
    if mismatches:
        print(f"\nhistory_bench.py: FAILED: {len(mismatches)} answers differ between PostgreSQL and deepspan:",
              file=sys.stderr)
        for m in mismatches[:50]:
            print(f"  MISMATCH {m}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    try:
        main()
    except (KeyboardInterrupt, Stop) as e:
        sys.exit(f"history_bench.py: interrupted ({type(e).__name__}); the cluster was removed")
