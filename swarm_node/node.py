"""The node: the round loop. Read it top to bottom; each stage has a banner.

    round r:  generate -> offer -> collect + admit -> combine -> train -> guard (every k rounds)
              -> sync weights -> evaluate (every k rounds) -> log one metrics row -> checkpoint

Round 0 is the starting point (held-out accuracy before any RL); rounds 1..N train. A
checkpoint after round r resumes at r + 1 with the same prompts and sampling seeds (a swarm node
draws its prompts from its public schedule, keyed by its peer id: given the same --identity) and
the optimizer state. Alone (`swarm-node train`) the swarm stages are skipped; in a swarm
(`swarm-node join`) `connect(model_id, tokenizer_fingerprint)` builds the transport.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from swarm_node import metrics as M
from swarm_node.config import NodeConfig
from swarm_node.errors import SwarmNodeError
from swarm_node.metrics import MetricsWriter, drop_rounds_after, set_aside, summary_line
from swarm_node.net import Transport
from swarm_node.status import StatusFile
from swarm_node.swarm.admit import Admission, Expectations
from swarm_node.swarm.exchange import Exchange
from swarm_node.tasks import Task, load_task
from swarm_node.tracking import check_trackers, open_tracker
from swarm_node.train.batch import TrainBatch
from swarm_node.train.checkpoint import latest_checkpoint, load_checkpoint, load_extra, save_checkpoint
from swarm_node.train.defaults import resolve as resolve_defaults
from swarm_node.train.evaluate import held_out, pass_at_1
from swarm_node.train.guard import Guard
from swarm_node.train.models import plan_node_memory
from swarm_node.train.policy import Policy
from swarm_node.train.rollout import (OWN, RolloutBuffer, combine, draws_key, group_stats, has_signal, prompt_tokens,
                                      round_examples, round_seed, sample_groups)
from swarm_node.train.sampling import Sampler
from swarm_node.train.sampling.hf import HFSampler
from swarm_node.train.trainer import Trainer
from swarm_node.train.warmstart import warmstarted_model
from swarm_node.wire.codec import tokenizer_fingerprint
from swarm_node.wire.contract import manifest_for, prompt_base
from swarm_node.wire.schedule import schedule_key

log = logging.getLogger(__name__)


class OutputError(SwarmNodeError):
    """The output directory cannot be created or written."""


def _due(r: int, every: int, last: int) -> bool:
    return r == last or (every > 0 and r % every == 0)


def load_policy(cfg: NodeConfig, base: str, checkpoint: Path | None) -> Policy:
    """The policy to train: from a checkpoint if resuming, else the (warm-started) base model."""
    model_cfg = type(cfg.model)(**{**cfg.model.__dict__, "name": base})
    if checkpoint is None:
        return Policy.load(model_cfg)
    if cfg.model.lora_r > 0:  # a LoRA checkpoint holds only the adapter: base weights first
        return Policy.load(model_cfg, adapter_path=checkpoint / "model")
    return Policy.load(type(cfg.model)(**{**model_cfg.__dict__, "name": str(checkpoint / "model")}))


@dataclass
class Parts:
    """Everything the round loop uses, built once by `build`."""

    cfg: NodeConfig  # with every open setting resolved (defaults.py)
    task: Task
    eval_task: Task
    eval_set: list
    base: str  # the model the run started from (a warm-started cache path, or cfg.model.name)
    policy: Policy
    sampler: Sampler
    trainer: Trainer
    first: int  # the first round to run (after a checkpoint: its round + 1)
    exchange: Exchange | None = None
    admission: Admission | None = None
    guard: Guard | None = None


def build(cfg: NodeConfig, resume: bool, connect: Callable[[str, str], Transport] | None, status: StatusFile) -> Parts:
    """Data, (warm-started) policy, sampler, trainer, checkpoint state and, in a swarm, the exchange."""
    task = load_task(cfg.task.name, cfg.task.data, **cfg.task.options)
    cfg, chosen = resolve_defaults(cfg, task)
    for line in chosen:
        log.info("default: %s", line)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    cfg.save(Path(cfg.out) / "config.yaml")
    eval_task = load_task(cfg.task.eval_task, cfg.task.eval_data) if cfg.task.eval_task else task
    base = cfg.model.name
    if cfg.train.warmstart_steps > 0:
        status.update(state="warmstart")
        base = warmstarted_model(cfg, task, lambda step, loss: status.update(
            warmstart={"step": step, "steps": cfg.train.warmstart_steps, "loss": loss}))
    checkpoint = latest_checkpoint(cfg.out) if resume else None
    policy = load_policy(cfg, base, checkpoint)
    sampler = build_sampler(cfg, policy)
    trainer = Trainer(policy, cfg.train, cfg.loss, cfg.rollout.temperature, sampler.on_policy)
    parts = Parts(cfg, task, eval_task, held_out(eval_task, cfg.task.eval_limit), base, policy, sampler, trainer, first=0)
    status.update(model=cfg.model.name, params=sum(p.numel() for p in policy.model.parameters()),
                  trainable_params=sum(p.numel() for p in policy.trainable_parameters()))
    check_memory(cfg, policy, len(prompt_tokens(policy, task, task.split("train")[0])),
                 guard=connect is not None and cfg.swarm.guard_every > 0)
    if checkpoint is not None:
        state = load_checkpoint(checkpoint, parts.trainer.optimizer)
        parts.first, parts.trainer.policy_version = state["round"] + 1, state["policy_version"]
        if state.get("plausibility_floors"):  # the anchor stays where the run began, not where it resumed
            parts.trainer.first_floors = tuple(state["plausibility_floors"])
        parts.trainer.first_length = state.get("length_bound")  # absent before session 36: anchored anew
        log.info("resumed from %s: next round %d", checkpoint, parts.first)
    if connect is not None:
        fingerprint = tokenizer_fingerprint(policy.tokenizer)
        transport = connect(policy.model_id, fingerprint)
        manifest = manifest_for(task, policy.tokenizer, fingerprint, chat=policy.chat_template,
                                system=policy.system_prompt, group_size=cfg.rollout.group_size,
                                max_new_tokens=cfg.rollout.max_new_tokens, mode=cfg.swarm.mode,
                                prompts=cfg.swarm.prompts)
        if hasattr(transport, "set_manifest"):  # test doubles of the Transport protocol may lack it
            transport.set_manifest(manifest.digest(), required=cfg.swarm.prompts == "sha256")
        log.info("run manifest %s: %s", manifest.digest()[:19], manifest.to_json()[:300])
        parts.exchange = Exchange(transport, cfg.swarm, policy.model_id, fingerprint, prompt_base(policy.tokenizer))
        transport.start()
        reach = getattr(transport, "reachability", None)
        status.update(peer_id=transport.peer_id, join_addrs=transport.join_addrs(), reachability=reach and reach.line)
        log.info("peer id %s; others join this swarm with --peers %s", transport.peer_id,
                 (status.status.join_addrs or ["?"])[0])
        expect = Expectations(run_id=cfg.swarm.run_id, tokenizer=fingerprint, staleness=cfg.swarm.staleness,
                              max_lag=cfg.swarm.max_lag if cfg.swarm.mode == "vertical" else 0,
                              max_tokens=cfg.rollout.max_new_tokens, group_size=cfg.rollout.group_size,
                              trusted_peers=frozenset(cfg.swarm.trusted_peers), prompts=cfg.swarm.prompts,
                              horizontal=cfg.swarm.mode == "horizontal",
                              schedule_depth=cfg.swarm.schedule_depth or cfg.rollout.prompts_per_round)
        parts.admission = Admission(expect, policy.scorer(task))
        if cfg.swarm.guard_every:
            parts.guard = build_guard(cfg, trainer, sampler, task, checkpoint, parts.admission)
    return parts


def build_guard(cfg: NodeConfig, trainer: Trainer, sampler: Sampler, task: Task, checkpoint: Path | None,
                admission: Admission) -> Guard:
    """The guard, with the reference, bans and lockdown it had at `checkpoint` (when resuming)."""
    shadow = Trainer(trainer.policy, cfg.train, cfg.loss, cfg.rollout.temperature, sampler.on_policy)
    guard = Guard(trainer, shadow, sampler, task, cfg.swarm.guard_examples, cfg.rollout,
                  cfg.swarm.guard_margin, cfg.swarm.guard_ban_rounds, cfg.swarm.guard_reserve)
    saved = load_extra(checkpoint, "guard") if checkpoint is not None else None
    try:
        if saved is not None:
            guard.load_state_dict(saved)
            admission.distrust(guard.bans, guard.locked_until, guard.lockdown_admits)
            log.info("guard resumed: %d reset(s) so far, %d ban(s), lockdown until round %d",
                     guard.resets, len(guard.bans), guard.locked_until)
            return guard
    except ValueError as e:  # an older version's state, or other trainable weights
        log.warning("the checkpoint's guard state does not fit (%s)", e)
    if checkpoint is not None:
        log.warning("the guard's reference starts from the resumed weights, with a new reserve")
    return guard


def build_sampler(cfg: NodeConfig, policy: Policy) -> Sampler:
    """model.sampler: hf samples from the trained model itself; vllm from an engine synced after every step."""
    from swarm_node.train.sampling.vllm import VLLMSampler, default_sampler

    kind = default_sampler() if cfg.model.sampler == "auto" else cfg.model.sampler
    log.info("sampler: %s", kind)
    return HFSampler(policy) if kind == "hf" else VLLMSampler(policy, seed=cfg.train.seed or 0)


def check_memory(cfg: NodeConfig, policy: Policy, prompt_len: int, guard: bool) -> None:
    """Say what the config needs against what the device has; checkpoint activations if that is what fits."""
    fit = plan_node_memory(cfg, policy, prompt_len, guard)
    log.log(logging.WARNING if fit.status != "ok" else logging.INFO, "memory: %s%s", fit.message,
            f" ({fit.remedy})" if fit.remedy else "")
    if fit.gradient_checkpointing and fit.status == "warn":
        policy.model.gradient_checkpointing_enable()
        log.info("gradient checkpointing is on")


def run(cfg: NodeConfig, resume: bool = False, connect: Callable[[str, str], Transport] | None = None,
        on_round: Callable[[dict], None] | None = None) -> list[dict]:
    """Train for `cfg.train.rounds` rounds; returns the metrics rows (also in OUT/metrics.jsonl).

    `connect(model_id, tokenizer_fingerprint)` returns the transport of a swarm node (None: alone).
    `on_round(row)` is called after every round. The loop is one piece on purpose: it is the
    whole algorithm, read top to bottom.
    """
    out = Path(cfg.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        cfg.save(out / "config.yaml")  # as given; replaced by the resolved config once the task is loaded
    except OSError as e:
        raise OutputError(f"cannot write to the output directory {out}: {e.strerror or e}") from None
    status = StatusFile(out, cfg.name, cfg.train.rounds)
    check_trackers(cfg.report_to)
    try:
        p = build(cfg, resume, connect, status)
    except BaseException as e:
        status.update(state="failed", error=f"{type(e).__name__}: {e}"[:500])
        raise
    cfg = p.cfg
    policy, sampler, trainer, exchange, admission, guard = p.policy, p.sampler, p.trainer, p.exchange, p.admission, p.guard
    scorer = policy.scorer(p.task)
    if resume:  # rounds after the checkpoint are trained again: their old rows must not appear twice
        drop_rounds_after(out / "metrics.jsonl", p.first - 1)
    else:  # a fresh run in a used OUT: one metrics file, one run
        set_aside(out / "metrics.jsonl")
    buffer = RolloutBuffer(cfg.swarm.max_peer_groups, cfg.swarm.peer_groups_per_own, cfg.swarm.max_peer_share,
                           horizontal=cfg.swarm.mode == "horizontal")
    draws = draws_key(cfg.train.seed, exchange.transport.peer_id if exchange is not None else None)
    # in a swarm our prompts are our public schedule (receivers train only on scheduled groups); alone, our own
    prompt_key = (schedule_key(cfg.swarm.run_id, cfg.swarm.mode, exchange.transport.peer_id) if exchange is not None
                  else f"alone/{draws}")
    trusted = frozenset(cfg.swarm.trusted_peers)  # their negatives count as the paper's (loss.teach_only)
    # the guard's reserve is never trained on: we draw, answer and offer prompts as if there were none (what
    # we offer shows nothing of it), and groups on it, ours and peers', never enter the buffer
    trainable = guard.reserve.trainable if guard is not None else (lambda groups: groups)
    metrics, tracker, rows, last = None, None, [], cfg.train.rounds
    status.update(state="running", round=p.first - 1, policy_version=trainer.policy_version)
    finished = False
    try:
        metrics = MetricsWriter(out / "metrics.jsonl")
        tracker = open_tracker(cfg.report_to, out, cfg.to_dict(), run_name=cfg.name, first_step=p.first if resume else None)
        for r in range(p.first, last + 1):
            row: dict = {M.ROUND: r, M.NODE: cfg.name}
            t_round = time.perf_counter()
            if r > 0:
                # ---------------------------------------------------------------- generate
                t = time.perf_counter()
                examples = round_examples(p.task, r, cfg.rollout.prompts_per_round, prompt_key)
                own = sample_groups(sampler, scorer, examples, cfg.rollout, round_seed(draws, r))
                texts = scorer.score(own)
                buffer.add(trainable(own), OWN)
                row.update(group_stats(own), **{M.FORMAT_FAIL_FRAC: scorer.format_fail_frac(texts),
                                                M.TIME_GENERATE: time.perf_counter() - t})

                if exchange is not None:
                    # ------------------------------------------------------------ offer
                    admission.remember_own(own)  # their echoes from other peers are refused
                    row.update(exchange.offer(r, trainer.policy_version, own))
                    # ------------------------------------------------------------ collect + admit
                    accepted, swarm_stats = exchange.collect(r, admission)
                    for peer, packet in accepted:
                        buffer.add(trainable(packet.groups), peer)  # reserved problems out
                    row.update(swarm_stats)

                # ---------------------------------------------------------------- combine
                rollouts = buffer.take(r, drawn=len(own))  # peer slots as if none of ours were reserved
                peer_groups = [x.group for x in rollouts if x.source != OWN]
                row.update(group_stats(peer_groups, prefix=M.PEER_PREFIX))
                if exchange is not None:
                    row[M.PEER_GROUPS_USED] = len(peer_groups)
                    by_peer = Counter(x.source for x in rollouts if x.source != OWN)
                    log.info("round %d trains on peer groups %s", r, dict(by_peer) or "none")

                # ---------------------------------------------------------------- train
                groups, sources = combine(rollouts, cfg.swarm.mode)
                batch = TrainBatch.from_groups(groups, policy.pad_id, own=[s == OWN for s in sources],
                                               untrusted=[s != OWN and s not in trusted for s in sources])
                row.update(trainer.step(batch))
                if exchange is not None:  # the mesh keeps neighbours we took data from that did not misbehave
                    exchange.credit(accepted, set(sources) - {OWN},
                                    implausible_only(sources, batch.rewards > 0, trainer.implausible),
                                    useful={x.source for x in rollouts if x.source != OWN and has_signal(x.group)},
                                    # before the reserve's filter: whether we wait for a peer shows nothing of it
                                    teaching={peer for peer, packet in accepted if any(map(has_signal, packet.groups))},
                                    round_index=r)

                # ---------------------------------------------------------------- guard
                if guard is not None:  # a copy learns alone from its own samples; peers must not leave us behind it
                    taught = {s for s, signal in zip(sources, batch.in_signal_group().tolist()) if signal} - {OWN} - trusted
                    present = ({peer for peer, _ in accepted} | exchange.standing_by) - trusted if exchange else set()
                    seconds = guard.step(examples, round_seed(draws, r), taught_by=taught, present=present)
                    if _due(r, cfg.swarm.guard_every, last):
                        verdict = guard.check(r, last=r == last)
                        admission.distrust(verdict.distrusted, verdict.locked_until, verdict.admitted)
                        row.update(verdict.stats)
                    row[M.TIME_GUARD] = row.get(M.TIME_GUARD, 0.0) + seconds
                    row[M.GUARD_DISTRUSTED] = admission.distrusted_at(r)
                    row[M.GUARD_LOCKDOWN] = max(0, admission.locked_until - r)

                # ---------------------------------------------------------------- sync weights
                sampler.sync(policy, trainer.policy_version)

            # -------------------------------------------------------------------- evaluate
            if r == 0 and p.first == 0 or r > 0 and _due(r, cfg.train.eval_every, last):
                result = pass_at_1(sampler, policy, p.eval_task, p.eval_set, cfg.rollout.max_new_tokens)
                row.update({M.EVAL_ACCURACY: result["accuracy"], M.EVAL_N: result["n"], M.TIME_EVAL: result["seconds"]})

            # -------------------------------------------------------------------- log + checkpoint
            row[M.TIME_ROUND] = time.perf_counter() - t_round
            metrics.write(row)
            tracker.log(row, step=r)
            rows.append(row)
            log.info(summary_line(row))
            status.update(round=r, policy_version=trainer.policy_version,
                          neighbours=exchange.transport.neighbours() if exchange is not None else None)
            if on_round is not None:
                on_round(row)
            if r > 0 and _due(r, cfg.train.checkpoint_every, last):
                save_checkpoint(out, policy, trainer.optimizer, {"round": r, "policy_version": trainer.policy_version,
                                                                  "base_model": p.base,
                                                                  "plausibility_floors": trainer.first_floors,
                                                                  "length_bound": trainer.first_length}, cfg,
                                extras={"guard": guard.state_dict()} if guard is not None else None)
        if cfg.task.ood_task:
            rows.append(evaluate_ood(cfg, sampler, policy, metrics))
            tracker.log(rows[-1], step=last)
        finished = True
    except KeyboardInterrupt:
        status.update(state="stopped")
        raise
    except BaseException as e:
        status.update(state="failed", error=f"{type(e).__name__}: {e}"[:500])
        raise
    finally:
        if metrics is not None:
            metrics.close()
        if tracker is not None:
            tracker.close()
        sampler.close()
        if exchange is not None:
            exchange.close(linger=finished)
    status.update(state="finished")
    return rows


def implausible_only(sources: list[str], positive, dropped) -> set[str]:
    """Peers whose positives in this step were all found implausible (positive, dropped: [N] bool)."""
    taken = Counter(s for s, p in zip(sources, positive.tolist()) if p)
    lost = Counter(s for s, p, d in zip(sources, positive.tolist(), dropped.tolist()) if p and d)
    return {s for s, n in taken.items() if s != OWN and lost[s] == n}


def evaluate_ood(cfg: NodeConfig, sampler: Sampler, policy: Policy, metrics: MetricsWriter) -> dict:
    """Greedy pass@1 on the out-of-distribution task, once at the end, as its own metrics row."""
    ood = load_task(cfg.task.ood_task, cfg.task.ood_data, **cfg.task.ood_options)
    result = pass_at_1(sampler, policy, ood, held_out(ood, cfg.task.eval_limit), cfg.rollout.max_new_tokens)
    row = {M.ROUND: cfg.train.rounds, M.NODE: cfg.name, M.OOD_ACCURACY: result["accuracy"], M.OOD_N: result["n"]}
    metrics.write(row)
    log.info("out-of-distribution (%s) pass@1: %.3f", cfg.task.ood_task, result["accuracy"])
    return row
