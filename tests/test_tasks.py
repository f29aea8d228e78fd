"""Tests for swarm_node.tasks: the answer format, arith, GSM8K and MATH-500.

The real-data tests read ``../shared/data`` (beside the repository; override
with ``$SWARM_NODE_DATA``) and skip when it is absent. Everything else uses
tiny JSONL files written to a temporary directory.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm_node.tasks import TASKS, Example, Task, TaskError, extract_answer, load_task
from swarm_node.tasks.answer import parse_number
from swarm_node.tasks.arith import ArithTask, is_test_problem
from swarm_node.tasks.deadline import call_with_deadline
from swarm_node.tasks.math500 import unwrap_math


def data_root() -> Path:
    env = os.environ.get("SWARM_NODE_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"


def real_data(subdir: str) -> Path:
    path = data_root() / subdir
    if not path.is_dir():
        pytest.skip(f"benchmark data not found at {path} (set SWARM_NODE_DATA to a dir with gsm8k/ and math500/)")
    return path


# --------------------------------------------------------------------------- fixtures

TOY_GSM8K = [
    {"question": "Natalia sold 48 clips and then 24. How many?", "answer": "48+24 = <<48+24=72>>72\n#### 72"},
    {"question": "What is owed?", "answer": "It is 1,000+200 = <<1000+200=1200>>1,200 dollars.\n#### $1,200"},
    {"question": "How much colder?", "answer": "5-10 = <<5-10=-5>>-5\n#### -5"},
]
TOY_MATH = [
    {"problem": "Compute 1/2.", "solution": "It is $\\boxed{\\frac{1}{2}}$.", "answer": "\\frac{1}{2}",
     "subject": "Algebra", "level": 1, "unique_id": "test/algebra/1.json"},
    {"problem": "What is 2+1?", "solution": "$\\boxed{3}$", "answer": "3",
     "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/2.json"},
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def toy_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_jsonl(root / "gsm8k" / "train.jsonl", TOY_GSM8K)
    write_jsonl(root / "math500" / "test.jsonl", TOY_MATH)
    return root


@pytest.fixture(scope="module")
def toy_gsm8k(toy_root) -> Task:
    return load_task("gsm8k", str(toy_root / "gsm8k"))


@pytest.fixture(scope="module")
def toy_math(toy_root) -> Task:
    return load_task("math500", str(toy_root / "math500" / "test.jsonl"), timeout_s=2)


@pytest.fixture(scope="module")
def arith() -> Task:
    return load_task("arith")


@pytest.fixture(scope="module")
def gsm8k() -> Task:
    return load_task("gsm8k", str(real_data("gsm8k")))


@pytest.fixture(scope="module")
def math500() -> Task:
    return load_task("math500", str(real_data("math500")))


# --------------------------------------------------------------------------- format rule


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("#### 72", "72"),
        ("Step 1: 48 + 24 = 72.\n#### 72\n", "72"),
        ("So the answer is #### 72", "72"),
        ("### Work\n48+24\n####72  \n\n \t", "72"),
        ("#### \\frac{1}{2}", "\\frac{1}{2}"),
        ("#### 72\r\n", "72"),
        ("72", None),  # no marker
        ("", None),
        ("#### 1\n#### 2", None),  # two markers
        ("#### 72 ####", None),
        ("##### 72", None),  # not a marker
        ("#### 72\nand then more", None),  # trailing text
        ("#### ", None),  # empty answer
        ("####\n72", None),  # answer not on the marker line
        ("#### \t \n", None),
        (None, None),
        (72, None),
    ],
)
def test_extract_answer(completion, answer):
    assert extract_answer(completion) == answer


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("72", 72), ("72.0", 72), ("72.", 72), (" 72 ", 72), ("1,200", 1200), ("$1,200", 1200),
        ("$ 1200.00", 1200), ("-5", -5), ("$-5", -5), ("-$5", -5), ("+5", 5), ("0.25", Fraction(1, 4)),
        (".5", Fraction(1, 2)), ("1,234,567", 1234567),
        ("72 dollars", None), ("72%", None), ("12,00", None), ("1.2e3", None), ("3/4", None), ("--5", None),
        ("-$-5", None), ("$", None), ("", None), ("72..", None), ("7 2", None), ("٧٢", None), ("9" * 100, None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("48+24=72\n#### 72", 1.0),
        ("#### 72.0", 1.0),
        ("#### 72.", 1.0),
        ("#### $72", 1.0),
        ("#### 72 clips", 0.0),
        ("#### 73", 0.0),
        ("The answer is 72.", 0.0),
        ("#### 72\n#### 72", 0.0),
        ("#### 72\nI hope this helps", 0.0),
        ("#### ", 0.0),
    ],
)
def test_gsm8k_reward_strictness(toy_gsm8k, completion, reward):
    ex = toy_gsm8k.example("train/0")
    assert ex.answer == "72"
    assert toy_gsm8k.reward(completion, ex) == reward


def test_gsm8k_commas_dollars_negatives(toy_gsm8k):
    big, neg = toy_gsm8k.example("train/1"), toy_gsm8k.example("train/2")
    assert big.answer == "1200" and neg.answer == "-5"
    for c in ("#### 1,200", "#### $1,200", "#### 1200", "#### 1200.00", "#### $1,200.00."):
        assert toy_gsm8k.reward(c, big) == 1.0, c
    for c in ("#### 12,00", "#### 1,200 dollars", "#### 1.2"):
        assert toy_gsm8k.reward(c, big) == 0.0, c
    for c in ("#### -5", "#### -5.0", "#### $-5", "#### -$5"):
        assert toy_gsm8k.reward(c, neg) == 1.0, c
    assert toy_gsm8k.reward("#### 5", neg) == 0.0


def test_toy_gsm8k_loading_and_reference(toy_gsm8k):
    assert [e.id for e in toy_gsm8k.split("train")] == ["train/0", "train/1", "train/2"]
    with pytest.raises(ValueError, match="not available"):
        toy_gsm8k.split("test")
    with pytest.raises(ValueError, match="unknown split"):
        toy_gsm8k.split("validation")
    ex = toy_gsm8k.example("train/1")
    ref = toy_gsm8k.reference_completion(ex)
    assert "<<" not in ref and ref.endswith("#### $1,200")
    assert toy_gsm8k.reward(ref, ex) == 1.0
    # An example the task does not hold still gets a valid (answer-only) reference.
    stranger = Example("train/999", "?", "41")
    assert toy_gsm8k.reward(toy_gsm8k.reference_completion(stranger), stranger) == 1.0


completions = st.one_of(
    st.text(max_size=200),
    st.lists(
        st.sampled_from(["####", "#", " ", "\n", "72", "-", "$", ",", ".", "5", "\\boxed{", "}", "\\frac{1}{2}",
                         "x", "=", "^", "{9}", "dollars", "\\(", "\\)", "3", "e"]),
        max_size=25,
    ).map("".join),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(completion=completions, example_id=st.text(max_size=30))
def test_never_raises_on_garbage(arith, toy_gsm8k, toy_math, completion, example_id):
    for task in (arith, toy_gsm8k, toy_math):
        found = task.example(example_id)
        assert found is None or found.id == example_id
        ex = task.split("test" if task.name != "gsm8k" else "train")[0]
        assert task.reward(completion, ex) in (0.0, 1.0)


def test_reward_tolerates_bad_arguments(arith, toy_gsm8k, toy_math):
    for task in (arith, toy_gsm8k, toy_math):
        ex = task.split("test" if task.name != "gsm8k" else "train")[0]
        assert task.reward(None, ex) == 0.0
        assert task.reward(b"#### 3", ex) == 0.0
        assert task.reward("#### 3", None) == 0.0
        assert task.reward("#### 3", "not an example") == 0.0


# --------------------------------------------------------------------------- arith


def test_arith_examples_and_prompt(arith):
    ex = arith.split("train")[0]
    m = re.fullmatch(r"What is (\d+) (plus|minus) (\d+)\?", ex.question)
    assert m, ex.question
    a, op, b = int(m[1]), m[2], int(m[3])
    assert int(ex.answer) == (a + b if op == "plus" else a - b)
    prompt = arith.prompt(ex)
    assert prompt == f"Q: {ex.question}\nA: " and len(prompt) <= 60
    assert arith.reference_completion(ex) == f"#### {ex.answer}"
    assert len(arith.split("train")) == 100_000 and len(arith.split("test")) == 500
    assert arith.split("test")[-1] == arith.split("test")[499]
    assert arith.split("train")[10:13] == [arith.example(f"train/{i}") for i in (10, 11, 12)]
    with pytest.raises(IndexError):
        arith.split("test")[500]
    with pytest.raises(ValueError):
        arith.split("validation")


def test_arith_determinism_across_instances():
    ids = [f"train/{i}" for i in (0, 1, 17, 99_999)] + [f"test/{i}" for i in (0, 123, 499)]
    first, second = ArithTask(), load_task("arith", seed=0)
    for example_id in ids:
        assert first.example(example_id) == second.example(example_id)
        assert first.example(example_id).id == example_id
    other_seed = ArithTask(seed=1)
    assert [other_seed.example(i) for i in ids] != [first.example(i) for i in ids]


def _problem(ex: Example) -> tuple[str, tuple[int, int]]:
    """(op, sorted operands): operand order does not make a different problem."""
    m = re.fullmatch(r"What is (\d+) (\w+) (\d+)\?", ex.question)
    return m[2], tuple(sorted((int(m[1]), int(m[3]))))


def test_arith_train_test_disjoint(arith):
    test = {_problem(ex) for ex in arith.split("test")}
    train_sample = [arith.split("train")[i] for i in range(0, 100_000, 25)]
    train = {_problem(ex) for ex in train_sample} | {_problem(ex) for ex in ArithTask(seed=7).split("train")[:2000]}
    assert len(test) > 100 and len(train) > 1000
    assert not test & train
    for ex in arith.split("test"):
        op, pair = _problem(ex)
        assert is_test_problem(op, *pair)


def test_arith_minus_never_negative(arith):
    for ex in arith.split("train")[:3000]:
        assert int(ex.answer) >= 0


def test_problem_keys_name_twins_alike(arith, toy_gsm8k):
    """The guard's reserve keeps a problem's twins together (train/reserve.py)."""
    key = lambda task, q: task.problem_key(Example("x", q, "0"))  # noqa: E731
    assert key(arith, "What is 3 plus 15?") == key(arith, "What is 15 plus 3?") != key(arith, "What is 3 plus 16?")
    assert key(arith, "What is 4 times 7?") == key(arith, "What is 7 times 4?")
    assert key(arith, "What is 15 minus 3?") != key(arith, "What is 3 minus 15?")
    assert key(toy_gsm8k, "How many  apples?\n") == key(toy_gsm8k, "how many apples?") != key(toy_gsm8k, "How many pears?")


def test_arith_reward(arith):
    for split in ("train", "test"):
        for ex in arith.split(split)[:200]:
            assert arith.reward(arith.reference_completion(ex), ex) == 1.0
            assert arith.reward(f"#### {int(ex.answer) + 1}", ex) == 0.0
            assert arith.reward(ex.answer, ex) == 0.0  # no marker


@pytest.mark.parametrize(
    "bad_id",
    ["train/-1", "test/99999999999", "train/100000", "test/500", "x", "", "train/", "/1", "train/01", "train/1 ",
     " train/1", "train/+1", "train/1.0", "train/١", "valid/1", "train/1/2", "train/" + "9" * 400, None, 3, b"train/1"],
)
def test_arith_example_rejects_garbage(arith, bad_id):
    assert arith.example(bad_id) is None


def test_arith_options():
    small = load_task("arith", digits=1, ops=("plus",), seed=3, train_size=10, test_size=4)
    assert len(small.split("train")) == 10 and small.example("test/3") is not None and small.example("test/4") is None
    for ex in small.split("train"):
        assert re.fullmatch(r"What is \d plus \d\?", ex.question)
    three = ArithTask(digits=3)
    assert any(int(n) >= 100 for ex in three.split("train")[:50] for n in re.findall(r"\d+", ex.question))
    with pytest.raises(ValueError):
        ArithTask(ops=("divide",))
    with pytest.raises(ValueError):
        ArithTask(digits=0)
    with pytest.raises(ValueError):
        ArithTask(test_size=0)
    with pytest.raises(TaskError, match="takes no data"):
        load_task("arith", "somewhere")


# --------------------------------------------------------------------------- loading


def test_load_task_errors(tmp_path):
    assert set(TASKS) == {"gsm8k", "math500", "arith"}
    with pytest.raises(TaskError, match="unknown task"):
        load_task("mnist")
    with pytest.raises(TaskError, match="no such|none of|holds none"):
        load_task("gsm8k", str(tmp_path / "missing"))
    with pytest.raises(TaskError, match="no such|none of|holds none"):
        load_task("gsm8k", "./nope/train.jsonl")
    with pytest.raises(TaskError, match="no such|none of|holds none"):
        load_task("gsm8k", str(tmp_path))  # a dir with no train/test.jsonl


def test_default_data_from_env(toy_root, monkeypatch):
    monkeypatch.setenv("SWARM_NODE_DATA", str(toy_root))
    assert len(load_task("gsm8k").split("train")) == len(TOY_GSM8K)
    assert len(load_task("math500").split("test")) == len(TOY_MATH)
    monkeypatch.setenv("SWARM_NODE_DATA", str(toy_root / "nothing"))
    with pytest.raises(TaskError, match="has no 'gsm8k' directory"):
        load_task("gsm8k")


# --------------------------------------------------------------------------- GSM8K (real data)


def test_gsm8k_all_gold_answers_and_references(gsm8k):
    train, test = gsm8k.split("train"), gsm8k.split("test")
    assert (len(train), len(test)) == (7473, 1319)
    failures = []
    for split, examples in (("train", train), ("test", test)):
        for index, ex in enumerate(examples):
            assert ex.id == f"{split}/{index}"
            assert re.fullmatch(r"-?[0-9]+", ex.answer), ex
            ref = gsm8k.reference_completion(ex)
            if "<<" in ref or gsm8k.reward(ref, ex) != 1.0:
                failures.append(ex.id)
    assert failures == []
    assert gsm8k.example("train/0").answer == "72"
    assert gsm8k.example("test/1318") == test[-1]
    assert gsm8k.example("train/7473") is None and gsm8k.example("test/-1") is None
    assert gsm8k.example("") is None and gsm8k.example(None) is None


def test_gsm8k_prompt(gsm8k):
    ex = gsm8k.example("train/0")
    assert gsm8k.prompt(ex) == (
        "Solve the math problem. Think step by step, then give the final answer on its own last line "
        f"as '#### <number>'.\n\nQuestion: {ex.question}\nAnswer: "
    )
    assert gsm8k.reference_completion(ex).startswith("Natalia sold 48/2 = 24 clips in May.")


# --------------------------------------------------------------------------- MATH-500 (real data)


def test_math500_gold_verifies_against_itself(math500):
    examples = math500.split("test")
    assert len(examples) == 500
    assert [e.id for e in examples[:2]] == ["test/0", "test/1"]
    passed = [ex.id for ex in examples if math500.reward(f"#### {ex.answer}", ex) == 1.0]
    print(f"\nMATH-500: math-verify accepts the gold answer against itself for {len(passed)}/500")
    assert len(passed) >= 495
    sample = examples[::10]
    assert sum(math500.reward(math500.reference_completion(ex), ex) for ex in sample) >= 0.99 * len(sample)


def test_math500_is_evaluation_only(math500):
    with pytest.raises(ValueError, match="math500 is evaluation-only"):
        math500.split("train")
    assert math500.example("train/0") is None and math500.example("test/500") is None
    assert math500.example("test/0").answer == "\\left( 3, \\frac{\\pi}{2} \\right)"


def test_math500_answer_forms(toy_math):
    half = toy_math.example("test/0")
    for c in ("#### \\frac{1}{2}", "#### $\\frac{1}{2}$", "#### \\boxed{\\frac12}", "#### $\\boxed{1/2}$",
              "#### 0.5", "#### \\(\\dfrac{1}{2}\\)", "Since 2x = 1,\n#### $$\\frac{1}{2}$$"):
        assert toy_math.reward(c, half) == 1.0, c
    for c in ("#### 1/3", "#### $\\frac{1}{2}$ dollars", "#### \\frac{1}{2}\nDone.", "\\boxed{\\frac{1}{2}}"):
        assert toy_math.reward(c, half) == 0.0, c
    assert unwrap_math("$\\boxed{3}$") == "3" and unwrap_math("$3$ or $4$") is None


def test_math500_reward_in_worker_thread(toy_math):
    ex = toy_math.example("test/1")
    results: list[float] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.extend(toy_math.reward(c, ex) for c in ("#### 3", "#### $\\boxed{3}$", "#### 4"))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive() and errors == []
    assert results == [1.0, 1.0, 0.0]


@pytest.mark.parametrize(
    "completion", ["#### 9^{9^{9}}", "#### 10^{10^{10}}", "#### (10^{100})!", "#### \\frac{1}{9^{9^{9}}}",
                   "#### (x+1)^{10^{9}}", "#### " + "1" * 600],
)
def test_math500_pathological_answers_are_cheap(toy_math, completion):
    ex = toy_math.example("test/1")
    out: list[float] = []
    worker = threading.Thread(target=lambda: out.append(toy_math.reward(completion, ex)), daemon=True)
    start = time.monotonic()
    worker.start()
    worker.join(timeout=30)
    assert out == [0.0] and time.monotonic() - start < 10


# --------------------------------------------------------------------------- deadline


def _spin(seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "done"


@pytest.mark.parametrize("on_thread", [False, True])
def test_call_with_deadline(on_thread):
    outcome: list[object] = []

    def run() -> None:
        start = time.monotonic()
        try:
            call_with_deadline(lambda: _spin(30), 0.2)
        except TimeoutError:
            outcome.append(time.monotonic() - start)
        outcome.append(call_with_deadline(lambda: "fast", 0.05))
        _spin(0.2)  # a cancelled deadline must not fire later
        outcome.append(call_with_deadline(lambda: _spin(0.01), None))

    if on_thread:
        worker = threading.Thread(target=run)
        worker.start()
        worker.join(timeout=30)
    else:
        run()
    assert len(outcome) == 3 and outcome[0] < 5 and outcome[1:] == ["fast", "done"]


# --------------------------------------------------------------------------- answers as Qwen2.5 writes them
# The decisions and their reasons are the table in swarm_node/tasks/answer.py's docstring.


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("#### 72 clips", 0.0),  # trailing words: "72 or 73" would pass too
        ("#### \\boxed{72}", 1.0),
        ("**#### 72**", 1.0),
        ("#### $72$", 1.0),
        ("#### 72.", 1.0),
        ("#### 72.00", 1.0),
        ("#### **72**", 1.0),
        ("**Answer: #### 72**", 1.0),  # bold opened before the marker, closed at the line's end
        ("#### $\\boxed{72}$", 1.0),
        ("#### \\(72\\)", 1.0),
        ("#### \\$72", 1.0),  # LaTeX-escaped currency sign, like "$72"
        ("#### $72$.", 1.0),
        ("Natalia sold 48 + 24 = 72 clips.\n**#### 72**\n", 1.0),
        ("#### \\boxed{73}", 0.0),
        ("**#### 73**", 0.0),
        ("#### 72 or 73", 0.0),
        ("#### $72$ or $73$", 0.0),
        ("#### \\boxed{72} clips", 0.0),
        ("#### $72$ dollars", 0.0),
        ("#### 72%", 0.0),
        ("**Answer:** #### 72**", 0.0),  # the bold before the marker is closed: "72**" is not a number
        ("#### 72**", 0.0),
        ("#### \\boxed{72}\nDone.", 0.0),  # the format rule is unchanged: nothing after the answer line
        ("**#### 72**\n#### 72", 0.0),
        ("#### \\boxed{\\boxed{72}}", 0.0),
    ],
)
def test_qwen_answer_forms(toy_gsm8k, arith, completion, reward):
    ex = toy_gsm8k.example("train/0")
    assert ex.answer == "72"
    assert toy_gsm8k.reward(completion, ex) == reward
    assert arith.reward(completion, Example("test/0", "What is 70 plus 2?", "72")) == reward


def test_thousands_forms(toy_gsm8k, arith):
    big = toy_gsm8k.example("train/1")
    for c in ("#### 1,200", "#### \\boxed{1,200}", "#### $1,200$", "**#### 1,200**", "#### \\$1,200.00"):
        assert toy_gsm8k.reward(c, big) == 1.0, c
    thousand = Example("test/0", "What is 999 plus 1?", "1000")
    for c in ("#### 1,000", "#### 1000.", "#### \\boxed{1000}"):
        assert arith.reward(c, thousand) == 1.0, c
    for c in ("#### 1,00", "#### 1.000,00", "#### \\boxed{1,000} apples"):
        assert arith.reward(c, thousand) == 0.0, c


@pytest.mark.parametrize(
    ("completion", "plain", "numeric"),
    [
        ("#### 72", True, True),
        ("#### 73", True, True),  # a wrong number is a wrong answer, not a format failure
        ("#### \\boxed{72}", True, True),
        ("**#### 72**", True, True),
        ("#### 72 clips", True, False),  # not a number: a format failure for numeric tasks
        ("#### \\frac{1}{2}", True, False),
        ("The answer is 72.", False, False),
        ("#### 72\n#### 72", False, False),
        ("#### 72\nI hope this helps", False, False),
        ("", False, False),
        (None, False, False),
    ],
)
def test_format_ok(completion, plain, numeric):
    from swarm_node.tasks.answer import format_ok

    assert format_ok(completion) is plain
    assert format_ok(completion, numeric=True) is numeric


def test_task_format_ok_follows_numeric_answers(toy_gsm8k, toy_math, monkeypatch):
    from swarm_node.tasks.gsm8k import GSM8KTask

    assert toy_math.numeric_answers is False and toy_math.format_ok("#### \\frac{1}{2}")
    monkeypatch.setattr(GSM8KTask, "numeric_answers", True)  # what gsm8k and arith declare
    assert toy_gsm8k.format_ok("#### 1,200") and not toy_gsm8k.format_ok("#### 1,200 dollars")
    assert not toy_gsm8k.format_ok("#### 72\nmore")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(completion=completions)
def test_reward_one_implies_format_ok(toy_gsm8k, completion):
    from swarm_node.tasks.answer import format_ok

    for ex in toy_gsm8k.split("train"):
        if toy_gsm8k.reward(completion, ex) == 1.0:
            assert format_ok(completion, numeric=True)


# --------------------------------------------------------------------------- prompts for chat models

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def chat_tokenizer(eos: str, name: str = "", template: str | None = CHATML):
    """A word-level fast tokenizer with a ChatML template (the shape of Qwen2.5's), built locally."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(specials)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=eos, unk_token="<unk>", chat_template=template)
    tok.name_or_path = name
    return tok


def test_render_prompt_with_a_chat_template(toy_gsm8k):
    from swarm_node.tasks.prompt import render_prompt, uses_chat_template

    ex = toy_gsm8k.example("train/0")
    plain = toy_gsm8k.prompt(ex)
    instruct = chat_tokenizer(eos="<|im_end|>")  # Qwen2.5-Instruct: the template's turn end is the EOS
    user_turn = f"<|im_start|>user\n{plain.rstrip()}<|im_end|>\n<|im_start|>assistant\n"
    assert uses_chat_template(instruct, "auto")
    assert render_prompt(toy_gsm8k, ex, instruct) == user_turn
    assert render_prompt(toy_gsm8k, ex, instruct, system="Be brief.") == (
        "<|im_start|>system\nBe brief.<|im_end|>\n" + user_turn)
    assert render_prompt(toy_gsm8k, ex, instruct, chat="off") == plain
    assert render_prompt(toy_gsm8k, ex, instruct, chat="off", system="Be brief.") == "Be brief.\n\n" + plain


def test_auto_keeps_base_models_plain(toy_gsm8k):
    """Qwen2.5 base checkpoints ship the ChatML template but stop on <|endoftext|>, which it never emits."""
    from swarm_node.tasks.prompt import render_prompt, uses_chat_template

    ex = toy_gsm8k.example("train/0")
    base = chat_tokenizer(eos="<|endoftext|>", name="Qwen/Qwen2.5-3B")
    assert not uses_chat_template(base, "auto")
    assert render_prompt(toy_gsm8k, ex, base) == toy_gsm8k.prompt(ex)
    assert render_prompt(toy_gsm8k, ex, base, chat="on").startswith("<|im_start|>user\n")
    named = chat_tokenizer(eos="<|endoftext|>", name="/models/Qwen2.5-3B-Instruct")
    assert uses_chat_template(named, "auto")  # the name says instruction-tuned
    mistral_like = chat_tokenizer(eos="</s>", template=CHATML.replace("'<|im_end|>\\n'", "eos_token"))
    assert uses_chat_template(mistral_like, "auto")  # the template ends turns with {{ eos_token }}


def test_render_prompt_without_a_chat_template(arith):
    from swarm_node.tasks.prompt import PromptError, render_prompt
    from swarm_node.train.presets import char_tokenizer

    ex = arith.split("test")[0]
    tok = char_tokenizer()
    assert not getattr(tok, "chat_template", None)
    assert render_prompt(arith, ex, tok) == arith.prompt(ex) == render_prompt(arith, ex, tok, chat="off")
    with pytest.raises(PromptError, match="has no chat template"):
        render_prompt(arith, ex, tok, chat="on")
    with pytest.raises(PromptError, match="must be one of"):
        render_prompt(arith, ex, tok, chat="yes")
