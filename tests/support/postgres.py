"""A throwaway PostgreSQL server for tests: Debian's ``postgresql`` package
(``apt-get install -y postgresql``: ``/usr/lib/postgresql/<version>/bin``, or the folder
``OUTBOX_TEST_PG_BIN`` names). :func:`postgres_or_skip` skips a test without it, the reason
printed; nothing is installed here (``.ci/run`` installs the package).

:class:`PostgresServer` makes its own cluster in a temporary folder (``initdb``, ``trust``
authentication, superuser ``postgres``) and serves it on a loopback port only, no Unix socket
outside that folder. PostgreSQL refuses to run as root: as root the folder is given to
``nobody`` and every server command runs as that user (``runuser``)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support.valkey import free_port, wait_until

#: The unprivileged user the server runs as when the tests run as root.
UNPRIVILEGED = "nobody"


def postgres_bin() -> Path | None:
    """The folder of ``initdb``, ``pg_ctl`` and ``postgres`` (the newest version installed),
    or None."""
    named = os.environ.get("OUTBOX_TEST_PG_BIN")
    if named:
        return Path(named)
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return Path(found[-1]).parent if found else None


def postgres_or_skip() -> Path:
    """:func:`postgres_bin`, or skip the test (printing why) when PostgreSQL or psycopg is
    missing."""
    pytest.importorskip("psycopg", reason="psycopg is not installed (the test extra has it)")
    found = postgres_bin()
    if found is None or not (found / "pg_ctl").exists():
        reason = (
            "no PostgreSQL server: /usr/lib/postgresql/*/bin missing "
            "(apt-get install -y postgresql)"
        )
        print(reason)
        pytest.skip(reason)
    return found


class PostgresServer:
    """One PostgreSQL server on ``127.0.0.1:<port>`` with its own cluster, for tests.

    ``bin`` is the folder of its programs (default :func:`postgres_bin`); ``port`` defaults
    to a free one. The cluster and ``postgres.log`` live in a temporary folder removed by
    :meth:`stop`. Use it as a context manager, or call :meth:`start` and :meth:`stop`;
    :meth:`restart` is ``pg_ctl restart -m fast`` (every client connection is ended, as a
    database failover or a maintenance restart ends them). Settings for Django:
    :meth:`database`.
    """

    def __init__(self, bin: Path | None = None, *, port: int | None = None) -> None:
        found = bin or postgres_bin()
        if found is None:
            raise RuntimeError("no PostgreSQL server installed (apt-get install -y postgresql)")
        self.bin = found
        self.port = port or free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix="outbox-postgres-"))
        self.data = self.workdir / "data"
        self.log = self.workdir / "postgres.log"
        self._user = UNPRIVILEGED if os.geteuid() == 0 else None
        if self._user is not None:
            os.chmod(self.workdir, 0o755)
            shutil.chown(self.workdir, self._user)

    @property
    def url(self) -> str:
        """``postgresql://postgres@127.0.0.1:<port>/postgres`` (libpq's form; no password)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def database(self, name: str = "postgres", **settings: object) -> dict[str, object]:
        """A ``DATABASES`` entry for database ``name`` on this server; ``settings`` are
        added to it (``CONN_MAX_AGE=None``, ``CONN_HEALTH_CHECKS=True``...)."""
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": "postgres",
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
            **settings,
        }

    def _run(self, program: str, *args: str, timeout: float = 60) -> None:
        command = [str(self.bin / program), *args]
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(
                f"{program} failed ({done.returncode}): {done.stdout}{done.stderr}"
                f"{self.log.read_text() if self.log.exists() else ''}"
            )

    def _pg_ctl(self, action: str, *args: str) -> None:
        self._run("pg_ctl", action, "-D", str(self.data), "-l", str(self.log), "-w", *args)

    def start(self, timeout: float = 30.0) -> PostgresServer:
        """Make the cluster (the first time) and start the server; return self once it
        accepts connections. Raises ``RuntimeError`` with the server's log if it does not."""
        if not self.data.exists():
            self._run(
                "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                "--no-sync",
            )  # fmt: skip
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} "
            f"-c unix_socket_directories={self.workdir} -c fsync=off"
        )
        self._pg_ctl("start", "-t", str(int(timeout)), "-o", options)
        wait_until(self.ready, timeout, message="PostgreSQL accepts connections")
        return self

    def ready(self) -> bool:
        """Whether the server answers a query now."""
        import psycopg

        try:
            with psycopg.connect(self.url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.OperationalError:
            return False
        return True

    def restart(self, timeout: float = 30.0) -> None:
        """``pg_ctl restart -m fast``: end every client connection, stop, start again on
        the same port; return once it accepts connections."""
        self._pg_ctl("restart", "-m", "fast", "-t", str(int(timeout)))
        wait_until(self.ready, timeout, message="PostgreSQL accepts connections again")

    def execute(self, sql: str, params: tuple[object, ...] = (), dbname: str = "postgres"):
        """Run one statement in its own autocommit connection; the rows it returns (or [])."""
        import psycopg

        url = self.url.rsplit("/", 1)[0] + f"/{dbname}"
        with psycopg.connect(url, autocommit=True) as conn:
            cursor = conn.execute(sql, params)  # type: ignore[arg-type]
            return cursor.fetchall() if cursor.description else []

    def stop(self) -> None:
        """Stop the server (``-m immediate``) and remove its folder."""
        if (self.data / "postmaster.pid").exists():
            try:
                self._pg_ctl("stop", "-m", "immediate")
            except RuntimeError:
                pass
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
