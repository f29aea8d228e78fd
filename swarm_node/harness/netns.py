"""A small internet inside Linux network namespaces, for tests and benchmarks that cross real networks.

    with Internet("sn1") as net:            # a bridge namespace: the "internet", 11.11.0.0/16
        relay = net.host("relay")           # a public host on it, in a /24 of its own: 11.11.0.10
        far = net.host("far", subnet=0)     # another in the same /24: 11.11.0.11
        a = net.nat_host("a")               # a host at 10.1.0.2 behind its own masquerading NAT router
        net.shape(a, loss_pct=1, rate_kbit=2000, delay_ms=50, jitter_ms=10)  # nftables loss, tc tbf,
                                            # and a userspace netem (netem.py) on the host's link
        net.partition([relay], [a])         # nftables drops between the two sides; net.heal() undoes it
        subprocess.Popen(a.cmd(["python", ...]))   # `ip netns exec` + the command

Everything lives in namespaces named `<prefix>-*` that `close()` (or leaving the `with`) deletes,
killing what still runs inside them, so a failed test leaves nothing behind. Needs root (or
CAP_NET_ADMIN), iproute2 and nftables (tests/host-packages.sh installs them); `unavailable()` says why
not, for a clear skip (a failure under CI, tests/ci_skips.py). Delays
also need /dev/net/tun (`shape` raises without it).
Addresses: public hosts 11.11.s.10.. (s: the host's /24, a new one per host unless given: separate
machines, as the per-subnet neighbour limit sees them), NAT router k's WAN 11.11.(100 + k).1, its LAN
10.k.0.0/24; the bridge's hosts are all on one link (11.11.0.0/16).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

PUBLIC_NET = "11.11"  # a public-looking range: libp2p drops special-purpose ranges (TEST-NET...) from relay addresses; traffic never leaves our namespaces


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(list(args), capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
    return out


def unavailable() -> str | None:
    """Why namespaces cannot be used here (None: they can): tries one namespace with nftables in it."""
    for tool in ("ip", "nft", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed; install with: sh tests/host-packages.sh (as root; `make test` runs it)"
    name = f"snprobe{os.getpid() % 100000}"
    try:
        _sh("ip", "netns", "add", name)
    except RuntimeError as e:
        return f"cannot create a network namespace: {e}"
    try:
        _sh("ip", "netns", "exec", name, "nft", "add", "table", "ip", "probe")
    except RuntimeError as e:
        return f"cannot use nftables in a namespace: {e}"
    finally:
        _sh("ip", "netns", "del", name, check=False)
    return None


@dataclass
class Host:
    ns: str  # namespace name
    ip: str  # this host's own address (private for a NATed host)
    link: str  # the host-side interface shaped by `Internet.shape`
    public_ip: str  # the address others see: its own, or its NAT router's WAN address
    port: str  # the bridge port of its way to the internet (its own link's, or its NAT router's)
    router: str | None = None  # the NAT router's namespace, if any
    dropped: set[str] = field(default_factory=set)  # addresses a partition currently drops

    def cmd(self, argv: list[str]) -> list[str]:
        """`argv` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return _sh(*self.cmd(list(argv)), check=check)


class Internet:
    """A bridge namespace plus hosts attached to it (public, or behind a masquerading NAT)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.namespaces: list[str] = []
        self.hosts: list[Host] = []
        self._public: dict[int, int] = {}  # public hosts so far, per subnet
        self._nat = 0
        self._netem: subprocess.Popen | None = None  # netem.py in the bridge namespace, once a link is delayed
        self.bridge_ns = self._namespace("inet")
        _sh("ip", "-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.bridge_ns, "link", "set", "br0", "up")

    # ---- building -------------------------------------------------------------------------------
    def _namespace(self, name: str) -> str:
        ns = f"{self.prefix}-{name}"
        _sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        return ns

    def _wire(self, ns: str, ifname: str, peer_ns: str, peer_ifname: str) -> None:
        """A veth pair between two namespaces (temporary names avoid clashes in the root namespace)."""
        tmp_a, tmp_b = f"v{os.getpid() % 10000}{len(self.namespaces)}a", f"v{os.getpid() % 10000}{len(self.namespaces)}b"
        _sh("ip", "link", "add", tmp_a, "type", "veth", "peer", "name", tmp_b)
        _sh("ip", "link", "set", tmp_a, "netns", ns, "name", ifname)
        _sh("ip", "link", "set", tmp_b, "netns", peer_ns, "name", peer_ifname)
        _sh("ip", "-n", ns, "link", "set", ifname, "up")
        _sh("ip", "-n", peer_ns, "link", "set", peer_ifname, "up")

    def _attach(self, ns: str, ip: str, tag: str) -> str:
        """Connect `ns` (interface wan0) to the bridge with address `ip`/16; returns the bridge port."""
        port = f"p-{tag}"[:15]
        self._wire(ns, "wan0", self.bridge_ns, port)
        _sh("ip", "-n", self.bridge_ns, "link", "set", port, "master", "br0")
        _sh("ip", "-n", ns, "addr", "add", f"{ip}/16", "dev", "wan0")
        return port

    def host(self, name: str, subnet: int | None = None) -> Host:
        """A host with a public address on the internet, in 11.11.`subnet`.0/24 (0..99; default: the
        lowest no host has yet)."""
        if subnet is None:
            subnet = min(k for k in range(100) if k not in self._public)
        assert 0 <= subnet < 100
        ns = self._namespace(name)
        ip = f"{PUBLIC_NET}.{subnet}.{10 + self._public.get(subnet, 0)}"
        self._public[subnet] = self._public.get(subnet, 0) + 1
        host = Host(ns, ip, "wan0", ip, self._attach(ns, ip, name))
        self.hosts.append(host)
        return host

    def nat_host(self, name: str) -> Host:
        """A host at 10.k.0.2 behind its own router namespace that masquerades to the internet and
        forwards nothing inward (a home router with no port forwarding)."""
        self._nat += 1
        k = self._nat
        router = self._namespace(f"{name}-nat")
        wan_ip = f"{PUBLIC_NET}.{100 + k}.1"
        port = self._attach(router, wan_ip, f"{name}-nat")
        ns = self._namespace(name)
        self._wire(router, "lan0", ns, "eth0")
        _sh("ip", "-n", router, "addr", "add", f"10.{k}.0.1/24", "dev", "lan0")
        _sh("ip", "-n", ns, "addr", "add", f"10.{k}.0.2/24", "dev", "eth0")
        _sh("ip", "-n", ns, "route", "add", "default", "via", f"10.{k}.0.1")
        _sh("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        rules = (f"table ip nat {{\n chain post {{\n type nat hook postrouting priority 100\n"
                 f" oifname \"wan0\" ip saddr 10.{k}.0.0/24 masquerade\n }}\n}}\n"
                 # inbound: only replies to connections made from inside (no port forwarding)
                 "table ip filter {\n chain forward_in {\n type filter hook forward priority 0; policy drop\n"
                 " ct state established,related accept\n iifname \"lan0\" accept\n }\n}\n")
        subprocess.run(["ip", "netns", "exec", router, "nft", "-f", "-"], input=rules, text=True, check=True)
        host = Host(ns, f"10.{k}.0.2", "eth0", wan_ip, port, router)
        self.hosts.append(host)
        return host

    # ---- faults -------------------------------------------------------------------------------------
    def shape(self, host: Host, loss_pct: float = 0, rate_kbit: int | None = None, delay_ms: float = 0,
              jitter_ms: float = 0, seed: int = 0) -> None:
        """Degrade the host's outgoing traffic: random loss (nftables `numgen`), a rate limit (tc tbf on
        its link), latency with jitter (netem.py on its way into the bridge, behind its NAT
        router if any: this kernel has no sch_netem)."""
        if loss_pct:
            rules = (f"table inet shape {{\n chain out {{\n type filter hook output priority 0\n"
                     f" numgen random mod 1000 < {int(loss_pct * 10)} drop\n }}\n}}\n")
            subprocess.run(host.cmd(["nft", "-f", "-"]), input=rules, text=True, check=True)
        if rate_kbit:
            host.run("tc", "qdisc", "replace", "dev", host.link, "root", "tbf", "rate", f"{rate_kbit}kbit",
                     "burst", "32kbit", "latency", "400ms")
        if delay_ms:
            self._delay(host.port, delay_ms, jitter_ms, seed)

    def _delay(self, port: str, delay_ms: float, jitter_ms: float, seed: int) -> None:
        """Put netem.py between `port` and the bridge: a tap it makes takes the port's place."""
        if self._netem is None:
            wire = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netem.py")
            self._netem = subprocess.Popen(["ip", "netns", "exec", self.bridge_ns, sys.executable, wire],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        tap = f"t{port[1:]}"
        answer = self._ask(f"add {port} {tap} {delay_ms} {jitter_ms} {seed}")
        if answer != f"ok {tap}":
            raise RuntimeError(f"netem.py could not delay {port}: {answer or 'it exited'}")
        _sh("ip", "-n", self.bridge_ns, "link", "set", port, "nomaster")
        _sh("ip", "-n", self.bridge_ns, "link", "set", tap, "master", "br0")
        _sh("ip", "-n", self.bridge_ns, "link", "set", tap, "up")

    def netem_stats(self) -> dict:
        """Frames netem.py delayed and dropped, per bridge port ({} when no link is delayed)."""
        return json.loads(self._ask("stats")) if self._netem is not None else {}

    def _ask(self, line: str) -> str:
        """One control line to netem.py, its one-line answer ("" if it exited)."""
        self._netem.stdin.write(line + "\n")
        self._netem.stdin.flush()
        return self._netem.stdout.readline().strip()

    def partition(self, *sides: list[Host]) -> None:
        """Drop every packet between hosts of different sides (both directions), until `heal`."""
        self.heal()
        for side in sides:
            others = {h.public_ip for s in sides if s is not side for h in s} | \
                     {h.ip for s in sides if s is not side for h in s}
            for h in side:
                addrs = ", ".join(sorted(others))
                rules = (f"table inet part {{\n chain out {{\n type filter hook output priority 0\n"
                         f" ip daddr {{ {addrs} }} drop\n }}\n chain in {{\n type filter hook input priority 0\n"
                         f" ip saddr {{ {addrs} }} drop\n }}\n}}\n")
                subprocess.run(h.cmd(["nft", "-f", "-"]), input=rules, text=True, check=True)
                h.dropped = others

    def heal(self) -> None:
        for h in self.hosts:
            if h.dropped:
                h.run("nft", "delete", "table", "inet", "part", check=False)
                h.dropped = set()

    # ---- teardown -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill what runs in our namespaces, then delete them."""
        if self._netem is not None:
            self._netem.kill()
            self._netem.wait(10)
        for ns in self.namespaces:
            pids = _sh("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        for ns in reversed(self.namespaces):
            _sh("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()

    def __enter__(self) -> Internet:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_RECEIVE = """import socket, time
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", 5102))
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); t.bind(("0.0.0.0", 5101)); t.listen()
print("ready", flush=True); u.settimeout(5); k = 0
try:
    while True: u.recv(64); k += 1; u.settimeout(1)
except socket.timeout: pass
c, _ = t.accept(); n = 0; t0 = None
while d := c.recv(65536): t0 = t0 or time.time(); n += len(d)
print(n * 8 / 1000 / (time.time() - t0), k)"""
_SEND_UDP = """import socket, sys, time
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(3000):
    time.sleep(0.0005)
    try: u.sendto(b"y" * 32, (sys.argv[1], 5102))
    except PermissionError: pass  # an nftables drop in the output hook is EPERM to the sender"""
_SEND_TCP = "import socket, sys; s = socket.create_connection((sys.argv[1], 5101)); s.sendall(b'x' * 1000000); s.close()"
_RTT = """import socket, statistics, sys, time
rtt = []
for _ in range(15):  # a SYN to a closed port comes back as a RST: one round trip
    t = time.perf_counter()
    try: socket.create_connection((sys.argv[1], 5109), timeout=5)
    except (ConnectionRefusedError, PermissionError, TimeoutError): pass
    rtt.append(time.perf_counter() - t)
print(round(1e3 * statistics.median(rtt), 1))"""


def measure_link(tcp_from: Host, udp_from: Host, to: Host) -> dict:
    """What the shaping does on the wire: kbit/s of 1 MB over TCP from `tcp_from`, the fraction of 3,000
    UDP datagrams from `udp_from` lost, both received at `to`; the median round trip from `tcp_from` to
    `to` (15 connects to a closed port); and whether `to` could have used the kernel's netem."""
    receiver = subprocess.Popen(to.cmd([sys.executable, "-c", _RECEIVE]), stdout=subprocess.PIPE, text=True)
    receiver.stdout.readline()
    subprocess.run(udp_from.cmd([sys.executable, "-c", _SEND_UDP, to.ip]), check=True, timeout=60)
    time.sleep(1.5)
    subprocess.run(tcp_from.cmd([sys.executable, "-c", _SEND_TCP, to.ip]), check=True, timeout=60)
    kbit, got = receiver.communicate(timeout=60)[0].split()
    rtt = subprocess.run(tcp_from.cmd([sys.executable, "-c", _RTT, to.ip]), capture_output=True, text=True,
                         check=True, timeout=120).stdout
    netem = to.run("tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "10ms", check=False)
    return {"measured_kbit": round(float(kbit)), "udp_sent": 3000, "udp_lost_frac": round(1 - int(got) / 3000, 4),
            "rtt_ms": float(rtt), "kernel_netem": netem.stderr.strip() or "available"}


def tmpfs_holder(host: Host, path, size: str, seconds: float) -> subprocess.Popen:
    """A process in `host`'s network namespace and its own private mount namespace, holding a tmpfs of
    `size` (e.g. "16m") on `path` for `seconds`; others enter it with `nsenter -t PID -m -n`."""
    os.makedirs(path, exist_ok=True)
    script = f"mount -t tmpfs -o size={size} tmpfs {path} && echo mounted && exec sleep {int(seconds)}"
    holder = subprocess.Popen(host.cmd(["unshare", "-m", "--propagation", "private", "sh", "-c", script]),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    line = holder.stdout.readline()
    if "mounted" not in line:
        raise RuntimeError(f"cannot mount a tmpfs in a private mount namespace: {line.strip()}")
    return holder


def leftover_namespaces(prefix: str) -> list[str]:
    """Namespaces named `<prefix>-*` that still exist."""
    return [line.split()[0] for line in _sh("ip", "netns", "list").stdout.splitlines()
            if line.startswith(f"{prefix}-")]
