"""JSON form of a rollout packet (protocol/SPEC.md "JSON form").

The JSON form mirrors the msgpack map key for key, with each binary array shown
as a JSON array of numbers: token ids as integers, log-probs as the exact
float64 value of each float32 (shortest round-trip decimal). It is what the
`swarm-node protocol` tools print and read, and what the golden vectors in
protocol/vectors/*.json hold, so a third party can produce packets without
writing msgpack by hand.

The text of a JSON form is not normative, its values are: `loads` reads `-0` as
negative zero, and `same_json_form` compares two parsed forms the way SPEC.md
section 9 says (float fields by float64 value and sign, everything else by type
and value), so `1`, `1.0` and `1e0` are the same reward.
"""
from __future__ import annotations

import json
import struct

import numpy as np

from swarm_node.wire.codec import Completion, Group, Packet, PacketError

PACKET_KEYS = ("version", "run_id", "sender", "model_id", "tokenizer", "policy_version", "round", "mode", "created_at", "groups")
GROUP_KEYS = ("task", "example_id", "prompt_tokens", "completions")
COMPLETION_KEYS = ("tokens", "logprobs", "finish_reason", "reward")


def packet_to_json(p: Packet) -> dict:
    """Packet -> plain JSON-able dict, keys in canonical order."""
    return {
        "version": p.version, "run_id": p.run_id, "sender": p.sender, "model_id": p.model_id, "tokenizer": p.tokenizer,
        "policy_version": p.policy_version, "round": p.round, "mode": p.mode, "created_at": p.created_at,
        "groups": [{
            "task": g.task, "example_id": g.example_id,
            "prompt_tokens": np.asarray(g.prompt_tokens).astype(np.int64).tolist(),
            "completions": [{
                "tokens": np.asarray(c.tokens).astype(np.int64).tolist(),
                "logprobs": np.asarray(c.logprobs, dtype=np.float32).astype(np.float64).tolist(),
                "finish_reason": c.finish_reason, "reward": float(c.reward),
            } for c in g.completions],
        } for g in p.groups],
    }


def _obj(x, keys: tuple, what: str) -> dict:
    if not isinstance(x, dict):
        raise PacketError("bad_type", f"{what} must be a JSON object")
    for k in x:
        if k not in keys:
            raise PacketError("unknown_field", f"{what} has unknown key {k!r}")
    for k in keys:
        if k not in x:
            raise PacketError("missing_field", f"{what} lacks {k!r}")
    return x


def _list(x, what: str) -> list:
    if not isinstance(x, list):
        raise PacketError("bad_type", f"{what} must be a JSON array")
    return x


def _ids(x, what: str) -> np.ndarray:
    x = _list(x, what)
    if not all(type(v) is int and 0 <= v <= 0xFFFFFFFF for v in x):
        raise PacketError("bad_type", f"{what} must hold integers in 0..2^32-1")
    return np.array(x, dtype="<u4")


def _floats(x, what: str) -> np.ndarray:
    x = _list(x, what)
    if not all(type(v) in (int, float) for v in x):
        raise PacketError("bad_type", f"{what} must hold numbers")
    with np.errstate(all="ignore"):  # out-of-range values become -inf and fail validation in encode()
        return np.array(x, dtype=np.float64).astype("<f4")


def _scalar(x, kind: type, what: str):
    ok = (type(x) in (int, float)) if kind is float else (type(x) is kind)
    if not ok:
        raise PacketError("bad_type", f"{what} must be a JSON {'number' if kind is float else kind.__name__}")
    return float(x) if kind is float else x


def packet_from_json(obj) -> Packet:
    """Parsed JSON form -> Packet. Checks shape and types only (PacketError); encode() validates the rest."""
    o = _obj(obj, PACKET_KEYS, "packet")
    groups = []
    for gi, g in enumerate(_list(o["groups"], "groups")):
        w = f"groups[{gi}]"
        g = _obj(g, GROUP_KEYS, w)
        comps = []
        for ci, c in enumerate(_list(g["completions"], w + ".completions")):
            wc = f"{w}.completions[{ci}]"
            c = _obj(c, COMPLETION_KEYS, wc)
            comps.append(Completion(_ids(c["tokens"], wc + ".tokens"), _floats(c["logprobs"], wc + ".logprobs"),
                                    _scalar(c["finish_reason"], str, wc + ".finish_reason"),
                                    _scalar(c["reward"], float, wc + ".reward")))
        groups.append(Group(_scalar(g["task"], str, w + ".task"), _scalar(g["example_id"], str, w + ".example_id"),
                            _ids(g["prompt_tokens"], w + ".prompt_tokens"), comps))
    s = {k: _scalar(o[k], str, k) for k in ("run_id", "sender", "model_id", "tokenizer", "mode")}
    i = {k: _scalar(o[k], int, k) for k in ("version", "policy_version", "round", "created_at")}
    return Packet(s["run_id"], s["sender"], s["model_id"], s["tokenizer"], i["policy_version"], i["round"], s["mode"],
                  groups, i["version"], i["created_at"])


def dumps(obj, indent: int = 0) -> str:
    """Readable JSON: objects and arrays of objects one item per line, arrays of numbers on one line."""
    pad, end = "  " * (indent + 1), "  " * indent
    if isinstance(obj, dict) and obj:
        items = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {dumps(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        return "[\n" + ",\n".join(pad + dumps(v, indent + 1) for v in obj) + "\n" + end + "]"
    return json.dumps(obj, ensure_ascii=False, allow_nan=False)



FLOAT_FIELDS = ("logprobs", "reward")  # JSON numbers read as float64 whatever their spelling


def _parse_int(text: str):
    return -0.0 if text == "-0" else int(text)  # "-0" is negative zero (JSON.stringify never writes it)


def _no_constant(name: str):
    raise ValueError(f"JSON constant {name} is not allowed")


def loads(text: str | bytes):
    """Parse JSON text for the JSON form: `-0` is negative zero; NaN/Infinity and nesting deeper than
    Python's recursion limit are errors. Raises ValueError (JSONDecodeError, bad UTF-8, too deep)."""
    try:
        return json.loads(text, parse_int=_parse_int, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("JSON nests too deeply") from None


def comparable(obj, floaty: bool = False):
    """`obj` with every number tagged by how SPEC.md section 9 compares it: numbers under a float field
    as their float64 bit pattern (so -0.0 != 0.0 but 1 == 1.0), every other value by type and value."""
    if isinstance(obj, dict):
        return {k: comparable(v, floaty or k in FLOAT_FIELDS) for k, v in obj.items()}
    if isinstance(obj, list):
        return [comparable(v, floaty) for v in obj]
    if floaty and type(obj) in (int, float):
        try:
            return ("float64", struct.pack(">d", obj))
        except OverflowError:
            return ("int", obj)
    return (type(obj).__name__, obj)


def same_json_form(a, b) -> bool:
    return comparable(a) == comparable(b)


def first_difference(expected, got, path: str = "") -> str:
    """Where two parsed JSON forms first differ (a path like groups[0].completions[1].reward), "" if nowhere."""
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in list(expected) + [k for k in got if k not in expected]:
            where = f"{path}.{key}" if path else key
            if key not in expected or key not in got:
                return where + (" (missing)" if key not in got else " (unexpected)")
            diff = first_difference(expected[key], got[key], where)
            if diff:
                return diff
        return ""
    if isinstance(expected, list) and isinstance(got, list):
        for i, (e, g) in enumerate(zip(expected, got)):
            diff = first_difference(e, g, f"{path}[{i}]")
            if diff:
                return diff
        return f"{path} (length {len(got)}, expected {len(expected)})" if len(expected) != len(got) else ""
    floaty = any(part in path.rsplit(".", 1)[-1] for part in FLOAT_FIELDS)
    return "" if comparable(expected, floaty) == comparable(got, floaty) else f"{path or 'top level'}: {got!r:.60} != {expected!r:.60}"
