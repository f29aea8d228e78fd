"""The groups of issue 26's red-team matrix kinds (poisoner.py's docstring says what each teaches and
why; bench/redteam_matrix.py runs them). Each builder takes the `Poisoner` (public model, task, rng,
arguments) and one train example and returns one Group of exactly G completions that passes every
admission check. Claimed log-probs are the public model's own for the ids sent (the victim ignores an
untrusted peer's claims anyway), so what a kind tests is only *which* completions it sends.

    zeros         G/2 `#### 0073`-style positives, G/2 wrong answers of the victim's own form
    noncanonical  G/2 positives: the reference's ids with special tokens (unk, pad) interleaved, which
                  decoding drops; G/2 wrong answers of the victim's form
    synonyms      G/2 reference positives, G/2 negatives one edit from the right line (`#### 7 3`)
    onepositive   1 junk-prefixed positive (advantage ~3.2 at G = 12), G - 1 junk-suffixed negatives
    padded        G/2 positives: filler the public model finds likeliest (no `#`, no EOS), then the
                  answer line, exactly the completion limit long; G/2 wrong answers of the victim's form
    skew          1 reference positive that clears both estimated plausibility bars (advantage ~3.2),
                  G - 1 wrong ones, on train examples whose answer ends in --digit only
(slotkeep's groups are junk's, poisoner.py.)
"""
from __future__ import annotations

import numpy as np

from swarm_node.wire.codec import Completion, Group

SYNONYMS = ("#### {h} {t}", "### {a}", "##### {a}", "#### {a}%", "#### {a} {a}", "#### {a}/1", "#### {a}\nok",
            "#### {a}x", "# ### {a}", "#### {a},", "#### {h}.{t}")
NO_FILLER = "#"  # filler characters that would break the answer format


def completions(p, example, prompt, samples: list[list[int]], rewards: list[float]) -> Group:
    """A Group of `samples` claiming the public model's log-probs; each reward checked as `rewards` says."""
    for t, r in zip(samples, rewards):
        assert p.task.reward(p.policy.decode(t), example) == r, (p.policy.decode(t), r)
    logp, _ = p.policy.token_logprobs([prompt] * len(samples), samples, 1.0, 64)  # [G, T]
    out = [Completion(np.asarray(t, np.uint32), logp[i, :len(t)].double().clamp(max=0).numpy().astype(np.float32),
                      "stop" if t[-1] == p.policy.eos_id else "length", r) for i, (t, r) in enumerate(zip(samples, rewards))]
    return Group(p.task.name, example.id, np.asarray(prompt, np.uint32), out)


def answer(p, example) -> str:
    return p.task.reference_completion(example).split("####", 1)[1].strip()


def fits(p, example, text: str, reward: float) -> list[int] | None:
    """`text` + EOS as ids if it fits the completion limit and scores `reward`, else None."""
    toks = p.policy.encode(text) + [p.policy.eos_id]
    ok = len(toks) <= p.max_tokens and p.task.reward(p.policy.decode(toks), example) == reward
    return toks if ok else None


def split(p, example, prompt, right: list[list[int]], n_right: int) -> Group:
    """`n_right` of `right` (cycled) and G - n_right wrong answers of the victim's own form."""
    G = p.args.group_size
    pos = (right * G)[:n_right]
    neg = p.wrong_answers(example, G - n_right)
    return completions(p, example, prompt, pos + neg, [1.0] * len(pos) + [0.0] * len(neg))


def zeros(p, example, prompt) -> Group:
    a = answer(p, example)
    right = [t for z in (1, 2, 3) if (t := fits(p, example, f"#### {'0' * z}{a}", 1.0))]
    return split(p, example, prompt, right, p.args.group_size // 2)


def noncanonical(p, example, prompt) -> Group:
    tok = p.policy.tokenizer
    specials = [i for i in (tok.unk_token_id, tok.pad_token_id, getattr(tok, "bos_token_id", None))
                if i is not None and i != p.policy.eos_id]
    base, right = p.policy.encode(p.task.reference_completion(example)), []
    for _ in range(p.args.group_size):
        ids = list(base)
        for _ in range(p.rng.randint(1, max(1, min(3, p.max_tokens - len(base) - 1)))):
            ids.insert(p.rng.randint(0, len(ids)), p.rng.choice(specials))
        right.append(ids + [p.policy.eos_id])
    assert all(p.policy.decode(t) == p.policy.decode(base + [p.policy.eos_id]) for t in right)
    return split(p, example, prompt, right, p.args.group_size // 2)


def synonyms(p, example, prompt) -> Group:
    a = answer(p, example)
    right = [p.policy.encode(p.task.reference_completion(example)) + [p.policy.eos_id]]
    wrong = [t for s in SYNONYMS if (t := fits(p, example, s.format(a=a, h=a[:1], t=a[1:]), 0.0))]
    G, half = p.args.group_size, p.args.group_size // 2
    samples = right * half + (wrong * G)[:G - half]
    return completions(p, example, prompt, samples, [1.0] * half + [0.0] * (G - half))


def onepositive(p, example, prompt) -> Group:
    return p.junk_group(example, 1)


def padded(p, example, prompt) -> Group:
    """Filler sampled at T = 1 from the public model's next-token distribution, restricted to tokens
    that keep the format (no `#`, no special token), up to the limit; then `#### <answer>` + EOS."""
    import torch

    line = p.policy.encode(p.task.reference_completion(example)) + [p.policy.eos_id]
    half = p.args.group_size // 2
    banned = torch.tensor([i in p.policy.tokenizer.all_special_ids or bool(set(p.policy.decode([i])) & set(NO_FILLER))
                           or not p.policy.decode([i]) for i in range(p.policy.vocab_size)])  # [V]
    ids = torch.tensor([prompt] * half)  # [half, L] the rows share the prompt: no padding
    for _ in range(p.max_tokens - len(line)):
        logits = p.policy.head_logits(p.policy.model.get_decoder()(input_ids=ids).last_hidden_state[:, -1:])[:, 0]  # [half, V]
        probs = torch.softmax(logits.masked_fill(banned, -float("inf")), -1)  # [half, V] over the allowed tokens
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=p.torch_rng)], 1)  # [half, L + 1]
    right = [row[len(prompt):] + line for row in ids.tolist()]
    return split(p, example, prompt, right, half)


def skew(p, example, prompt) -> Group | None:
    """None if the reference does not clear both estimated bars (the caller draws another example)."""
    right = p.policy.encode(p.task.reference_completion(example)) + [p.policy.eos_id]
    lp, _ = p.policy.token_logprobs([prompt], [right], 1.0, 64)  # [1, T]
    mean_floor, token_floor = p.floor_estimate(), p.token_floor
    if float(lp[0].mean()) < mean_floor + p.args.safety or float(lp[0].min()) < token_floor + p.args.safety:
        return None
    return split(p, example, prompt, [right], 1)


def skewed_examples(task, digit: int) -> list[int]:
    """Indices of the train examples whose answer ends in `digit` (skew's pool)."""
    train = task.split("train")
    return [i for i in range(len(train)) if train[i].answer.strip().endswith(str(digit))]


# ---- red team 2 ---------------------------------------------------------------------------------------
def wrongkeep(p, example, prompt) -> Group:
    """G wrong answers of the victim's own form (`#### <n+-d>`), reward 0 each: zero spread, advantage 0,
    never run and never judged (no positive), yet the sender is credited (`Exchange.credit`: wrong answers
    are not misbehaviour) and the group takes one of V's peer slots. Teaches nothing, costs nothing."""
    neg = p.wrong_answers(example, p.args.group_size)
    return completions(p, example, prompt, neg, [0.0] * len(neg))


def carries(a: int, b: int, op: str) -> bool:
    return (a % 10 + b % 10 >= 10) if op == "plus" else (a % 10 < b % 10)


def parse(example):
    """(a, op, b) of an arith prompt `What is 48 plus 7?`."""
    import re

    m = re.search(r"(\d+) (plus|minus|times) (\d+)", example.question)
    return (int(m.group(1)), m.group(2), int(m.group(3))) if m else None


def nocarry_examples(task) -> list[int]:
    """Indices of train examples (first 20000) with no carry / borrow: the answer's tens digit is a's."""
    train, out = task.split("train"), []
    for i in range(20000):
        x = parse(train[i])
        if x and x[1] in ("plus", "minus") and not carries(x[0], x[2], x[1]):
            out.append(i)
    return out


def nocarry(p, example, prompt) -> Group | None:
    """Selection attack, amplified: 6 identical reference positives (the largest positive advantage mass a
    group of 12 can carry, 5.74, vs skew's 3.2) + 6 wrong answers (weight 0 at the victim), only on
    problems WITHOUT a carry/borrow: every positive correct and in V's own form; the rule they teach
    ("the tens digit is the first operand's") is the error V makes on carries. Screened like skew."""
    right = p.policy.encode(p.task.reference_completion(example)) + [p.policy.eos_id]
    lp, _ = p.policy.token_logprobs([prompt], [right], 1.0, 64)  # [1, T]
    if float(lp[0].mean()) < p.floor_estimate() + p.args.safety or float(lp[0].min()) < p.token_floor + p.args.safety:
        return None
    return split(p, example, prompt, [right], p.args.group_size // 2)
