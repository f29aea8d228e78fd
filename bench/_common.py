"""Shared helpers for the bench/ scripts (not part of the swarm_node package).

Every script: argparse defaults that finish in < 5 min on 2 CPU cores, a printed table, and a JSON
file under bench/results/ holding the numbers, the exact command and the machine they came from.

    machine_info()            cpu, memory, load average, library versions, git commit
    write_results(name, ...)  bench/results/<name>.json (the files docs/BENCHMARKS.md quotes)
    print_table(...)          one rich table per result set
    time_call(fn)             timeit-style: calibrated loop count, median / min over repeats
    PeakMemory                peak RSS of this process over a block (VmHWM, reset via clear_refs)
    synthetic_packet(...)     a codec.Packet of realistic size and content, no model needed
    run_json_subprocess(...)  run a worker in a fresh interpreter, parse the JSON it prints last
    load_runs(path)           the runs of a resumable bench's results file ({"runs": [...]}), [] if none yet
"""
from __future__ import annotations

import gc
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
PYTHON = sys.executable


def single_thread() -> None:
    """One intra-op thread: much faster for the tiny presets on a shared 2-core box (set before torch work)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:  # pragma: no cover
        pass


# ------------------------------------------------------------------------------------ machine info
def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip() or None
    except Exception:
        return None


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on, and how busy the machine was when the script started."""
    cpu_model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        import psutil

        mem_gb = round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        affinity = None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "cpu_count": os.cpu_count(), "cpu_affinity": affinity, "cpu_model": cpu_model, "memory_gb": mem_gb,
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(), "python": platform.python_version(),
        "versions": {m: _version(m) for m in ("torch", "transformers", "numpy", "msgpack", "hivemind", "trl",
                                               "accelerate", "swarm-node")},
        "git_commit": _git("rev-parse", "--short", "HEAD"), "git_dirty": bool(status),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "gpu": _gpu_name(),
    }


def _gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        return None


def describe_load(info: dict[str, Any]) -> str:
    la = info["load_avg_1_5_15"]
    return f"{info['cpu_count']} CPUs, load average {la[0]:.2f} / {la[1]:.2f} / {la[2]:.2f} (1/5/15 min) at start"


# ------------------------------------------------------------------------------------ results
def write_results(name: str, results: Any, args: Any, info: dict[str, Any], started: float,
                  out: str | Path | None = None, **extra: Any) -> Path:
    """bench/results/<name>.json (or `out`): results + command + machine + wall time."""
    path = Path(out) if out else RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "command": command_line(),
        "args": vars(args) if hasattr(args, "__dict__") else args,
        "machine": info,
        "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "wall_s": round(time.time() - started, 1),
        **extra,
        "results": results,
    }
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return path


def command_line() -> str:
    """How this script was invoked, relative to the repository root (rerunnable as is)."""
    exe = Path(PYTHON)
    try:
        exe_s = str(exe.relative_to(REPO))
    except ValueError:
        exe_s = "python"
    script = Path(sys.argv[0]).resolve()
    try:
        script_s = str(script.relative_to(REPO))
    except ValueError:
        script_s = sys.argv[0]
    return " ".join(shlex.quote(a) for a in [exe_s, script_s, *sys.argv[1:]])


def shown(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def print_table(title: str, columns: list[str], rows: list[list[Any]], caption: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    for i, c in enumerate(columns):
        table.add_column(c, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*[fmt(v) for v in row])
    Console(width=200).print(table)


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != v:
            return "nan"
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 1e6:
            return f"{v:,.0f}"
        if a >= 100:
            return f"{v:,.0f}" if a >= 1000 else f"{v:.1f}"
        if a >= 1:
            return f"{v:.2f}"
        if a >= 0.01:
            return f"{v:.3f}"
        return f"{v:.2e}"
    return str(v)


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return float("nan")
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# ------------------------------------------------------------------------------------ timing
@dataclass
class Timing:
    median_s: float  # per call
    min_s: float
    repeats: int
    loops: int


def time_call(fn: Callable[[], Any], min_time_s: float = 0.2, repeats: int = 5) -> Timing:
    """timeit-style: pick a loop count so one repeat lasts >= min_time_s, then `repeats` repeats."""
    fn()  # warm-up
    loops = 1
    while True:
        t = time.perf_counter()
        for _ in range(loops):
            fn()
        dt = time.perf_counter() - t
        if dt >= min_time_s or loops >= 1 << 20:
            break
        loops = max(loops * 2, int(loops * min_time_s / max(dt, 1e-9) * 1.1))
    per_call = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(loops):
            fn()
        per_call.append((time.perf_counter() - t) / loops)
    return Timing(median(per_call), min(per_call), repeats, loops)


# ------------------------------------------------------------------------------------ memory, CPU
def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds process `pid` has used so far (/proc, 10 ms ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakMemory:
    """Peak resident memory of this process over a `with` block.

    Linux: resets the high-water mark (write "5" to /proc/self/clear_refs) on entry and reads
    VmHWM on exit, so earlier transients (model init, imports) do not hide the block's peak.
    Elsewhere falls back to ru_maxrss (a process-lifetime peak: run each variant in a fresh
    process). torch CPU tensors are plain malloc/mmap memory, so RSS sees them.
    """

    def __enter__(self) -> "PeakMemory":
        gc.collect()
        self.reset = False
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.reset = _status_kb("VmHWM") is not None
        except OSError:
            pass
        self.base = rss_bytes()
        return self

    def __exit__(self, *exc) -> None:
        hwm = _status_kb("VmHWM") if self.reset else None
        if hwm is None:
            hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        self.peak = hwm * 1024
        self.delta = self.peak - self.base
        self.method = "VmHWM after clear_refs" if self.reset else "ru_maxrss (process lifetime)"


# ------------------------------------------------------------------------------------ subprocesses
def run_json_subprocess(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `python argv...` in a fresh interpreter; its last stdout line must be one JSON object."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    proc = subprocess.run([PYTHON, *argv], capture_output=True, text=True, timeout=timeout_s, env=full_env, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or "")[-3000:]
        raise RuntimeError(f"worker {argv} failed (rc={proc.returncode}):\n{tail}")
    return json.loads(lines[-1])


# ------------------------------------------------------------------------------------ packets
QWEN_VOCAB = 151_936  # Qwen2.5 vocabulary (embedding rows)


def synthetic_packet(prompts: int = 2, group_size: int = 12, mean_tokens: int = 200, prompt_tokens: int = 120,
                     vocab: int = QWEN_VOCAB, seed: int = 0, round: int = 1, sender: str | None = None,
                     spread: float = 0.25):
    """A packet shaped like a real round: `prompts` groups of `group_size` completions whose lengths
    are uniform in mean_tokens * (1 +- spread), random token ids below `vocab`, log-probs drawn like a
    sampled LM's (mostly near 0, a heavy tail), realistic header strings. Returns (packet, n_tokens)."""
    import numpy as np

    from swarm_node.wire.codec import Completion, Group, Packet

    rng = np.random.default_rng(seed)
    lo, hi = max(1, int(mean_tokens * (1 - spread))), max(1, int(mean_tokens * (1 + spread)))
    groups, n_tokens = [], 0
    for g in range(prompts):
        comps = []
        for _ in range(group_size):
            n = int(rng.integers(lo, hi + 1))
            n_tokens += n
            logp = -rng.exponential(0.4, size=n).astype(np.float32)  # [n]
            comps.append(Completion(tokens=rng.integers(0, vocab, size=n, dtype=np.uint32), logprobs=logp,  # [n], [n]
                                    finish_reason="stop" if rng.random() < 0.8 else "length",
                                    reward=float(rng.random() < 0.5)))
        groups.append(Group(task="gsm8k", example_id=f"train/{int(rng.integers(0, 7473))}",
                            prompt_tokens=rng.integers(0, vocab, size=prompt_tokens, dtype=np.uint32),  # [P]
                            completions=comps))
    # A libp2p RSA peer id is 46 base58 characters ("Qm..."); tokenizer fingerprint is sha256:<64 hex>.
    sender = sender or "Qm" + "".join(rng.choice(list("123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"), 44))
    packet = Packet(run_id="swarm-node", sender=sender, model_id="Qwen/Qwen2.5-0.5B-Instruct",
                    tokenizer="sha256:" + "ab" * 32, policy_version=round, round=round, mode="vertical",
                    groups=groups, created_at=int(time.time() * 1000))
    return packet, n_tokens


# ------------------------------------------------------------------------------------ stage timers
class Timers:
    """Accumulate wall time and CPU time per stage by wrapping functions from the outside (no library edits).

        timers = Timers()
        timers.wrap(Policy, "generate", "generate")      # patches Policy.generate in place
        ... run ...
        timers.take()      # {"generate": wall s, "cpu/generate": CPU s of the calling thread, ...}, then reset

    CPU time is `time.thread_time()` of the calling thread: with one torch thread the compute runs
    there, and unlike wall time it does not grow when other processes compete for the cores (it
    misses work done on other threads, e.g. the transport's event loop or p2pd).
    `key` may be a callable(args) -> str to route one function to several stages. `sync` (e.g.
    torch.cuda.synchronize) runs before and after each call so GPU work is charged where it ran.
    Nested wrapped calls are charged to both the outer and the inner stage.
    """

    def __init__(self, sync: Callable[[], None] | None = None):
        self.acc: dict[str, float] = {}
        self.sync = sync or (lambda: None)

    def wrap(self, owner: Any, attr: str, key: str | Callable[[tuple], str]) -> None:
        fn = getattr(owner, attr)
        timers = self

        def wrapper(*a, **kw):
            timers.sync()
            t, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                timers.sync()
                k = key(a) if callable(key) else key
                timers.acc[k] = timers.acc.get(k, 0.0) + time.perf_counter() - t
                timers.acc["cpu/" + k] = timers.acc.get("cpu/" + k, 0.0) + time.thread_time() - c

        wrapper.__wrapped__ = fn
        setattr(owner, attr, wrapper)

    def take(self) -> dict[str, float]:
        out, self.acc = self.acc, {}
        return out


def load_runs(path: Path) -> list[dict]:
    """The runs of a resumable bench's results file ({"runs": [...]}), [] if there is none yet."""
    return json.loads(path.read_text())["runs"] if path.exists() else []
