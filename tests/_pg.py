"""A PostgreSQL server for the tests: the one named by ``HAREL_STORE_PG_URL``, or a
throwaway cluster started here when the server binaries are on the machine.

The throwaway cluster lives in a temporary directory (data, log and unix socket), listens
on a free port of 127.0.0.1, keeps PostgreSQL's default fsync settings, loads
``pg_stat_statements`` (so a test can count statements on the server) and is stopped and
deleted when the test session ends. As root, ``initdb``, ``pg_ctl`` and the server run as
the ``postgres`` user (``runuser -u postgres --``), which owns the directory; PostgreSQL
refuses to run as root.

Where there is neither a URL nor the binaries, :func:`unavailable` says why, and the
PostgreSQL tests are skipped with that reason, unless ``HAREL_STORE_REQUIRE_POSTGRES`` is
set (CI sets it): then they fail.

The binaries are looked up in ``HAREL_STORE_PG_BINDIR``, then the newest
``/usr/lib/postgresql/*/bin`` (Debian), then ``pg_config --bindir``, then ``PATH``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

URL_ENV = "HAREL_STORE_PG_URL"
REQUIRE_ENV = "HAREL_STORE_REQUIRE_POSTGRES"
BINDIR_ENV = "HAREL_STORE_PG_BINDIR"
SERVER_USER = "postgres"  # who runs the server when the tests run as root


def required() -> bool:
    """Whether a missing server fails the PostgreSQL tests instead of skipping them."""
    return os.environ.get(REQUIRE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def find_bindir() -> Path | None:
    """A directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or ``None``."""

    def usable(path: str | Path | None) -> Path | None:
        if not path:
            return None
        path = Path(path)
        ok = all(os.access(path / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres"))
        return path if ok else None

    if os.environ.get(BINDIR_ENV):
        return usable(os.environ[BINDIR_ENV])

    def major(path: str) -> float:
        try:
            return float(Path(path).parent.name)
        except ValueError:
            return 0.0

    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=major, reverse=True):
        if found := usable(candidate):
            return found
    if shutil.which("pg_config"):
        done = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=False
        )
        if found := usable(done.stdout.strip()):
            return found
    initdb = shutil.which("initdb")
    return usable(Path(initdb).parent) if initdb else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A server the tests may use: ``url`` is a libpq URL of a database where the tests
    may create and drop schemas. ``pg_ctl`` is set for a throwaway cluster only: that one
    the tests may restart."""

    url: str
    pg_ctl: list[str] | None = None
    data: Path | None = None
    root: Path | None = None
    log: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def throwaway(self) -> bool:
        return self.pg_ctl is not None

    def ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert self.pg_ctl is not None and self.data is not None
        done = subprocess.run(
            [*self.pg_ctl, "-D", str(self.data), *args],
            capture_output=True,
            text=True,
            check=False,
            env=self.env,
            timeout=120,
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"pg_ctl {' '.join(args)} failed ({done.returncode}):\n{done.stdout}"
                f"\n{done.stderr}\n{self.log_tail()}"
            )
        return done

    def restart(self) -> None:
        """Stop the server (fast: open connections are terminated) and start it again."""
        self.ctl("-m", "fast", "-w", "restart")

    def stop(self) -> None:
        self.ctl("-m", "fast", "-w", "stop")

    def start(self) -> None:
        self.ctl("-w", "start")

    def log_tail(self, lines: int = 30) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def destroy(self) -> None:
        if self.pg_ctl is not None:
            with contextlib.suppress(Exception):
                self.ctl("-m", "immediate", "-w", "stop", check=False)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


def _as_server_user(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", SERVER_USER, "--", *command]


def start_throwaway(bindir: Path) -> Server:
    """initdb and start a cluster in a new temporary directory; remove it on failure."""
    root = Path(tempfile.mkdtemp(prefix="harel-pg-"))
    os.chmod(root, 0o755)
    data, sockets, log = root / "data", root / "sock", root / "server.log"
    sockets.mkdir()
    if os.geteuid() == 0:
        try:
            entry = pwd.getpwnam(SERVER_USER)
        except KeyError:
            shutil.rmtree(root, ignore_errors=True)
            raise RuntimeError(
                f"running as root and there is no {SERVER_USER!r} user to run PostgreSQL"
            ) from None
        for path in (root, sockets):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    env.pop("PGDATA", None)
    port = free_port()
    user = SERVER_USER if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    server = Server(
        url=f"postgresql://{user}@127.0.0.1:{port}/postgres?sslmode=disable&gssencmode=disable",
        pg_ctl=_as_server_user([str(bindir / "pg_ctl"), "-l", str(log)]),
        data=data,
        root=root,
        log=log,
        env=env,
    )
    try:
        initdb = subprocess.run(
            _as_server_user(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    user,
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ]
            ),
            capture_output=True,
            text=True,
            check=False,
            env=env,
            timeout=300,
        )
        if initdb.returncode != 0:
            raise RuntimeError(f"initdb failed ({initdb.returncode}):\n{initdb.stderr}")
        settings = [
            f"port = {port}",
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{sockets}'",
            "max_connections = 200",
            "shared_buffers = 64MB",
        ]
        if (bindir.parent / "lib" / "pg_stat_statements.so").exists() or glob.glob(
            f"/usr/share/postgresql/{bindir.parent.name}/extension/pg_stat_statements.control"
        ):
            settings += [
                "shared_preload_libraries = 'pg_stat_statements'",
                "pg_stat_statements.track = 'all'",
            ]
        with open(data / "postgresql.conf", "a") as conf:
            conf.write("\n# harel_store tests\n" + "\n".join(settings) + "\n")
        try:
            server.start()
        except RuntimeError:
            if "shared_preload_libraries" not in "\n".join(settings):
                raise
            # The library is listed but cannot load: run without it.
            with open(data / "postgresql.conf", "a") as conf:
                conf.write("shared_preload_libraries = ''\n")
            server.start()
        wait_until_ready(server.url)
    except BaseException:
        server.destroy()
        raise
    return server


def wait_until_ready(url: str, timeout: float = 60.0) -> None:
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(url, connect_timeout=5) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def unavailable() -> str | None:
    """Why there can be no PostgreSQL for the tests, or ``None``."""
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        return f"psycopg is not installed ({exc}): pip install 'harel-store[postgres]'"
    if os.environ.get(URL_ENV):
        return None
    if find_bindir() is None:
        return (
            f"no PostgreSQL: set {URL_ENV} to a server's URL, or install the server "
            "binaries (initdb, pg_ctl; Debian: apt-get install postgresql)"
        )
    return None


def acquire() -> Server:
    """The server for this session (see the module docstring); raises ``RuntimeError``
    with the reason when there is none."""
    reason = unavailable()
    if reason is not None:
        raise RuntimeError(reason)
    url = os.environ.get(URL_ENV)
    if url:
        wait_until_ready(url, timeout=10.0)
        return Server(url=url)
    bindir = find_bindir()
    assert bindir is not None
    return start_throwaway(bindir)


def fresh_schema() -> str:
    """A schema name no other test uses."""
    return f"t_{os.getpid()}_{uuid.uuid4().hex[:12]}"


def drop_schema(url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '20s'")
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def port_of(server: Server) -> int:
    """The port of a throwaway ``server`` (its URL's)."""
    return int(server.url.split("@127.0.0.1:")[1].split("/")[0])


def configure(server: Server, *settings: str) -> None:
    """Append ``settings`` to a throwaway server's postgresql.conf (read at the next
    start or reload)."""
    assert server.data is not None
    with open(server.data / "postgresql.conf", "a") as conf:
        conf.write("\n".join(settings) + "\n")


def start_standby(primary: Server, bindir: Path) -> Server:
    """A streaming standby of the throwaway ``primary`` on another port of 127.0.0.1:
    ``pg_basebackup -R`` (so it starts in recovery, streaming from the primary), its own
    directory, removed by :meth:`Server.destroy`."""
    assert primary.root is not None
    root = Path(tempfile.mkdtemp(prefix="harel-pg-standby-"))
    os.chmod(root, 0o755)
    data, sockets, log = root / "data", root / "sock", root / "server.log"
    sockets.mkdir()
    if os.geteuid() == 0:
        entry = pwd.getpwnam(SERVER_USER)
        for path in (root, sockets):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    port = free_port()
    user = primary.url.split("://")[1].split("@")[0]
    standby = Server(
        url=primary.url.replace(f":{port_of(primary)}/", f":{port}/"),
        pg_ctl=_as_server_user([str(bindir / "pg_ctl"), "-l", str(log)]),
        data=data,
        root=root,
        log=log,
        env=primary.env,
    )
    try:
        backup = subprocess.run(
            _as_server_user(
                [
                    str(bindir / "pg_basebackup"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port_of(primary)),
                    "-U",
                    user,
                    "-D",
                    str(data),
                    "-R",
                    "-X",
                    "stream",
                    "-c",
                    "fast",
                ]
            ),
            capture_output=True,
            text=True,
            check=False,
            env=primary.env,
            timeout=300,
        )
        if backup.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed ({backup.returncode}):\n{backup.stderr}")
        configure(
            standby,
            f"port = {port}",
            f"unix_socket_directories = '{sockets}'",
            "hot_standby = on",
        )
        standby.start()
    except BaseException:
        standby.destroy()
        raise
    return standby


def demote(old: Server, new: Server) -> None:
    """Start the stopped throwaway server ``old`` as a read-only standby of ``new`` (as
    a demoted primary comes back): in recovery, answering read-only statements."""
    assert old.data is not None
    configure(old, f"primary_conninfo = 'host=127.0.0.1 port={port_of(new)}'")
    (old.data / "standby.signal").touch()
    if os.geteuid() == 0:
        entry = pwd.getpwnam(SERVER_USER)
        os.chown(old.data / "standby.signal", entry.pw_uid, entry.pw_gid)
    old.start()


@dataclass
class Bouncer:
    """A PgBouncer in front of a server: ``url`` reaches the server's ``postgres``
    database through it."""

    url: str
    process: subprocess.Popen[bytes]
    root: Path

    def destroy(self) -> None:
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def find_pgbouncer() -> str | None:
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None
    )


def start_pgbouncer(server: Server, pool_mode: str = "transaction") -> Bouncer:
    """PgBouncer (``pool_mode``, trust authentication) on a free port of 127.0.0.1 in
    front of the throwaway ``server``; it runs as the server's user when the tests run
    as root (PgBouncer refuses root)."""
    binary = find_pgbouncer()
    assert binary is not None
    root = Path(tempfile.mkdtemp(prefix="harel-pgbouncer-"))
    os.chmod(root, 0o755)
    user = server.url.split("://")[1].split("@")[0]
    port = free_port()
    (root / "users.txt").write_text(f'"{user}" ""\n')
    (root / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"postgres = host=127.0.0.1 port={port_of(server)} dbname=postgres\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {root / 'users.txt'}\n"
        f"pool_mode = {pool_mode}\n"
        "default_pool_size = 4\n"
        "max_client_conn = 200\n"
    )
    if os.geteuid() == 0:
        entry = pwd.getpwnam(SERVER_USER)
        for path in (root, root / "users.txt", root / "pgbouncer.ini"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    process = subprocess.Popen(
        _as_server_user([binary, str(root / "pgbouncer.ini")]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    bouncer = Bouncer(
        url=server.url.replace(f":{port_of(server)}/", f":{port}/"), process=process, root=root
    )
    try:
        wait_until_ready(bouncer.url, timeout=30.0)
    except BaseException:
        bouncer.destroy()
        raise
    return bouncer
