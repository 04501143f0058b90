"""Trust: no remote code, no pickle, classroom server settings, and running out of memory is a message."""

from __future__ import annotations

import ast
import dataclasses
import tomllib
from pathlib import Path

import pytest
import torch

from specviz.models import catalogue, locate
from specviz.serve.worker import PairStore
from specviz.models import PairError, load_pair
from tests.test_models import save_pair

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*ROOT.glob("specviz/**/*.py"), *ROOT.glob("pages/*.py"), ROOT / "app.py"])


def _calls(path: Path) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.Call)]


def _name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def test_no_pickle_and_no_remote_code_anywhere():
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        assert "import pickle" not in text and "torch.load(" not in text, path
        for call in _calls(path):
            if _name(call) == "from_pretrained":
                kw = {k.arg: k.value for k in call.keywords}
                # every load names trust_remote_code=False explicitly (a hub config cannot turn it on)
                assert isinstance(kw.get("trust_remote_code"), ast.Constant), (path, call.lineno)
                assert kw["trust_remote_code"].value is False, (path, call.lineno)
                if "dtype" in kw and "gguf_file" not in kw:  # a model from a folder or the hub: safetensors only,
                    # never a pickled .bin (GGUF files hold tensors and metadata, no code)
                    assert isinstance(kw.get("use_safetensors"), ast.Constant), (path, call.lineno)
                    assert kw["use_safetensors"].value is True, (path, call.lineno)


def test_streamlit_server_is_configured_for_a_classroom():
    cfg = tomllib.loads((ROOT / ".streamlit/config.toml").read_text(encoding="utf-8"))
    server = cfg["server"]
    assert server["headless"] is True and server["enableXsrfProtection"] is True and server["enableCORS"] is True
    assert server["maxUploadSize"] <= 5 and server["maxMessageSize"] <= 200
    assert cfg["browser"]["gatherUsageStats"] is False
    assert cfg["client"]["showErrorDetails"] == "none"
    assert cfg["runner"]["postScriptGC"] is False  # see the file: the default starves model threads


@pytest.mark.parametrize("boom", [
    MemoryError(),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory: you tried to allocate 6442450944 bytes"),
])
def test_running_out_of_memory_while_loading_is_one_line(tmp_path: Path, monkeypatch, boom):
    from transformers import AutoModelForCausalLM

    draft_dir, target_dir = save_pair(load_pair("tiny-random"), tmp_path)

    def too_big(*args, **kwargs):
        raise boom

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", too_big)
    with pytest.raises(PairError, match="out of memory while loading") as err:
        load_pair(f"hf:{draft_dir},{target_dir}")
    assert "\n" not in str(err.value) and "pick a smaller pair" in str(err.value)
    # in the server: the pair's load fails with that message and the server keeps serving others
    store = PairStore(lambda name, progress: load_pair(name), str)
    name = f"hf:{draft_dir},{target_dir}"
    view = store.request(name)
    while view.status == "loading":
        view = store.request(name)
    assert view.status == "failed" and "out of memory" in (view.error or "")
    monkeypatch.undo()
    store.forget(name)
    while (view := store.request(name)).status == "loading":
        pass
    assert view.status == "ready"  # memory freed (say, another pair closed): a retry loads it


def test_weight_packages_are_located_without_importing_them():
    import sys

    for sources in catalogue._PAIR_SOURCES.values():
        for source in sources:
            for part in source.parts:
                assert locate._locate_all(dataclasses.replace(source, parts=(part,))), f"{part.dist} is missing"
                assert part.module not in sys.modules, f"{part.module} was imported"
