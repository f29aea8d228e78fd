"""Benchmark 1 — codec: bytes per completion token, header overhead, encode/decode throughput.

For rounds of the paper's size (2 prompts x 12 completions x ~200 tokens, plus ~1000-token and
tiny-preset rounds) this builds a realistic packet (synthetic ids and log-probs, no model) and
measures, in one run:

  * size: encoded bytes, bytes per completion token (the floor is 8: uint32 id + float32 log-prob),
    header/framing overhead = everything except those 8 bytes per completion token;
  * throughput in completion tokens/s of `codec.encode`, `codec.decode` (strict: schema, limits,
    vocab check, canonical re-encode), `codec.digest` (sha256, computed on send and on receipt);
  * the same bytes through a plain memory copy (numpy, preallocated: the physical limit), and
    the formats one would otherwise reach for: the protocol's JSON form and pickle (unsafe on
    untrusted input; listed only as a speed reference).

    .venv/bin/python bench/codec_throughput.py            # ~1-2 min on 2 cores
    .venv/bin/python bench/codec_throughput.py --quick    # smoke run
"""
from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from pathlib import Path

if not __package__:  # run as `python bench/x.py`: import `bench` as a package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench import _common as C  # noqa: E402

SCENARIOS = {
    # name: (prompts, completions per prompt, mean completion tokens, prompt tokens, vocab)
    "paper-200": (2, 12, 200, 120, C.QWEN_VOCAB),
    "paper-1000": (2, 12, 1000, 120, C.QWEN_VOCAB),
    "tiny-arith": (2, 12, 8, 25, 101),
}


def measure(name: str, spec: tuple, min_time: float, repeats: int) -> dict:
    import numpy as np

    from swarm_node.wire import codec
    from swarm_node.wire.packet_json import packet_from_json, packet_to_json

    prompts, group, mean_tokens, prompt_tokens, vocab = spec
    packet, n_tokens = C.synthetic_packet(prompts, group, mean_tokens, prompt_tokens, vocab, seed=0,
                                          spread=0.25 if mean_tokens > 20 else 0.5)
    data = codec.encode(packet)
    assert codec.encode(codec.decode(data, vocab_size=vocab)) == data, "round trip"
    n_completions = prompts * group
    payload = 8 * n_tokens  # uint32 id + float32 log-prob per completion token
    overhead = len(data) - payload
    prompt_bytes = 4 * prompts * prompt_tokens
    # Split the overhead: the same packet with empty groups gives header + group framing + prompts.
    bare = codec.encode(codec.Packet(**{**packet.__dict__, "groups": [
        codec.Group(g.task, g.example_id, g.prompt_tokens, []) for g in packet.groups]}))
    per_completion = (len(data) - len(bare) - payload) / n_completions
    from swarm_node.wire.contract import by_reference  # prompts by reference (SPEC.md 14.6), digits in base `vocab`
    by_ref = len(codec.encode(codec.Packet(**{**packet.__dict__, "groups": by_reference(packet.groups, vocab)})))
    header_and_groups = len(bare) - prompt_bytes

    src = np.frombuffer(data, dtype=np.uint8)
    dst = np.empty_like(src)

    def memcpy():
        np.copyto(dst, src)

    json_text = json.dumps(packet_to_json(packet), separators=(",", ":"))
    pickled = pickle.dumps(packet, protocol=pickle.HIGHEST_PROTOCOL)
    ops = {
        "memcpy (numpy, same bytes)": (memcpy, len(data)),
        "codec.encode": (lambda: codec.encode(packet), len(data)),
        "codec.decode (strict, vocab)": (lambda: codec.decode(data, vocab_size=vocab), len(data)),
        "codec.digest (sha256)": (lambda: codec.digest(data), len(data)),
        "JSON form encode": (lambda: json.dumps(packet_to_json(packet), separators=(",", ":")), len(json_text)),
        "JSON form decode": (lambda: packet_from_json(json.loads(json_text)), len(json_text)),
        "pickle dumps (reference)": (lambda: pickle.dumps(packet, protocol=pickle.HIGHEST_PROTOCOL), len(pickled)),
        "pickle loads (reference)": (lambda: pickle.loads(pickled), len(pickled)),
    }
    timings = {}
    for op, (fn, nbytes) in ops.items():
        t = C.time_call(fn, min_time, repeats)
        # Throughput from the fastest repeat (timeit's advice: slower repeats measure other processes
        # competing for the CPU, not the code; this box is shared). Medians are kept in the JSON.
        timings[op] = {"min_s": t.min_s, "median_s": t.median_s, "loops": t.loops, "repeats": t.repeats,
                       "bytes": nbytes, "tokens_per_s": n_tokens / t.min_s, "mb_per_s": nbytes / t.min_s / 1e6}
    base = timings["memcpy (numpy, same bytes)"]["min_s"]
    for v in timings.values():
        v["x_memcpy_time"] = v["min_s"] / base
    return {
        "scenario": name, "prompts": prompts, "group_size": group, "mean_completion_tokens": mean_tokens,
        "prompt_tokens_per_group": prompt_tokens, "vocab": vocab,
        "completion_tokens": n_tokens, "packet_bytes": len(data), "bytes_per_completion_token": len(data) / n_tokens,
        "bytes_per_completion_token_prompts_by_reference": by_ref / n_tokens,
        "payload_bytes": payload, "overhead_bytes": overhead, "overhead_frac": overhead / len(data),
        "prompt_bytes": prompt_bytes, "header_and_group_framing_bytes": header_and_groups,
        "framing_bytes_per_completion": per_completion,
        "json_bytes": len(json_text), "json_bytes_per_completion_token": len(json_text) / n_tokens,
        "pickle_bytes": len(pickled), "timings": timings,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    ap.add_argument("--min-time", type=float, default=0.1, help="seconds per timing repeat (loop count is calibrated)")
    ap.add_argument("--repeats", type=int, default=15, help="timing repeats; the fastest gives the throughput, the "
                                                             "median is kept too")
    ap.add_argument("--quick", action="store_true", help="smoke run: fewer/shorter repeats")
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/codec_throughput.json)")
    args = ap.parse_args()
    if args.quick:
        args.min_time, args.repeats = 0.05, 3
    started, info = time.time(), C.machine_info()
    C.single_thread()
    print(C.describe_load(info))
    results = [measure(s, SCENARIOS[s], args.min_time, args.repeats) for s in args.scenarios]

    C.print_table("Packet size", ["scenario", "completion tokens", "packet bytes", "bytes / completion token",
                                  "overhead bytes", "overhead %", "prompts", "header + groups", "per completion",
                                  "JSON bytes / token", "B / token, prompts by ref."],
                  [[r["scenario"], r["completion_tokens"], r["packet_bytes"], r["bytes_per_completion_token"],
                    r["overhead_bytes"], 100 * r["overhead_frac"], r["prompt_bytes"], r["header_and_group_framing_bytes"],
                    r["framing_bytes_per_completion"], r["json_bytes_per_completion_token"],
                    r["bytes_per_completion_token_prompts_by_reference"]] for r in results],
                  caption="floor: 8 bytes per completion token (uint32 id + float32 log-prob); overhead = packet - 8 x completion "
                          "tokens = prompts (4 B/token) + packet header and group framing + framing per completion")
    for r in results:
        C.print_table(f"Throughput, {r['scenario']} ({r['completion_tokens']:,} completion tokens, "
                      f"{r['packet_bytes']:,} B)",
                      ["operation", "best ms", "median ms", "completion tokens/s", "MB/s", "x memcpy time"],
                      [[op, 1e3 * t["min_s"], 1e3 * t["median_s"], t["tokens_per_s"], t["mb_per_s"], t["x_memcpy_time"]]
                       for op, t in r["timings"].items()],
                      caption=f"best of {r['timings']['codec.encode']['repeats']} repeats (throughput and ratios use "
                              "it); MB/s of each format's own bytes")
    path = C.write_results("codec_throughput", results, args, info, started, out=args.out)
    print(f"wrote {C.shown(path)} ({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
