"""Removes what an earlier driver killed with SIGKILL left behind (its
services die with it through PR_SET_PDEATHSIG; PostgreSQL, running as
another user, and the kernel objects do not). Everything the driver makes
carries its pid in its name: a resource whose driver is gone is stale."""

import json
import os
import shutil
import signal
import subprocess
import time

from harness.faults import CPU_V1, UNIFIED


def _dead(pid):
    try:
        os.kill(int(pid), 0)
        return False
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False


def _owner(name, prefix):
    """The pid in `<prefix><pid>[-…]`, or None."""
    rest = name[len(prefix):] if name.startswith(prefix) else ""
    pid = rest.split("-")[0]
    return pid if pid.isdigit() else None


# podman's (and CRI-O's) list of containers, with their names.
CONTAINER_STORAGE = "/var/lib/containers/storage/overlay-containers/containers.json"


def cleanup_stale(log=print):
    _remove_stale_containers(log)
    for root in (CPU_V1, UNIFIED):
        if not os.path.isdir(root):
            continue
        for name in os.listdir(root):
            pid = _owner(name, "deepspan-demo-")
            if pid and _dead(pid):
                group = os.path.join(root, name)
                members = "tasks" if os.path.exists(os.path.join(group, "tasks")) else "cgroup.procs"
                try:
                    for tid in open(os.path.join(group, members)).read().split():
                        with open(os.path.join(root, members), "w") as f:
                            f.write(tid)
                    os.rmdir(group)
                    log(f"removed stale cgroup {group}")
                except OSError as e:
                    log(f"cannot remove stale cgroup {group}: {e}")
    if os.path.isdir("/run/netns"):
        for name in os.listdir("/run/netns"):
            pid = _owner(name, "deepspan-demo-")
            if pid and _dead(pid):
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
                log(f"removed stale network namespace {name}")
    for name in os.listdir("/sys/class/net"):
        # dsd<pid>n / dsd<pid>f
        pid = name[3:-1] if name.startswith("dsd") and name[3:-1].isdigit() else None
        if pid and _dead(pid):
            subprocess.run(["ip", "link", "del", name], capture_output=True)
            log(f"removed stale link {name}")
    for name in os.listdir("/var/tmp"):
        pid = _owner(name, "deepspan-demo-")
        if not pid or not _dead(pid):
            continue
        work = os.path.join("/var/tmp", name)
        pidfile = os.path.join(work, "pgdata", "postmaster.pid")
        if os.path.exists(pidfile):
            try:
                postmaster = int(open(pidfile).readline())
                # Only that cluster's postmaster (the pid may have been reused).
                with open(f"/proc/{postmaster}/cmdline", "rb") as f:
                    if work.encode() not in f.read():
                        raise ProcessLookupError
                os.kill(postmaster, signal.SIGQUIT)  # immediate shutdown
                for _ in range(50):
                    os.kill(postmaster, 0)
                    time.sleep(0.1)
            except (OSError, ValueError):
                pass
        shutil.rmtree(work, ignore_errors=True)
        log(f"removed stale work folder {work}")


def _remove_stale_containers(log):
    """Containers of `--containers` runs (harness.containers) whose driver
    is gone; read from podman's storage file, so that a machine without
    podman, or without such containers, does not wait for podman."""
    try:
        with open(CONTAINER_STORAGE) as f:
            text = f.read()
    except OSError:
        return
    if "deepspan-demo-" not in text:
        return
    try:
        stored = json.loads(text)
    except ValueError:
        return
    for container in stored:
        for name in container.get("names", []):
            pid = _owner(name, "deepspan-demo-")
            if pid and _dead(pid):
                out = subprocess.run(["podman", "--runtime", "runc", "rm", "-f", "-t", "0", name],
                                     capture_output=True, text=True)
                if out.returncode == 0:
                    log(f"removed stale container {name}")
                else:
                    log(f"cannot remove stale container {name}: {out.stderr.strip()}")
