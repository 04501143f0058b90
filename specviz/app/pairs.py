"""Model pairs for every session: loaded once per server in the background, warmed up, shared read-only."""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

import streamlit as st

from specviz.settings import encode_prompt
from specviz import models
from specviz.app import policy as policy_rules
from specviz.serve.worker import PairStore
from specviz.core.drafters.model import ModelDrafter
from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.progress import drain
from specviz.core.limits import DEFAULT_GAMMA
from specviz.core.trace import GenerationConfig
from specviz.serve.exact import batch_exactness, verdict_key

log = logging.getLogger("specviz.app")
WARMUP_TEXT = "def add(a, b):\n    return a + b\n"


def user_error(exc: BaseException) -> str:
    """One friendly line for any failure, without paths or internals (the full error goes to the server log)."""
    return policy_rules.visitor_message(exc, (models.PairError, ValueError))


def _load(name: str, progress: Any) -> models.LoadedPair:
    """Load a pair, then run it once briefly so the first measured run does not pay start-up costs."""
    gc.unfreeze()  # a pair released by the store was frozen below: let the collector free its cycles first
    gc.collect()
    pair = models.load_pair(name, progress=lambda f, m: progress(0.95 * f, m))
    progress(0.96, "warming up (one short run, so the first timing is fair)")
    ids = encode_prompt(pair.tokenizer, WARMUP_TEXT)
    config = GenerationConfig(max_new_tokens=6, gamma=DEFAULT_GAMMA)
    drain(speculative_generate(pair.target, ModelDrafter(pair.draft), pair.tokenizer, ids, config, pair.eos_ids))
    drain(autoregressive_generate(pair.target, pair.tokenizer, ids, config, pair.eos_ids))
    progress(0.98, "checking that runs may share the target's passes (same bits as alone)")
    # measured here, never in a pupil's first run; a target on rowgemm (rows exact by construction) is checked once per
    # model, code and machine, then read from the cache folder. Other kernels are checked at each start: oneDNN's
    # fp32 rows agreed for one load of the tiny pair and not for another (its paths follow the memory's alignment)
    key = (verdict_key(name, pair.target_precision, pair.target_kernel, pair.draft_kernel, str(pair.device))
           if pair.target_kernel.startswith("rowgemm") else None)
    log.info("%s: %s", name, batch_exactness(pair.target, remember=key).reason)
    gc.collect()
    gc.freeze()  # the models' objects are permanent: later collections need not walk them (shorter GIL pauses)
    progress(1.0, "ready")
    return pair


@st.cache_resource(show_spinner=False)
def pair_store() -> PairStore[models.LoadedPair]:
    """One loader per server: each pair is loaded once and shared read-only by every session."""
    return PairStore(_load, user_error)


def pair_title(name: str) -> str:
    """The pair's display name (its raw name when unknown)."""
    try:
        return models.get_spec(name).title
    except models.PairError:
        return name


def get_pair(name: str) -> models.LoadedPair:
    """The loaded pair, loading it once per server with a progress bar; raises PairError on failure."""
    view = pair_store().request(name)
    if view.status == "loading":
        title = pair_title(name)
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
