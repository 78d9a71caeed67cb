"""Demo processes in podman containers (`driver.py --containers`), as they
run on a container host: each container has its own cgroup
(`libpod_parent/libpod-<id>` in every hierarchy), PID and mount namespaces
and root file system, and shares the host's network (the services still
reach each other on 127.0.0.1). A service's spans then carry the thread
ids of its PID namespace, which deepspan maps to the kernel's.

The root file system is a folder with the host's `/usr` and this Python's
installation mounted read-only, so the containers run the same
interpreter and packages as the driver without an image to pull (none can
be pulled here). podman runs as this VM needs it: runc (crun refuses its
hybrid cgroup layout) and no rlimits raised (no CAP_SYS_RESOURCE).

The containers' cgroups are made under the driver's own CPU cgroup, not
podman's shared `libpod_parent`: they then get the CPU the driver's
group is given, as the demo's processes do outside containers (the tests
run the demo in a group ahead of other load). What podman makes there, in
every hierarchy, is removed at the end.

Every container is named `deepspan-demo-<driver pid>-<role>`, so that
`stale.cleanup_stale` can remove those of a driver that died."""

import os
import shutil
import subprocess
import sys
import time

from harness import procs

PREFIX = "deepspan-demo-"
CGROUPS = "/sys/fs/cgroup"


def _cpu_cgroup():
    """This process's cgroup in the v1 cpu hierarchy, or None (v2 only)."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "cpu" in controllers.split(","):
                return path
    return None


def hierarchies_without(parent):
    """The cgroup hierarchies that have no cgroup `parent` (yet): podman
    makes it there for a container under it."""
    hierarchies = [h for h in os.listdir(CGROUPS) if not os.path.islink(os.path.join(CGROUPS, h))]
    return [h for h in hierarchies if not os.path.isdir(os.path.join(CGROUPS, h, parent.lstrip("/")))]


def remove_podman_cgroups(parent, made):
    """What podman made under cgroup `parent` in each hierarchy (the
    containers' and conmon's cgroups), once their containers are removed,
    and `parent` itself in the hierarchies `made` (from
    `hierarchies_without`, before the containers started)."""
    for h in os.listdir(CGROUPS):
        top = os.path.join(CGROUPS, h, parent.lstrip("/"))
        if os.path.islink(os.path.join(CGROUPS, h)) or not os.path.isdir(top):
            continue
        for d, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
            if d != top and (os.path.basename(d) == "conmon" or "libpod-" in d):
                _rmdir_once_empty(d)
        if h in made:
            _rmdir_once_empty(top)


def _rmdir_once_empty(path, wait_s=10):
    """Removes a cgroup whose last process is on its way out (conmon exits
    after `podman rm` returns): the kernel refuses (EBUSY) until it is gone."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != 16 or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Podman:
    """Starts containers for one driver and removes them on cleanup."""

    def __init__(self, work, cleanup, demo_dir, out):
        if shutil.which("podman") is None:
            raise RuntimeError("--containers needs podman (Debian's podman and runc)")
        self.cleanup = cleanup
        self.env = dict(os.environ, CONTAINERS_CONF=os.path.join(work, "containers.conf"))
        with open(self.env["CONTAINERS_CONF"], "w") as f:
            f.write("[containers]\ndefault_ulimits = []\n")
        self.rootfs = os.path.join(work, "rootfs")
        os.makedirs(self.rootfs)
        for link in ("bin", "sbin", "lib", "lib64"):
            if os.path.islink(f"/{link}"):
                os.symlink(os.readlink(f"/{link}"), os.path.join(self.rootfs, link))
        # Read-only: the host's programs and libraries, this interpreter's
        # installation (it may live outside /usr), the demo and the SDK
        # (PYTHONPATH names them at the same paths). Writable: the
        # scenario's output folder (roles.jsonl).
        sdk = os.path.join(os.path.dirname(demo_dir), "sdk", "python")
        read_only = {os.path.realpath(p) for p in ("/usr", sys.base_prefix, sys.prefix, demo_dir, sdk)}
        read_only = sorted(p for p in read_only if os.path.isdir(p)
                           and not any(p.startswith(q + "/") for q in read_only))
        self.mounts = [arg for p in read_only for arg in ("-v", f"{p}:{p}:ro")]
        self.mounts += ["-v", f"{out}:{out}", "--tmpfs", "/tmp"]
        self.parent = _cpu_cgroup()
        if self.parent in (None, "/"):
            self.parent = None  # podman's own parent, beside everything else
        else:
            parent, made = self.parent, hierarchies_without(self.parent)
            # Pushed first, so run last: after every container is removed.
            cleanup.push(f"remove podman's cgroups under {parent}", lambda: remove_podman_cgroups(parent, made))

    def podman(self, *argv, check=True):
        out = subprocess.run(["podman", "--runtime", "runc", *argv], env=self.env,
                             capture_output=True, text=True)
        if check and out.returncode != 0:
            raise RuntimeError(f"podman {' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()}")
        return out.stdout.strip()

    def name(self, role):
        return f"{PREFIX}{os.getpid()}-{role}"

    def spawn(self, role, argv, log_dir, env, ready=False, cpus=None, cpu_shares=None):
        """Runs `argv` in a new container named after `role`, in the
        foreground: the returned process is `podman run`, which passes
        SIGTERM on to the container's process and exits with its status.
        `env` is the container's whole environment. Its process is the
        first of its PID namespace: it must handle SIGTERM itself."""
        name = self.name(role)
        options = ["--name", name, "--rm", "--network", "host", "--workdir", "/", *self.mounts]
        for key, value in env.items():
            options += ["--env", f"{key}={value}"]
        if cpus:
            options += ["--cpuset-cpus", ",".join(map(str, sorted(cpus)))]
        if cpu_shares:
            options += ["--cpu-shares", str(cpu_shares)]
        if self.parent:
            options += ["--cgroup-parent", self.parent]
        self.cleanup.push(f"remove container {name}", lambda: self.podman("rm", "-f", "-t", "0", name,
                                                                          check=False))
        proc = procs.spawn(role, ["podman", "--runtime", "runc", "run", *options, "--rootfs", self.rootfs, *argv],
                           self.cleanup, log_dir, env=self.env, ready=ready)
        proc.container = name
        return proc

    def identify(self, proc, timeout=30.0):
        """{"id", "name", "pid"} of the container `proc` runs, once its
        process has started (`pid` is its first process, in the host's
        ids)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"container {proc.container} exited with status {proc.popen.returncode} "
                                   f"before it ran; its log ({proc.log_path}) ends with:\n{proc.log_tail()}")
            out = self.podman("inspect", "--format", "{{.Id}} {{.State.Pid}}", proc.container, check=False)
            if out and out.split()[-1] not in ("", "0"):
                cid, pid = out.split()
                return {"id": cid, "name": proc.container, "pid": int(pid)}
            time.sleep(0.05)
        raise RuntimeError(f"container {proc.container} was not running after {timeout:.0f} s; "
                           f"log:\n{proc.log_tail()}")
