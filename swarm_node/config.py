"""Run configuration: one dataclass per concern, composed into `NodeConfig`.

Every field has a one-line doc comment; `__post_init__` validates on construction, so a bad
value fails at start-up with one clear message instead of deep inside a round. YAML files in
`configs/` hold data only (nested sections named like the dataclasses' fields); command-line
overrides use dotted keys (`--set train.lr=1e-4`). The resolved config is written next to every
run's metrics and inside every checkpoint (`NodeConfig.to_dict()` / `save()`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import ipaddress
import textwrap
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from swarm_node.errors import SwarmNodeError


class ConfigError(SwarmNodeError):
    """A user-caused configuration problem (bad key, bad value, unreadable file)."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


# the names of the F-TIS family and its filter's estimators (what each one is: train/loss.py's
# VARIANTS, KL_ESTIMATORS, KL_REDUCES, which tests/test_loss.py checks against these)
LOSS_VARIANTS = ("f-tis", "tis", "f-vis", "vis", "f-nois", "nois", "grpo")
KL_ESTIMATORS = ("k1", "k2", "k3")
KL_REDUCES = ("sum", "mean")


@dataclass
class LossConfig:
    """Which F-TIS family member to use and its hyper-parameters."""

    variant: str = "f-tis"
    """Loss variant: f-tis | tis | f-vis | vis | f-nois | nois | grpo (= nois)."""
    C: float = 2.0
    """TIS truncation cap on pi_theta/pi_gen; any C > 0 (C < 1 also down-weights on-policy tokens)."""
    g: float = 50.0
    """Filter threshold: a sequence with A_i <= 0 and divergence D_i >= g loses its advantage (inf = never)."""
    eps: float = 0.2
    """PPO clip range: clip(R, 1 - eps, 1 + eps); 0 < eps < 1."""
    kl_estimator: str = "k3"
    """Per-token divergence estimator of the filter: k1 | k2 | k3."""
    kl_reduce: str = "sum"
    """How per-token divergences combine over a completion: sum | mean."""
    C_negative: float | None = 1.0
    """TIS cap for sequences with A_i < 0 (None = C, the paper's TIS); 1.0 never up-weights a negative sample, so forged generator log-probs cannot amplify it."""
    positive_floor: float = 1.0
    """Lower bound on the TIS weight of sequences with A_i > 0 (0 = none, the paper's TIS; at most C); 1.0 never down-weights a correct sample."""
    check_certain_claims: bool = False
    """Treat a completion of >= 2 tokens whose claimed generator log-probs are all exactly 0 (certain at T = 1, which no sampler claims) as on-policy."""
    peer_negative_weight: float = 0.0
    """Weight of a negative-advantage sample from a peer outside swarm.trusted_peers, and of its rows in the baseline of this node's own rows of a merged (horizontal) group: 0 = such a peer can only teach what this node verified correct, never push down what it does (default); 1 = the paper's F-TIS for every peer."""
    peer_max_advantage: float | None = 1.0
    """Cap on the advantage of a sample from a peer outside swarm.trusted_peers (None = uncapped, the paper's): one correct completion among G - 1 wrong ones gets sqrt(G - 1) (3.3 at G = 12), the largest push a sample can carry, and a peer picks which groups it sends that way; 1.0 is what a half-correct group gives its positives."""
    peer_plausibility_margin: float | None = 1.0
    """An untrusted peer's positive sample teaches only if its mean per-token log-prob, and its worst token's, under this node's policy are at most this many nats below the 5th percentiles of the node's own samples (anchored at the node's first step; loss.implausible), and it is at most 1.25x as long as the median of the node's correct completions of the step (bounded below and above from its first step with one; Trainer._length_bound); its claimed generator log-probs are ignored (None = no check, the paper's F-TIS)."""

    def __post_init__(self) -> None:
        if self.C_negative is not None and not self.C_negative > 0:
            raise ValueError(f"C_negative must be > 0 or None, got {self.C_negative!r}")
        if self.peer_plausibility_margin is not None and not self.peer_plausibility_margin >= 0:
            raise ValueError(f"peer_plausibility_margin must be >= 0 or None, got {self.peer_plausibility_margin!r}")
        if self.peer_max_advantage is not None and not self.peer_max_advantage > 0:
            raise ValueError(f"peer_max_advantage must be > 0 or None, got {self.peer_max_advantage!r}")
        if not 0 <= self.peer_negative_weight <= 1:
            raise ValueError(f"peer_negative_weight must satisfy 0 <= w <= 1, got {self.peer_negative_weight!r}")
        if not 0 <= self.positive_floor <= self.C:
            raise ValueError(f"positive_floor must satisfy 0 <= positive_floor <= C, got {self.positive_floor!r}")
        if self.variant not in LOSS_VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; valid: {sorted(LOSS_VARIANTS)}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown kl_estimator {self.kl_estimator!r}; valid: {list(KL_ESTIMATORS)}")
        if self.kl_reduce not in KL_REDUCES:
            raise ValueError(f"unknown kl_reduce {self.kl_reduce!r}; valid: {list(KL_REDUCES)}")
        if not self.C > 0:
            raise ValueError(f"C must be > 0, got {self.C!r}")
        if not self.g > 0:
            raise ValueError(f"g must be > 0, got {self.g!r}")
        if not 0 < self.eps < 1:
            raise ValueError(f"eps must satisfy 0 < eps < 1, got {self.eps!r}")


@dataclass
class ModelConfig:
    name: str = "tiny-s"
    """Hub id (Qwen/Qwen2.5-3B, or short: Qwen2.5-3B), local path, or a preset: tiny-s | tiny-m | tiny-l | tiny-v."""
    lora_r: int = 0
    """LoRA rank; 0 trains every parameter (the paper uses r=128 on q_proj,v_proj)."""
    lora_alpha: int = 0
    """LoRA alpha; 0 means alpha = 2 * r."""
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])
    """Module names LoRA adapts."""
    dtype: str = "auto"
    """Compute dtype: float32 | bfloat16 | float16 | auto (bfloat16 on CUDA, float32 on CPU); trained weights stay float32."""
    device: str = "auto"
    """cpu | cuda | cuda:N | auto (cuda if available)."""
    init_seed: int = 0
    """Seed for the random init of built-in presets (real checkpoints ignore it)."""
    sampler: str = "auto"
    """Generation engine: hf (the trained model itself) | vllm (an engine synced after every step) | auto (vllm with a GPU and vllm installed, else hf)."""
    chat_template: str = "auto"
    """Prompt with the tokenizer's chat template: auto (instruct models) | on | off (plain prompt)."""
    system_prompt: str | None = None
    """System message for chat-templated prompts (prepended as a paragraph to plain ones)."""

    def __post_init__(self):
        _check(bool(self.name), "model.name must not be empty")
        _check(self.lora_r >= 0, f"model.lora_r must be >= 0, got {self.lora_r}")
        _check(self.lora_alpha >= 0, f"model.lora_alpha must be >= 0, got {self.lora_alpha}")
        _check(self.dtype in ("auto", "float32", "bfloat16", "float16"), f"model.dtype: unknown {self.dtype!r}")
        _check(self.lora_r == 0 or len(self.lora_targets) > 0, "model.lora_targets must name at least one module")
        _check(self.sampler in ("auto", "hf", "vllm"), f"model.sampler must be auto|hf|vllm, got {self.sampler!r}")
        _check(self.chat_template in ("auto", "on", "off"), f"model.chat_template must be auto|on|off, got {self.chat_template!r}")


@dataclass
class TaskConfig:
    name: str = "arith"
    """Training task: arith (built-in, no files) | gsm8k | math500."""
    data: str | None = None
    """Local directory/JSONL file or hub id for the task's data; None = the task's default."""
    eval_task: str | None = None
    """Held-out evaluation task; None = the training task's test split."""
    eval_data: str | None = None
    """Data location for eval_task (None = that task's default)."""
    eval_limit: int | None = None
    """Held-out examples for greedy pass@1 (0 = the whole split; None = the task's default: 200, math500 500)."""
    ood_task: str | None = None
    """Out-of-distribution task evaluated once at the end (e.g. math500); None = skip."""
    ood_data: str | None = None
    """Data location for ood_task."""
    ood_options: dict[str, Any] = field(default_factory=dict)
    """Options of ood_task (e.g. arith {second_digits: 2}: sums of two 2-digit numbers, never trained on)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Task-specific options (e.g. arith: digits, seed)."""

    def __post_init__(self):
        _check(bool(self.name), "task.name must not be empty")
        _check(self.eval_limit is None or self.eval_limit >= 0, "task.eval_limit must be >= 0")
        _check(bool(self.ood_task) or not self.ood_options, "task.ood_options needs task.ood_task")


@dataclass
class RolloutConfig:
    group_size: int = 12
    """Completions per prompt (G); the paper uses 12."""
    prompts_per_round: int | None = None
    """Prompts a node answers per round (None = 2 for real models: 2 x 12 = the paper's batch of 24; 16 for tiny presets)."""
    max_new_tokens: int | None = None
    """Longest completion, cut and marked finish_reason=length (None = the task's: arith digits+10, gsm8k 256)."""
    temperature: float = 1.0
    """Sampling temperature; training log-probs use the same temperature so ratios compare like with like."""

    def __post_init__(self):
        _check(self.group_size >= 2, f"rollout.group_size must be >= 2 (advantages need a group), got {self.group_size}")
        _check(self.prompts_per_round is None or self.prompts_per_round >= 1, "rollout.prompts_per_round must be >= 1")
        _check(self.max_new_tokens is None or self.max_new_tokens >= 1, "rollout.max_new_tokens must be >= 1")
        _check(self.temperature > 0, "rollout.temperature must be > 0 (greedy is for evaluation only)")


@dataclass
class TrainConfig:
    rounds: int = 50
    """Number of rounds (generate -> exchange -> train); the paper runs 50 iterations."""
    lr: float | None = None
    """AdamW learning rate (None = 1e-6, the paper's, for real models; tiny presets: 1e-4 at >= 8 prompts per round, else 2e-5)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0 disables)."""
    micro_batch: int = 8
    """Sequences per forward/backward pass (gradients are accumulated over the round's batch)."""
    logprob_chunk: int = 64
    """Time steps per chunk when computing token log-probs, so [B, T, V] logits never exist at once."""
    eval_every: int = 5
    """Evaluate greedy pass@1 every this many rounds (and after the last); 0 = only at start and end."""
    checkpoint_every: int = 5
    """Write a checkpoint every this many rounds (and after the last); 0 = only at the end."""
    seed: int | None = None
    """Seed for generation, and alone for the prompts (a swarm node's are its public schedule, by peer id);
    None = 0 alone, the peer id in a swarm (rollout.draws_key)."""
    warmstart_steps: int | None = None
    """Supervised steps on reference completions before RL (None = 600 for tiny presets, 0 for real models)."""
    warmstart_lr: float = 1e-3
    """Learning rate of the supervised warm start."""
    warmstart_batch: int = 64
    """Examples per warm-start step."""

    def __post_init__(self):
        _check(self.rounds >= 0, "train.rounds must be >= 0")
        _check(self.lr is None or self.lr > 0, "train.lr must be > 0")
        _check(self.micro_batch >= 1, "train.micro_batch must be >= 1")
        _check(self.logprob_chunk >= 1, "train.logprob_chunk must be >= 1")
        _check(self.eval_every >= 0 and self.checkpoint_every >= 0, "train.eval_every/checkpoint_every must be >= 0")
        _check(self.warmstart_steps is None or self.warmstart_steps >= 0, "train.warmstart_steps must be >= 0")


@dataclass
class SwarmConfig:
    peers: list[str] = field(default_factory=list)
    """Multiaddrs of peers to bootstrap from (any one answering is enough); empty starts a new swarm."""
    identity: str | None = None
    """libp2p private key file: created on first use, reused so the peer id survives restarts."""
    host_maddrs: list[str] = field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"])
    """Multiaddrs to listen on."""
    announce_maddrs: list[str] = field(default_factory=list)
    """Multiaddrs to announce to peers (e.g. a public IP behind NAT)."""
    run_id: str = "swarm-node"
    """Swarm namespace: nodes ignore records and packets of other runs."""
    mode: str = "vertical"
    """vertical: each node answers its own prompts (paper default) | horizontal: all answer the same prompts
    and their groups merge per prompt (the paper's horizontal with N nodes: rollout.group_size = G / N)."""
    prompts: str = "tokens"
    """tokens: packets carry prompt token ids | sha256: a 32-byte digest of them, receivers render the prompt (SPEC 14.6)."""
    min_peers: int = 1
    """Stop collecting a round's peer packets once this many peers' packets were accepted (or the deadline passed)."""
    deadline_s: float = 30.0
    """Longest wait for peer packets after generating a round."""
    fair_wait_s: float = 2.0
    """Once min_peers were accepted, keep collecting at most this long for the other neighbours that have not delivered this round (so a peer that always delivers first cannot crowd slower ones out)."""
    alone_wait_s: float | None = 5.0
    """A round's wait while no neighbour is a producer near our round: a new swarm's first node, or neighbours that only relay or announce far-off rounds (None = deadline_s)."""
    staleness: int = 2
    """Accept peer packets from rounds r - staleness .. r + staleness; older ones are ignored and counted."""
    max_lag: int = 64
    """Vertical mode: a peer whose newest packet lies outside the staleness window (a slower or faster node) still has that newest packet taken, once, up to this many rounds from ours, without waiting for it (0: the window only)."""
    max_peer_groups: int = 24
    """Hard cap on peer groups used per training step."""
    peer_groups_per_own: float = 1.0
    """Peer groups trained on per own group in a step (1.0 = the paper's batch: 1 own + 1 peer group per node)."""
    max_peer_share: float = 0.5
    """One peer's groups fill at most this share of a step's peer slots (rounded up), so one liar is diluted."""
    schedule_depth: int | None = None
    """Train on a peer's group only if its problem is among the first N of the sender's public schedule for
    the packet's round (SPEC 14.5); unset: our rollout.prompts_per_round. A larger N admits peers that answer
    more prompts a round, and lets each peer choose among more problems which ones to teach."""
    trusted_peers: list[str] = field(default_factory=list)
    """If non-empty, train only on packets from these peer ids (private swarms); others are rejected."""
    guard_every: int | None = None
    """Every this many rounds (and after the last) compare the model with a copy that learns alone from its own samples, on reserved problems no peer knows and nothing trains on; if peers made it measurably worse, go back to the copy and train only on vouched peers for a while (train/guard.py). None = 5 in an open swarm, 0 (off) with trusted_peers."""
    guard_examples: int | None = None
    """Reserved train problems each model answers per guard check (at most a third of the reserve). None = 500 for tiny presets, 200 for real models."""
    guard_margin: float = 0.04
    """Smallest pass@1 gap (alone minus mixed, over the last 3 checks' examples) the guard acts on, besides two standard deviations of the paired difference."""
    guard_ban_rounds: int = 20
    """Rounds a new peer blamed by the guard is not trained on, and of the guard's lockdown; doubled on repeat."""
    guard_reserve: float = 0.2
    """Share of the train problems the guard keeps secret for its checks: never trained on, ours or peers' (train/reserve.py)."""
    fetch_timeout_s: float = 10.0
    """A stalled peer costs at most this per packet fetch."""
    linger_s: float = 5.0
    """After the last round, keep serving our packets this long so peers can fetch them."""
    record_ttl_s: float = 60.0
    """Lifetime of our discovery record; it is republished every record_ttl_s / 3."""
    max_packet_bytes: int = 16 * 2**20
    """Largest packet fetched from a peer (offers declaring more are never fetched)."""
    max_offers: int = 4
    """Packets we serve at once (the newest ones)."""
    max_peer_packets: int = 4
    """Packets fetched from one peer per round at most."""
    max_peer_bytes: int = 32 * 2**20
    """Declared bytes fetched from one peer per round at most."""
    bootstrap_retry_s: float = 10.0
    """While no initial peer answers, retry bootstrapping this often."""
    start_timeout_s: float = 60.0
    """Longest wait for the libp2p daemon and DHT to start."""
    discovery: str = "push"
    """How peers find each other's packets: push (v2: neighbors push offers) | dht-key (v1, for benchmarks only)."""
    port: int = 0
    """TCP port to listen on (0: any free port); forward it on your router to be reachable from outside."""
    public_ip: str | None = None
    """This node's public IP, when peers can reach --port on it (port-forward, server): announced, serves as relay."""
    reachability: str = "auto"
    """auto: ask a peer to dial back at start-up | public | private (behind NAT: serve through a relay)."""
    relay: bool = True
    """Circuit relays: reserve a slot at a relay when unreachable, dial relayed peers, relay for others."""
    relays: list[str] = field(default_factory=list)
    """Multiaddrs of relays to reserve at when unreachable (default: the --peers)."""

    def __post_init__(self):
        _check(self.discovery in ("push", "dht-key"), f"swarm.discovery must be push|dht-key, got {self.discovery!r}")
        _check(self.mode in ("vertical", "horizontal"), f"swarm.mode must be vertical|horizontal, got {self.mode!r}")
        _check(self.prompts in ("tokens", "sha256"), f"swarm.prompts must be tokens|sha256, got {self.prompts!r}")
        _check(self.min_peers >= 0, "swarm.min_peers must be >= 0")
        _check(self.fair_wait_s >= 0, "swarm.fair_wait_s must be >= 0")
        _check(self.deadline_s >= 0 and (self.alone_wait_s is None or self.alone_wait_s >= 0),
               "swarm.deadline_s/alone_wait_s must be >= 0")
        _check(self.staleness >= 0, "swarm.staleness must be >= 0")
        _check(self.max_lag >= 0, "swarm.max_lag must be >= 0")
        _check(self.max_peer_groups >= 0, "swarm.max_peer_groups must be >= 0")
        _check(self.peer_groups_per_own >= 0, "swarm.peer_groups_per_own must be >= 0")
        _check(0 < self.max_peer_share <= 1, "swarm.max_peer_share must be in (0, 1]")
        _check(self.schedule_depth is None or self.schedule_depth >= 1, "swarm.schedule_depth must be >= 1 (or unset)")
        _check((self.guard_every is None or self.guard_every >= 0) and (self.guard_examples is None or self.guard_examples >= 1)
               and 0 <= self.guard_margin < 1 and self.guard_ban_rounds >= 1 and 0 < self.guard_reserve <= 0.5,
               "swarm.guard_every must be >= 0, guard_examples >= 1, guard_margin in [0, 1), guard_ban_rounds >= 1, "
               "guard_reserve in (0, 0.5]")
        _check(self.fetch_timeout_s > 0, "swarm.fetch_timeout_s must be > 0")
        _check(self.linger_s >= 0, "swarm.linger_s must be >= 0")
        _check(bool(self.run_id) and len(self.run_id) <= 64, "swarm.run_id must be 1..64 characters")
        _check(self.record_ttl_s > 0, "swarm.record_ttl_s must be > 0")
        _check(self.max_packet_bytes >= 1, "swarm.max_packet_bytes must be >= 1")
        _check(1 <= self.max_offers <= 16, "swarm.max_offers must be in 1..16 (records list at most 16 offers)")
        _check(self.max_peer_packets >= 1 and self.max_peer_bytes >= 1, "swarm.max_peer_packets/max_peer_bytes must be >= 1")
        _check(self.bootstrap_retry_s > 0 and self.start_timeout_s > 0, "swarm.bootstrap_retry_s/start_timeout_s must be > 0")
        _check(0 <= self.port < 65536, f"swarm.port must be in 0..65535, got {self.port}")
        _check(self.reachability in ("auto", "public", "private"),
               f"swarm.reachability must be auto|public|private, got {self.reachability!r}")
        if self.public_ip is not None:
            try:
                ipaddress.ip_address(self.public_ip)
            except ValueError:
                raise ConfigError(f"swarm.public_ip: not an IP address: {self.public_ip!r}") from None
            _check(self.port > 0, "swarm.public_ip needs a fixed swarm.port (--port N), the port you forwarded")


@dataclass
class NodeConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy this node trains."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """Training and evaluation data."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How completions are sampled."""
    loss: LossConfig = field(default_factory=LossConfig)
    """Policy-gradient objective (F-TIS family, see swarm_node/train/loss.py)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimisation schedule."""
    swarm: SwarmConfig = field(default_factory=SwarmConfig)
    """Peer-to-peer settings."""
    out: str = "runs/node"
    """Output directory: metrics.jsonl, node.log, config.yaml, checkpoints/."""
    name: str = ""
    """Display name of this node in logs and plots; empty = derived from the model name."""
    threads: int | None = None
    """CPU threads for torch (0 = torch's default; None = 1 for the tiny presets, where it is 3-4x faster, else 0)."""
    report_to: list[str] = field(default_factory=list)
    """Experiment trackers that also get every metrics row: tensorboard | wandb (metrics.jsonl is always written)."""

    def __post_init__(self):
        _check(self.threads is None or self.threads >= 0, "threads must be >= 0")
        unknown = sorted(set(self.report_to) - {"tensorboard", "wandb", "none"})
        _check(not unknown, f"report_to: unknown tracker(s) {unknown} (valid: tensorboard, wandb, none)")
        if not self.name:
            self.name = Path(self.model.name.rstrip("/")).name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def _coerce(value: Any, hint: Any, path: str) -> Any:
    """Check a YAML value against a field's type, converting the forms YAML leaves ambiguous
    (`1e-4` is a string in YAML 1.1; `2` for a float field is an int). `X | None` fields take None."""
    args = typing.get_args(hint)
    if type(None) in args and len(args) == 2:
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is float and isinstance(value, (int, str)) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            pass
    simple = {int: int, float: float, str: str, bool: bool}.get(hint)
    if simple is not None and (not isinstance(value, simple) or (simple is int and isinstance(value, bool))):
        raise ConfigError(f"{path}: expected {simple.__name__}, got {value!r}")
    if typing.get_origin(hint) is list and not isinstance(value, list):
        raise ConfigError(f"{path}: expected a list, got {value!r}")
    return value


def _build(cls, data: dict[str, Any], where: str):
    """Build dataclass `cls` from a nested dict, rejecting unknown keys with their dotted path."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in fields:
            raise ConfigError(f"unknown config key {path!r} (valid: {', '.join(fields)})")
        sub = _SECTIONS.get(key) if cls is NodeConfig else None
        kwargs[key] = _build(sub, value or {}, path) if sub else _coerce(value, hints[key], path)
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{where or 'config'}: {e}") from None
    except ValueError as e:  # LossConfig raises plain ValueError
        raise ConfigError(str(e)) from None


_SECTIONS = {"model": ModelConfig, "task": TaskConfig, "rollout": RolloutConfig, "loss": LossConfig,
             "train": TrainConfig, "swarm": SwarmConfig}


@functools.cache
def field_docs(cls) -> dict[str, str]:
    """{field name: its doc line} of a config dataclass, read from the string under each field."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body, docs = tree.body[0].body, {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def doc(dotted: str) -> str:
    """The doc line of a config key such as `swarm.peers` (the CLI's help text comes from here)."""
    section, _, key = dotted.rpartition(".")
    return field_docs(_SECTIONS[section] if section else NodeConfig).get(key, "")


def all_keys() -> list[tuple[str, Any, str]]:
    """(dotted key, default, doc) of every config field, in declaration order."""
    defaults = NodeConfig().to_dict()
    keys = []
    for name, value in defaults.items():
        if name in _SECTIONS:
            keys += [(f"{name}.{k}", v, doc(f"{name}.{k}")) for k, v in value.items()]
        else:
            keys.append((name, value, doc(name)))
    return keys


def apply_override(data: dict[str, Any], dotted: str) -> None:
    """Apply one `section.key=value` override to a nested dict (the value is parsed as YAML)."""
    key, sep, raw = dotted.partition("=")
    _check(bool(sep) and bool(key), f"override {dotted!r} must look like section.key=value")
    *parents, leaf = key.strip().split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        _check(isinstance(node, dict), f"override {dotted!r}: {part!r} is not a section")
    node[leaf] = yaml.safe_load(raw) if raw.strip() else None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> NodeConfig:
    """Read a YAML config (or the defaults), apply dotted overrides, validate, return the config."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as e:
            raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config {path} is not valid YAML: {e}") from None
    for item in overrides or []:
        apply_override(data, item)
    return _build(NodeConfig, data, "")
