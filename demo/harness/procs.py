"""Child processes of the demo: started in their own session (a Ctrl-C on
the terminal reaches the driver only, which stops them in order), killed
with the driver if it dies (PR_SET_PDEATHSIG), stopped by SIGTERM then
SIGKILL."""

import ctypes
import os
import select
import signal
import subprocess
import time

_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class Process:
    def __init__(self, name, popen, log_path):
        self.name = name
        self.popen = popen
        self.log_path = log_path

    @property
    def pid(self):
        return self.popen.pid

    def log_tail(self, lines=20):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self, sig=signal.SIGTERM, timeout=15.0):
        """Stops the process (SIGKILL after `timeout`); returns its status."""
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(sig)
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        return self.popen.wait()


def start(name, argv, cleanup, log_dir, env=None, ready=False, ready_timeout=30.0,
          affinity=None, user=None, stop_signal=signal.SIGTERM):
    """Starts `argv`; with `ready`, waits for its `READY <port>` line and
    returns (process, port), else (process, None). Registered on `cleanup`."""
    proc = spawn(name, argv, cleanup, log_dir, env=env, ready=ready, affinity=affinity, user=user,
                 stop_signal=stop_signal)
    if not ready:
        return proc, None
    return proc, wait_ready(proc, ready_timeout)


def spawn(name, argv, cleanup, log_dir, env=None, ready=False, affinity=None, user=None,
          stop_signal=signal.SIGTERM):
    """Starts `argv` and returns its Process at once, registered on
    `cleanup`. With `ready` its stdout is a pipe for `wait_ready`: several
    services start side by side, then each is waited for."""
    log_path = os.path.join(log_dir, f"{name}.log")
    log = open(log_path, "ab")

    def preexec():
        _die_with_parent()
        if affinity is not None:
            os.sched_setaffinity(0, affinity)

    popen = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if ready else log,
        stderr=log,
        env=env,
        start_new_session=True,
        preexec_fn=preexec,
        user=user,
        group=None if user is None else _group_of(user),
        extra_groups=None if user is None else [],
    )
    log.close()
    proc = Process(name, popen, log_path)
    cleanup.push(f"stop {name} (pid {popen.pid})", lambda: proc.stop(stop_signal))
    return proc


def _group_of(user):
    import pwd

    return pwd.getpwnam(user).pw_gid


def wait_ready(proc, timeout=30.0):
    """The port of `proc`'s `READY <port>` line (a process spawned with
    `ready`); an error naming its log when it exits or stays silent."""
    deadline = time.monotonic() + timeout
    buf = b""
    fd = proc.popen.stdout.fileno()
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(
                f"{proc.name} exited with status {proc.popen.returncode} before it was ready; "
                f"its log ({proc.log_path}) ends with:\n{proc.log_tail()}"
            )
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            chunk = os.read(fd, 4096)
            buf += chunk
            for line in buf.decode(errors="replace").splitlines():
                if line.startswith("READY "):
                    return int(line.split()[1])
    raise RuntimeError(f"{proc.name} was not ready within {timeout:.0f} s; log:\n{proc.log_tail()}")
