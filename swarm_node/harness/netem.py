"""A userspace netem: delays the frames hosts send into netns.py's bridge, for kernels built
without sch_netem (this machine's `tc qdisc ... netem` says "Error: Specified qdisc kind is unknown.").

Runs in the bridge namespace, started by `Internet.shape(host, delay_ms=...)`. For a delayed host,
the host's veth end there (PORT) leaves the bridge and a tap device (TAP) made by this process takes
its place; frames are copied between the two:

    host --veth--> PORT --(held DELAY +- JITTER ms)--> TAP --> bridge     the host's outgoing frames
    host <--veth-- PORT <--------(at once)------------ TAP <-- bridge     its incoming frames

as `tc qdisc add dev <host link> root netem delay DELAY JITTER` would, jitter uniform, except that
frames never overtake each other (netem reorders under jitter; TCP would see that as loss). Both
ends carry virtio-net headers (PACKET_VNET_HDR, IFF_VNET_HDR), so TCP segments of up to 64 KiB
cross as one frame and the kernel keeps segmenting and checksumming them. At most LIMIT frames wait
per host (netem's default limit is 1000); more are dropped and counted.

Control lines on stdin: `add PORT TAP DELAY_MS JITTER_MS SEED` (answered `ok TAP` once the tap
exists) and `stats` (answered with one JSON line: frames delayed / dropped per port).
"""

from __future__ import annotations

import collections
import fcntl
import json
import os
import random
import select
import socket
import struct
import sys
import time

ETH_P_ALL, SOL_PACKET, PACKET_VNET_HDR, PACKET_IGNORE_OUTGOING = 0x0003, 263, 15, 23
TUNSETIFF, TUNSETOFFLOAD = 0x400454CA, 0x400454D0
IFF_TAP, IFF_NO_PI, IFF_VNET_HDR = 0x0002, 0x1000, 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6 = 0x01, 0x02, 0x04
LIMIT = 10_000  # frames held per host
FRAME = 65_536 + 64  # the largest frame (a 64 KiB GSO segment) plus its virtio-net header


class Link:
    """One delayed host link: PORT's packet socket, the tap standing in for it, the frames held."""

    def __init__(self, port: str, tap: str, delay_ms: float, jitter_ms: float, seed: int):
        self.port, self.delay, self.jitter, self.rng = port, delay_ms / 1e3, jitter_ms / 1e3, random.Random(seed)
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
        self.sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)  # not the frames we send the host
        self.sock.bind((port, 0))
        self.sock.setblocking(False)
        self.tap = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(self.tap, TUNSETIFF, struct.pack("16sH", tap.encode(), IFF_TAP | IFF_NO_PI | IFF_VNET_HDR))
        fcntl.ioctl(self.tap, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)
        self.held: collections.deque[tuple[float, bytes]] = collections.deque()  # (due, frame), due ascending
        self.delayed = self.dropped = 0

    def from_host(self, now: float) -> None:
        """Hold every frame the host sent until its due time (never before an earlier frame's)."""
        while True:
            try:
                frame = self.sock.recv(FRAME)
            except BlockingIOError:
                return
            if len(self.held) >= LIMIT:
                self.dropped += 1
                continue
            due = now + max(0.0, self.delay + self.rng.uniform(-self.jitter, self.jitter))
            self.held.append((max(due, self.held[-1][0]) if self.held else due, frame))
            self.delayed += 1

    def to_bridge(self, now: float) -> None:
        while self.held and self.held[0][0] <= now:
            _, frame = self.held.popleft()
            try:
                os.write(self.tap, frame)
            except OSError:  # the bridge refused it (e.g. the tap is down): lost, as on a wire
                self.dropped += 1

    def to_host(self) -> None:
        while True:
            try:
                frame = os.read(self.tap, FRAME)
            except BlockingIOError:
                return
            try:
                self.sock.send(frame)
            except OSError:
                pass


def serve() -> None:
    links: list[Link] = []
    by_fd: dict[int, tuple[Link, str]] = {}
    stdin = sys.stdin.fileno()
    while True:
        now = time.monotonic()
        due = [link.held[0][0] for link in links if link.held]
        timeout = max(0.0, min(due) - now) if due else None
        ready, _, _ = select.select([stdin, *by_fd], [], [], timeout)
        now = time.monotonic()
        for fd in ready:
            if fd == stdin:
                line = sys.stdin.readline()
                if not line:  # our parent is gone
                    return
                command = line.split()
                if command[0] == "add":
                    port, tap, delay, jitter, seed = command[1:]
                    link = Link(port, tap, float(delay), float(jitter), int(seed))
                    links.append(link)
                    by_fd[link.sock.fileno()], by_fd[link.tap] = (link, "host"), (link, "bridge")
                    print(f"ok {tap}", flush=True)
                elif command[0] == "stats":
                    print(json.dumps({lk.port: {"delayed": lk.delayed, "dropped": lk.dropped} for lk in links}),
                          flush=True)
                continue
            link, side = by_fd[fd]
            if side == "host":
                link.from_host(now)
            else:
                link.to_host()
        for link in links:
            link.to_bridge(now)


if __name__ == "__main__":
    serve()
