"""Removes what an earlier driver killed with SIGKILL left behind (its
services die with it through PR_SET_PDEATHSIG; PostgreSQL, running as
another user, and the kernel objects do not). Everything the driver makes
carries its pid in its name: a resource whose driver is gone is stale."""

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


def cleanup_stale(log=print):
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
