"""The task contract: what a producer must reproduce for a receiver to accept its groups (protocol/SPEC.md section 14).

A receiver re-renders every group's prompt from its own copy of the task and recomputes every
reward (SPEC section 8). A third party can only produce packets a reference node accepts if it
knows everything that rendering and scoring depend on. This module names those things and gives
them one digest, and writes and checks golden vectors for the built-in tasks:

    RunManifest          task, its options, dataset identity, example-id scheme, prompt template,
                         system prompt, chat template (or none), tokenizer, G, max completion tokens,
                         mode, prompt schedule; canonical JSON and a digest every node announces. Not in it: the
                         model (Qwen2.5 base and Instruct exchange), and pacing, which is each node's
                         own (SPEC section 12 Round pacing)
    manifest_for         a node's manifest from its task and policy (read, never re-implemented:
                         prompts come from `Task.prompt` and `tasks.prompt.render_prompt`)
    task_vectors         arith's generator, prompts and rewards, GSM8K's prompts and rewards, a
                         manifest with its digest, and prompt schedules (protocol/vectors/tasks.json)
    check_task_vectors   the reference against those vectors (`swarm-node protocol verify`)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from swarm_node.tasks import Example, Task, load_task
from swarm_node.tasks.arith import ArithTask
from swarm_node.wire.schedule import SCHEDULE, scheduled_indices

EXAMPLE_IDS = "<split>/<index>"  # the only id scheme: split name, "/", decimal index without leading zeros
QUESTION = "{question}"  # the placeholder of a prompt template
MANIFEST_VERSION = 2  # 2: `schedule` (2026-11)
# the built-in tiny models' tokenizer ("char-v1", swarm_node/train/policy.py): one id per character
CHAR_VOCAB = ["<|pad|>", "<|endoftext|>", "<|unk|>", "\n", "\t"] + [chr(i) for i in range(32, 127)]
ARITH_DEFAULTS = dict(digits=2, second_digits=None, ops=["plus", "minus"], seed=0, train_size=100_000, test_size=500)


def canonical_json(obj: object) -> str:
    """Sorted keys, no whitespace, non-ASCII as itself (SPEC section 5 step 4's escapes); no floats."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def sha256_text(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class RunManifest:
    """Everything a receiver checks a producer's groups against. Equal manifests (equal digests)
    mean that a group one node renders for an example id is byte-equal to the receiver's rendering."""

    task: str
    """Task name: arith | gsm8k | math500."""
    task_options: dict = field(default_factory=dict)
    """The task's options as the node runs it (arith: digits, second_digits, ops, seed, train_size, test_size)."""
    dataset: dict = field(default_factory=dict)
    """Dataset identity: {"generator": "arith"} or {"source", "config", "train": "sha256:<hex of the examples>"}."""
    example_ids: str = EXAMPLE_IDS
    """How example ids are spelled (one scheme for every task)."""
    prompt_template: str = QUESTION
    """The task's plain prompt with the example's question as "{question}" (Task.prompt)."""
    system_prompt: str | None = None
    """The system prompt (a system turn with a chat template, a leading paragraph without), or null."""
    chat_template: str = "none"
    """"none" (the plain prompt is the text) or "sha256:<hex>" of the Jinja chat template applied."""
    tokenizer: str = ""
    """Tokenizer fingerprint (SPEC section 5): the vocabulary the prompt tokens are ids of."""
    group_size: int = 12
    """G: completions per group; receivers reject other counts (group_size)."""
    max_new_tokens: int = 0
    """Longest completion in tokens; longer ones are rejected."""
    mode: str = "vertical"
    """vertical (each node its own prompts) | horizontal (every node the run's prompts of the round)."""
    prompts: str = "tokens"
    """How groups carry their prompt: "tokens" (the ids) or "sha256" (prompt_digest of them, section 14.6)."""
    schedule: str = SCHEDULE
    """Which problems a producer answers in a round (section 14.5, wire/schedule.py): receivers train on no other."""
    version: int = MANIFEST_VERSION
    """Version of this manifest's schema."""

    def to_json(self) -> str:
        return canonical_json(asdict(self))

    def digest(self) -> str:
        return sha256_text(self.to_json())


def prompt_template(task: Task) -> str:
    """The task's own plain prompt with the question left as "{question}" (prompts insert it verbatim)."""
    return task.prompt(Example("train/0", QUESTION, ""))


def dataset_identity(task: Task) -> dict:
    """arith: its generator (SPEC section 14.2); a dataset task: sha256 over its train examples as
    canonical JSON lines `[id, question, answer]` (what a receiver looks ids up in)."""
    if isinstance(task, ArithTask):
        return {"generator": "arith"}
    out = {"source": task.name}
    for split in ("train",) if "train" in task.split_names else ():  # math500 has only a test split
        h = hashlib.sha256()
        for ex in task.split(split):
            h.update((canonical_json([ex.id, ex.question, ex.answer]) + "\n").encode("utf-8"))
        out[split] = "sha256:" + h.hexdigest()
    return out


def arith_options(task: ArithTask) -> dict:
    return {"digits": task.digits, "second_digits": task.second_digits, "ops": list(task.ops), "seed": task.seed,
            "train_size": len(task.split("train")), "test_size": len(task.split("test"))}


def manifest_for(task: Task, tokenizer, fingerprint: str, *, chat: str, system: str | None, group_size: int,
                 max_new_tokens: int, mode: str, prompts: str = "tokens") -> RunManifest:
    """A node's manifest. The chat template is the one `render_prompt` would apply for setting `chat`."""
    from swarm_node.tasks.prompt import uses_chat_template

    template = getattr(tokenizer, "chat_template", None) if uses_chat_template(tokenizer, chat) else None
    return RunManifest(
        task=task.name, task_options=arith_options(task) if isinstance(task, ArithTask) else {},
        dataset=dataset_identity(task), prompt_template=prompt_template(task), system_prompt=system,
        chat_template=sha256_text(template) if template else "none", tokenizer=fingerprint,
        group_size=group_size, max_new_tokens=max_new_tokens, mode=mode, prompts=prompts)


# ---- prompts by reference (section 14.6) ------------------------------------------------------------------
def prompt_base(tokenizer) -> int:
    """V: the largest id of the tokenizer's vocabulary + 1 (what section 5 fingerprints). Digest
    digits below V are valid token ids for every receiver with this fingerprint."""
    return max(tokenizer.get_vocab().values()) + 1


def prompt_digest(tokens, base: int) -> np.ndarray:
    """What a group carries instead of its prompt in sha256 mode: the first 16 bytes of SHA-256 over
    the prompt's ids as uint32 little-endian, as a big-endian integer, written in base `base` with the
    fewest digits that hold any 128-bit value, least significant first (8 digits for Qwen2.5's
    151,665 ids: a 32-byte bin; 20 for char-v1's 100)."""
    raw = np.ascontiguousarray(np.asarray(tokens, dtype="<u4")).tobytes()
    value, n = int.from_bytes(hashlib.sha256(raw).digest()[:16], "big"), 1
    while base ** n < 2**128:
        n += 1
    digits = []
    for _ in range(n):
        value, d = divmod(value, base)
        digits.append(d)
    return np.asarray(digits, dtype=np.uint32)


def by_reference(groups: list, base: int) -> list:
    """`groups` with each prompt replaced by its prompt_digest (completions shared, not copied)."""
    return [dataclasses.replace(g, prompt_tokens=prompt_digest(g.prompt_tokens, base)) for g in groups]


# ---- golden vectors (protocol/vectors/tasks.json) ------------------------------------------------------
ARITH_CASES = [  # (options, example ids)
    ({}, ["train/0", "train/1", "train/2", "train/99999", "test/0", "test/499"]),
    ({"digits": 3, "second_digits": 2, "ops": ["plus", "minus", "times"], "seed": 7}, ["train/0", "train/5", "test/3"]),
]
REWARD_CASES = [  # (completion, gold, reward): the shared final-answer format (SPEC section 14.4)
    ("#### 72", "72", 1.0), ("Reasoning.\n#### 72.\n", "72", 1.0), ("#### 72.00", "72", 1.0),
    ("#### 1,000", "1000", 1.0), ("#### $72", "72", 1.0), ("#### \\boxed{72}", "72", 1.0),
    ("**#### 72**", "72", 1.0), ("#### 72 clips", "72", 0.0), ("#### 72%", "72", 0.0), ("#### 3/4", "0.75", 0.0),
    ("#### 72\nDone.", "72", 0.0), ("#### 71", "72", 0.0), ("72", "72", 0.0), ("##### 72", "72", 0.0),
    ("#### 72 #### 72", "72", 0.0), ("#### -5", "-5", 1.0),
]
SCHEDULE_CASES = [  # (key, round, n, k): section 14.5
    ("vertical/swarm-node/12D3KooWGzxzKZYveHXtpG6AsrUJBcWxHBFS2HsEoGTxrMLvKXtf", 1, 100_000, 16),
    ("vertical/swarm-node/12D3KooWGzxzKZYveHXtpG6AsrUJBcWxHBFS2HsEoGTxrMLvKXtf", 2, 100_000, 16),
    ("vertical/my-run/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", 7, 7_473, 2),
    ("horizontal/swarm-node", 3, 100_000, 4),
    ("horizontal/swarm-node", 3, 5, 5),  # the whole split, in scheduled order
    ("horizontal/swarm-node", 4, 3, 10),  # k above n: the whole split
    ("vertical/swarm-node/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", 1, 2**62 + 1, 8),  # a quarter of draws skipped
]
GSM8K_QUESTION = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?"


def char_encode(text: str) -> list[int]:
    """char-v1: each character's index in CHAR_VOCAB, <|unk|> (2) for any other character."""
    index = {t: i for i, t in enumerate(CHAR_VOCAB)}
    return [index.get(c, 2) for c in text]


def task_vectors() -> dict:
    arith = []
    for options, ids in ARITH_CASES:
        task = ArithTask(**options)
        for example_id in ids:
            ex = task.example(example_id)
            arith.append({"options": options, "example_id": example_id, "question": ex.question, "answer": ex.answer,
                          "prompt": task.prompt(ex), "reference_completion": task.reference_completion(ex),
                          "prompt_tokens_char_v1": char_encode(task.prompt(ex)),
                          "prompt_digest_char_v1": prompt_digest(char_encode(task.prompt(ex)), len(CHAR_VOCAB)).tolist()})
    gsm8k = load_task("gsm8k", _tiny_gsm8k())
    ex = gsm8k.example("train/0")
    manifest = RunManifest(task="arith", task_options=arith_options(ArithTask()), dataset={"generator": "arith"},
                           prompt_template=prompt_template(ArithTask()), tokenizer="sha256:" + "0" * 64,
                           group_size=12, max_new_tokens=12)
    return {
        "arith": arith,
        "gsm8k": {"prompt_template": prompt_template(gsm8k), "question": ex.question, "prompt": gsm8k.prompt(ex)},
        "char_v1": {"vocab": CHAR_VOCAB, "fingerprint": _char_fingerprint()},
        "rewards": [{"completion": c, "gold": g, "reward": r} for c, g, r in REWARD_CASES],
        "manifest": {"manifest": asdict(manifest), "canonical_json": manifest.to_json(), "digest": manifest.digest()},
        "schedule": [{"key": key, "round": r, "n": n, "k": k, "indices": scheduled_indices(key, r, n, k)}
                     for key, r, n, k in SCHEDULE_CASES],
    }


def _char_fingerprint() -> str:
    from swarm_node.wire.codec import tokenizer_fingerprint

    return tokenizer_fingerprint({t: i for i, t in enumerate(CHAR_VOCAB)})


def _tiny_gsm8k() -> str:
    """A one-record GSM8K file (the official train.jsonl's first question) in a temp dir."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="swarm-gsm8k-")) / "train.jsonl"
    path.write_text(json.dumps({"question": GSM8K_QUESTION, "answer": "48/2 = <<48/2=24>>24\n48+24 = 72\n#### 72"}) + "\n")
    return str(path)


def check_task_vectors(path: Path) -> list[tuple[str, bool, str]]:
    """(name, passed, detail) for every entry of tasks.json, recomputed with the reference."""
    want = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for i, case in enumerate(want["arith"]):
        task = ArithTask(**case["options"])
        ex = task.example(case["example_id"])
        got = {"question": ex.question, "answer": ex.answer, "prompt": task.prompt(ex),
               "reference_completion": task.reference_completion(ex), "prompt_tokens_char_v1": char_encode(task.prompt(ex)),
               "prompt_digest_char_v1": prompt_digest(char_encode(task.prompt(ex)), len(CHAR_VOCAB)).tolist()}
        diff = [k for k, v in got.items() if v != case[k]]
        out.append((f"arith {i} {case['example_id']}", not diff, f"differs: {diff}" if diff else "ok"))
    ok = want["char_v1"] == {"vocab": CHAR_VOCAB, "fingerprint": _char_fingerprint()}
    out.append(("char-v1 tokenizer", ok, "ok" if ok else "vocabulary or fingerprint differs"))
    g = want["gsm8k"]
    gsm8k = load_task("gsm8k", _tiny_gsm8k())
    rendered = gsm8k.prompt(gsm8k.example("train/0"))
    ok = rendered == g["prompt"] and prompt_template(gsm8k) == g["prompt_template"]
    out.append(("gsm8k prompt", ok, "ok" if ok else f"rendered {rendered!r}"))
    for i, case in enumerate(want["rewards"]):
        reward = ArithTask().reward(case["completion"], Example("train/0", "", case["gold"]))
        out.append((f"reward {i} {case['completion']!r:.30}", reward == case["reward"], f"reward {reward}"))
    m = want["manifest"]
    manifest = RunManifest(**m["manifest"])
    ok = manifest.to_json() == m["canonical_json"] and manifest.digest() == m["digest"]
    out.append(("manifest digest", ok, "ok" if ok else manifest.digest()))
    for i, case in enumerate(want["schedule"]):
        got = scheduled_indices(case["key"], case["round"], case["n"], case["k"])
        out.append((f"schedule {i} {case['key'][:20]}", got == case["indices"], "ok" if got == case["indices"] else str(got)))
    return out


def write_task_vectors(path: Path) -> None:
    path.write_text(json.dumps(task_vectors(), ensure_ascii=True, indent=2) + "\n", encoding="utf-8")
