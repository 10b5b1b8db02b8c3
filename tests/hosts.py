"""Two "hosts" on this machine, made from network namespaces, for MPI jobs that span hosts.

Each host is a network namespace with its own address on a veth pair between the two; every process the launcher
starts there also gets its own hostname (UTS namespace), IPC namespace and a private tmpfs on /dev/shm, so MPI sees
two machines and moves the data over the veth. The launcher is a stand-in for ssh, ``SCRIPT HOST CMD...``, which
runs CMD in HOST's namespaces; mpiexec itself runs in the first host's network namespace.

Needs root, ``ip netns`` and ``unshare``; ``TwoHosts.why_unavailable()`` says in one line why not. Everything made
(namespaces, the veth pair, the launcher script, the processes left in the namespaces) goes in ``close()``.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HOST_NAMES = ("hostA", "hostB")
_INSTANCES = itertools.count()

_LAUNCHER = """#!/bin/sh
# {this}: run CMD... on HOST, a network namespace with its own hostname, IPC namespace and /dev/shm.
# Like ssh, the words of CMD are joined and run by a shell (hydra passes the proxy's command as one word).
host=$1; shift
case "$host" in
{cases}
  *) echo "launcher: unknown host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare --uts --ipc --mount --propagation private \\
  sh -c 'hostname "$0" && mount -t tmpfs -o size=256m tmpfs /dev/shm && {private}exec sh -c "$*"' "$host" "$@"
"""


def _run(*command: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


@dataclass
class Launcher:
    """How to start an MPI job across the hosts: the launcher's path and the options that make it use the hosts.

    ``args(hosts, ranks_per_host)`` gives the mpiexec options before ``-n N PROGRAM``. MPICH's hydra by default;
    another MPI (Open MPI's mpiexec, for instance) passes its own ``mpiexec`` and ``host_args``.
    """

    mpiexec: str
    python: str = sys.executable
    host_args: str = "hydra"  # "hydra" or "openmpi"

    def args(self, hosts: TwoHosts, ranks_per_host: int) -> list[str]:
        placement = ",".join(f"{name}:{ranks_per_host}" for name in HOST_NAMES)
        if self.host_args == "openmpi":
            return ["--allow-run-as-root", "--map-by", "slot", "--host", placement, "--prtemca", "plm_ssh_agent",
                    str(hosts.launcher), "--mca", "mpi_yield_when_idle", "1", "--mca", "osc", "^ucx"]
        return ["-launcher", "rsh", "-launcher-exec", str(hosts.launcher), "-localhost", hosts.addresses[0],
                "-hosts", placement]


@dataclass
class TwoHosts:
    """Two network namespaces joined by a veth pair; ``close()`` removes them. Use as a context manager.

    private_dir: a directory that only the first host sees as it is; every process started on the other host gets an
    empty tmpfs of its own over it (storage only that host sees, as on a cluster whose nodes share no filesystem).
    """

    # Unique to this process and instance: a test's own TwoHosts beside a module's must not share its namespaces.
    tag: str = field(default_factory=lambda: f"{(os.getpid() * 10 + next(_INSTANCES)) % 100000:05d}")
    namespaces: tuple[str, str] = ("", "")
    devices: tuple[str, str] = ("", "")
    addresses: tuple[str, str] = ("", "")
    directory: Path = Path()
    launcher: Path = Path()
    private_dir: Path | None = None

    @staticmethod
    def why_unavailable() -> str | None:
        """One line saying why namespaces cannot be made here, or None when they can."""
        if os.geteuid() != 0:
            return "needs root (network namespaces)"
        for tool in ("ip", "unshare"):
            if shutil.which(tool) is None:
                return f"'{tool}' is not installed"
        probe = _run("unshare", "--uts", "--ipc", "--mount", "--net", "true")
        if probe.returncode != 0:
            return f"unshare fails here: {probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else probe}"
        return None

    def open(self) -> TwoHosts:
        # Names unique to this process: other jobs on the machine may have namespaces of their own. Interface names
        # are at most 15 characters; the addresses live only inside the namespaces, so they cannot collide.
        self.namespaces = (f"mbrl{self.tag}A", f"mbrl{self.tag}B")
        self.devices = (f"mb{self.tag}a", f"mb{self.tag}b")
        octet = int(self.tag) % 250 + 1
        self.addresses = (f"10.213.{octet}.1", f"10.213.{octet}.2")
        self.directory = Path(tempfile.mkdtemp(prefix=f"twohosts{self.tag}_"))
        try:
            for ns in self.namespaces:
                self._must("ip", "netns", "add", ns)
                self._must("ip", "-n", ns, "link", "set", "lo", "up")
            self._must("ip", "link", "add", self.devices[0], "netns", self.namespaces[0], "type", "veth",
                       "peer", "name", self.devices[1], "netns", self.namespaces[1])
            for ns, dev, address in zip(self.namespaces, self.devices, self.addresses, strict=True):
                self._must("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", dev)
                self._must("ip", "-n", ns, "link", "set", dev, "up")
            self._wait_until_link_up()
            cases = "\n".join(f"  {name}) ns={ns} ;;" for name, ns in zip(HOST_NAMES, self.namespaces, strict=True))
            self.launcher = self.directory / "launcher.sh"
            private = "" if self.private_dir is None else (
                f'{{ [ "$0" = {HOST_NAMES[0]} ] || mount -t tmpfs -o size=64m tmpfs {self.private_dir}; }} && ')
            self.launcher.write_text(_LAUNCHER.format(this=self.launcher.name, cases=cases, private=private))
            self.launcher.chmod(0o755)
        except BaseException:
            self.close()
            raise
        return self

    def _wait_until_link_up(self, timeout_s: float = 10) -> None:
        """Poll until both ends of the veth report operstate UP (a moment after ``link set up``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = [json.loads(_run("ip", "-n", ns, "-j", "link", "show", "dev", dev).stdout)[0].get("operstate")
                      for ns, dev in zip(self.namespaces, self.devices, strict=True)]
            if states == ["UP", "UP"]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the veth pair did not come up within {timeout_s} s: {states}")
            time.sleep(0.02)

    def _must(self, *command: str) -> None:
        result = _run(*command)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()}")

    def __enter__(self) -> TwoHosts:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pids(self) -> list[int]:
        """Processes running in either namespace (the job's ranks, proxies and launchers)."""
        found: list[int] = []
        for ns in self.namespaces:
            if ns:
                result = _run("ip", "netns", "pids", ns)
                found += [int(p) for p in result.stdout.split()]
        return found

    def close(self) -> None:
        """End every process left in the namespaces, then remove the namespaces (and with them the veth pair) and
        the launcher script. Safe to call twice."""
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        for ns in self.namespaces:
            if ns:
                _run("ip", "netns", "del", ns)
        if self.directory != Path() and self.directory.exists():
            shutil.rmtree(self.directory, ignore_errors=True)

    def link_bytes(self) -> int:
        """Bytes the first host's end of the veth has sent plus received so far."""
        result = _run("ip", "-n", self.namespaces[0], "-s", "-j", "link", "show", "dev", self.devices[0])
        stats = json.loads(result.stdout)[0]["stats64"]
        return int(stats["rx"]["bytes"]) + int(stats["tx"]["bytes"])

    def mpiexec_command(self, launcher: Launcher, ranks_per_host: int, program: list[str]) -> list[str]:
        """The command line that runs ``program`` (after the interpreter) as ``ranks_per_host`` ranks on each host:
        mpiexec in the first host's network namespace."""
        return ["ip", "netns", "exec", self.namespaces[0], launcher.mpiexec, *launcher.args(self, ranks_per_host),
                "-n", str(2 * ranks_per_host), launcher.python, "-u", *program]
