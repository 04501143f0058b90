"""Thin Streamlit helpers shared by every page: sidebar settings, cached pair loading, run jobs, styles."""

from __future__ import annotations

import gc
import logging
import os
import runpy
import sys
import threading
import time
from contextlib import contextmanager
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

from specviz import models
from specviz.core.progress import drain
from specviz.core.drafters import ModelDrafter, make_drafter
from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.trace import GAMMA_RANGE, GenerationConfig
from specviz.lessons import has_lesson, lesson
from specviz.presets import GROUP_TITLES, presets_in
from specviz.app import policy as policy_rules
from specviz.app.policy import Policy
from specviz.app.runner import Job, JobView, OwnerBusy, PairStore, Runner, RunnerBusy
from specviz.core.progress import JobSteps
from specviz.app.settings import (
    LEVEL_TITLES, LEVELS, QUERY_KEYS, SEED_RANGE, TEMPERATURE_RANGE, TOP_P_RANGE, Settings, clean_prompt, to_query,
)

log = logging.getLogger("specviz.app")
ASSETS = Path(__file__).resolve().parents[2] / "assets"
APP_SCRIPT = Path(__file__).resolve().parents[2] / "app.py"
TEST_PAIR = "tiny-random"
K = "cfg."  # session_state prefix of the sidebar's widgets
DRAFTER_TITLES = {"model": "small draft model", "ngram": "prompt lookup (n-gram, no second model)"}
MODE_TITLES = {"greedy": "greedy", "sample": "sampling"}


def user_error(exc: BaseException) -> str:
    """One friendly line for any failure, without paths or internals (the full error goes to the server log)."""
    return policy_rules.visitor_message(exc, (models.PairError, ValueError))


def current_policy() -> Policy:
    """The operator's rules (secrets, environment, `streamlit run app.py -- --classroom …`), read on every run.

    Cheap, and never cached: an operator's edit of secrets.toml applies on the next rerun.
    """
    found, problems = policy_rules.load_policy(models.PAIR_NAMES, os.environ, _secrets(), sys.argv[1:])
    for problem in problems:
        log.warning("policy: %s", problem)
    return found


def _secrets() -> Mapping[str, Any]:
    """`.streamlit/secrets.toml` as a dict ({} when there is none or it cannot be read)."""
    try:
        return st.secrets.to_dict() if st.secrets.load_if_toml_exists() else {}
    except Exception as exc:  # noqa: BLE001 - a broken secrets file must not take the app down
        log.warning("secrets.toml could not be read: %s", exc)
        return {}


def owner_id() -> str:
    """Who asks for a run: one browser (all its tabs share Streamlit's XSRF cookie), else this session."""
    browser = policy_rules.browser_id(st.context.cookies.get(policy_rules.XSRF_COOKIE))
    if browser:
        return "browser:" + browser
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return "session:" + (ctx.session_id if ctx is not None else "none")


def _submit(key: tuple[Any, ...], make: Callable[[], JobSteps]) -> Job:
    """Queue on the shared runner as this browser, within its share of waiting runs."""
    return runner().submit(key, make, owner=owner_id(), owner_limit=current_policy().waiting_per_browser)


WARMUP_TEXT = "def add(a, b):\n    return a + b\n"


def _load(name: str, progress: Any) -> models.LoadedPair:
    """Load a pair, then run it once briefly so the first measured run does not pay start-up costs."""
    gc.unfreeze()  # a pair released by the store was frozen below: let the collector free its cycles first
    gc.collect()
    pair = models.load_pair(name, progress=lambda f, m: progress(0.95 * f, m))
    progress(0.96, "warming up (one short run, so the first timing is fair)")
    ids = list(pair.tokenizer(WARMUP_TEXT)["input_ids"])
    config = GenerationConfig(max_new_tokens=6, gamma=4)
    drain(speculative_generate(pair.target, ModelDrafter(pair.draft), pair.tokenizer, ids, config, pair.eos_ids))
    drain(autoregressive_generate(pair.target, pair.tokenizer, ids, config, pair.eos_ids))
    gc.collect()
    gc.freeze()  # the models' objects are permanent: later collections need not walk them (shorter GIL pauses)
    progress(1.0, "ready")
    return pair


@st.cache_resource(show_spinner=False)
def pair_store() -> PairStore[models.LoadedPair]:
    """One loader per server: each pair is loaded once and shared read-only by every session."""
    return PairStore(_load, user_error)


@st.cache_resource(show_spinner=False)
def runner() -> Runner:
    """One model worker per server: runs are queued, timed one at a time, and shared by key.

    The GIL switch interval is shortened so page redraws delay the worker's torch calls less
    (the worker needs the GIL between ops; timings stay closer to an idle server's).
    """
    sys.setswitchinterval(0.001)
    return Runner(user_error)


# ------------------------------------------------------------------------------------------
# The shell (app.py) around every page
# ------------------------------------------------------------------------------------------

_shell = threading.local()  # each session's script run has its own thread


@contextmanager
def shell() -> Iterator[None]:
    """Marks app.py's run of the chosen page (pages check it with run_page)."""
    _shell.active = True
    try:
        yield
    finally:
        _shell.active = False


def run_page(main: Callable[[], None]) -> None:
    """Run a page's main() inside the app's shell.

    Until st.navigation has run once, a fresh server treats pages/ as an old-style page folder and
    answers a deep link such as /why_cheap by running that file alone: no sidebar, no menu. Then
    the page runs app.py instead, which draws the shell and routes back to this page.
    """
    if getattr(_shell, "active", False):
        main()
    else:
        runpy.run_path(str(APP_SCRIPT), run_name="__main__")


# ------------------------------------------------------------------------------------------
# Sidebar settings <-> widgets <-> URL
# ------------------------------------------------------------------------------------------


def _pair_titles(rules: Policy) -> dict[str, str]:
    return {**{n: _pair_title(n) for n in rules.pairs}, **DRAFTER_TITLES}


def _init_from_query() -> None:
    """On a session's first run, read the URL into the widgets (bad values become friendly notes).

    Only pairs the policy offers are taken from a link: a hub id or a folder is refused before
    anything is resolved, read or downloaded.
    """
    if K + "ready" in st.session_state:
        return
    rules = current_policy()
    params = st.query_params.to_dict()
    # a link's pair may carry a target precision ("qwen-coder@bf16"): the policy checks the pair, the precision box gets the rest
    params["pair"], precision = models.split_ref(str(params.get("pair", models.DEFAULT_PAIR)))
    settings, notes = policy_rules.settings_from_link(params, rules, models.DEFAULT_PAIR, _pair_titles(rules))
    for name in ("level", "pair", "drafter", "mode", "temperature", "top_p", "seed", "gamma", "adaptive", "max_new_tokens",
                 "presenter"):
        st.session_state[K + name] = getattr(settings, name)
    st.session_state[K + "precision"] = precision or AUTO
    st.session_state[K + "notes"] = notes
    st.session_state[K + "ready"] = True


def visible_pairs(current: str, rules: Policy | None = None) -> list[str]:
    """The sidebar's pair choices (the policy's pairs): the test pair only when asked for (URL or SPECVIZ_SHOW_TEST_PAIR=1)."""
    offered = (rules or current_policy()).pairs
    show_test = os.environ.get("SPECVIZ_SHOW_TEST_PAIR") == "1" or current == TEST_PAIR
    names = [n for n in offered if n != TEST_PAIR or show_test]
    if current not in names and current in offered:
        names.append(current)
    return names or list(offered)


def _pair_title(name: str) -> str:
    try:
        return models.get_spec(name).title
    except models.PairError:
        return name


def _pair_caption(name: str) -> str:
    try:
        spec = models.get_spec(name)
    except models.PairError as exc:
        return str(exc)
    view = pair_store().peek(name)
    ready = view is not None and view.status == "ready"
    if name not in models.PAIR_NAMES:  # an operator's hub or folder pair: its description would show where it lives
        return f"A model pair added by this server's operator.  \n**{'loaded ✓' if ready else 'not loaded yet'}**"
    return f"{spec.description}  \n**{'loaded ✓' if ready else f'Load cost: {spec.load_cost}'}**"


def sidebar_settings() -> Settings:
    """Draw the shared sidebar and return the settings it holds (also kept for pages in session_state)."""
    _init_from_query()
    rules = current_policy()
    _hold_to(rules)
    sb = st.sidebar
    for note in st.session_state.pop(K + "notes", []):
        sb.warning(note, icon=":material/link:")
    sb.radio("Explanation level", LEVELS, key=K + "level", format_func=LEVEL_TITLES.get, horizontal=True,
             help="Changes the words and how much is shown, never the run itself.")
    pair = st.session_state.get(K + "pair", models.DEFAULT_PAIR)
    if rules.classroom and len(rules.pairs) == 1:  # a classroom's pupils see what they may change, nothing else
        sb.markdown(f"**Model pair:** {_pair_title(pair)}")
    else:
        sb.selectbox("Model pair (draft → target)", visible_pairs(pair, rules), key=K + "pair", format_func=_pair_title)
        precision_select(sb, st.session_state[K + "pair"])
        sb.caption(_pair_caption(_pair_from_state()))
    if len(rules.drafters) > 1:
        sb.radio("Drafter", rules.drafters, key=K + "drafter", format_func=DRAFTER_TITLES.get, horizontal=False,
                 help="Who guesses: the pair's small model, or a lookup that copies what followed the same words earlier.")
    sb.radio("Decoding", ("greedy", "sample"), key=K + "mode", format_func=MODE_TITLES.get, horizontal=True,
             help="Greedy always takes the most likely token; sampling draws from the probabilities.")
    if st.session_state[K + "mode"] == "sample":
        sb.slider("Temperature", *TEMPERATURE_RANGE, step=0.05, key=K + "temperature", persist_state="session")
        sb.slider("Top-p", *TOP_P_RANGE, step=0.05, key=K + "top_p", persist_state="session")
        sb.number_input("Seed", *SEED_RANGE, step=1, key=K + "seed", persist_state="session",
                        help="Same seed, same dice: a sampled run replays exactly.")
    adaptive = sb.toggle("Adaptive γ", key=K + "adaptive",
                         help="Let the engine choose the draft length each round: long while the helper is sure "
                         "and right, nothing while drafting does not pay. γ below is then the most it may draft.")
    sb.slider("γ — most tokens guessed per round" if adaptive else "γ — draft length (tokens guessed per round)",
              *GAMMA_RANGE, key=K + "gamma")
    sb.slider("Max new tokens", *rules.max_new_range, key=K + "max_new_tokens")
    sb.toggle("Presenter mode (large type)", key=K + "presenter")
    # checked again on the server, whatever the browser sent
    settings, changed = policy_rules.enforce(_settings_from_state(), rules, models.DEFAULT_PAIR)
    if changed:
        log.warning("settings held to the policy: %s", changed)
    st.session_state[K + "settings"] = settings
    _write_query(to_query(settings), QUERY_KEYS)
    return settings


def _hold_to(rules: Policy) -> None:
    """Keep the widgets' state inside the policy before they are drawn (an operator may tighten it while a session is open)."""
    ss = st.session_state
    if ss.get(K + "pair") not in rules.pairs:
        ss[K + "pair"] = rules.first_pair(models.DEFAULT_PAIR)
    if ss.get(K + "drafter") not in rules.drafters:
        ss[K + "drafter"] = rules.drafters[0]
    lo, hi = rules.max_new_range
    ss[K + "max_new_tokens"] = policy_rules.bounded(ss.get(K + "max_new_tokens"), lo, hi, min(Settings().max_new_tokens, hi))


AUTO = "auto"  # the precision box's "chosen at load" entry


def _pair_from_state() -> str:
    """The sidebar's pair with its target precision ("qwen-coder@bf16"; the plain name when automatic)."""
    ss = st.session_state
    precision = ss.get(K + "precision", AUTO)
    return models.pair_ref(ss.get(K + "pair", Settings().pair), None if precision == AUTO else precision)


def precision_select(sb: Any, pair: str) -> None:
    """The target precision box: each entry with its memory cost and whether it keeps the promise here."""
    try:
        auto = models.choose_precisions(pair)
    except models.PairError:
        return

    def title(p: str) -> str:
        target = auto.target if p == AUTO else p
        cost = models.memory_estimate(pair, target, auto.draft)
        label = f"automatic: {models.precision.describe(target)}" if p == AUTO else models.precision.describe(p)
        return label + (f" · ≈ {cost / 1e9:.1f} GB" if cost else "")

    sb.selectbox("Target precision", (AUTO, *models.TARGET_PRECISIONS), key=K + "precision", format_func=title,
                 help="fp32 keeps speculative greedy output identical to the target alone. bf16 and int8 halve or "
                 "quarter the memory (and are faster on CPUs with bf16 / int8 instructions), but a verify pass and "
                 "a one-token step then round differently, so where the target's two best tokens are nearly tied "
                 "the two runs can pick differently: not bit-exact here.")
    if st.session_state.get(K + "level") == "d5":
        sb.caption(f"Chosen here: {auto.reason}. {memory_line()}")


def memory_line() -> str:
    """This server's own memory use (resident set) and the loaded pairs' weights, for the D5 sidebar."""
    import psutil

    rss = psutil.Process().memory_info().rss
    held = pair_store().ready()
    weights = ", ".join(f"{getattr(p.spec, 'title', n)} {p.weight_bytes / 1e9:.1f} GB" for n, p in held.items())
    return f"Server memory now: {rss / 1e9:.1f} GB resident" + (f" (weights: {weights})." if weights else ".")


def _settings_from_state() -> Settings:
    ss, d = st.session_state, Settings()
    return Settings(
        level=ss.get(K + "level", d.level), pair=_pair_from_state(), drafter=ss.get(K + "drafter", d.drafter),
        mode=ss.get(K + "mode", d.mode), temperature=float(ss.get(K + "temperature", d.temperature)),
        top_p=float(ss.get(K + "top_p", d.top_p)), seed=int(ss.get(K + "seed", d.seed)),
        gamma=int(ss.get(K + "gamma", d.gamma)), adaptive=bool(ss.get(K + "adaptive", d.adaptive)),
        max_new_tokens=int(ss.get(K + "max_new_tokens", d.max_new_tokens)),
        presenter=bool(ss.get(K + "presenter", d.presenter)),
    )


def settings() -> Settings:
    """The settings the sidebar drew on this run (defaults before it ran)."""
    return st.session_state.get(K + "settings", Settings())


def _write_query(values: Mapping[str, str], owned: Mapping[str, Any]) -> None:
    """Make the URL hold exactly `values` for the keys this caller owns (others are left alone)."""
    qp = st.query_params
    for key in owned:
        if key in values:
            if qp.get(key) != values[key]:
                qp[key] = values[key]
        elif key in qp:
            del qp[key]


def write_page_query(values: Mapping[str, str], owned: tuple[str, ...]) -> None:
    """Pages keep their own entries (prompt, preset, …) in the URL too, so a link replays a demo."""
    _write_query(values, dict.fromkeys(owned))


def read_query(key: str) -> str | None:
    """One raw URL value (pages read theirs once, on the session's first run)."""
    value = st.query_params.get(key)
    return None if value is None else str(value)


# ------------------------------------------------------------------------------------------
# Pairs and runs
# ------------------------------------------------------------------------------------------


def get_pair(name: str) -> models.LoadedPair:
    """The loaded pair, loading it once per server with a progress bar; raises PairError on failure."""
    view = pair_store().request(name)
    if view.status == "loading":
        title = _pair_title(name)
        bar = st.empty()
        while view.status == "loading":
            bar.progress(view.fraction, text=f"Loading {title} (first time only): {view.message}")
            time.sleep(0.25)
            view = pair_store().request(name)
        bar.empty()
    if view.status == "failed" or view.pair is None:
        raise models.PairError(view.error or f"could not load {name}")
    return view.pair


def retry_pair(name: str) -> None:
    """Forget a failed load so the next get_pair tries again."""
    pair_store().forget(name)


def pair_or_message(name: str, key: str | None = None) -> models.LoadedPair | None:
    """The loaded pair; or None after saying why it failed, with a button to try again."""
    try:
        return get_pair(name)
    except models.PairError as exc:
        st.error(f"The model pair could not be loaded: {exc}", icon=":material/error:")
        st.button("Try loading it again", on_click=retry_pair, args=(name,), key=key)
        st.caption("Or choose another model pair in the sidebar.")
        return None


def repaired_prompt(prompt: str) -> str:
    """The prompt a tokenizer can take (settings.clean_prompt), with a caption for each repair."""
    prompt, changes = clean_prompt(prompt)
    for change in changes:
        st.caption(f":material/healing: {change}")
    return prompt


def preset_buttons(prefix: str, on_click: Callable[[str], None], hints: Mapping[str, str] | None = None) -> None:
    """The preset prompts as buttons in a Predictable and a Creative column; a press calls on_click(preset id)."""
    cols = st.columns(2, gap="medium")
    for col, group in zip(cols, ("predictable", "creative")):
        with col:
            st.markdown(f"**{GROUP_TITLES[group]}**{(hints or {}).get(group, '')}")
            with st.container(horizontal=True, gap="small"):
                for p in presets_in(group):
                    st.button(p.title, key=f"{prefix}preset.{p.id}", on_click=on_click, args=(p.id,), help=p.why)


@dataclass(frozen=True)
class RunRef:
    """What a page keeps in session_state about a run: keys into the shared runner, nothing heavy."""

    spec_key: tuple[Any, ...]
    plain_key: tuple[Any, ...]
    prompt: str
    settings: Settings


def run_keys(pair: str, prompt: str, s: Settings) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Cache keys of the speculative run and of its target-only baseline (γ and drafter do not change the baseline)."""
    return ("spec", pair, prompt, s.drafter, s.generation_config()), ("plain", pair, prompt, s.baseline_config())


def start_runs(pair: models.LoadedPair, prompt: str, prompt_ids: list[int], s: Settings) -> RunRef:
    """Queue the speculative run, then the baseline (each reused if it already exists)."""
    spec_key, plain_key = run_keys(pair.spec.name, prompt, s)
    _room_for(spec_key, plain_key)
    drafter = make_drafter(s.drafter, pair.draft, adaptive=s.adaptive)
    config: GenerationConfig = s.generation_config()
    ids = list(prompt_ids)
    _submit(spec_key, lambda: speculative_generate(pair.target, drafter, pair.tokenizer, ids, config, pair.eos_ids))
    base = s.baseline_config()
    _submit(plain_key, lambda: autoregressive_generate(pair.target, pair.tokenizer, ids, base, pair.eos_ids))
    return RunRef(spec_key, plain_key, prompt, s)


def _room_for(*keys: tuple[Any, ...]) -> None:
    """Raise OwnerBusy unless this browser may queue all of `keys` (so a run never waits without its baseline)."""
    new = sum(1 for k in keys if (j := runner().get(k)) is None or j.view().state in ("failed", "cancelled"))
    limit, owner = current_policy().waiting_per_browser, owner_id()
    if new and (waiting := runner().waiting(owner)) + new > limit:
        raise OwnerBusy.waiting(waiting)


def room_for(*keys: tuple[Any, ...]) -> bool:
    """Whether this browser may queue all of `keys` together; if not, say so on the page."""
    try:
        _room_for(*keys)
    except RunnerBusy as exc:
        st.warning(f"The server is busy: {exc}.", icon=":material/hourglass_top:")
        return False
    return True


def job(key: tuple[Any, ...]) -> Job | None:
    return runner().get(key)


def submit_job(key: tuple[Any, ...], make: Callable[[], JobSteps]) -> Job | None:
    """Queue a model job on the shared runner (reused if `key` exists); None, with a message, if the queue is full.

    Labs key their jobs on every setting that changes the result, so a view change never re-runs
    a model and two pupils asking for the same measurement share one run.
    """
    try:
        return _submit(key, make)
    except RunnerBusy as exc:
        st.warning(f"The server is busy: {exc}.", icon=":material/hourglass_top:")
        return None


def wait_line(j: Job) -> str | None:
    """"3 ahead of you" while a job waits its turn; None once it runs or is done."""
    ahead = runner().ahead(j)
    if ahead <= 0 or j.view().state != "queued":
        return None
    return f"Waiting for the model: {ahead} {'run' if ahead == 1 else 'runs'} ahead of you."


def poll_jobs(keys: Sequence[tuple[Any, ...]], what: Sequence[str], every: float = 1.0) -> None:
    """Redraw the jobs' status every `every` seconds (place in the queue, progress); rerun the page once all are finished."""

    @st.fragment(run_every=every)
    def status() -> None:
        jobs = [runner().get(k) for k in keys]
        if all(j is None or j.view().finished for j in jobs):
            st.rerun(scope="app")
        for j, name in zip(jobs, what):
            if j is not None and not j.view().finished:
                show_job_status(j, j.view(), name)

    status()


def show_job_status(j: Job, view: JobView, what: str) -> None:
    """Queue position, progress bar or error of a lab job (nothing once it is done)."""
    if view.state == "failed":
        st.error(f"{what} failed: {view.error}", icon=":material/error:")
    elif view.state == "cancelled":
        st.warning(f"{what} was stopped.", icon=":material/stop_circle:")
    elif view.state == "queued":
        st.info(wait_line(j) or f"{what}: starting…", icon=":material/hourglass_top:")
    elif view.state == "running":
        prog = view.progress
        st.progress(prog.fraction if prog else 0.0, text=f"{what}: {prog.message if prog else 'working…'}")


def cancel_runs(old: RunRef, new: RunRef) -> None:
    """Stop a session's previous run when it starts another (keys the new run shares are kept)."""
    for key in (old.spec_key, old.plain_key):
        if key not in (new.spec_key, new.plain_key) and (j := runner().get(key)) is not None and not j.view().finished:
            j.cancel()


# ------------------------------------------------------------------------------------------
# Styles and lesson text
# ------------------------------------------------------------------------------------------


@st.cache_data(show_spinner=False, max_entries=4)
def _css(presenter: bool) -> str:
    css = (ASSETS / "style.css").read_text(encoding="utf-8")
    if presenter:
        css += "\nhtml { font-size: 21px !important; } .sv-lane, .sv-text { font-size: 1.25rem; }\n"
    return f"<style>{css}</style>"


def inject_css(presenter: bool) -> None:
    """The app's stylesheet (and large type in presenter mode)."""
    st.html(_css(presenter))


def lesson_md(level: str, key: str) -> bool:
    """Show a lesson text if the level has it; returns whether something was shown."""
    if not has_lesson(level, key):
        return False
    st.markdown(lesson(level, key))
    return True


def font_size(s: Settings) -> int:
    """Chart font size: bigger for a projector."""
    return 19 if s.presenter else 13
