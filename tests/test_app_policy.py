"""Safe to share: who may choose which pair, classroom limits, fair use, fit before load, messages without internals."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from specviz.app import policy
from specviz.app.policy import PAIR_REFUSED, Policy, load_policy, settings_from_link, visitor_message
from specviz.serve.worker import OwnerBusy, Runner
from specviz.app.settings import QUERY_KEYS, shown
from specviz.core.limits import APP_MAX_NEW_RANGE
from specviz.core import drafters
from specviz.models import PAIR_NAMES, PairError, fit, load_pair

NAMED = PAIR_NAMES
HUGE_PARAMS = 405_000_000_000  # a 405B model: no machine here holds it in fp32
HOSTILE_PAIRS = {
    "hub id": "hf:meta-llama/Llama-3.1-405B,meta-llama/Llama-3.1-405B",
    "hub id, no prefix": "meta-llama/Llama-3.1-405B",
    "root folder": "hf:/,/",
    "etc and root": "hf:/etc,/root",
    "home": "hf:~,~",
    "parent": "hf:..,..",
    "bare folder": "/etc",
    "bare home": "~",
    "bare parent": "../../etc/passwd",
    "windows": "hf:C:\\Windows,C:\\Windows",
}
PATH_BITS = ("/etc", "/root", "~", "..", "meta-llama", "405B", "Windows", "passwd")


def open_policy(**kw: object) -> Policy:
    return Policy(named=NAMED, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------
# The operator's settings
# ------------------------------------------------------------------------------------------


def test_a_plain_server_offers_only_the_named_pairs():
    rules, problems = load_policy(NAMED, {}, {}, [])
    assert rules.pairs == NAMED and not rules.classroom and problems == []
    assert rules.max_new_range == APP_MAX_NEW_RANGE and rules.drafters == drafters.names()


def test_the_operator_allows_pairs_by_environment_secrets_and_arguments():
    hub = "hf:HuggingFaceTB/SmolLM2-135M,HuggingFaceTB/SmolLM2-360M"
    folder = "hf:/models/draft,/models/target"
    env = {policy.ENV_ALLOWED: f"{hub}; {folder}\n"}
    rules, _ = load_policy(NAMED, env, {"specviz": {"allowed_pairs": ["hf:a/b,c/d"]}}, ["--allow-pair", "hf:e/f,g/h"])
    assert rules.pairs == (*NAMED, "hf:a/b,c/d", hub, folder, "hf:e/f,g/h")


def test_classroom_from_arguments_env_and_secrets_in_that_order():
    secrets = {"specviz": {"classroom": {"enabled": True, "pair": "smollm2-135m", "max_new_tokens": 100,
                                        "drafters": ["model", "ngram"]}}}
    rules, _ = load_policy(NAMED, {}, secrets)
    assert rules.classroom and rules.pairs == ("smollm2-135m",) and rules.max_new_tokens == 100
    env = {policy.ENV_MAX_NEW: "48", policy.ENV_DRAFTERS: "model"}
    rules, _ = load_policy(NAMED, env, secrets)
    assert rules.max_new_tokens == 48 and rules.drafters == ("model",)
    rules, _ = load_policy(NAMED, env, secrets, ["--classroom", "--pair", "tiny-random", "--max-new", "24",
                                                 "--drafters", "ngram"])
    assert rules.pairs == ("tiny-random",) and rules.max_new_tokens == 24 and rules.drafters == ("ngram",)


def test_class_wide_memory_is_off_unless_the_operator_turns_it_on():
    assert not load_policy(NAMED, {}, {})[0].class_memory
    assert not load_policy(NAMED, {policy.ENV_CLASS_MEMORY: "0"}, {"specviz": {"class_memory": "no"}})[0].class_memory
    assert load_policy(NAMED, {}, {"specviz": {"class_memory": True}})[0].class_memory
    assert load_policy(NAMED, {policy.ENV_CLASS_MEMORY: "1"}, {})[0].class_memory
    assert load_policy(NAMED, {}, {}, ["--class-memory"])[0].class_memory


def test_bad_operator_settings_fall_back_safely_and_are_logged():
    env = {policy.ENV_CLASSROOM: "1", policy.ENV_PAIR: "hf:/etc,/root", policy.ENV_MAX_NEW: "lots",
           policy.ENV_DRAFTERS: "oracle", policy.ENV_WAITING: "1000"}
    rules, problems = load_policy(NAMED, env, {"specviz": "not a table"})
    assert rules.classroom and rules.pair is None and rules.pairs == NAMED  # a pair nobody allowed is never fixed
    assert rules.max_new_tokens == APP_MAX_NEW_RANGE[1] and rules.drafters == drafters.names()
    assert rules.waiting_per_browser == policy.WAITING_RANGE[1]
    assert len(problems) == 4


# ------------------------------------------------------------------------------------------
# Links
# ------------------------------------------------------------------------------------------


@pytest.fixture()
def nothing_resolved(monkeypatch):
    """Fails the test if a link's pair is resolved, read from disk or sent to the hub."""
    from specviz.models import hub, registry

    def refuse(*args, **kwargs):
        raise AssertionError(f"a link's pair reached the loader: {args}")

    for module, name in ((hub, "_check_ref"), (hub, "_parse_hf"), (registry, "get_spec"), (fit, "estimate")):
        monkeypatch.setattr(module, name, refuse)


@pytest.mark.parametrize("raw", list(HOSTILE_PAIRS.values()), ids=list(HOSTILE_PAIRS))
def test_hub_and_folder_pairs_from_a_link_are_refused_without_echo(raw, nothing_resolved):
    got, notes = settings_from_link({"pair": raw, "autoplay": "1"}, open_policy(), "qwen-coder")
    assert got.pair == "qwen-coder"
    assert notes == [PAIR_REFUSED]
    assert not any(bit in notes[0] for bit in PATH_BITS)


def test_an_allowed_pair_is_taken_from_a_link():
    allowed = "hf:HuggingFaceTB/SmolLM2-135M,HuggingFaceTB/SmolLM2-360M"
    got, notes = settings_from_link({"pair": allowed}, open_policy(allowed=(allowed,)), "qwen-coder")
    assert got.pair == allowed and notes == []


def test_an_unknown_name_is_not_echoed_either():
    got, notes = settings_from_link({"pair": "gpt-5"}, open_policy(default_pair="smollm2-135m"), "qwen-coder")
    assert got.pair == "smollm2-135m" and len(notes) == 1 and "gpt-5" not in notes[0]


@pytest.mark.parametrize("raw, want", [("1000000000000", 256), ("1e308", 256), ("-5", 1), ("nan", 64), ("inf", 256), ("-inf", 1)])
def test_absurd_max_new_tokens_are_clamped_with_a_note(raw, want):
    got, notes = settings_from_link({"max_new": raw}, open_policy(), "qwen-coder")
    assert got.max_new_tokens == want and len(notes) == 1


def test_a_classroom_holds_pair_drafter_and_max_new_tokens():
    rules = open_policy(classroom=True, pair="smollm2-135m", max_new_tokens=48, drafters=("model",))
    got, notes = settings_from_link({"pair": "qwen-coder", "drafter": "ngram", "max_new": "200"}, rules, "qwen-coder",
                                    {"smollm2-135m": "SmolLM2", "model": "small draft model"})
    assert (got.pair, got.drafter, got.max_new_tokens) == ("smollm2-135m", "model", 48)
    assert any("SmolLM2" in n for n in notes) and any("small draft model" in n for n in notes)
    assert any("48" in n for n in notes)


def test_echoed_link_values_stay_one_short_line_inside_their_code_span():
    evil = "d9`![x](http://evil.example/p.png)`\n# Big\x00"
    got, notes = settings_from_link({"level": evil, "gamma": "9" * 500}, open_policy(), "qwen-coder")
    assert got.level == "d1" and len(notes) == 2  # a bad level falls back to the default, D1
    for note in notes:
        assert "\n" not in note and note.count("`") == 2 and len(note) < 160
    assert shown("plain") == "plain"
    assert all(shown(raw) == "…" for raw in HOSTILE_PAIRS.values())  # a path or hub id is never echoed


QUERY_NAMES = st.sampled_from([*QUERY_KEYS, "prompt", "preset", "speed", "autoplay", "x", ""])
QUERY_VALUES = st.one_of(st.text(max_size=60), st.sampled_from([*HOSTILE_PAIRS.values(), "1", "-1", "1e999", "nan"]),
                         st.lists(st.text(max_size=10), max_size=3))


@hsettings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(params=st.dictionaries(QUERY_NAMES, QUERY_VALUES, max_size=8),
       classroom=st.booleans())
def test_any_query_string_gives_settings_inside_the_policy(params, classroom):
    rules = open_policy(classroom=classroom, pair="tiny-random" if classroom else None, max_new_tokens=32 if classroom
                        else APP_MAX_NEW_RANGE[1], drafters=("model",) if classroom else drafters.names())
    got, notes = settings_from_link(params, rules, "qwen-coder")
    assert got.pair in rules.pairs and got.drafter in rules.drafters
    assert rules.max_new_range[0] <= got.max_new_tokens <= rules.max_new_range[1]
    assert all("\n" not in n and len(n) < 300 for n in notes)


# ------------------------------------------------------------------------------------------
# Fair use: waiting runs per browser
# ------------------------------------------------------------------------------------------


def _blocked_runner() -> tuple[Runner, threading.Event]:
    """A runner whose worker is busy until the event is set (so submitted jobs stay waiting)."""
    release = threading.Event()
    runner = Runner(str)

    def hold():
        release.wait(30)
        return None
        yield  # a generator that yields nothing

    blocker = runner.submit("block", hold)
    while blocker.view().state != "running":
        pass
    return runner, release


def _steps():
    return iter(())


def test_one_browser_gets_a_few_waiting_runs_and_the_class_keeps_its_places():
    runner, release = _blocked_runner()
    try:
        for i in range(4):
            runner.submit(("pupil", i), _steps, owner="browser:a", owner_limit=4)
        with pytest.raises(OwnerBusy, match="already has 4 runs waiting"):
            runner.submit(("pupil", 4), _steps, owner="browser:a", owner_limit=4)
        assert runner.submit(("pupil", 0), _steps, owner="browser:a", owner_limit=4) is runner.get(("pupil", 0))
        runner.submit(("other", 0), _steps, owner="browser:b", owner_limit=4)  # the next pupil is not held back
        assert runner.ahead(runner.get(("other", 0))) == 5
        runner.get(("pupil", 3)).cancel()  # a stopped run frees its place
        runner.submit(("pupil", 4), _steps, owner="browser:a", owner_limit=4)
        assert runner.waiting("browser:a") == 4
    finally:
        release.set()


def test_a_browser_is_known_by_its_xsrf_token_whatever_the_mask():
    from streamlit.web.server.starlette.starlette_app_utils import generate_xsrf_token_string

    token = b"0123456789abcdef"
    first, second = generate_xsrf_token_string(token, 1), generate_xsrf_token_string(token, 1)
    assert first != second and policy.browser_id(first) == policy.browser_id(second) is not None
    assert policy.browser_id(generate_xsrf_token_string(b"another browser!", 1)) != policy.browser_id(first)
    for junk in (None, "", "2|zz|yy|1", "2|||", "not hex", "2|00|"):
        assert policy.browser_id(junk) is None


# ------------------------------------------------------------------------------------------
# Messages without internals
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("exc", [
    OSError(2, "No such file or directory", "/root/.cache/specviz/x/model.safetensors"),
    PairError("could not load /srv/models/x: OSError: Errno 13"),
    RuntimeError("Traceback (most recent call last):\n  File \"/usr/lib/python3.11/x.py\""),
    ValueError("torch.cat(): expected a non-empty list of Tensors"),
    KeyError("model.layers.0.weight"),
    PairError("could not load C:\\models\\x"),
    PairError("see https://huggingface.co/meta-llama/x"),
])
def test_internal_errors_become_one_plain_line_and_go_to_the_log(exc, caplog):
    with caplog.at_level(logging.ERROR, logger="specviz.app"):
        line = visitor_message(exc, (PairError, ValueError))
    assert line == policy.GENERIC_FAILURE
    assert caplog.records and caplog.records[-1].exc_info is not None  # the whole error is in the server log


def test_own_one_line_errors_pass_and_memory_errors_are_named():
    assert visitor_message(ValueError("every γ must be in 1..16, got (17,)"), (ValueError,)).startswith("Every γ")
    assert visitor_message(MemoryError(), ()) == policy.OUT_OF_MEMORY
    assert visitor_message(PairError("out of memory while loading /x/y"), (PairError,)) == policy.OUT_OF_MEMORY
    assert visitor_message(ValueError("fine words"), ()) == policy.GENERIC_FAILURE  # not a safe type


# ------------------------------------------------------------------------------------------
# Fit before load
# ------------------------------------------------------------------------------------------


def fake_model_folder(folder: Path, params: int) -> Path:
    """A folder whose safetensors header claims `params` fp16 weights (the data itself is not there)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = params // 8192
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "model.embed.weight": {"dtype": "F16", "shape": [rows, 8192], "data_offsets": [0, rows * 16384]}})
    raw = header.encode()
    (folder / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8192}))
    return folder


@pytest.fixture()
def no_loading(monkeypatch):
    """Fails the test if any weights or tokenizer are opened."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", refuse)


def test_a_huge_folder_pair_is_refused_before_anything_is_loaded(tmp_path, no_loading):
    huge = fake_model_folder(tmp_path / "huge", HUGE_PARAMS)
    need = fit.folder_need(huge)
    assert need is not None and need.bytes == HUGE_PARAMS // 8192 * 8192 * 4 and need.how == "safetensors headers"
    with pytest.raises(fit.DoesNotFit) as err:
        load_pair(f"hf:{huge},{huge}")
    message = str(err.value)
    assert "\n" not in message and str(tmp_path) not in message and "huge" not in message
    assert policy.is_safe_line(message)


def test_header_count_equals_the_model_and_config_estimate_is_close(tmp_path):
    import copy

    from specviz.models.packed import unpack_linears
    from tests.test_models import save_pair

    pair = load_pair("tiny-random")
    draft_dir, target_dir = save_pair(pair, tmp_path)
    n = sum(p.numel() for p in unpack_linears(copy.deepcopy(pair.target)).state_dict().values())  # as saved
    assert fit.folder_need(target_dir).bytes == n * fit.FP32
    cfg = json.loads((target_dir / "config.json").read_text())
    assert 0.5 < fit.config_elements(cfg) / n < 1.5
    need = fit.check_fit(f"hf:{draft_dir},{target_dir}")
    assert need is not None and need.bytes > 2 * n * fit.FP32


def test_named_pairs_use_measured_figures_and_are_refused_when_memory_is_short():
    assert fit.estimate("qwen-coder").how == "measured"
    with pytest.raises(fit.DoesNotFit, match=f"needs about {fit.gb(fit.MEASURED_PEAK['qwen-coder'])}"):
        fit.check_fit("qwen-coder", available=lambda: 4 * fit.GIB)
    assert fit.check_fit("tiny-random", available=lambda: 4 * fit.GIB) is not None


def test_an_index_or_a_config_alone_gives_an_estimate(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 2000}}))
    (tmp_path / "a" / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert fit.folder_need(tmp_path / "a") == fit.Need(4000, "safetensors index")
    (tmp_path / "b").mkdir()
    assert fit.folder_need(tmp_path / "b") is None


# ------------------------------------------------------------------------------------------
# Every lab's sizes are held by its config, on the server
# ------------------------------------------------------------------------------------------


def test_lab_configs_refuse_sizes_beyond_their_ranges():
    from specviz.core.sampling import SamplingConfig
    from specviz.core.trace import GenerationConfig
    from specviz.bench import batch
    from specviz.labs import how_far, same_answer, where_it_helps, why_cheap

    sampling = SamplingConfig("sample", temperature=0.8, top_p=0.95, seed=0)
    with pytest.raises(ValueError):
        same_answer.SampleConfig(sampling, n_samples=10**9)
    with pytest.raises(ValueError):
        same_answer.SpecConfig(rule="topk", top_k=10**6)
    with pytest.raises(ValueError):
        how_far.make_sweep_config("tiny-random", "x", "model", [1], 10**6, sampling)
    big = GenerationConfig(max_new_tokens=10**6)
    with pytest.raises(ValueError):
        where_it_helps.WorkloadsConfig("tiny-random", "model", big, big)
    with pytest.raises(ValueError):
        why_cheap.PassCostConfig(repeats=10**6)
    with pytest.raises(ValueError):
        batch.BatchConfig(repeats=10**6)


def test_the_app_starts_on_the_light_pair_where_the_default_does_not_fit():
    """An 8 GB school laptop starts on SmolLM2 with a note; a 24 GB machine on the default pair."""
    small = fit.start_pair("qwen-coder", total=lambda: 8 * fit.GIB)
    assert small.pair == fit.LIGHT_PAIR and "qwen-coder needs about" in small.note and "8.0 GB in all" in small.note
    big = fit.start_pair("qwen-coder", total=lambda: 24 * fit.GIB)
    assert big == fit.StartPair("qwen-coder", None)
    assert fit.start_pair(fit.LIGHT_PAIR, total=lambda: fit.GIB).pair == fit.LIGHT_PAIR  # nothing lighter to offer
    assert fit.estimate(fit.LIGHT_PAIR).bytes <= fit.DEFAULT_SHARE * 4 * fit.GIB  # the light pair fits a 4 GB machine
    # with fp16 weights (the default where they are faster) the 8 GB laptop gets the real pair; 4 GB still does not
    assert fit.start_pair("qwen-coder", total=lambda: 8 * fit.GIB, precision="fp16w") == fit.StartPair("qwen-coder", None)
    assert fit.start_pair("qwen-coder", total=lambda: 4 * fit.GIB, precision="fp16w").pair == fit.LIGHT_PAIR
    assert fit.estimate("qwen-coder", "bf16") == fit.estimate("qwen-coder")  # no figure of its own: the fp32 bound


def test_the_sidebar_starts_a_small_machine_on_the_light_pair(monkeypatch):
    from specviz.app import sidebar

    monkeypatch.setattr(fit, "total_bytes", lambda: 4 * fit.GIB)  # too small for the default in any precision
    sidebar.start_pair.cache_clear()
    try:
        assert sidebar.start_pair().pair == fit.LIGHT_PAIR
        rules, _ = load_policy(PAIR_NAMES, env={}, secrets={})
        settings, notes = settings_from_link({}, rules, sidebar.start_pair().pair)
        assert settings.pair == fit.LIGHT_PAIR and not notes
    finally:
        sidebar.start_pair.cache_clear()
