"""A live conformance probe: checks a running node of any implementation against protocol/SPEC.md.

`swarm-node protocol conformance --peer ADDR` opens streams to the node at ADDR and checks, one
line each: that it speaks the versioned protocol ids; that it answers a valid announcement with
its own (every field of section 11's table, valid) and refuses a wrong run, a wrong packet
protocol, a malformed and an out-of-range announcement with the right reason; that the fetch
server answers not_found, bad_request and unknown keys as section 12 says; and, when the node
offers a packet, that it serves exactly the announced bytes (digest, size, a valid packet of the
node's run signed by the node's peer id), resumes at an offset and refuses an offset past the end.

No hivemind here: the caller supplies `open_stream(protocol ids) -> (id negotiated, reader, writer)`
to the node under test (hivemind.py's `HivemindTransport.aopen_stream` over libp2p).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from swarm_node.net.records import (ANNOUNCE_PROTOCOL, FETCH_PROTOCOL, MAX_ANNOUNCE_BYTES, MAX_ROUND,
                                    STATUS_BAD_REQUEST, STATUS_FULL, STATUS_NOT_FOUND, STATUS_OK, STATUS_REFUSED,
                                    RecordError, decode_frame_body, encode_frame, frame_length, make_announcement,
                                    parse_announcement, parse_peer_exchange)
from swarm_node.wire import codec

OpenStream = Callable[[tuple[str, ...]], Awaitable[tuple[str, asyncio.StreamReader, asyncio.StreamWriter]]]
STEP_TIMEOUT_S = 10.0  # one exchange with the node under test at most
ZERO_DIGEST = "sha256:" + "0" * 64


@dataclass
class Check:
    name: str
    outcome: str  # PASS | FAIL | SKIP
    detail: str


class Probe:
    """The checks against one node; `run()` returns them in order, never raises on the node's behaviour."""

    def __init__(self, open_stream: OpenStream, run_id: str, peer_id: str, protocol: int = codec.PROTOCOL_VERSION):
        self.open_stream, self.run_id, self.peer_id, self.protocol = open_stream, run_id, peer_id, protocol
        self.checks: list[Check] = []
        self.offers: list[tuple[int, str, int]] = []

    def record(self, name: str, passed: bool, detail: str) -> None:
        self.checks.append(Check(name, "PASS" if passed else "FAIL", detail))

    async def exchange(self, protos: tuple[str, ...], frame: bytes, max_reply: int) -> tuple[str, dict, bytes]:
        """Write `frame`, read one reply frame and whatever follows until the node closes (bounded)."""
        proto, reader, writer = await self.open_stream(protos)
        try:
            writer.write(frame)
            await writer.drain()
            n = frame_length(await reader.readexactly(4), max_reply)
            reply = decode_frame_body(await reader.readexactly(n))
            rest = bytearray()
            while len(rest) <= codec.MAX_PACKET_BYTES:
                chunk = await reader.read(1 << 20)
                if not chunk:
                    break
                rest += chunk
            return proto, reply, bytes(rest)
        finally:
            writer.close()

    async def step(self, name: str, fn: Callable[[], Awaitable[tuple[bool, str]]]) -> None:
        try:
            passed, detail = await asyncio.wait_for(fn(), STEP_TIMEOUT_S)
        except asyncio.TimeoutError:
            passed, detail = False, f"no answer within {STEP_TIMEOUT_S:.0f} s"
        except Exception as e:  # the node's misbehaviour is a failed check, never a crash of the probe
            passed, detail = False, f"{type(e).__name__}: {e}"[:200]
        self.record(name, passed, detail)

    # ---- announcements (SPEC section 11) ---------------------------------------------------------------
    def announcement(self, **change) -> dict:
        ann = make_announcement(self.run_id, time.time_ns() // 1000, "conformance-probe", "", self.protocol, 0, 0, [],
                                [], [], produces=False)
        return {**ann, **change}

    async def announce(self, ann: dict) -> dict:
        _, reply, _ = await self.exchange((ANNOUNCE_PROTOCOL,), encode_frame(ann, MAX_ANNOUNCE_BYTES), MAX_ANNOUNCE_BYTES)
        return reply

    async def check_announce_ok(self) -> tuple[bool, str]:
        reply = await self.announce(self.announcement())
        status = reply.get("status")
        if status == STATUS_FULL:
            parse_peer_exchange(reply.get("peers", []))
            return True, "full (no room for a neighbor), with a valid peer sample"
        if status != STATUS_OK:
            return False, f"expected ok or full, got {reply!r:.120}"
        ann = parse_announcement(reply, self.peer_id, time.time())  # every field of the table, valid
        if ann.run_id != self.run_id or ann.info.protocol != self.protocol:
            return False, f"its reply says run {ann.run_id!r}, protocol {ann.info.protocol}"
        self.offers = sorted(ann.info.offers)
        return True, f"ok: round {ann.info.round}, {len(ann.info.offers)} offers, produces {ann.info.produces}"

    def refusal(self, reason: str, **change) -> Callable[[], Awaitable[tuple[bool, str]]]:
        async def check() -> tuple[bool, str]:
            ann = change.pop("_replace", None) or self.announcement(**change)
            reply = await self.announce(ann)
            got = (reply.get("status"), reply.get("reason"))
            return got == (STATUS_REFUSED, reason), f"answered {got[0]}/{got[1]}"
        return check

    # ---- fetch (SPEC section 12) -----------------------------------------------------------------------
    async def fetch(self, request: dict) -> tuple[dict, bytes]:
        _, header, body = await self.exchange((FETCH_PROTOCOL,), encode_frame(request), 1024)
        return header, body

    def fetch_status(self, want: str, **request) -> Callable[[], Awaitable[tuple[bool, str]]]:
        async def check() -> tuple[bool, str]:
            header, body = await self.fetch({"run_id": self.run_id, "digest": ZERO_DIGEST, **request})
            return header.get("status") == want and not body, f"answered {header!r:.100} and {len(body)} bytes"
        return check

    async def check_fetch_ok(self) -> tuple[bool, str]:
        r, digest, size = self.offers[-1]
        header, body = await self.fetch({"run_id": self.run_id, "digest": digest})
        if header.get("status") != STATUS_OK or header.get("size") != size or header.get("offset", 0) != 0:
            return False, f"header {header!r:.120} for an offer of {size} bytes"
        if len(body) != size or "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            return False, f"{len(body)} bytes that do not hash to the announced digest"
        packet = codec.decode(body)
        if packet.sender != self.peer_id or packet.run_id != self.run_id or packet.round != r:
            return False, f"packet of sender {packet.sender}, run {packet.run_id!r}, round {packet.round}"
        self.body = body
        return True, f"{size} bytes, digest and packet valid, sender = the peer"

    async def check_resume(self) -> tuple[bool, str]:
        _, digest, size = self.offers[-1]
        offset = size // 2
        header, body = await self.fetch({"run_id": self.run_id, "digest": digest, "offset": offset})
        ok = header.get("status") == STATUS_OK and header.get("offset") == offset and body == self.body[offset:]
        return ok, f"header {header!r:.100}, {len(body)} bytes"

    async def run(self) -> list[Check]:
        for proto in (ANNOUNCE_PROTOCOL, FETCH_PROTOCOL):
            async def speaks(proto=proto) -> tuple[bool, str]:
                got, _, writer = await self.open_stream((proto,))
                writer.close()
                return got == proto, f"negotiated {got}"
            await self.step(f"speaks {proto}", speaks)
        await asyncio.sleep(1.0)  # streams opened and closed unused: let the node finish them (1 per peer at a time)
        await self.step("announce: valid -> ok", self.check_announce_ok)
        await self.step("announce: other run -> wrong_run", self.refusal("wrong_run", run_id=self.run_id + "-other"))
        await self.step("announce: other protocol -> wrong_protocol", self.refusal("wrong_protocol", protocol=self.protocol + 1000))
        await self.step("announce: {run_id, protocol} only -> bad_request",
                        self.refusal("bad_request", _replace={"run_id": self.run_id, "protocol": self.protocol}))
        await self.step("announce: round 2^53 -> bad_request", self.refusal("bad_request", round=MAX_ROUND + 1))
        await self.step("fetch: unknown digest -> not_found", self.fetch_status(STATUS_NOT_FOUND))
        await self.step("fetch: malformed digest -> bad_request", self.fetch_status(STATUS_BAD_REQUEST, digest="sha256:xyz"))
        await self.step("fetch: unknown request key ignored", self.fetch_status(STATUS_NOT_FOUND, future_key=1))
        if not self.offers:
            for name in ("fetch: offered packet", "fetch: resume at offset", "fetch: other run -> not_found",
                         "fetch: offset past the end -> bad_request"):
                self.checks.append(Check(name, "SKIP", "the node offers no packet"))
            return self.checks
        _, digest, size = self.offers[-1]
        await self.step("fetch: offered packet", self.check_fetch_ok)
        if hasattr(self, "body"):
            await self.step("fetch: resume at offset", self.check_resume)
        await self.step("fetch: other run -> not_found",
                        self.fetch_status(STATUS_NOT_FOUND, digest=digest, run_id=self.run_id + "-other"))
        await self.step("fetch: offset past the end -> bad_request",
                        self.fetch_status(STATUS_BAD_REQUEST, digest=digest, offset=size + 1))
        return self.checks


def report(checks: list[Check]) -> list[str]:
    """One line per check, then `N passed, M failed` (skipped checks are listed, not counted)."""
    width = max((len(c.name) for c in checks), default=5)
    lines = [f"{c.outcome:<4}  {c.name:<{width}}  {c.detail}" for c in checks]
    passed, failed = (sum(c.outcome == o for c in checks) for o in ("PASS", "FAIL"))
    return lines + [f"{passed} passed, {failed} failed"]


__all__ = ["Check", "Probe", "report", "RecordError"]
