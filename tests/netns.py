"""Virtual hosts for the tests: network namespaces on a private bridge, each with its own
address, as separate machines on one network (root and iproute2 needed, see
:func:`why_not`).

Every name carries this process's id (``dfpt<pid>...``), so that two test runs at once never
share an interface or a namespace, and the addresses are a /24 no interface of this
machine uses: the tests send traffic only on what they made.  :class:`Network` removes
what it made when its block ends, whatever ends it (an error, Ctrl-C, SIGTERM); what a
killed run left behind (its process gone) the next one removes.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
from pathlib import Path

#: the prefix of every interface and namespace name made here (followed by the pid)
PREFIX = "dfpt"


def _ip(*args, check=True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def why_not() -> str | None:
    """None if :class:`Network` works here, else why not: root, ``ip``, network namespaces
    and bridges (a container without CAP_NET_ADMIN/CAP_SYS_ADMIN has none of them)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's `ip`"
    name = f"{PREFIX}{os.getpid()}p"
    try:
        made = _ip("netns", "add", name, check=False)
        if made.returncode:
            return f"`ip netns add` failed: {made.stderr.strip()}"
        made = _ip("link", "add", name, "type", "bridge", check=False)
        if made.returncode:
            return f"`ip link add ... type bridge` failed: {made.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip` cannot run: {exc}"
    finally:
        _ip("link", "delete", name, check=False)
        _ip("netns", "delete", name, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers() -> None:
    """Remove the namespaces and interfaces of runs whose process is gone (killed before
    their cleanup ran); those of live runs, this one's included, are left alone."""
    owner = re.compile(rf"{PREFIX}(\d+)")
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if (m := owner.match(name)) and not _alive(int(m.group(1))):
            _delete_namespace(name)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        fields = line.split(":")
        name = fields[1].strip().split("@")[0] if len(fields) > 1 else ""
        if (m := owner.match(name)) and not _alive(int(m.group(1))):
            _ip("link", "delete", name, check=False)


def _delete_namespace(name: str) -> None:
    """Kill what still runs in the namespace ``name`` (processes a test started there), then
    delete it: a namespace with a process left lives on, unnamed, until that process ends."""
    for pid in _ip("netns", "pids", name, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass
    _ip("netns", "delete", name, check=False)


def _free_subnet(seed: int) -> str:
    """``10.213.X``: a /24 that no address or route of this machine's uses."""
    used = _ip("-4", "-o", "addr", "show", check=False).stdout + _ip("-4", "route", check=False).stdout
    for i in range(256):
        subnet = f"10.213.{(seed + i) % 256}"
        if f" {subnet}." not in used and f"\n{subnet}." not in used and not used.startswith(subnet + "."):
            return subnet
    raise RuntimeError("no free 10.213.X.0/24 for the test network")


class Network:
    """Network namespaces ``hosts`` (names), each with one interface ``eth0`` on a private
    bridge; this process (the client) reaches them at the bridge's address,
    :attr:`gateway`.

    Parameters
    ----------
    hosts : list of str
        Short names of the virtual hosts (letters and digits).
    """

    def __init__(self, hosts):
        pid = os.getpid()
        tag = f"{PREFIX}{pid}"  # at most 4 + 7 digits: names fit the 15 bytes of an interface
        self.bridge = f"{tag}b"
        self.hosts = list(hosts)
        self.namespaces = {h: f"{tag}-{h}" for h in self.hosts}
        self.veths = {h: f"{tag}v{i}" for i, h in enumerate(self.hosts)}
        self._subnet = _free_subnet(pid)
        self.gateway = f"{self._subnet}.1"
        self.addresses = {h: f"{self._subnet}.{i + 2}" for i, h in enumerate(self.hosts)}
        self._sigterm = None

    def prefix(self, host: str) -> list[str]:
        """The prefix of a command that runs it on ``host``."""
        return ["ip", "netns", "exec", self.namespaces[host]]

    def cut(self, host: str) -> None:
        """Take ``host``'s link down (its cable pulled): packets to and from it are lost,
        no connection is closed or refused."""
        _ip("link", "set", self.veths[host], "down")

    def received_bytes(self) -> int:
        """Bytes this machine has received from the virtual hosts (the bridge's count of
        what it passed up to this network stack; not what the hosts sent each other)."""
        return int(Path(f"/sys/class/net/{self.bridge}/statistics/rx_bytes").read_text())

    def __enter__(self):
        remove_leftovers()
        if threading.current_thread() is threading.main_thread():
            # SIGTERM (a CI job cancelled) unwinds like Ctrl-C, so that __exit__ runs
            self._sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for host in self.hosts:
                ns, veth = self.namespaces[host], self.veths[host]
                _ip("netns", "add", ns)
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", veth, "master", self.bridge, "up")
                _ip("-n", ns, "addr", "add", f"{self.addresses[host]}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        """Remove the namespaces (killing any process a failed stop left in them), the
        links and the bridge."""
        try:
            for host in self.hosts:
                _ip("link", "delete", self.veths[host], check=False)  # both ends of the pair
                _delete_namespace(self.namespaces[host])
            _ip("link", "delete", self.bridge, check=False)
        finally:
            if self._sigterm is not None:
                signal.signal(signal.SIGTERM, self._sigterm)
                self._sigterm = None

    def leftovers(self) -> list[str]:
        """Names of this network still present (for a test that checks its cleanup)."""
        names = set(self.namespaces.values()) | set(self.veths.values()) | {self.bridge}
        found = _ip("netns", "list", check=False).stdout.split() + [
            line.split(":")[1].strip().split("@")[0]
            for line in _ip("-o", "link", "show", check=False).stdout.splitlines()
            if len(line.split(":")) > 1]
        return sorted(names & set(found))


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")
