"""The trust boundary: everything a peer sends passes here before training sees it.

    exchange.py     offer our packet's bytes, collect peers' over a Transport (fair arrival),
                    count bytes and outcomes; no model, no task
    admit.py        Admission: decode a peer's packet, check it against what we expect (run,
                    rounds, group size, lengths), recompute its rewards with our own scorer,
                    refuse echoes of our own groups by content hash

`Rejected` (below) is the one way a packet is refused; both modules raise or count it.

May import the base, tasks/, wire/ and net/. Must not import train/ (admission gets a tokenizer
and a scorer, not the model), node.py or commands/.
"""

from __future__ import annotations


class Rejected(Exception):
    """A peer packet that must not be trained on; `reason` is a short metric-friendly code;
    `valid`: it passed every check and is refused only by who sent it (a guard's lockdown): its
    sender is alive."""

    def __init__(self, reason: str, detail: str = "", valid: bool = False):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.valid = reason, valid
