"""The in-process Hugging Face sampler: ancestral sampling from the trained model itself.

It shares the trainer's `Policy` (same module, same weights), so its samples are exactly
on-policy and `sync` has nothing to do. Sampling is plain ancestral sampling from
softmax(logits / temperature) (or argmax for `greedy`), with a KV cache; the returned log-probs
are of that exact distribution. A completion that stopped ends with its EOS token (and EOS's
log-prob): stopping is part of what is learned. Only the last position's hidden state goes
through the LM head (a [B, P, V] prefill logits tensor never exists). Every tensor and the random generator live on the policy's
device (a CPU generator cannot drive `torch.multinomial` on CUDA probabilities).
"""

from __future__ import annotations

import torch

from swarm_node.train.policy import Policy
from swarm_node.train.sampling import Sample


class HFSampler:
    """Samples from `policy.model` in place; `sync` is a no-op because the weights are shared."""

    on_policy = True  # the trained model itself: its log-probs are the trainer's

    def __init__(self, policy: Policy):
        self.policy = policy

    def sample(self, prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float,
               seed: int) -> list[list[Sample]]:
        generator = torch.Generator(device=self.policy.device).manual_seed(seed)
        return self._generate(prompts, n, max_new_tokens, temperature, generator)

    def greedy(self, prompts: list[list[int]], max_new_tokens: int) -> list[Sample]:
        return [group[0] for group in self._generate(prompts, 1, max_new_tokens, 1.0, None)]

    def sync(self, policy: Policy, version: int) -> None:
        assert policy.model is self.policy.model, "HFSampler samples from the trained model itself"

    def close(self) -> None:
        pass

    @torch.no_grad()
    def _generate(self, prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float,
                  generator: torch.Generator | None) -> list[list[Sample]]:
        """`n` completions per prompt; argmax when `generator` is None."""
        policy, device = self.policy, self.policy.device
        was_training = policy.model.training
        policy.model.eval()
        ids, mask = policy.left_pad([p for p in prompts for _ in range(n)])  # [B, P], [B, P]
        B = ids.shape[0]
        out_tokens = torch.full((B, max_new_tokens), policy.pad_id, dtype=torch.long, device=device)  # [B, T]
        out_logp = torch.zeros((B, max_new_tokens), dtype=torch.float32, device=device)  # [B, T]
        done = torch.zeros(B, dtype=torch.bool, device=device)  # [B]
        lengths = torch.full((B,), max_new_tokens, dtype=torch.long, device=device)  # [B]
        position = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, P]
        past, step_ids = None, ids
        for t in range(max_new_tokens):
            with policy.autocast():
                out = policy.model.get_decoder()(input_ids=step_ids, attention_mask=mask, position_ids=position,
                                                 past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = policy.head_logits(out.last_hidden_state[:, -1:, :])[:, 0]  # [B, V] last position only
            logprobs = torch.log_softmax(logits / temperature, dim=-1)  # [B, V]
            if generator is None:
                token = logprobs.argmax(dim=-1)  # [B]
            else:
                token = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(-1)  # [B]
            token = torch.where(done, torch.full_like(token, policy.pad_id), token)  # [B]
            out_tokens[:, t] = token
            out_logp[:, t] = logprobs.gather(-1, token[:, None]).squeeze(-1)  # [B]
            just_ended = (token == policy.eos_id) & ~done  # [B]
            lengths = torch.where(just_ended, torch.full_like(lengths, t + 1), lengths)  # [B] EOS kept
            done |= just_ended
            if bool(done.all()):
                break
            step_ids = token[:, None]  # [B, 1]
            mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=device)], dim=-1)  # [B, P+t+1]
            position = position[:, -1:] + 1  # [B, 1]
        policy.model.train(was_training)
        tokens, logps, lengths, done = out_tokens.tolist(), out_logp.tolist(), lengths.tolist(), done.tolist()
        samples = [Sample(tokens[i][:lengths[i]], logps[i][:lengths[i]], "stop" if done[i] else "length")
                   for i in range(B)]
        return [samples[k * n:(k + 1) * n] for k in range(len(prompts))]
