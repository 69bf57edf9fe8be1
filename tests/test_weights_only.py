"""Every file the project reads with torch goes through ``torch.load(..., weights_only=True)``: a pickle
that would run code is refused with a clear error before anything runs, and the project's own files
(checkpoints with RNG states, optimizer states, actor files, the shipped warm starts) still load."""

from __future__ import annotations

import os
import pickle
import random
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

from sppo_rl.runtime.checkpoint import torch_load, torch_save

ASSETS = Path(__file__).resolve().parents[1] / "sppo_rl" / "assets" / "warmstart"


class _System:
    """Unpickles as ``os.system(command)``."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class _Mkdir:
    """Unpickles as ``os.mkdir(path)``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _torch_file_with_payload(path: Path, marker: Path) -> None:
    """A torch.save file that looks like a checkpoint and creates ``marker`` when unpickled."""
    payload = _System(f"touch {shlex.quote(str(marker))}")
    torch.save({"actor": {"w": torch.ones(2)}, "arch": {"hidden": [4]}, "meta": payload}, path)


def test_a_torch_file_that_runs_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "state.pt"
    _torch_file_with_payload(evil, marker)
    with pytest.raises(pickle.UnpicklingError, match=re.escape(str(evil))) as err:
        torch_load(evil)
    assert type(err.value).__name__ == "UnsafeCheckpointError"
    assert "weights_only=True" in str(err.value) and "system" in str(err.value)
    assert not marker.exists(), "the payload ran"


def test_a_plain_pickle_that_runs_code_is_refused(tmp_path):
    marker = tmp_path / "pwned-dir"
    evil = tmp_path / "engine.pt"
    with open(evil, "wb") as f:
        pickle.dump({"module": _Mkdir(str(marker))}, f, protocol=2)
    with pytest.raises(pickle.UnpicklingError, match="refusing to load"):
        torch_load(evil)
    assert not marker.exists(), "the payload ran"


def test_an_init_from_actor_file_that_runs_code_is_refused(tmp_path):
    """``--init-from`` takes a user's file: the control trainer's loader refuses the payload too."""
    from sppo_rl.control.actor_files import load_actor_file

    marker = tmp_path / "pwned"
    evil = tmp_path / "final.pt"
    _torch_file_with_payload(evil, marker)
    with pytest.raises(pickle.UnpicklingError, match="refusing to load"):
        load_actor_file(evil)
    assert not marker.exists(), "the payload ran"


def test_project_state_with_rng_states_round_trips(tmp_path):
    """What the trainers save: module and optimizer states, NumPy bit-generator state (128-bit ints),
    Python ``random`` state (tuples), torch generator states (byte tensors), plain numbers."""
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, betas=(0.9, 0.99))
    net(torch.ones(1, 3)).sum().backward()
    opt.step()
    seed_rng = np.random.default_rng(7)
    seed_rng.integers(0, 10, size=5)
    gen = torch.Generator().manual_seed(3)
    py_rng = random.Random(5)
    state = {
        "actor": net.state_dict(),
        "actor_opt": opt.state_dict(),
        "seed_rng": seed_rng.bit_generator.state,
        "sample_gen": gen.get_state(),
        "data_rng": py_rng.getstate(),
        "torch_rng": torch.get_rng_state(),
        "order": [3, 1, 2],
        "update": 4,
        "elapsed": 1.5,
        "meta": {"config": {"hidden": (64, 64), "out": None, "ok": True}},
    }
    torch_save(state, tmp_path / "state.pt")
    back = torch_load(tmp_path / "state.pt")
    assert back["seed_rng"] == state["seed_rng"] and back["data_rng"] == state["data_rng"]
    assert torch.equal(back["sample_gen"], state["sample_gen"]) and back["meta"] == state["meta"]
    again = np.random.default_rng()
    again.bit_generator.state = back["seed_rng"]
    assert again.integers(0, 1 << 30) == seed_rng.integers(0, 1 << 30)
    restored = random.Random()
    restored.setstate(back["data_rng"])
    assert restored.random() == py_rng.random()
    opt.load_state_dict(back["actor_opt"])
    net.load_state_dict(back["actor"])


@pytest.mark.parametrize("asset", sorted(p.name for p in ASSETS.glob("*.pt")))
def test_shipped_warm_starts_load(asset):
    blob = torch_load(ASSETS / asset)
    assert {"arch", "actor", "meta"} <= set(blob)


# ------------------------------------------------------------------------------------ model folders


def _pickled_model_folder(tmp_path: Path, tiny: Path, name: str, state: object) -> Path:
    """A copy of the tiny model's folder whose weights are ``state`` in ``pytorch_model.bin`` (no
    ``model.safetensors``, so transformers would read the pickle)."""
    import shutil

    folder = tmp_path / name
    shutil.copytree(tiny, folder)
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    return folder


def test_a_model_folder_with_a_pickle_that_runs_code_is_one_line_naming_the_file(tmp_path, capsys, tiny):
    """``--model`` on a folder whose ``pytorch_model.bin`` would run code: nothing runs (transformers
    reads it with weights_only=True), and instead of a 46-line traceback whose advice is
    ``weights_only=False``, one line naming the file, exit 2, before the run folder exists."""
    from sppo_rl.cli import main

    marker = tmp_path / "pwned"
    folder = _pickled_model_folder(
        tmp_path, tiny, "evil", {"w": _System(f"touch {shlex.quote(str(marker))}")}
    )
    out = tmp_path / "run"
    for flags in (
        ["--model", str(folder)],
        ["--model", str(tiny), "--algo", "sppo", "--critic-model", str(folder)],
    ):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main(["llm", *flags, "--task", "arithmetic", "--out-dir", str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and len(err) == 1, err
        assert f"{flags[-2]} {folder}: pytorch_model.bin holds pickled objects" in err[0]
        assert "weights_only=False" not in err[0] and "nothing in it ran" in err[0]
        assert not marker.exists() and not out.exists()


def test_loading_a_pickle_that_runs_code_names_the_file_and_a_plain_one_loads(tmp_path, tiny):
    """The same from the loader itself (a folder changed after the check), and a pickled folder of
    tensors only (``save_pretrained(safe_serialization=False)``'s kind) passes the check and loads."""
    from safetensors.torch import load_file

    from sppo_rl.llm.models.checks import check_weight_files
    from sppo_rl.llm.models.core import load_actor

    marker = tmp_path / "pwned"
    evil = _pickled_model_folder(tmp_path, tiny, "evil", {"w": _System(f"touch {shlex.quote(str(marker))}")})
    with pytest.raises(ValueError, match="pytorch_model.bin holds pickled objects") as err:
        load_actor(evil)
    assert "weights_only=False" not in str(err.value) and not marker.exists()
    state = load_file(tiny / "model.safetensors")
    plain = _pickled_model_folder(tmp_path, tiny, "plain", state)
    check_weight_files(plain, "--model")
    loaded = load_actor(plain).state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
