"""Small instrumented programs whose kernel critical paths are known in
advance, for crates/cli/tests/it/analyze_real.rs.

Usage: python3 cases.py CASE OUT_DIR [CGROUP_DIR]

Each case runs one or two requests (root spans of service "analyze-test")
with the deepspan processor installed. Spans are exported over OTLP/HTTP to
OTEL_EXPORTER_OTLP_ENDPOINT (what `deepspan record` gives the command: its
run's receiver); without that variable they are written as an OTLP protobuf
request to OUT_DIR/spans.pb, for `deepspan import`. The span ids of the
requests go to OUT_DIR/ids.json ({"name": "16 hex digits"}).

Cases:
  lock     request "holder" takes a lock and sleeps 300 ms holding it;
           request "waiter" starts once the lock is held and waits for it.
  cgroup   request "throttled" runs in a CPU cgroup limited to 1 % of a CPU
           (CGROUP_DIR, made by the test) and burns ~15 ms of CPU.
  odirect  request "read" reads 16 MiB with O_DIRECT (no page cache).
  sleep    request "sleep" sleeps 200 ms.
  diskflood
           a "backup" process writes 1 MiB blocks with O_DIRECT in a loop;
           meanwhile request "read" reads 8 MiB with O_DIRECT. The backup's
           pid goes to ids.json as "backup_pid".
  hog      two busy processes named "cpuhog" pinned to one CPU; request
           "contended", pinned there too, burns 60 ms of CPU. Their pids go
           to ids.json as "hog_pids" ("pid,pid").
  hogpods  hog, each hog moved into a container's CPU cgroup as the kubelet
           lays them out, made under this process's own (v1): the first in
           the cgroupfs layout, the second in the systemd one. ids.json
           also has "hog_containers": "pid=CONTAINER_ID/POD_UID,…".
  hogpodman
           hog, the hogs being two podman containers (busybox, a shell
           loop) under this process's own CPU cgroup. ids.json has
           "hog_containers": "pid=CONTAINER_ID/NAME,…".
  pgrowlock PORT MODE
           PostgreSQL on 127.0.0.1:PORT (user postgres, trust): request
           "holder" updates row 1 of table t and keeps its transaction open
           300 ms (MODE server: SELECT pg_sleep in the backend; client:
           time.sleep in Python) before committing; request "waiter" updates
           the same row meanwhile and waits for the row lock. The backends'
           pids go to ids.json as "holder_backend" and "waiter_backend".
"""

import json
import mmap
import os
import subprocess
import sys
import threading
import time

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import deepspan_otel

# The demo's harness: how podman's cgroups are removed.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "demo"))
from harness.containers import hierarchies_without, remove_podman_cgroups  # noqa: E402

provider = TracerProvider(resource=Resource.create({"service.name": "analyze-test"}))
deepspan_otel.install(provider)
exporter = InMemorySpanExporter()
provider.add_span_processor(SimpleSpanProcessor(exporter))
if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(timeout=10)))
tracer = provider.get_tracer("analyze-test")
ids = {}


def remember(name, span):
    ids[name] = format(span.get_span_context().span_id, "016x")


def case_lock(_args):
    lock = threading.Lock()
    held = threading.Event()

    def holder():
        with tracer.start_as_current_span("holder") as span:
            remember("holder", span)
            with lock:
                held.set()
                time.sleep(0.3)

    def waiter():
        held.wait()
        with tracer.start_as_current_span("waiter") as span:
            remember("waiter", span)
            with lock:
                pass

    threads = [threading.Thread(target=holder), threading.Thread(target=waiter)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def burn(cpu_seconds):
    """Spins until this thread has used `cpu_seconds` of CPU."""
    start = time.thread_time()
    x = 0
    while time.thread_time() - start < cpu_seconds:
        for i in range(1000):
            x += i
    return x


def case_cgroup(args):
    tasks = os.path.join(args[0], "tasks")

    def work():
        tid = threading.get_native_id()
        with open(tasks, "w") as f:
            f.write(str(tid))
        try:
            with tracer.start_as_current_span("throttled") as span:
                remember("throttled", span)
                burn(0.015)
        finally:
            # Back to the root group, so the test can remove this one.
            root = os.path.join(os.path.dirname(os.path.abspath(args[0])), "tasks")
            with open(root, "w") as f:
                f.write(str(tid))

    t = threading.Thread(target=work)
    t.start()
    t.join()


def case_odirect(_args):
    path = os.path.join(OUT, "direct.bin")
    size = 16 << 20
    with open(path, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
    # Page-aligned, as O_DIRECT needs. 1 MiB a read, not less: each read
    # costs the reader CPU (Python, pinning the pages), and with smaller
    # reads on a fast virtual disk that CPU time can outweigh the wait.
    buf = mmap.mmap(-1, 1 << 20)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        with tracer.start_as_current_span("read") as span:
            remember("read", span)
            done = 0
            while done < size:
                n = os.preadv(fd, [buf], done)
                if n <= 0:
                    break
                done += n
    finally:
        os.close(fd)
        os.unlink(path)


def case_sleep(_args):
    with tracer.start_as_current_span("sleep") as span:
        remember("sleep", span)
        time.sleep(0.2)


BACKUP = (
    "import ctypes, mmap, os, sys\n"
    "ctypes.CDLL(None).prctl(15, b'backup', 0, 0, 0)\n"
    "buf = mmap.mmap(-1, 1 << 20)\n"
    "buf.write(os.urandom(1 << 20))\n"
    "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)\n"
    "off = 0\n"
    "while True:\n"
    "    os.pwritev(fd, [buf], off)\n"
    "    off = (off + (1 << 20)) % (64 << 20)\n"
)


def case_diskflood(_args):
    size = 8 << 20
    path = os.path.join(OUT, "direct.bin")
    with open(path, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
    backup_file = os.path.join(OUT, "backup.img")
    backup = subprocess.Popen([sys.executable, "-c", BACKUP, backup_file])
    try:
        ids["backup_pid"] = str(backup.pid)
        time.sleep(0.5)  # the backup keeps the disk busy first
        buf = mmap.mmap(-1, 128 << 10)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            with tracer.start_as_current_span("read") as span:
                remember("read", span)
                done = 0
                while done < size:
                    n = os.preadv(fd, [buf], done)
                    if n <= 0:
                        break
                    done += n
        finally:
            os.close(fd)
    finally:
        backup.kill()
        backup.wait()
        os.unlink(path)
        if os.path.exists(backup_file):
            os.unlink(backup_file)


HOG = "import ctypes\nctypes.CDLL(None).prctl(15, b'cpuhog', 0, 0, 0)\nwhile True:\n    pass\n"


# The kernel's weight of each nice value, -20 to 19 (sched_prio_to_weight).
NICE_WEIGHT = [
    88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916,
    9548, 7620, 6100, 4904, 3906, 3121, 2501, 1991, 1586, 1277,
    1024, 820, 655, 526, 423, 335, 272, 215, 172, 137,
    110, 87, 70, 56, 45, 36, 29, 23, 18, 15,
]


def kubelet_cgroups(n):
    """n leaf CPU cgroups named as the kubelet names a container's, under
    this process's own v1 CPU cgroup, alternating the cgroupfs and the
    systemd layout: [(leaf, container id, pod uid)], and the top folders
    to remove (each top's cpu.shares is one thread of this process's
    weight, so that a hog inside competes as it would beside it)."""
    import uuid

    with open("/proc/self/cgroup") as f:
        own = next(l.split(":", 2)[2].strip() for l in f if ":cpu," in l or ":cpu:" in l)
    base = os.path.join("/sys/fs/cgroup/cpu", own.lstrip("/"))
    weight = NICE_WEIGHT[os.getpriority(os.PRIO_PROCESS, 0) + 20]
    leaves, tops = [], []
    for i in range(n):
        uid, cid = str(uuid.uuid4()), os.urandom(32).hex()
        if i % 2 == 0:
            top = os.path.join(base, f"kubepods-{i}")
            leaf = os.path.join(top, "burstable", f"pod{uid}", cid)
        else:
            top = os.path.join(base, f"kubepods-{i}.slice")
            pod = f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
            leaf = os.path.join(top, "kubepods-burstable.slice", pod, f"cri-containerd-{cid}.scope")
        os.makedirs(leaf)
        tops.append(top)
        with open(os.path.join(top, "cpu.shares"), "w") as f:
            f.write(str(weight))
        leaves.append((leaf, cid, uid))
    return leaves, tops


def remove_cgroups(tops):
    for top in tops:
        for d, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
            os.rmdir(d)


def case_hog(args, in_pods=False):
    cpu = max(os.sched_getaffinity(0))
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(2)]
    tops = []
    try:
        for h in hogs:
            os.sched_setaffinity(h.pid, {cpu})
        ids["hog_pids"] = ",".join(str(h.pid) for h in hogs)
        if in_pods:
            leaves, tops = kubelet_cgroups(len(hogs))
            for h, (leaf, cid, uid) in zip(hogs, leaves):
                with open(os.path.join(leaf, "cgroup.procs"), "w") as f:
                    f.write(str(h.pid))
            ids["hog_containers"] = ",".join(
                f"{h.pid}={cid}/{uid}" for h, (_, cid, uid) in zip(hogs, leaves)
            )
        contend(cpu)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        remove_cgroups(tops)


def contend(cpu):
    """Request "contended": 60 ms of CPU on `cpu`, once the hogs spin."""
    time.sleep(0.3)  # the hogs spinning before the request starts

    def work():
        os.sched_setaffinity(0, {cpu})  # this thread only
        with tracer.start_as_current_span("contended") as span:
            remember("contended", span)
            burn(0.06)

    t = threading.Thread(target=work)
    t.start()
    t.join()


def case_hogpodman(_args):
    cpu = max(os.sched_getaffinity(0))
    # A busybox root file system, and podman's settings for this VM: runc
    # (crun refuses its hybrid cgroup layout), no rlimits raised (no
    # CAP_SYS_RESOURCE).
    rootfs = os.path.join(OUT, "rootfs")
    os.makedirs(os.path.join(rootfs, "bin"))
    subprocess.run(["cp", "/bin/busybox", os.path.join(rootfs, "bin", "busybox")], check=True)
    os.symlink("busybox", os.path.join(rootfs, "bin", "sh"))
    conf = os.path.join(OUT, "containers.conf")
    with open(conf, "w") as f:
        f.write("[containers]\ndefault_ulimits = []\n")
    env = dict(os.environ, CONTAINERS_CONF=conf)
    with open("/proc/self/cgroup") as f:
        parent = next(l.split(":", 2)[2].strip() for l in f if ":cpu," in l or ":cpu:" in l)
    weight = NICE_WEIGHT[os.getpriority(os.PRIO_PROCESS, 0) + 20]
    # Short: reports name them in lines of 78 characters.
    names = [f"hog{i}-{os.getpid()}" for i in range(2)]

    def podman(*argv):
        out = subprocess.run(["podman", "--runtime", "runc", *argv], env=env,
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"podman {' '.join(argv)}: {out.stderr.strip()}")
        return out.stdout.strip()

    try:
        made = hierarchies_without(parent)
        found = []
        for name in names:
            # Under this process's own CPU cgroup, each weighing what one of
            # its threads does, so that they compete with the request as
            # the hog case's processes do.
            cid = podman("run", "-d", "--name", name, "--network", "host",
                         "--cgroup-parent", parent, "--cpu-shares", str(weight),
                         "--cpuset-cpus", str(cpu), "--rootfs", rootfs,
                         "/bin/sh", "-c", "while :; do :; done")
            pid = podman("inspect", "--format", "{{.State.Pid}}", name)
            found.append(f"{pid}={cid}/{name}")
        ids["hog_containers"] = ",".join(found)
        contend(cpu)
    finally:
        for name in names:
            subprocess.run(["podman", "--runtime", "runc", "rm", "-f", "-t", "0", name], env=env,
                           capture_output=True)
        remove_podman_cgroups(parent, made)


def case_pgrowlock(args):
    import psycopg2

    port, mode = int(args[0]), args[1]

    def connect():
        return psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres")

    setup = connect()
    setup.autocommit = True
    with setup.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS t (id int PRIMARY KEY, v int)")
        cur.execute("INSERT INTO t VALUES (1, 0) ON CONFLICT (id) DO NOTHING")
    setup.close()
    holder_conn, waiter_conn = connect(), connect()
    ids["holder_backend"] = str(holder_conn.get_backend_pid())
    ids["waiter_backend"] = str(waiter_conn.get_backend_pid())
    locked = threading.Event()

    def holder():
        with tracer.start_as_current_span("holder") as span:
            remember("holder", span)
            with holder_conn.cursor() as cur:
                cur.execute("UPDATE t SET v = v + 1 WHERE id = 1")
                locked.set()
                if mode == "server":
                    cur.execute("SELECT pg_sleep(0.3)")
                else:
                    time.sleep(0.3)
            holder_conn.commit()

    def waiter():
        locked.wait()
        time.sleep(0.02)
        with tracer.start_as_current_span("waiter") as span:
            remember("waiter", span)
            with waiter_conn.cursor() as cur:
                cur.execute("UPDATE t SET v = v + 1 WHERE id = 1")
            waiter_conn.commit()

    threads = [threading.Thread(target=holder), threading.Thread(target=waiter)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    holder_conn.close()
    waiter_conn.close()


CASES = {
    "lock": case_lock,
    "cgroup": case_cgroup,
    "odirect": case_odirect,
    "diskflood": case_diskflood,
    "sleep": case_sleep,
    "hog": case_hog,
    "hogpods": lambda args: case_hog(args, in_pods=True),
    "hogpodman": case_hogpodman,
    "pgrowlock": case_pgrowlock,
}

if __name__ == "__main__":
    case, OUT = sys.argv[1], sys.argv[2]
    CASES[case](sys.argv[3:])
    if not provider.force_flush(10_000):
        sys.exit("the spans could not be exported in 10 s")
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        with open(os.path.join(OUT, "spans.pb"), "wb") as f:
            f.write(encode_spans(exporter.get_finished_spans()).SerializeToString())
    with open(os.path.join(OUT, "ids.json"), "w") as f:
        json.dump(ids, f)
