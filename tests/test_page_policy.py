"""AppTests of a shared server: hostile links, a classroom, one browser's many tabs, a pair too big, random links."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from specviz import models
from specviz.app import jobs, pairs, policy
from tests.test_page_watch import APP, ShellAppTest, no_exception, texts
from tests.test_app_policy import HOSTILE_PAIRS, HUGE_PARAMS, fake_model_folder

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("pages/watch.py", "pages/same_answer.py", "pages/how_far.py", "pages/where_it_helps.py", "pages/why_cheap.py")
# what a page must never show: where the server keeps things, what it runs on, the link's pair text
SECRETS = (str(ROOT), str(Path.home()) + "/", "/etc", "site-packages", "Traceback", "meta-llama", "405B", "C:\\",
           "passwd")


@pytest.fixture()
def guarded(monkeypatch):
    """The test pair by default; every model load recorded; the hub client and the network fail the test."""
    import huggingface_hub
    import huggingface_hub.file_download
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv(policy.ENV_DEFAULT, "tiny-random")
    for name in (policy.ENV_ALLOWED, policy.ENV_CLASSROOM, policy.ENV_PAIR, policy.ENV_MAX_NEW, policy.ENV_DRAFTERS):
        monkeypatch.delenv(name, raising=False)
    asked: dict[str, list[str]] = {"loads": [], "hub": [], "network": []}

    def record(kind: str, what: str):
        def refuse(*args, **kwargs):
            asked[kind].append(f"{what}{args[:2]}")
            raise AssertionError(f"{what} was asked for {args[:2]}")
        return refuse

    for name in ("hf_hub_download", "snapshot_download", "get_safetensors_metadata", "model_info", "list_repo_files"):
        if hasattr(huggingface_hub, name):
            monkeypatch.setattr(huggingface_hub, name, record("hub", name))
    monkeypatch.setattr(huggingface_hub.file_download, "hf_hub_download", record("hub", "hf_hub_download"))
    for cls in (AutoModelForCausalLM, AutoTokenizer, AutoConfig):
        monkeypatch.setattr(cls, "from_pretrained", record("hub", f"{cls.__name__}.from_pretrained"))
    monkeypatch.setattr(socket.socket, "connect", record("network", "socket.connect"))
    monkeypatch.setattr(socket, "create_connection", record("network", "create_connection"))
    real_load = models.load_pair

    def load(name, *args, **kwargs):
        asked["loads"].append(name)
        return real_load(name, *args, **kwargs)

    monkeypatch.setattr(models, "load_pair", load)
    yield asked
    assert asked["hub"] == [] and asked["network"] == [], asked


def app(**query: str) -> ShellAppTest:
    at = ShellAppTest(APP, default_timeout=120)
    at.query_params.update(query)
    return at


def page_dump(at) -> str:
    """Every element's protobuf on the page and in the sidebar, as text (what the browser would get)."""
    parts: list[str] = []

    def walk(node) -> None:
        proto = getattr(node, "proto", None)
        if proto is not None:
            parts.append(str(proto))
        for child in getattr(node, "children", {}).values():
            walk(child)

    walk(at._tree)
    return "\n".join(parts)


def assert_no_internals(at) -> None:
    dump = page_dump(at)
    assert "Explanation level" in dump  # the dump holds the page and its sidebar
    leaked = [s for s in SECRETS if s in dump]
    assert not leaked, leaked


@pytest.mark.parametrize("raw", list(HOSTILE_PAIRS.values()), ids=list(HOSTILE_PAIRS))
def test_a_hostile_pair_link_is_refused_with_a_note_and_loads_nothing(raw, guarded):
    at = app(pair=raw, autoplay="1", max_new="8")
    at.run()
    no_exception(at)
    notes = [w.value for w in at.sidebar.warning]
    assert policy.PAIR_REFUSED in notes
    assert at.session_state["cfg.settings"].pair == "tiny-random"
    assert set(guarded["loads"]) <= {"tiny-random"}
    assert pairs.pair_store().peek(raw) is None and jobs.runner().get(("watch.spec", raw)) is None
    assert_no_internals(at)
    assert [o.label for o in at.sidebar.selectbox] == ["Model pair (draft → target)", "Target precision"]
    assert all("hf:" not in str(o) for box in at.sidebar.selectbox for o in box.options)


def test_an_absurd_max_new_tokens_is_clamped_with_a_note(guarded):
    at = app(pair="tiny-random", max_new="99999999999999999999")
    at.run()
    no_exception(at)
    assert at.slider(key="cfg.max_new_tokens").value == 256
    assert any("max_new=" in w.value and "using 256" in w.value for w in at.sidebar.warning)
    at.run()  # the page runs again by itself (Play, a finished job): the link's note stays
    assert any("using 256" in w.value for w in at.sidebar.warning)
    at.slider(key="cfg.max_new_tokens").set_value(32).run()  # the visitor changes a setting: the note has done its job
    no_exception(at)
    assert not any("using 256" in w.value for w in at.sidebar.warning)


def test_a_classroom_shows_pupils_only_what_they_may_change(guarded, monkeypatch):
    monkeypatch.setenv(policy.ENV_CLASSROOM, "1")
    monkeypatch.setenv(policy.ENV_PAIR, "tiny-random")
    monkeypatch.setenv(policy.ENV_MAX_NEW, "32")
    monkeypatch.setenv(policy.ENV_DRAFTERS, "model")
    at = app(pair="smollm2-135m", drafter="ngram", max_new="200")
    at.run()
    no_exception(at)
    s = at.session_state["cfg.settings"]
    assert (s.pair, s.drafter, s.max_new_tokens) == ("tiny-random", "model", 32)
    assert len(at.sidebar.selectbox) == 0  # no pair to choose
    keys = {w.key for kind in ("radio", "slider", "toggle", "selectbox") for w in getattr(at.sidebar, kind)}
    assert "cfg.drafter" not in keys and "cfg.pair" not in keys
    assert at.slider(key="cfg.max_new_tokens").max == 32
    notes = " ".join(w.value for w in at.sidebar.warning)
    assert "In this classroom everyone uses" in notes and "drafter" in notes and "at most 32" in notes
    assert set(guarded["loads"]) <= {"tiny-random"}


def test_a_pair_too_big_for_this_machine_is_refused_in_one_line(guarded, monkeypatch, tmp_path):
    huge = fake_model_folder(tmp_path / "huge", HUGE_PARAMS)
    name = f"hf:{huge},{huge}"
    monkeypatch.setenv(policy.ENV_ALLOWED, name)  # the operator allowed it; it still cannot fit
    at = app(pair=name)
    at.run()
    no_exception(at)
    errors = [e.value for e in at.error]
    assert any("needs about" in e and "GB" in e for e in errors), errors
    view = pairs.pair_store().peek(name)
    assert view is not None and view.status == "failed" and view.pair is None  # nothing half-loaded kept
    dump = page_dump(at)
    assert str(tmp_path) not in dump and str(huge) not in dump
    assert "added by this server's operator" in texts(at) or any(
        "added by this server's operator" in c.value for c in at.sidebar.caption)


def test_ten_autoplay_tabs_of_one_browser_queue_only_its_share(guarded, monkeypatch):
    monkeypatch.setattr(jobs, "owner_id", lambda: "browser:one-pupil")
    release = threading.Event()

    def hold():
        release.wait(60)
        return None
        yield

    blocker = jobs.runner().submit(("test.block", id(release)), hold, owner="teacher")
    while blocker.view().state != "running":
        pass
    try:
        told = 0
        for tab in range(10):
            at = app(pair="tiny-random", autoplay="1", max_new="8", prompt=f"tab {tab} of one pupil")
            at.run()
            no_exception(at)
            told += any("already has 4 runs waiting" in w.value for w in at.warning)
        limit = policy.WAITING_PER_BROWSER
        assert jobs.runner().waiting("browser:one-pupil") == limit
        assert told == 10 - limit // 2  # each Play queues a run and its baseline
    finally:
        release.set()


QUERY = st.dictionaries(
    st.sampled_from(["pair", "level", "drafter", "mode", "temp", "top_p", "seed", "gamma", "adaptive", "max_new",
                     "present", "prompt", "preset", "speed", "autoplay", "zzz"]),
    st.one_of(st.text(max_size=40), st.sampled_from([*HOSTILE_PAIRS.values(), "1", "0", "-3", "1e999", "nan", "d1",
                                                     "sample", "ngram", "tiny-random"])),
    max_size=6)


@hsettings(max_examples=10, deadline=None, derandomize=True, database=None,
           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(params=QUERY, page=st.sampled_from(PAGES))
def test_any_link_on_any_page_raises_nothing(guarded, params, page):
    at = app(**params)
    at.run()
    no_exception(at)
    if page != PAGES[0]:
        at.switch_page(page).run()
        no_exception(at)
    assert set(guarded["loads"]) <= {"tiny-random"}
    assert_no_internals(at)
