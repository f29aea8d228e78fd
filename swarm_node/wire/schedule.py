"""Which problems a producer answers in a round: a public function of who it is and the round (SPEC section 14.5).

A peer that may pick any train problem can pick a biased selection of them: every completion it
sends is correct and plausible, yet the distribution it teaches is not (the red team's `skew`:
only problems whose answer ends in 0). So a producer's prompts for round r are fixed in advance,
by its peer id and r, and a receiver trains only on groups whose problem is among the first
`depth` of the sender's schedule for the packet's round (train/admit: `unscheduled`). A hostile
peer still chooses which of its scheduled problems carry signal, but among `depth` random problems
a round, not the whole split.

    schedule_key       vertical: the run and the sender's peer id; horizontal: the run (everyone
                       answers the same problems); a node alone: its own key (train.seed)
    scheduled_indices  the first k distinct indices of a split of n examples, SHA-256 in counter mode

No Python `random`: a third party's node computes the same list from section 14.5 alone.
"""

from __future__ import annotations

import hashlib

SCHEDULE = "sha256-v1"  # the derivation below, as the run manifest names it
DOMAIN = "swarm-node/schedule/v1"


def schedule_key(run_id: str, mode: str, peer_id: str | None) -> str:
    """Whose schedule: `vertical/<run>/<peer id>` (each producer its own), `horizontal/<run>`."""
    if mode == "horizontal":
        return f"horizontal/{run_id}"
    if peer_id is None:
        raise ValueError("a vertical schedule is keyed by the producer's peer id")
    return f"vertical/{run_id}/{peer_id}"


def scheduled_indices(key: str, round_index: int, n: int, k: int) -> list[int]:
    """The first min(k, n) distinct indices of range(n) scheduled for (key, round_index), in order.

    Draw i (i = 0, 1, ...) is the first 8 bytes, big-endian, of SHA-256 over the UTF-8 of
    `"<DOMAIN>/<key>/<round>/<i>"`; draws at or above the largest multiple of n below 2^64 are
    skipped (no modulo bias), the rest taken mod n, repeats skipped.
    """
    if n <= 0 or k <= 0:
        return []
    k, limit = min(k, n), (1 << 64) - (1 << 64) % n
    out: list[int] = []
    seen: set[int] = set()
    i = 0
    while len(out) < k:  # ends: each draw is new with probability >= (n - k + 1) / n > 0
        digest = hashlib.sha256(f"{DOMAIN}/{key}/{round_index}/{i}".encode("utf-8")).digest()
        value = int.from_bytes(digest[:8], "big")
        i += 1
        if value >= limit or value % n in seen:
            continue
        seen.add(value % n)
        out.append(value % n)
    return out
