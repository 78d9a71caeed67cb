"""The faults the scenarios inject. Each registers its undo on the cleanup
stack as soon as it exists."""

import os
import subprocess
import sys

from harness import procs

CPU_V1 = "/sys/fs/cgroup/cpu"
UNIFIED = "/sys/fs/cgroup"


class CpuQuota:
    """A CPU cgroup with a quota (`percent` of one CPU) that a process's
    threads are moved into, and out of again on `release()`. cgroup v1's
    cpu controller when mounted, else cgroup v2."""

    def __init__(self, name, percent, cleanup):
        self.v1 = os.path.isfile(os.path.join(CPU_V1, "cpu.cfs_quota_us"))
        if self.v1:
            self.path = os.path.join(CPU_V1, name)
        elif "cpu" in _read(os.path.join(UNIFIED, "cgroup.controllers")).split():
            self.path = os.path.join(UNIFIED, name)
        else:
            raise RuntimeError(f"no CPU cgroup controller: neither {CPU_V1} (v1) nor cpu in {UNIFIED}/cgroup.controllers")
        self.moved = {}  # tid -> the cgroup folder it came from
        os.mkdir(self.path)
        cleanup.push(f"remove cgroup {self.path}", self.remove)
        period = 100_000
        quota = max(1000, int(period * percent / 100))
        # The largest weight: a group competes for the CPU by its weight, not
        # by its tasks' nice values, and the staged fault is the quota, not
        # whatever else keeps the machine busy (a build beside the demo).
        if self.v1:
            _write(os.path.join(self.path, "cpu.cfs_period_us"), period)
            _write(os.path.join(self.path, "cpu.cfs_quota_us"), quota)
            _write(os.path.join(self.path, "cpu.shares"), 262144)
        else:
            _write(os.path.join(self.path, "cpu.max"), f"{quota} {period}")
            _write(os.path.join(self.path, "cpu.weight"), 10000)

    def confine(self, pid):
        """Moves every thread of `pid` into the group."""
        for tid in os.listdir(f"/proc/{pid}/task"):
            origin = self._origin(tid)
            if self.v1:
                _write(os.path.join(self.path, "tasks"), tid)
            else:
                # v2 moves whole processes (threaded groups aside).
                _write(os.path.join(self.path, "cgroup.procs"), pid)
            self.moved[tid] = origin

    def release(self):
        """Moves the threads back where they came from."""
        for tid, origin in list(self.moved.items()):
            try:
                _write(os.path.join(origin, "tasks" if self.v1 else "cgroup.procs"), tid)
            except ProcessLookupError:
                pass  # the thread ended meanwhile
            except OSError as e:
                if e.errno != 3:  # ESRCH
                    raise
            del self.moved[tid]

    def remove(self):
        self.release()
        # Threads started inside the group since (a new request thread)
        # go back to the root group.
        root = CPU_V1 if self.v1 else UNIFIED
        members = os.path.join(self.path, "tasks" if self.v1 else "cgroup.procs")
        if os.path.exists(members):
            for tid in _read(members).split():
                try:
                    _write(os.path.join(root, "tasks" if self.v1 else "cgroup.procs"), tid)
                except OSError:
                    pass
            os.rmdir(self.path)

    def _origin(self, tid):
        for line in _read(f"/proc/{tid}/cgroup").splitlines():
            _, controllers, path = line.split(":", 2)
            if (self.v1 and "cpu" in controllers.split(",")) or (not self.v1 and controllers == ""):
                return os.path.join(CPU_V1 if self.v1 else UNIFIED, path.lstrip("/"))
        return CPU_V1 if self.v1 else UNIFIED


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _write(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def start_program(name, module, args, cleanup, log_dir, env, affinity=None):
    """Starts `python3 -m harness.MODULE ARGS` (a hog, a backup…)."""
    proc, _ = procs.start(name, [sys.executable, "-m", f"harness.{module}", *map(str, args)],
                          cleanup, log_dir, env=env, affinity=affinity)
    return proc


def run(argv, check=True):
    out = subprocess.run(argv, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


class SlowLink:
    """A network namespace joined to ours by a veth pair: the far side is
    where a service listens; `limit()` puts a token-bucket (tbf) rate limit
    on the far side's egress, so its responses queue; `unlimit()` removes it.
    Addresses are link-local (169.254.x.y/30), chosen not to overlap any
    route of this host."""

    def __init__(self, tag, cleanup):
        self.netns = f"deepspan-demo-{tag}"
        self.near = f"dsd{tag}n"[:15]
        self.far = f"dsd{tag}f"[:15]
        self.cleanup = cleanup
        subnet = self._free_subnet()
        self.near_addr, self.far_addr = f"169.254.{subnet}.1", f"169.254.{subnet}.2"
        run(["ip", "netns", "add", self.netns])
        cleanup.push(f"delete network namespace {self.netns}", self._delete_netns)
        run(["ip", "link", "add", self.near, "type", "veth", "peer", "name", self.far])
        cleanup.push(f"delete veth {self.near}", self._delete_link)
        run(["ip", "link", "set", self.far, "netns", self.netns])
        run(["ip", "addr", "add", f"{self.near_addr}/30", "dev", self.near])
        run(["ip", "link", "set", self.near, "up"])
        self._in_ns(["ip", "addr", "add", f"{self.far_addr}/30", "dev", self.far])
        self._in_ns(["ip", "link", "set", self.far, "up"])
        self._in_ns(["ip", "link", "set", "lo", "up"])

    @property
    def netns_path(self):
        return f"/run/netns/{self.netns}"

    def limit(self, rate, burst="32kb", latency="1s"):
        self._in_ns(["tc", "qdisc", "replace", "dev", self.far, "root", "tbf",
                     "rate", rate, "burst", burst, "latency", latency])

    def unlimit(self):
        out = self._in_ns(["tc", "qdisc", "del", "dev", self.far, "root"], check=False)
        if out.returncode != 0 and "No such file" not in out.stderr and "Cannot find" not in out.stderr:
            raise RuntimeError(f"tc qdisc del failed: {out.stderr.strip()}")

    def _in_ns(self, argv, check=True):
        return run(["ip", "netns", "exec", self.netns, *argv], check=check)

    def _delete_netns(self):
        # Deleting the namespace also deletes its veth end, its peer and the qdisc.
        run(["ip", "netns", "del", self.netns], check=False)

    def _delete_link(self):
        if os.path.exists(f"/sys/class/net/{self.near}"):
            run(["ip", "link", "del", self.near])

    @staticmethod
    def _free_subnet():
        routes = run(["ip", "-4", "route", "show", "table", "all"]).stdout
        for third in range(77, 255):
            if f"169.254.{third}." not in routes and "169.254.0.0/16" not in routes:
                return third
        raise RuntimeError("no free 169.254.x.0/30 subnet for the demo's veth pair")
