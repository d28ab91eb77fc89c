"""Two hosts' network stacks on one machine: two network namespaces joined by a veth pair (root only).

    with NetnsPair() as net:          # namespaces kvb<pid>a / kvb<pid>b, addresses 10.231.<n>.1 / .2
        net.run("b", ["python", ...]) # a command in namespace b (its own hostname too: see exec_argv)
        net.rsh_agent(path)           # an Open MPI launch agent that starts a host's daemon in its namespace

Each namespace also gets its own hostname (a UTS namespace): Open MPI and our results tell ranks apart by
host name, and two ranks with one name are taken for one node (shared memory between them fails across
network namespaces). Every test that needs two hosts uses this one helper; it removes what it made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def why_not() -> str | None:
    """Why two namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2, util-linux)"
    probe = f"kvbprobe{os.getpid()}"  # a container may deny it even to root (no CAP_SYS_ADMIN / CAP_NET_ADMIN)
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"ip netns add failed here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class NetnsPair:
    def __init__(self):
        tag = os.getpid() % 100000
        self.ns = {"a": f"kvb{tag}a", "b": f"kvb{tag}b"}
        self.veth = {"a": f"kvv{tag}a", "b": f"kvv{tag}b"}
        self.subnet = f"10.231.{tag % 250}"
        self.addr = {"a": f"{self.subnet}.1", "b": f"{self.subnet}.2"}
        self.cidr = f"{self.subnet}.0/24"

    def __enter__(self) -> NetnsPair:
        try:
            for side in "ab":
                _ip("netns", "add", self.ns[side])
            _ip("link", "add", self.veth["a"], "type", "veth", "peer", "name", self.veth["b"])
            for side in "ab":
                ns, dev = self.ns[side], self.veth[side]
                _ip("link", "set", dev, "netns", ns)
                _ip("-n", ns, "addr", "add", f"{self.addr[side]}/24", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except subprocess.CalledProcessError as e:
            self.__exit__()
            raise RuntimeError(f"could not make two network namespaces: {e.stderr.strip()}") from None
        return self

    def __exit__(self, *exc) -> None:
        for side in "ab":  # removing a namespace removes its end of the veth pair, and so the pair
            subprocess.run(["ip", "netns", "del", self.ns[side]], capture_output=True)

    def exec_argv(self, side: str, argv: list[str]) -> list[str]:
        """argv run in namespace `side`, under its own hostname (the namespace's name)."""
        return ["ip", "netns", "exec", self.ns[side], "unshare", "--uts", "sh", "-c",
                f'hostname {self.ns[side]} && exec "$@"', "sh", *argv]

    def run(self, side: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.exec_argv(side, argv), capture_output=True, text=True, **kw)

    def popen(self, side: str, argv: list[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self.exec_argv(side, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, **kw)

    def rsh_agent(self, path: Path) -> Path:
        """Open MPI's remote launch agent (plm_ssh_agent): `agent HOST CMD...` runs CMD in HOST's namespace."""
        cases = "\n".join(f'  {self.addr[s]}) ns={self.ns[s]} ;;' for s in "ab")
        path.write_text(f"""#!/bin/sh
host=$1; shift
case $host in
{cases}
  *) echo "no namespace for host $host" >&2; exit 1 ;;
esac
exec ip netns exec $ns unshare --uts sh -c "hostname $ns; $*"
""")
        path.chmod(0o755)
        return path


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)
