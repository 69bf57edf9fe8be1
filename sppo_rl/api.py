"""The Python API: train a policy in one call, use it, save it, load it.

``train_control(task, algo, **settings) -> Policy`` and ``train_llm(examples, reward, algo, **settings)
-> LLMPolicy`` run the same trainers as ``sppo-rl control`` and ``sppo-rl llm``; every keyword is a field
of :class:`~sppo_rl.control.config.ControlConfig` / :class:`~sppo_rl.llm.config.LLMConfig` (the flags of
``sppo-rl control --help`` / ``sppo-rl llm --help``, with ``_`` for ``-``). The run folder is
``out_dir`` (default: a new ``runs/api/control-<task>-<algo>-<time>`` / ``llm-...``), holding everything a command-line run
keeps; ``policy.run_dir`` and ``policy.summary`` point at it. Everything is importable from ``sppo_rl``
(lazily: ``import sppo_rl`` loads neither torch nor transformers).

A control policy, trained on a built-in task; ``predict`` takes the task's observation (numpy, one or a
batch) and returns ``(action(s), state)`` as SB3's does (``deterministic=True``: greedy); ``save`` / ``Policy.load`` use the project's actor
file (``final.pt`` of a run; loaded with ``torch.load(weights_only=True)``, so a file runs no code):

```python
import gymnasium as gym
from sppo_rl import Policy, train_control
policy = train_control("short-cartpole", algo="sppo", total_episodes=128, init_from="none")
obs, _ = gym.make("sppo_rl/ShortCartPole-v0").reset(seed=0)
policy.save("policy.pt"); print(Policy.load("policy.pt").predict(obs, deterministic=True)[0], policy.summary["tail_success_rate"])
```

Your own task: any Gymnasium env (an id, or a function returning a new env) with a success test
``success(obs, info, terminated, truncated) -> bool`` called on the episode's last step, and a horizon
(:mod:`sppo_rl.envs.custom`). A stock Gymnasium id needs no registration (``train_control("MountainCar-v0")``,
``sppo-rl control --task MountainCar-v0``): it is judged by the env's own success (:mod:`sppo_rl.envs.stock`:
CartPole survived, MountainCar and Acrobot reached the goal, LunarLander landed, ...); any other id (also
``module:Id``) needs ``success=`` (a function, or ``"survived"``, ``"terminated"``, ``"return:X"``).
The policy's observation is the env's plus the time left ``(H - t) / H`` as the last feature:

```python
from sppo_rl import register_custom_task, train_control
def upright(obs, info, terminated, truncated): return not terminated and abs(obs[2]) < 0.05
register_custom_task("cartpole-upright", "CartPole-v1", success=upright, horizon=20)
policy = train_control("cartpole-upright", algo="grpo", total_episodes=64, init_from="none")
print(policy.summary["tail_success_rate"], policy.predict([[0.0, 0.0, 0.01, 0.0, 1.0]] * 3, deterministic=True)[0])
```

An LLM, on in-memory ``(prompt, answer)`` pairs (written to a JSONL file in the run folder), with a
reward ``f(response, truth) -> score in [0, 1]``. ``model_dir`` is any local Hugging Face causal-LM
folder (the tests use a tiny one); ``generate`` decodes greedily by default; ``save_pretrained`` /
``LLMPolicy.load`` use the exported ``final/actor`` folder (``transformers`` loads it too):

```python
from sppo_rl import LLMPolicy, train_llm
from sppo_rl.llm.rewards.verify import verify_integer  # any module-level f(response, truth) -> score in [0, 1]
examples = [(f"{a}+{b}=", str(a + b)) for a in range(10) for b in range(10)]
policy = train_llm(examples, reward=verify_integer, algo="grpo", model=model_dir, updates=1, prompts_per_step=4)
policy.save_pretrained("tiny-grpo"); print(LLMPolicy.load("tiny-grpo").generate(["2+3="]), policy.run_dir)
```

**The reward runs in a worker process** (:class:`~sppo_rl.llm.rewards.scorer.RewardScorer`: a reward that
raises, hangs or crashes scores 0 and the run goes on), which imports it by name, so it must be a
function defined at the top level of a module (``reward=mymodule.score`` becomes
``"mymodule:score"``), or a ``"module:function"`` / ``"path/to/file.py:function"`` string, or
``"math"`` / ``"integer"``. A lambda, a function defined inside another function, a method or a
function typed into a notebook cannot be imported there and is refused with a message saying so: put it
in a ``.py`` file and import it. (A function of the main script is loaded from the script's file, whose
work must then sit under ``if __name__ == "__main__":``, as for any spawned process.)

As in Stable-Baselines3: ``predict(obs, state, episode_start, deterministic)`` returns ``(action, state)``
and also takes the env's own observation (``policy.wrap(env)`` appends the time left and restarts it on
``env.reset()``, so SB3's plain loops run as they are; unwrapped, mark each episode's first observation
with ``episode_start=True`` and the others ``False``),
:func:`evaluate_policy` returns the mean and std of the return (and the success rate), a ``callback``
sees each update's metrics row and stops the run by returning ``False``, and ``lr_schedule`` anneals
the learning rates (``"linear"`` as CleanRL, ``"cosine"`` after ``warmup_updates`` as TRL/verl):

```python
import gymnasium as gym; from sppo_rl import evaluate_policy, train_control
policy = train_control("CartPole-v1", algo="ppo", total_episodes=32, init_from="none", lr_schedule="linear",
                       callback=lambda row: row["episode_length"] < 400)  # returning False stops the run
obs, _ = (env := gym.make("CartPole-v1")).reset(seed=0); mean, std = evaluate_policy(policy, env, 5, seed=0)
print(policy.predict(obs, episode_start=True, deterministic=True)[0], round(mean, 1))  # the env's own 4 features
```
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sppo_rl.config import flat_keys, from_flat, unknown_keys

__all__ = [
    "Evaluation",
    "LLMPolicy",
    "Policy",
    "evaluate_policy",
    "reward_spec",
    "train_control",
    "train_llm",
]


# ------------------------------------------------------------------------------------- shared


def _new_run_dir(kind: str, task: str, algo: str) -> Path:
    """``runs/api/<kind>-<task>-<algo>-<time>`` in the working folder, made unique."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{kind}-{Path(task).stem if kind == 'llm' else task}-{algo}")
    base = Path("runs") / "api" / f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}"
    out, i = base, 1
    while out.exists():
        i += 1
        out = base.with_name(f"{base.name}-{i}")
    return out


def _config(cls: type, caller: str, fields: dict[str, Any]) -> Any:
    """``cls`` from settings named by their flag (``lora_rank=8`` for ``--lora-rank 8``: the flat keys of
    :func:`sppo_rl.config.flat_keys`), refusing unknown ones in one line; lists become tuples
    (``hidden_sizes``)."""
    unknown = unknown_keys(cls, fields)
    if unknown:
        raise TypeError(
            f"{caller}: unknown setting(s) {', '.join(unknown)}; the settings are the flags of "
            f"{cls.__name__} with underscores (valid: {', '.join(sorted(flat_keys(cls)))})"
        )
    return from_flat(cls, {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


# ------------------------------------------------------------------------------------- control


class Policy:
    """A trained control policy: :meth:`predict` actions from observations; :meth:`save` / :meth:`load`.

    Attributes:
        actor: the :class:`~sppo_rl.control.networks.Actor` (a torch module, observation normaliser inside).
        run_dir: the run folder it came from (None when loaded from a lone file).
        summary: the run's summary (``tail_success_rate``, ``episodes``, ...; empty if unknown).
        meta: what the actor file stores beside the weights (``summary``, ``config``).
    """

    def __init__(
        self,
        actor: Any,
        run_dir: str | Path | None = None,
        summary: dict[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        from sppo_rl.runtime.logging import summary_now

        self.actor = actor.eval()
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.meta = dict(meta or {})
        self.summary = dict(summary_now(summary if summary is not None else self.meta.get("summary") or {}))
        self._t: np.ndarray | None = None  # predict's step counter, one per batch row

    @property
    def task(self) -> str | None:
        """The task it was trained on (from the file's config), if known."""
        return (self.meta.get("config") or {}).get("task")

    @property
    def obs_dim(self) -> int:
        return int(self.actor.obs_dim)

    @property
    def discrete(self) -> bool:
        return bool(self.actor.discrete)

    @property
    def horizon(self) -> int | None:
        """The task's horizon ``H`` (from the file, else from the task table; None if unknown)."""
        H = (self.meta.get("observation") or {}).get("horizon")
        if H is None and self.task is not None:
            try:
                from sppo_rl.envs.tasks import get_task

                H = get_task(self.task).horizon
            except (ValueError, TypeError):
                H = None
        return int(H) if H is not None else None

    @property
    def _time_only(self) -> bool:
        """Whether the only feature the task appends to the env's observation is the time left."""
        appended = (self.meta.get("observation") or {}).get("appended")
        if appended is None and self.task is not None:
            try:
                from sppo_rl.envs.tasks import get_task

                appended = get_task(self.task).appended
            except (ValueError, TypeError):
                appended = None
        return appended == "(H - t) / H"

    def reset(self) -> None:
        """Forget the step counter of :meth:`predict` (the next call starts a new episode, as with
        ``episode_start=True``)."""
        self._t = None

    def wrap(self, env: Any) -> Any:
        """``env`` (a Gymnasium env or id) as the policy reads it: its own observation with the time left
        ``(H - t) / H`` appended, counted from each ``reset`` and truncated at ``H``
        (:class:`~sppo_rl.envs.core.TimeLeftObservation`), for SB3's plain ``predict`` loops; only for a
        task that appends nothing but the time left (every Gymnasium id, the classic-control tasks)."""
        import gymnasium as gym

        from sppo_rl.envs.core import TimeLeftObservation

        if isinstance(env, str):
            env = gym.make(env)
        if not self._time_only or self.horizon is None:
            raise ValueError(
                f"{self.task}: its observation is not the env's own plus the time left; make the task's env "
                "(sppo_rl.envs.tasks.make_episode_env) instead"
            )
        return TimeLeftObservation(env, self.horizon)

    def predict(
        self,
        obs: Any,
        state: Any = None,
        episode_start: Any = None,
        deterministic: bool = False,
        *,
        seed: int | None = None,
        greedy: bool | None = None,
    ) -> tuple[np.ndarray, Any]:
        """``(action, state)`` for ``obs`` (``[obs_dim]``) or ``(actions, state)`` for a batch
        (``[..., obs_dim]``), as Stable-Baselines3's ``predict``: ``state`` is returned as given (the
        policy has no recurrent state), ``deterministic=True`` the greedy action, else one sampled
        (``seed`` makes it reproducible); ``greedy=`` is the older name of ``deterministic``.

        ``obs`` is either the task env's observation (``obs_dim`` features, the last the time left
        ``(H - t) / H``; a :meth:`wrap`-ped env gives it), used as is, or the base Gymnasium env's own
        (``obs_dim - 1``, for tasks that append only the time left: every Gymnasium id and the
        classic-control tasks). For the latter the policy counts the steps itself and needs
        ``episode_start`` (a bool, or one per row, as SB3's recurrent policies and ``evaluate_policy``
        pass it: True on the first observation of each episode) with every call: ``t`` is the number of
        calls since the row's episode began; without ``episode_start`` the call is refused at once
        (the policy cannot see where an episode ends; wrap the env instead). A call at ``t >= H`` is
        refused too.

        Discrete tasks: int64 action(s) (a 0-d array for one observation); continuous: float32
        ``[..., action_dim]``, the Gaussian's mean when deterministic (unclipped: the env clips, as in
        training).
        """
        import torch

        if greedy is not None:
            deterministic = greedy
        x = np.asarray(obs, dtype=np.float32)
        counted = x.ndim > 0 and x.shape[-1] == self.obs_dim - 1 and self._time_only
        if x.ndim == 0 or (x.shape[-1] != self.obs_dim and not counted):
            own = (
                f" or the env's own {self.obs_dim - 1} (the policy adds the time left)"
                if self._time_only
                else ""
            )
            raise ValueError(
                f"observation of shape {x.shape}; the policy takes the task's {self.obs_dim} features (the "
                f"last is the time left (H - t) / H){own}"
            )
        lead = x.shape[:-1]
        rows = x.reshape(-1, x.shape[-1])
        if counted:
            H = self.horizon
            if H is None:
                raise ValueError(
                    "this policy's file does not say its horizon H: pass the task's observation (with the "
                    "time left (H - t) / H as the last feature)"
                )
            if episode_start is None:
                raise ValueError(
                    f"the env's own {self.obs_dim - 1} features without episode_start: the policy adds the "
                    "time left (H - t) / H and cannot tell where an episode begins; wrap the env "
                    "(env = policy.wrap(env): it appends the time left and resets it on env.reset()), or pass "
                    "episode_start=True with each episode's first observation and False after"
                )
            n = rows.shape[0]
            t = getattr(self, "_t", None)
            if t is None or t.shape != (n,):
                t = np.zeros(n, dtype=np.int64)
            t[np.broadcast_to(np.asarray(episode_start, dtype=bool).reshape(-1), (n,))] = 0
            if (t >= H).any():
                raise ValueError(
                    f"step {int(t.max()) + 1} of an episode of horizon {H}: pass episode_start=True with "
                    "the first observation of each episode (or wrap the env: policy.wrap(env))"
                )
            rows = np.concatenate([rows, ((H - t) / H).astype(np.float32)[:, None]], axis=1)
            self._t = t + 1
        batch = torch.from_numpy(np.ascontiguousarray(rows))
        # greedy acting draws nothing that matters; a private generator leaves torch's global RNG alone
        gen = torch.Generator().manual_seed(int(seed or 0)) if seed is not None or deterministic else None
        flags = torch.full((batch.shape[0],), bool(deterministic)) if deterministic else None
        with torch.no_grad():
            actions, _ = self.actor.act(batch, flags, gen)
        out = actions.numpy()
        return (out.reshape(lead) if self.discrete else out.reshape(*lead, -1)), state

    def save(self, path: str | Path) -> Path:
        """Write the actor file (the format of a run's ``final.pt``) to ``path``; returns the path."""
        from sppo_rl.control.actor_files import save_actor_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_actor_file(path, self.actor, {**self.meta, "summary": self.summary})
        return path

    @classmethod
    def load(cls, path: str | Path) -> Policy:
        """A policy from an actor file (``final.pt``, a warm start, one written by :meth:`save`) or a run
        folder (its ``final.pt``). Read with the project's ``torch_load`` (``weights_only=True``)."""
        from sppo_rl.control.actor_files import load_actor_file
        from sppo_rl.runtime.checkpoint import torch_load

        path = Path(path)
        run_dir = None
        if path.is_dir():
            run_dir, path = path, path / "final.pt"
            if not path.is_file():
                raise FileNotFoundError(f"{run_dir}: no final.pt (is it a finished control run folder?)")
        elif path.name == "final.pt" and (path.parent / "config.json").is_file():
            run_dir = path.parent
        actor = load_actor_file(path)
        meta = torch_load(path).get("meta") or {}
        summary = None
        if run_dir is not None and (run_dir / "summary.json").is_file():
            summary = json.loads((run_dir / "summary.json").read_text())
        return cls(actor, run_dir, summary, meta)

    def __repr__(self) -> str:
        kind = "discrete" if self.discrete else "continuous"
        return f"Policy(task={self.task!r}, obs_dim={self.obs_dim}, {kind}, run_dir={self.run_dir})"


def train_control(
    task: str = "precision-cartpole",
    algo: str = "sppo",
    *,
    success: str | Callable[..., Any] | None = None,
    callback: Callable[[dict[str, Any]], Any] | None = None,
    **settings: Any,
) -> Policy | list[Policy]:
    """Train ``algo`` on control task ``task`` and return the final :class:`Policy` (with ``seeds``, e.g.
    ``seeds="0-15"``: the seeds' runs in one process, and their policies in the order given).

    ``task``: a built-in task (``sppo-rl info``), a name added with
    :func:`~sppo_rl.envs.custom.register_custom_task`, or a Gymnasium id (``Id`` or ``module:Id``) with a
    ``max_episode_steps``, judged by its shipped success test (:mod:`sppo_rl.envs.stock`) or by
    ``success``: a function ``f(obs, info, terminated, truncated) -> bool`` or a ``--success`` name
    (``"survived"``, ``"terminated"``, ``"return:X"``, ``"module:function"``). ``callback(row)`` is called
    with each update's metrics row; returning ``False`` stops the run there (the summary says
    ``stopped_by_callback``). ``settings``: fields of :class:`~sppo_rl.control.config.ControlConfig`
    (``total_episodes``, ``seed``, ``init_from``, ``lr_schedule``, ``out_dir``, ``resume``, ...). Errors are
    the command line's, one line each (``RunError``, ``ValueError``).
    """
    from sppo_rl.control.config import ControlConfig
    from sppo_rl.control.trainer import run_control
    from sppo_rl.envs.stock import predicate_name

    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be a function of the metrics row, got {callback!r}")
    if success is not None:
        settings["success"] = success if isinstance(success, str) else predicate_name(success)
    settings.setdefault("out_dir", str(_new_run_dir("control", task, algo)))
    cfg = _config(ControlConfig, "train_control", {"task": task, "algo": algo, **settings})
    summary = run_control(cfg, callback=callback)
    if cfg.seeds is not None:  # each seed's run in <out_dir>/seed<K>
        policies = [
            Policy.load(Path(cfg.out_dir) / f"seed{s['seed']}" / "final.pt")
            for s in summary["seed_summaries"]
        ]
        for policy, s in zip(policies, summary["seed_summaries"]):
            policy.summary = dict(s)
        return policies
    policy = Policy.load(Path(cfg.out_dir) / "final.pt")
    policy.summary = dict(summary)
    return policy


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate_policy` measured; ``mean, std = evaluate_policy(...)`` unpacks like SB3's.

    ``returns``: each episode's return of the env's own reward; ``std_return`` the population std
    (``numpy.std``, as SB3); ``success_rate``: the mean of ``successes`` (None where the env's
    success cannot be judged: see :func:`evaluate_policy`)."""

    mean_return: float
    std_return: float
    success_rate: float | None
    mean_length: float
    returns: tuple[float, ...]
    lengths: tuple[int, ...]
    successes: tuple[bool, ...] | None

    def __iter__(self):
        return iter((self.mean_return, self.std_return))


def evaluate_policy(
    policy: Policy,
    env: Any,
    n_eval_episodes: int = 10,
    deterministic: bool = True,
    seed: int | None = None,
) -> Evaluation:
    """Run ``n_eval_episodes`` episodes of ``policy`` on ``env`` (SB3's ``evaluate_policy``).

    ``env``: a Gymnasium env or an id (``gymnasium.make``; a built-in task's short name makes its task
    env). It may be the task env (the policy reads its time-left feature) or the plain base env (the
    policy counts the steps, :meth:`Policy.predict`). Episode ``i`` resets with ``seed + i`` (unseeded
    when ``seed`` is None) and ends when the env terminates or truncates. ``deterministic``: the
    greedy action, else sampled. Success: the env's ``info["success"]`` on the last step (the task
    envs), else the policy's ``--success`` test or the stock test of ``env``'s id
    (:mod:`sppo_rl.envs.stock`) on the last step; None if neither applies.
    """
    import gymnasium as gym

    from sppo_rl.envs.stock import stock_success, success_rule

    if isinstance(n_eval_episodes, bool) or not isinstance(n_eval_episodes, int) or n_eval_episodes < 1:
        raise ValueError(f"n_eval_episodes must be an integer >= 1, got {n_eval_episodes!r}")
    if isinstance(env, str):
        from sppo_rl.envs.tasks import TASKS

        env = gym.make(TASKS[env].env_id if env in TASKS else env)
    test = None
    own = (policy.meta.get("config") or {}).get("success")
    if own:
        try:
            test = success_rule(own)[0]
        except ValueError:
            test = None
    if test is None and getattr(env, "spec", None) is not None:
        found = stock_success(env.spec.id)
        test = found[0] if found else None
    returns, lengths, successes = [], [], []
    for i in range(n_eval_episodes):
        obs, info = env.reset(seed=None if seed is None else seed + i)
        total, steps, start, success = 0.0, 0, True, None
        while True:
            action, _ = policy.predict(obs, episode_start=start, deterministic=deterministic)
            start = False
            action = int(action) if policy.discrete else np.asarray(action, dtype=np.float32)
            obs, reward, terminated, truncated, info = env.step(action)
            total += float(reward)
            steps += 1
            if terminated or truncated:
                break
        if "success" in info:
            success = bool(info["success"])
        elif test is not None:
            success = bool(
                test(obs, {**info, "base_reward": float(reward), "base_return": total}, terminated, truncated)
            )
        returns.append(total)
        lengths.append(steps)
        successes.append(success)
    judged = None if any(s is None for s in successes) else tuple(bool(s) for s in successes)
    return Evaluation(
        mean_return=float(np.mean(returns)),
        std_return=float(np.std(returns)),
        success_rate=float(np.mean(judged)) if judged is not None else None,
        mean_length=float(np.mean(lengths)),
        returns=tuple(returns),
        lengths=tuple(lengths),
        successes=judged,
    )


# ------------------------------------------------------------------------------------- LLM


def reward_spec(reward: str | Callable[[str, str], Any] | None) -> str:
    """The ``--reward-fn`` string for ``reward``: None -> ``"auto"``; a string as is; a module-level
    function -> ``"module:function"`` (``"path/to/script.py:function"`` for one of the main script).
    Anything the reward worker process could not import by name is refused with a ``ValueError`` saying
    why (see the module docstring)."""
    if reward is None:
        return "auto"
    if isinstance(reward, str):
        return reward
    if not callable(reward):
        raise TypeError(
            f"reward must be a function f(response, truth) -> float, a string or None, got {reward!r}"
        )
    why = (
        "rewards are scored in a separate worker process (so that one that raises, hangs or crashes cannot "
        "stop training), which imports the function by name"
    )
    fix = "define it at the top level of a .py module and import it from there, or pass 'path/to/file.py:function'"
    name = getattr(reward, "__qualname__", None)
    module = getattr(reward, "__module__", None)
    if not isinstance(name, str) or not isinstance(module, str):
        raise ValueError(f"reward {reward!r} has no importable name: {why}; {fix}")
    if name == "<lambda>" or "<locals>" in name or "<lambda>" in name:
        what = "a lambda" if "<lambda>" in name else "a function defined inside another function"
        raise ValueError(f"reward {name} is {what}, which cannot be imported by name: {why}; {fix}")
    if not name.isidentifier():
        raise ValueError(f"reward {module}.{name} is not a top-level function (a method?): {why}; {fix}")
    if module == "__main__":
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        if not main_file or not str(main_file).endswith(".py"):
            raise ValueError(
                f"reward {name} was defined in a notebook or the interactive interpreter, where another "
                f"process cannot import it: {why}; {fix}"
            )
        return f"{Path(main_file).resolve()}:{name}"
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        found = None
    if found is not reward:
        raise ValueError(f"reward {module}.{name} is not importable as {module}:{name}: {why}; {fix}")
    return f"{module}:{name}"


def _records(examples: Iterable[Any], what: str) -> str:
    """JSONL text of ``(prompt, answer)`` pairs (or records the loader reads, e.g. ``{"question", "answer"}``)."""
    lines = []
    for i, ex in enumerate(examples):
        if isinstance(ex, dict):
            rec = ex
        elif isinstance(ex, (tuple, list)) and len(ex) == 2:
            rec = {"prompt": ex[0], "answer": ex[1]}
        else:
            raise TypeError(f"{what} {i}: expected a (prompt, answer) pair or a dict, got {ex!r:.80}")
        try:
            lines.append(json.dumps(rec, ensure_ascii=False))
        except (TypeError, ValueError) as e:
            raise TypeError(f"{what} {i}: not JSON data ({e})") from None
    if not lines:
        raise ValueError(f"{what}: no examples")
    return "\n".join(lines) + "\n"


def _data_path(out: Path, stem: str, text: str) -> Path:
    """``out/<stem>-<hash>.jsonl``: named by its content, so a run resumed with other examples is refused
    by the trainer, as any change of ``--task`` is."""
    return out / f"{stem}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.jsonl"


def _write_data(path: Path, text: str) -> None:
    if not (path.is_file() and path.read_text(encoding="utf-8") == text):
        from sppo_rl.runtime.files import atomic_write_text

        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)


class LLMPolicy:
    """A trained causal LM (a Hugging Face folder with its tokenizer): :meth:`generate` responses.

    Attributes:
        folder: the model folder (a run's ``final/actor``).
        run_dir: the run folder it came from (None for a lone model folder).
        summary: the run's summary (``final_val_accuracy``, ``updates``, ...; empty if unknown).
        prompt_format: how the run turned a prompt into the model's text (``--chat-template``,
            ``--system-prompt``, ``--instruction``: :class:`~sppo_rl.llm.data.prompts.PromptFormat`); read from
            the folder's ``prompt_format.json``, else the run's ``config.json``, else the defaults.
    """

    def __init__(
        self,
        folder: str | Path,
        run_dir: str | Path | None = None,
        summary: dict[str, Any] | None = None,
        *,
        max_new_tokens: int | None = None,
        device: str = "auto",
        prompt_format: Any = None,
    ) -> None:
        from sppo_rl.llm.data.prompts import load_format
        from sppo_rl.runtime.logging import summary_now

        self.folder = Path(folder)
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.summary = dict(summary_now(summary or {}))
        self.max_new_tokens = max_new_tokens
        self.device = device
        self.prompt_format = prompt_format if prompt_format is not None else load_format(folder, run_dir)
        self._engine: Any = None

    def _load(self) -> Any:
        if self._engine is None:
            import torch

            from sppo_rl.llm.models.core import load_actor
            from sppo_rl.llm.models.tiny import load_tokenizer
            from sppo_rl.llm.rollout.hf import HFRollout

            device = self.device
            if device == "auto":
                device = "cuda" if torch.cuda.is_available() else "cpu"
            tokenizer = load_tokenizer(self.folder)
            model = load_actor(self.folder, device=device).eval().requires_grad_(False)
            self._engine = HFRollout(model, tokenizer, add_special_tokens=False)
        return self._engine

    def render(self, prompts: Sequence[Any] | str) -> list[str]:
        """The text the model reads for each prompt (a string or chat messages), as in training:
        :func:`sppo_rl.llm.data.prompts.render` with :attr:`prompt_format` and the folder's tokenizer."""
        from sppo_rl.llm.data.prompts import render
        from sppo_rl.llm.models.tiny import load_tokenizer

        if self._engine is not None:
            tokenizer = self._engine.tokenizer
        else:  # the tokenizer alone: rendering needs no weights
            if getattr(self, "_tokenizer", None) is None:
                self._tokenizer = load_tokenizer(self.folder)
            tokenizer = self._tokenizer
        items = [prompts] if isinstance(prompts, str) else list(prompts)
        try:
            return [render(p, tokenizer, self.prompt_format) for p in items]
        except ValueError as e:  # --chat-template on, and this folder's tokenizer has no template
            raise ValueError(f"{self.folder}: {e}") from None

    def generate(
        self,
        prompts: Sequence[Any] | str,
        *,
        greedy: bool = True,
        max_new_tokens: int | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        rendered: bool = False,
    ) -> list[str]:
        """One response per prompt: a string or chat messages, rendered exactly as in training
        (:func:`sppo_rl.llm.data.prompts.render` with :attr:`prompt_format`: the run's instruction appended to
        the last user message, its system prompt, then the tokenizer's chat template when the run used it;
        a plain string is one user message). ``rendered=True``: the prompts are the model's text already,
        used as they are. Greedy by default; ``greedy=False`` samples at ``temperature`` / ``top_p``
        (``seed`` makes it reproducible). ``max_new_tokens`` defaults to the run's setting (256 for a
        lone folder), within the model's context."""
        from sppo_rl.llm.models.sources import model_context

        engine = self._load()
        items = [prompts] if isinstance(prompts, str) else list(prompts)
        if not items:
            return []
        texts = [str(p) for p in items] if rendered else self.render(items)
        n = max_new_tokens or self.max_new_tokens or 256
        ctx = model_context(self.folder)
        if ctx is not None and max_new_tokens is None:
            longest = max(len(ids) for ids in engine.tokenizer(texts, add_special_tokens=False)["input_ids"])
            n = max(1, min(n, ctx - longest))
        from sppo_rl.llm.rollout.base import SamplingParams

        params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=n, greedy=greedy)
        rb = engine.generate(texts, params, seeds=seed)
        return list(rb.texts)

    def save_pretrained(self, path: str | Path) -> Path:
        """Copy the model folder (weights, config, tokenizer) to ``path`` (which must not hold files);
        the run's ``max_new_tokens`` goes into its ``generation_config.json``, where :meth:`load` (and
        ``transformers``' ``generate``) take it from, and its prompt options into ``prompt_format.json``."""
        from sppo_rl.llm.data.prompts import save_format

        path = Path(path)
        if path.exists() and any(path.iterdir()):
            raise FileExistsError(f"{path} is not empty")
        shutil.copytree(self.folder, path, dirs_exist_ok=True)
        save_format(path, self.prompt_format)
        if self.max_new_tokens:
            gen_file = path / "generation_config.json"
            gen = json.loads(gen_file.read_text()) if gen_file.is_file() else {}
            gen["max_new_tokens"] = int(self.max_new_tokens)
            gen_file.write_text(json.dumps(gen, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path, device: str = "auto") -> LLMPolicy:
        """From a Hugging Face model folder (``final/actor``, one written by :meth:`save_pretrained`) or
        a run folder of ``sppo-rl llm`` (its ``final/actor``), with the prompt options it was trained with
        (:attr:`prompt_format`). Weights load through ``transformers`` (safetensors), offline."""
        path = Path(path)
        run_dir, folder = None, path
        if (path / "final" / "actor" / "config.json").is_file():
            run_dir, folder = path, path / "final" / "actor"
        elif not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"{path}: neither a Hugging Face model folder nor a finished LLM run folder"
            )
        elif (
            path.name == "actor"
            and path.parent.name == "final"
            and (path.parent.parent / "config.json").is_file()
        ):
            run_dir = path.parent.parent
        summary, max_new = None, None
        if (folder / "generation_config.json").is_file():
            max_new = json.loads((folder / "generation_config.json").read_text()).get("max_new_tokens")
        if run_dir is not None:
            if (run_dir / "summary.json").is_file():
                summary = json.loads((run_dir / "summary.json").read_text())
            if (run_dir / "config.json").is_file():
                max_new = json.loads((run_dir / "config.json").read_text()).get("max_new_tokens")
        return cls(folder, run_dir, summary, max_new_tokens=max_new, device=device)

    from_pretrained = load

    def __repr__(self) -> str:
        return f"LLMPolicy(folder={str(self.folder)!r}, run_dir={self.run_dir})"


def train_llm(
    examples: Iterable[Any] | str | Path | None = None,
    reward: str | Callable[[str, str], Any] | None = None,
    algo: str = "sppo",
    *,
    val_examples: Iterable[Any] | None = None,
    callback: Callable[[dict[str, Any]], Any] | None = None,
    **settings: Any,
) -> LLMPolicy:
    """Train ``algo`` on a causal LM and return the final :class:`LLMPolicy`.

    ``examples``: ``(prompt, answer)`` pairs (a prompt is text or chat messages; records such as
    ``{"question": ..., "answer": ...}`` work too, see :mod:`sppo_rl.llm.data`), written to
    ``<out_dir>/train-<hash>.jsonl``, which becomes ``--task``; or a data file's path, or
    ``"arithmetic"``; None: the ``task`` setting (default ``arithmetic``). ``val_examples``: the same for
    the validation set (none by default for examples). ``reward``: see :func:`reward_spec` (None: the
    task's default, math-verify for data). ``settings``: fields of :class:`~sppo_rl.llm.config.LLMConfig`
    (``model`` is needed for anything but arithmetic, ``updates``, ``group_size``, ``lr_schedule``,
    ``out_dir``, ...). ``callback(row)`` is called with each update's metrics row; returning ``False``
    stops the run there (the summary says ``stopped_by_callback``).
    """
    from sppo_rl.llm.config import LLMConfig
    from sppo_rl.llm.models.sources import cache_folder, check_model_paths
    from sppo_rl.llm.trainer import run_llm
    from sppo_rl.runtime.run import RunError, _has_run

    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be a function of the metrics row, got {callback!r}")
    for given, key in ((examples, "task"), (val_examples, "val_data"), (reward, "reward_fn")):
        if given is not None and key in settings:
            raise TypeError(f"train_llm: give the {key} setting or its argument, not both")
    if isinstance(examples, (str, Path)):
        settings["task"], examples = str(examples), None
    task = settings.get("task", "arithmetic" if examples is None else "examples")
    settings.setdefault("out_dir", str(_new_run_dir("llm", task, algo)))
    if reward is not None:
        settings["reward_fn"] = reward_spec(reward)
    out = Path(settings["out_dir"])
    data = [("train", examples, "task"), ("val", val_examples, "val_data")]
    texts = {key: _records(ex, f"{stem} example") for stem, ex, key in data if ex is not None}
    if texts and _has_run(out) and not settings.get("resume") and not settings.get("overwrite"):
        raise RunError(
            f"{out} already holds a run; pass resume=True to continue it, or overwrite=True to start over, "
            "or choose another out_dir"
        )
    files = {key: _data_path(out, stem, texts[key]) for stem, _, key in data if key in texts}
    settings.update({key: str(path) for key, path in files.items()})
    cfg = _config(LLMConfig, "train_llm", {"algo": algo, **settings})
    cfg.validate()  # every setting checked, and the model folders found, before a file is written
    check_model_paths(cfg, cache_folder(cfg))
    for key, path in files.items():
        _write_data(path, texts[key])
    summary = run_llm(cfg, callback=callback, validated=True)  # validated above: once per run
    for key, path in files.items():  # --overwrite cleared the folder after the trainer read them: put back
        _write_data(path, texts[key])
    from sppo_rl.llm.config import default_max_new_tokens

    n = cfg.max_new_tokens or default_max_new_tokens(cfg.task, cfg.level, cfg.model)
    return LLMPolicy(out / "final" / "actor", out, summary, max_new_tokens=n)
