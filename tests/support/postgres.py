"""A private PostgreSQL server for tests: Debian's ``postgresql`` package (``apt-get install
postgresql``; ``.ci/run`` installs it), one unprivileged cluster in a temporary directory,
listening on a free loopback port, started and stopped by the test that needs it.

PostgreSQL refuses to run as root, and the tests run as root on CI: the cluster then belongs
to ``nobody``, and ``initdb`` and ``pg_ctl`` run through ``runuser -u nobody``. The cluster
trusts local connections (it listens on 127.0.0.1 only) and syncs nothing to disk.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.valkey import free_port

#: Where Debian installs each major version's server programs.
BIN_GLOB = "/usr/lib/postgresql/*/bin"
#: The cluster's superuser, the one role the tests connect as.
SUPERUSER = "outbox"
#: Who owns the cluster when the tests run as root.
UNPRIVILEGED = "nobody"


def bindir() -> Path | None:
    """The newest installed ``/usr/lib/postgresql/<major>/bin`` with ``initdb``, ``pg_ctl`` and
    ``postgres``, or None when Debian's ``postgresql`` package is not installed."""
    found = [
        path
        for path in Path("/").glob(BIN_GLOB.lstrip("/"))
        if all((path / name).exists() for name in ("initdb", "pg_ctl", "postgres"))
    ]
    return max(found, key=lambda p: int(p.parent.name), default=None) if found else None


def unavailable() -> str | None:
    """Why a PostgreSQL test cannot run here (a sentence for ``pytest.skip``), or None."""
    if bindir() is None:
        return (
            "PostgreSQL is not installed (Debian's postgresql package: apt-get install "
            "postgresql; .ci/run installs it)"
        )
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[test]')"
    return None


class PostgresServer:
    """One PostgreSQL cluster for a test run: :meth:`start`, :meth:`create_database`,
    :meth:`restart`, :meth:`stop`. ``port`` is its loopback port, ``log`` its server log."""

    def __init__(self, bin_dir: Path | None = None) -> None:
        found = bin_dir or bindir()
        if found is None:
            raise RuntimeError(unavailable() or "PostgreSQL is not installed")
        self.bin = found
        # Not under pytest's tmp_path: that is private to root, and the cluster may not be.
        self.root = Path(tempfile.mkdtemp(prefix="outbox-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self._owner = pwd.getpwnam(UNPRIVILEGED) if os.geteuid() == 0 else None

    def _run(self, program: str, *args: str, timeout: float = 120) -> None:
        command = [str(self.bin / program), *args]
        if self._owner is not None:
            command = ["runuser", "-u", UNPRIVILEGED, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            log = self.log.read_text(errors="replace") if self.log.exists() else ""
            raise RuntimeError(
                f"{program} failed ({done.returncode}): {done.stdout}{done.stderr}{log[-4000:]}"
            )

    def start(self) -> PostgresServer:
        """Create the cluster (first time only) and start the server; return self once it
        accepts connections. Raises ``RuntimeError`` with the output when it does not."""
        if self._owner is not None:
            os.chown(self.root, self._owner.pw_uid, self._owner.pw_gid)
        if not self.data.exists():
            self._run(
                "initdb",
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            )
        self._pg_ctl("start")
        return self

    def _pg_ctl(self, action: str) -> None:
        options = " ".join(
            [
                f"-p {self.port}",
                f"-k {self.root}",
                "-c listen_addresses=127.0.0.1",
                "-c fsync=off",
                "-c synchronous_commit=off",
                "-c full_page_writes=off",
                "-c shared_buffers=16MB",
                "-c max_connections=50",
            ]
        )
        args = ["-D", str(self.data), "-l", str(self.log), "-w", "-t", "60"]
        if action == "start" or action == "restart":
            args += ["-o", options]
        if action != "start":
            args += ["-m", "fast"]
        self._run("pg_ctl", *args, action)

    def restart(self) -> None:
        """Stop the server (fast: connections are cut) and start it again on the same port."""
        self._pg_ctl("restart")

    def stop(self) -> None:
        """Stop the server and delete the cluster."""
        try:
            self._pg_ctl("stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def connect(self, dbname: str = "postgres"):
        """A psycopg connection (autocommit) to ``dbname`` as the superuser."""
        import psycopg

        return psycopg.connect(
            host="127.0.0.1", port=self.port, user=SUPERUSER, dbname=dbname, autocommit=True
        )

    def create_database(self, name: str) -> dict[str, object]:
        """Create the database ``name`` (dropping one of that name first); return its
        Django ``DATABASES`` entry."""
        with self.connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.django_database(name)

    def django_database(self, name: str) -> dict[str, object]:
        """The Django ``DATABASES`` entry of database ``name`` on this server."""
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": SUPERUSER,
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
        }
