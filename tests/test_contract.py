"""The task contract (SPEC.md section 14, issue 28): a third party reproduces arith examples, prompts and
rewards from the spec alone; the vectors are current and checked; the manifest digest covers what
receivers check."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from swarm_node.wire.contract import RunManifest, check_task_vectors, task_vectors

VECTORS = Path(__file__).resolve().parents[1] / "protocol" / "vectors" / "tasks.json"


# ---- arith's generator written from SPEC.md section 14.2 alone (no `random`, no swarm_node) -------------
class MT19937:
    """The Mersenne Twister as SPEC.md 14.2 describes it: init_by_array, genrand_uint32."""

    def __init__(self, key: list[int]):
        mt = [0] * 624
        mt[0] = 19650218
        for i in range(1, 624):
            mt[i] = (1812433253 * (mt[i - 1] ^ (mt[i - 1] >> 30)) + i) & 0xFFFFFFFF
        i, j = 1, 0
        for _ in range(max(624, len(key))):
            mt[i] = ((mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525)) + key[j] + j) & 0xFFFFFFFF
            i, j = i + 1, j + 1
            if i >= 624:
                mt[0], i = mt[623], 1
            if j >= len(key):
                j = 0
        for _ in range(623):
            mt[i] = ((mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941)) - i) & 0xFFFFFFFF
            i += 1
            if i >= 624:
                mt[0], i = mt[623], 1
        mt[0] = 0x80000000
        self.mt, self.index = mt, 624

    def uint32(self) -> int:
        mt = self.mt
        if self.index >= 624:
            for k in range(624):
                y = (mt[k] & 0x80000000) | (mt[(k + 1) % 624] & 0x7FFFFFFF)
                mt[k] = mt[(k + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
            self.index = 0
        y = mt[self.index]
        self.index += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        return y ^ (y >> 18)

    def bits(self, k: int) -> int:
        out, shift = 0, 0
        while k > 0:
            word = self.uint32()
            if k < 32:
                word >>= 32 - k
            out |= word << shift
            shift, k = shift + 32, k - 32
        return out

    def below(self, n: int) -> int:
        k = n.bit_length()
        while True:
            r = self.bits(k)
            if r < n:
                return r


def seeded(text: str) -> MT19937:
    raw = text.encode()
    a = int.from_bytes(raw + hashlib.sha512(raw).digest(), "big")
    key = []
    while a:
        key.append(a & 0xFFFFFFFF)
        a >>= 32
    return MT19937(key or [0])


def spec_arith(example_id: str, digits=2, second_digits=None, ops=("plus", "minus"), seed=0, **_) -> tuple[str, str]:
    ops = list(dict.fromkeys(ops))
    second_digits = 1 if second_digits is None else second_digits
    split, _, index = example_id.partition("/")
    rng = seeded(f"arith/{seed}/{split}/{index}")
    while True:
        op = ops[rng.below(len(ops))]
        a, b = rng.below(10**digits), rng.below(10**second_digits)
        if op == "minus" and a < b:
            a, b = b, a
        lo, hi = sorted((a, b))
        h = int.from_bytes(hashlib.blake2b(f"{op}:{lo}:{hi}".encode(), digest_size=8).digest(), "big")
        if (h % 1000 < 100) == (split == "test"):
            value = {"plus": a + b, "minus": a - b, "times": a * b}[op]
            return f"What is {a} {op} {b}?", str(value)


def test_arith_from_the_spec_alone_reproduces_every_vector():
    cases = json.loads(VECTORS.read_text())["arith"]
    assert len(cases) >= 9
    for case in cases:
        question, answer = spec_arith(case["example_id"], **case["options"])
        assert (question, answer) == (case["question"], case["answer"]), case
        assert case["prompt"] == f"Q: {question}\nA: " and case["reference_completion"] == f"#### {answer}"


def test_the_vectors_are_current_and_the_reference_passes_them(tmp_path):
    assert json.loads(VECTORS.read_text()) == json.loads(json.dumps(task_vectors()))
    results = check_task_vectors(VECTORS)
    assert results and all(ok for _, ok, _ in results), [r for r in results if not r[1]]
    broken = json.loads(VECTORS.read_text())
    broken["arith"][0]["answer"] = "0"
    broken["rewards"][0]["reward"] = 0.0
    broken["manifest"]["digest"] = "sha256:" + "1" * 64
    (tmp_path / "tasks.json").write_text(json.dumps(broken))
    failed = [name for name, ok, _ in check_task_vectors(tmp_path / "tasks.json") if not ok]
    assert failed == ["arith 0 train/0", "reward 0 '#### 72'", "manifest digest"]


def test_the_manifest_digest_covers_what_receivers_check():
    base = RunManifest(task="arith", tokenizer="sha256:" + "0" * 64, group_size=12, max_new_tokens=12)
    assert base.digest() == RunManifest(**json.loads(base.to_json())).digest()
    for change in (dict(group_size=8), dict(max_new_tokens=13), dict(chat_template="sha256:" + "2" * 64),
                   dict(system_prompt="Be brief."), dict(prompt_template="Q: {question}\nA:"), dict(mode="horizontal"),
                   dict(task_options={"seed": 1}), dict(tokenizer="sha256:" + "3" * 64)):
        assert dataclasses.replace(base, **change).digest() != base.digest(), change


def test_a_node_announcing_another_manifest_is_refused_before_any_fetch():
    from swarm_node.net.memory import MemoryNetwork, MemoryTransport

    network = MemoryNetwork()
    ours, theirs = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    a = MemoryTransport(network, "QmA")
    b = MemoryTransport(network, "QmB")
    c = MemoryTransport(network, "QmC")
    for node, manifest in ((a, ours), (b, ours), (c, theirs)):
        node.set_manifest(manifest)
        node.start()
    b.offer(3, 1, b"b's packet")
    c.offer(3, 1, b"c's packet")
    got = a.collect(1, 5, min_peers=2, deadline_s=0.5)
    assert [x.peer_id for x in got.packets] == ["QmB"] and network.bytes_out("QmC") == 0
    assert a._mesh.refused["wrong_manifest"] >= 1 and "QmC" not in a._mesh.neighbors


GSM8K_TRAIN_EXAMPLES = "sha256:f469c09c3550e0269b0c38d5237d1868d461f8866f5c977a1f898680950ac283"  # SPEC.md 14.4


def test_gsm8k_dataset_identity_of_the_official_files_is_the_one_the_spec_quotes():
    from test_tasks import real_data

    from swarm_node.tasks import load_task
    from swarm_node.wire.contract import dataset_identity

    spec = (VECTORS.parents[1] / "SPEC.md").read_text(encoding="utf-8")
    assert GSM8K_TRAIN_EXAMPLES in spec
    task = load_task("gsm8k", real_data("gsm8k"))
    assert dataset_identity(task) == {"source": "gsm8k", "train": GSM8K_TRAIN_EXAMPLES}


def test_the_char_v1_vectors_are_what_the_tiny_models_tokenizer_does():
    from swarm_node.train.presets import CHAR_VOCAB, char_tokenizer
    from swarm_node.wire.codec import tokenizer_fingerprint

    want = json.loads(VECTORS.read_text())
    tok = char_tokenizer()
    assert want["char_v1"]["vocab"] == CHAR_VOCAB
    assert want["char_v1"]["fingerprint"] == tokenizer_fingerprint(tok) and tok.chat_template is None
    for case in want["arith"]:
        assert tok.encode(case["prompt"], add_special_tokens=False) == case["prompt_tokens_char_v1"]
    assert tok.decode([54, 1, 0], skip_special_tokens=True) == "Q"  # specials skipped when scoring


def test_prompts_by_reference_are_accepted_only_in_sha256_mode_and_restored_for_training(tiny_policy, arith):
    import numpy as np

    from swarm_node.net import Received
    from swarm_node.swarm import Rejected
    from swarm_node.swarm.admit import Admission, Expectations
    from swarm_node.train.rollout import prompt_tokens
    from swarm_node.wire.codec import Completion, Group, Packet, digest, encode, tokenizer_fingerprint
    from swarm_node.wire.contract import by_reference, prompt_base, prompt_digest

    ex = arith.example("train/0")
    ours = np.asarray(prompt_tokens(tiny_policy, arith, ex), dtype=np.uint32)
    # a third party's group built from the vectors alone is what the reference admits (below: `full`)
    vector = next(c for c in json.loads(VECTORS.read_text())["arith"] if c["options"] == {} and c["example_id"] == "train/0")
    assert ours.tolist() == vector["prompt_tokens_char_v1"]
    completion = Completion(tokens=np.asarray([5, 1], dtype=np.uint32), logprobs=np.asarray([-0.5, -0.1], dtype=np.float32),
                            finish_reason="stop", reward=0.0)
    full = Group("arith", ex.id, ours, [completion] * 2)
    base = prompt_base(tiny_policy.tokenizer)
    [ref] = by_reference([full], base)
    assert base == 100 and ref.prompt_tokens.nbytes == 80 and np.array_equal(ref.prompt_tokens, prompt_digest(ours, base))
    assert ref.prompt_tokens.max() < base
    fingerprint = tokenizer_fingerprint(tiny_policy.tokenizer)

    def item(group) -> Received:
        data = encode(Packet(run_id="r", sender="QmPeer", model_id="m", tokenizer=fingerprint, policy_version=0,
                             round=3, mode="vertical", groups=[group]))
        return Received("QmPeer", 3, digest(data), data)

    def admission(prompts: str) -> Admission:
        return Admission(Expectations("r", fingerprint, 2, group_size=2, prompts=prompts), tiny_policy.scorer(arith))

    packet = admission("sha256").check(item(ref), 3)
    assert np.array_equal(packet.groups[0].prompt_tokens, ours)  # the trainer sees the real prompt
    assert admission("sha256").check(item(full), 3).groups[0].prompt_tokens.tolist() == ours.tolist()  # tokens still fine
    with pytest.raises(Rejected, match="prompt_mismatch"):
        admission("tokens").check(item(ref), 3)
    wrong = dataclasses.replace(ref, prompt_tokens=prompt_digest(ours[:-1], base))
    with pytest.raises(Rejected, match="prompt_mismatch"):
        admission("sha256").check(item(wrong), 3)


def test_prompts_by_reference_save_the_prompt_bytes_of_a_paper_round():
    import numpy as np

    from swarm_node.wire.codec import Completion, Group, Packet, encode
    from swarm_node.wire.contract import by_reference

    rng = np.random.default_rng(0)
    comp = [Completion(rng.integers(0, 151_000, 200).astype(np.uint32), -rng.random(200).astype(np.float32), "stop", 1.0)
            for _ in range(12)]
    groups = [Group("gsm8k", f"train/{i}", rng.integers(0, 151_000, 120).astype(np.uint32), comp) for i in range(2)]
    packet = Packet(run_id="swarm-demo-1", sender="12D3KooWGzxzKZYveHXtpG6AsrUJBcWxHBFS2HsEoGTxrMLvKXtf",
                    model_id="Qwen/Qwen2.5-0.5B-Instruct", tokenizer="sha256:" + "0" * 64, policy_version=12, round=3,
                    mode="vertical", groups=groups)
    full, ref = len(encode(packet)), len(encode(dataclasses.replace(packet, groups=by_reference(groups, 151_665))))
    assert full - ref == 2 * ((4 * 120 + 3) - (32 + 2))  # bin16 of 480 bytes -> bin8 of 32, per group
    assert ref / (2 * 12 * 200) < 8.41 < full / (2 * 12 * 200)
