"""A throw-away PostgreSQL cluster: initdb into the demo's work folder,
postgres on a free loopback port and a Unix socket, stopped and deleted by
the cleanup stack.

PostgreSQL refuses to run as root: as root it runs as the `postgres` user
(made by Debian's package), else `nobody`, owning the cluster's folders.
The shop connects through the Unix socket: a message on a Unix socket
wakes the reader directly from the writer's thread, so the kernel
critical path follows a request into its backend process and on to a
backend that held a row lock (over TCP the wake-up comes from a network
softirq and the chain is lost)."""

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time

from harness import procs

SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, stock int NOT NULL, price_cents int NOT NULL);
CREATE TABLE orders (id serial PRIMARY KEY, item_id int NOT NULL REFERENCES items, at timestamptz DEFAULT now());
INSERT INTO items SELECT i, 'item ' || i, 1000000, 100 + i FROM generate_series(1, 100) AS i;
"""


def find_bindir():
    """The newest installed server's bin folder (Debian layout), or pg_config's."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=_major, reverse=True)
    if candidates:
        return os.path.dirname(candidates[0])
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True)
        if os.path.exists(os.path.join(out.stdout.strip(), "postgres")):
            return out.stdout.strip()
    raise RuntimeError(
        "no PostgreSQL server found (looked in /usr/lib/postgresql/*/bin and pg_config): "
        "scripts/setup.sh demo installs postgresql-15"
    )


def _major(path):
    try:
        return int(path.split("/")[4])
    except (IndexError, ValueError):
        return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    def __init__(self, workdir, cleanup, log_dir):
        self.bindir = find_bindir()
        self.user = None
        if os.geteuid() == 0:
            self.user = "postgres" if _user_exists("postgres") else "nobody"
        self.datadir = os.path.join(workdir, "pgdata")
        self.sockdir = os.path.join(workdir, "pgsock")
        self.port = free_port()
        self.log_dir = log_dir
        self.cleanup = cleanup
        self.proc = None

    @property
    def dsn(self):
        return f"host={self.sockdir} port={self.port} user=demo dbname=postgres"

    def start(self):
        for d in (self.datadir, self.sockdir):
            os.makedirs(d, mode=0o700)
            if self.user:
                pw = pwd.getpwnam(self.user)
                os.chown(d, pw.pw_uid, pw.pw_gid)
        # initdb's own parent folder may be unreadable to the user: the
        # cluster folders are all it needs.
        initdb = [os.path.join(self.bindir, "initdb"), "-D", self.datadir, "-U", "demo",
                  "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"]
        out = subprocess.run(initdb, capture_output=True, text=True, user=self.user,
                             cwd=self.datadir, start_new_session=True)
        if out.returncode != 0:
            raise RuntimeError(f"initdb failed ({out.returncode}):\n{out.stderr}")
        self.proc, _ = procs.start(
            "postgres",
            [os.path.join(self.bindir, "postgres"), "-D", self.datadir, "-k", self.sockdir,
             "-p", str(self.port), "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=60",
             "-c", "shared_buffers=32MB",
             # A lock wait wakes up at deadlock_timeout to look for deadlocks:
             # the kernel path then shows that wait as TIMER up to there.
             # Row-lock waits here stay under 3 s.
             "-c", "deadlock_timeout=3s"],
            self.cleanup,
            self.log_dir,
            user=self.user,
            # SIGQUIT is PostgreSQL's "immediate" shutdown: no shutdown
            # checkpoint, whose writes and fsyncs a cluster deleted next
            # does not need.
            stop_signal=signal.SIGQUIT,
        )
        self._wait_ready()
        import psycopg2

        with psycopg2.connect(self.dsn) as conn, conn.cursor() as cur:
            cur.execute(SCHEMA)
        conn.close()

    def _wait_ready(self, timeout=30.0):
        deadline = time.monotonic() + timeout
        isready = [os.path.join(self.bindir, "pg_isready"), "-q", "-h", self.sockdir, "-p", str(self.port)]
        while time.monotonic() < deadline:
            if self.proc.popen.poll() is not None:
                raise RuntimeError(f"postgres exited ({self.proc.popen.returncode}):\n{self.proc.log_tail()}")
            if subprocess.run(isready).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"postgres was not ready within {timeout:.0f} s:\n{self.proc.log_tail()}")


def _user_exists(name):
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False
