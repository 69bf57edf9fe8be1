"""The rollout worker: a sampler in a child process gives the in-process sampler's numbers, serves weight
pushes and requests in order, reports its death in one line, ignores the group's SIGTERM / SIGINT and
never outlives its parent. One worker serves the module's tests of numbers; each of them first pushes
the weights it compares against, so no test depends on another's."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from paths import REPO

from sppo_rl.llm.models.core import load_actor
from sppo_rl.llm.models.tiny import load_tokenizer
from sppo_rl.llm.rollout.base import Rollout, RolloutBatch, SamplingParams, pad_id_of
from sppo_rl.llm.rollout.hf import HFRollout
from sppo_rl.llm.rollout.worker import RolloutWorker, WorkerDied, replica_builder
from sppo_rl.runtime.run import RunError

pytestmark = pytest.mark.timeout(300)

PROMPTS = ["1+2=", "13*4=", "7-9=", "x"]
SEEDS = [11, 12, 13, 14]
SAMPLE = SamplingParams(n=4, max_new_tokens=24)


def assert_same(a: RolloutBatch, b: RolloutBatch) -> None:
    """Every tensor field equal (``torch.equal``: same shape, dtype and values), texts and counts too."""
    for f in fields(RolloutBatch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y), f.name
        else:
            assert x == y, f.name


def replica(tiny: Path, noise_seed: int | None = None) -> torch.nn.Module:
    """The tiny actor as the worker loads it (float32, eval, its parameters requiring grad as a trained
    actor's do); with ``noise_seed``, every parameter moved by Gaussian noise (std 0.3): weights a
    training step could have reached."""
    model = load_actor(tiny, dtype=torch.float32).eval()
    if noise_seed is not None:
        g = torch.Generator().manual_seed(noise_seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


def in_process(model: torch.nn.Module, tok, pad_id: int) -> HFRollout:
    return HFRollout(model, tok, add_special_tokens=False, pad_id=pad_id)


def push(worker: RolloutWorker, model: torch.nn.Module) -> None:
    worker.update_weights(model.state_dict().items())


@pytest.fixture(scope="module")
def one_thread():
    """Both sides sample with one torch thread (the worker is built with ``threads=1``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def setup(tiny, one_thread):
    """``(tokenizer, pad id, base replica, perturbed replica)`` of the tiny model."""
    tok = load_tokenizer(tiny)
    return tok, pad_id_of(tok), replica(tiny), replica(tiny, noise_seed=0)


@pytest.fixture(scope="module")
def worker(tiny, setup):
    tok, pad_id, _, _ = setup
    w = RolloutWorker(replica_builder(str(tiny), "float32", pad_id), tok, threads=1)
    yield w
    w.close()


def test_the_worker_samples_what_the_in_process_sampler_does(worker, setup):
    """Sampling (n=4, one seed per prompt) and greedy decoding give the in-process HFRollout's batch bit
    for bit, with the checkpoint's weights and after a push of other weights."""
    tok, pad_id, base, other = setup
    assert isinstance(worker, Rollout) and not worker.shares_actor and worker.tokenizer is tok
    for model in (base, other):
        push(worker, model)
        ref = in_process(model, tok, pad_id)
        for params in (SAMPLE, SAMPLE.as_greedy()):
            assert_same(worker.generate(PROMPTS, params, SEEDS), ref.generate(PROMPTS, params, SEEDS))
    worker.sleep(), worker.wake_up()  # no-ops


def test_a_push_serves_the_requests_after_it_not_those_before(worker, setup):
    """submit A, push new weights, submit B: A is sampled with the old weights, B with the new, whatever
    order their results are taken in; tickets carry the version. The push is a copy: the caller's
    tensors changed right after it (while the worker is still busy with A) do not reach the worker."""
    tok, pad_id, base, other = setup
    push(worker, base)
    old = in_process(base, tok, pad_id).generate(PROMPTS, SAMPLE, SEEDS)
    new = in_process(other, tok, pad_id).generate(PROMPTS, SAMPLE, SEEDS)
    assert not torch.equal(old.logprobs, new.logprobs)  # the two weight sets are told apart

    a = worker.submit(PROMPTS, SAMPLE, SEEDS)
    state = {k: v.clone() for k, v in other.state_dict().items()}
    worker.update_weights(state.items())
    for v in state.values():  # the caller trains its tensors in place at once
        v.add_(1.0)
    b = worker.submit(PROMPTS, SAMPLE, SEEDS)
    assert (a.version + 1, b.version) == (b.version, worker.version)

    assert_same(b.result(), new)  # B taken first
    assert a.done() and b.done()
    assert_same(a.result(), old)
    assert_same(a.result(), old)  # a result can be read again


def test_results_are_taken_in_any_order(worker, setup):
    tok, pad_id, base, _ = setup
    push(worker, base)
    ref = in_process(base, tok, pad_id)
    tickets = [worker.submit(PROMPTS[:k], SAMPLE, SEEDS[:k]) for k in (1, 2, 3)]
    for k, ticket in sorted(zip((1, 2, 3), tickets), key=lambda kt: -kt[0]):
        assert_same(ticket.result(), ref.generate(PROMPTS[:k], SAMPLE, SEEDS[:k]))


def test_an_error_in_generate_comes_back_and_the_worker_goes_on(worker, setup):
    """An empty prompt raises ValueError in the child's encode_prompts: result() raises it (same type, the
    child's message, its traceback as the cause) and the next request is served."""
    tok, pad_id, base, _ = setup
    push(worker, base)
    with pytest.raises(ValueError, match="every prompt must have at least one token") as err:
        worker.generate([""], SAMPLE)
    assert f"pid {worker.pid}" in str(err.value.__cause__) and "encode_prompts" in str(err.value.__cause__)
    ref = in_process(base, tok, pad_id).generate(PROMPTS, SAMPLE, SEEDS)
    assert_same(worker.generate(PROMPTS, SAMPLE, SEEDS), ref)


def test_a_refused_push_fails_later_requests_until_a_complete_push(worker, setup):
    tok, pad_id, base, _ = setup
    worker.update_weights([("no.such.weight", torch.zeros(2))])
    with pytest.raises(RunError, match=r"weight push \d+ was not loaded: KeyError: .*no.such.weight"):
        worker.generate(PROMPTS, SAMPLE, SEEDS)
    push(worker, base)
    assert_same(
        worker.generate(PROMPTS, SAMPLE, SEEDS),
        in_process(base, tok, pad_id).generate(PROMPTS, SAMPLE, SEEDS),
    )


def test_the_worker_ignores_sigterm_and_sigint(worker, setup):
    """SIGTERM and SIGINT sent to the child while a request is pending: the request completes (the parent
    decides about preemption and closes the worker; the child used to die of SIGTERM)."""
    tok, pad_id, base, _ = setup
    push(worker, base)
    ticket = worker.submit(PROMPTS, SAMPLE, SEEDS)
    os.kill(worker.pid, signal.SIGTERM)
    os.kill(worker.pid, signal.SIGINT)
    assert_same(ticket.result(), in_process(base, tok, pad_id).generate(PROMPTS, SAMPLE, SEEDS))
    assert worker.generate(PROMPTS[:1], SAMPLE.as_greedy()).batch_size == 1


def _reaped(pid: int) -> bool:
    """Whether ``pid`` no longer exists (not even as a zombie)."""
    return not Path(f"/proc/{pid}").exists()


class LoggingRollout(HFRollout):
    """An HFRollout that writes a line to ``log`` as each ``generate`` starts (what the child is doing,
    seen from the test without asking the worker)."""

    def __init__(self, log: str, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log = log

    def generate(self, prompts, params, seeds=None) -> RolloutBatch:
        with open(self.log, "a") as f:
            f.write(f"{len(prompts)}\n")
        return super().generate(prompts, params, seeds)


def logging_build(path: str, pad_id: int, log: str) -> Rollout:
    """A picklable ``build`` (the child imports this module) of a :class:`LoggingRollout` replica."""
    return LoggingRollout(
        log, replica(Path(path)), load_tokenizer(path), add_special_tokens=False, pad_id=pad_id
    )


def test_an_unread_answer_does_not_stall_the_worker_and_a_killed_one_raises_one_line(tiny, setup, tmp_path):
    """(1) A's answer (over 1 MB, more than the pipe holds) is not read yet: the child still starts B (it
    used to wait in its send until the parent read A). (2) SIGKILL while a request is in flight: result()
    raises WorkerDied naming the worker, its pid and the signal on one line; every later call raises it
    too; close() after that (twice) reaps the child."""
    tok, pad_id, base, _ = setup
    log = tmp_path / "log.txt"
    log.write_text("")
    build = functools.partial(logging_build, str(tiny), pad_id, str(log))
    w = RolloutWorker(build, tok, name="test sampler")
    assert w.version == 0
    a = w.submit(PROMPTS * 16, SamplingParams(n=8, max_new_tokens=64), SEEDS * 16)  # [512, 64] rows
    b = w.submit(PROMPTS[:1], SAMPLE, SEEDS[:1])
    deadline = time.monotonic() + 120
    while log.read_text().split() != ["64", "1"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log.read_text().split() == ["64", "1"], "B never started while A's answer waited"
    assert a.result().batch_size == 512
    assert_same(b.result(), in_process(base, tok, pad_id).generate(PROMPTS[:1], SAMPLE, SEEDS[:1]))

    ticket = w.submit(PROMPTS * 8, SamplingParams(n=4, max_new_tokens=256), SEEDS * 8)
    assert ticket.version == 0
    os.kill(w.pid, signal.SIGKILL)
    with pytest.raises(WorkerDied) as err:
        ticket.result()
    message = str(err.value)
    assert "\n" not in message and f"test sampler (pid {w.pid}) died" in message, message
    assert "killed by SIGKILL" in message, message
    with pytest.raises(WorkerDied, match="killed by SIGKILL"):
        w.submit(PROMPTS, SAMPLE)
    w.close()
    w.close()
    assert _reaped(w.pid)


def test_close_is_idempotent_and_reaps_the_child(tiny, setup):
    """close() serves what was submitted before it, stops the child (exit code 0, not killed), reaps it;
    a second close() does nothing and a later call raises WorkerDied."""
    tok, pad_id, base, _ = setup
    with RolloutWorker(replica_builder(str(tiny), "float32", pad_id), tok) as w:
        pid = w.pid
        ticket = w.submit(PROMPTS, SAMPLE, SEEDS)
    assert w._proc.exitcode == 0 and _reaped(pid)
    assert_same(ticket.result(), in_process(base, tok, pad_id).generate(PROMPTS, SAMPLE, SEEDS))
    w.close()
    with pytest.raises(WorkerDied, match="was closed"):
        w.generate(PROMPTS, SAMPLE)


def _children() -> set[int]:
    pids: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        pids |= {int(p) for p in (task / "children").read_text().split()}
    return pids


def test_a_build_that_fails_raises_its_message_and_leaves_no_process(tmp_path, setup):
    tok, pad_id, _, _ = setup
    before = _children()
    with pytest.raises(RunError, match=r"could not build its backend: .*no_model") as err:
        RolloutWorker(replica_builder(str(tmp_path / "no_model"), "float32", pad_id), tok)
    assert "\n" not in str(err.value)
    assert _children() <= before


def test_replica_builder_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="backend must be 'hf' or 'vllm', got 'tgi'"):
        replica_builder("x", "float32", 0, backend="tgi")


ORPHAN = """
import os, signal, sys
from sppo_rl.llm.models.tiny import load_tokenizer
from sppo_rl.llm.rollout.base import SamplingParams, pad_id_of
from sppo_rl.llm.rollout.worker import RolloutWorker, replica_builder

if __name__ == "__main__":
    tok = load_tokenizer(sys.argv[1])
    worker = RolloutWorker(replica_builder(sys.argv[1], "float32", pad_id_of(tok)), tok)
    worker.generate(["1+2="], SamplingParams(max_new_tokens=4))
    print(worker.pid, flush=True)  # the child now waits for the next message
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    worker.submit(["1+2="], SamplingParams(max_new_tokens=4))  # and the script ends without close()
"""


def _gone(pid: int) -> bool:
    """Whether ``pid`` runs no more (gone, or a zombie its new parent has not reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


@pytest.mark.parametrize("end", ["kill", pytest.param("exit", marks=pytest.mark.slow)])  # ~10 s each
def test_the_worker_ends_with_its_parent(tmp_path, tiny, end):
    """``kill``: a parent SIGKILLed (no handler, no atexit) while its worker waits for work: the worker
    exits too (it would wait forever). ``exit``: a script that ends without close() exits at once and
    takes its worker with it (multiprocessing's exit hook used to wait forever on the child, which
    ignores the SIGTERM it sends)."""
    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with open(tmp_path / "stderr.txt", "w") as err:  # a killed parent's resource tracker warns
        proc = subprocess.Popen(
            [sys.executable, str(script), str(tiny), end],
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )  # not run(): an orphan holding the pipe would keep it waiting
        assert proc.stdout is not None
        line = proc.stdout.readline()
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = None
    pid = int(line)
    deadline = time.monotonic() + 30
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not _gone(pid):
        os.kill(pid, signal.SIGKILL)  # leave nothing behind
    assert code == {"kill": -signal.SIGKILL, "exit": 0}[end], (tmp_path / "stderr.txt").read_text()[-2000:]
    assert _gone(pid), f"the worker {pid} outlived its parent"


VLLM_SETTINGS = dict(hidden_size=64, layers=2, heads=2, kv_heads=1, seed=0, max_position_embeddings=512)


@pytest.mark.slow
def test_a_vllm_worker_samples_its_trainers_logprobs_before_and_after_a_push(tmp_path):
    """vLLM in the child (``replica_builder(backend="vllm")``; runs where vLLM is installed, e.g.
    ``.venv-vllm``): its log-probs are the trainer's recomputation on the checkpoint, and on other weights
    once they are pushed."""
    pytest.importorskip("vllm")
    from sppo_rl.llm.models.tiny import TINY_CHARSET, ensure_tiny_model
    from sppo_rl.llm.rollout.base import logprob_agreement

    path = ensure_tiny_model(tmp_path, TINY_CHARSET, **VLLM_SETTINGS)
    tok = load_tokenizer(path)
    engine = dict(
        dtype="float32", kv_cache_memory_bytes=64 * 2**20, max_num_seqs=64, add_special_tokens=False
    )
    build = replica_builder(str(path), "float32", pad_id_of(tok), backend="vllm", vllm_kwargs=engine)
    with RolloutWorker(build, tok, name="vllm worker") as w:
        params = SamplingParams(n=2, max_new_tokens=16)
        base, other = replica(path), replica(path, noise_seed=1)
        assert logprob_agreement(w, base, PROMPTS, params) < 1e-4
        push(w, other)
        assert logprob_agreement(w, other, PROMPTS, params) < 1e-4
        assert logprob_agreement(w, base, PROMPTS, params) > 1e-2  # the push took


def test_the_resource_sharers_reset_connection_is_not_printed(capsys):
    """A child killed before it took a push's file descriptor makes multiprocessing's resource-sharer
    thread report ConnectionResetError through ``sys.excepthook``: the worker's hook drops that one (the
    death is said once, by WorkerDied) and prints any other error as before."""
    import sys

    from sppo_rl.llm.rollout.worker import _quiet_resource_sharer

    hook = _quiet_resource_sharer(sys.__excepthook__)

    def raised(code: str, filename: str) -> tuple:
        try:
            exec(compile(code, filename, "exec"), {})
        except BaseException:
            return sys.exc_info()
        raise AssertionError("nothing raised")

    hook(
        *raised(
            "raise ConnectionResetError(104, 'Connection reset by peer')",
            "/x/multiprocessing/resource_sharer.py",
        )
    )
    assert capsys.readouterr().err == ""
    hook(*raised("raise ConnectionResetError(104, 'Connection reset by peer')", "/x/elsewhere.py"))
    hook(*raised("raise ValueError('other')", "/x/multiprocessing/resource_sharer.py"))
    err = capsys.readouterr().err
    assert "ConnectionResetError" in err and "ValueError: other" in err
