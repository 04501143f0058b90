"""hf:DRAFT,TARGET pairs: hub ids or local folders, safetensors only, never remote code."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from specviz.models.base import PairError, LoadProgress, _first_line, _oom_as_pair_error


# ----------------------------------------------------------------------------------------------
# hf:DRAFT,TARGET pairs
# ----------------------------------------------------------------------------------------------

# owner/name as the hub spells them; checked before any network call so nothing else is fetched
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")


def _parse_hf(name: str) -> tuple[str, str]:
    """`hf:DRAFT,TARGET` -> (draft, target), each a hub id or an existing local folder."""
    refs = [r.strip() for r in name[len("hf:") :].split(",")]
    if len(refs) != 2 or not all(refs):
        raise PairError(
            f"{name!r}: write a hub pair as 'hf:DRAFT,TARGET', "
            "e.g. hf:HuggingFaceTB/SmolLM2-135M,HuggingFaceTB/SmolLM2-360M"
        )
    return _check_ref(refs[0]), _check_ref(refs[1])


def _check_ref(ref: str) -> str:
    """A local folder (absolute path) or a well-formed `owner/name` hub id; anything else is refused."""
    folder = Path(ref).expanduser()
    if folder.is_dir():
        return str(folder.resolve())
    if _HUB_ID.fullmatch(ref) and ".." not in ref and not ref.endswith((".", "-")):
        return ref
    raise PairError(f"{ref!r} is neither an existing local folder nor a Hugging Face id like 'owner/name'")


def _short(ref: str) -> str:
    """Last path component for titles."""
    return Path(ref).name or ref


def _load_hf_pair(draft_ref: str, target_ref: str, report: LoadProgress) -> tuple[Any, nn.Module, nn.Module]:
    """Tokenizers first (cheap, refuse a vocabulary mismatch early), then target, then draft."""
    from transformers import AutoTokenizer

    report(0.0, f"loading the tokenizer of {target_ref}")
    with _hf_errors(target_ref):
        tokenizer = AutoTokenizer.from_pretrained(target_ref, trust_remote_code=False)
    if draft_ref != target_ref:
        with _hf_errors(draft_ref):
            draft_tokenizer = AutoTokenizer.from_pretrained(draft_ref, trust_remote_code=False)
        if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
            raise PairError(
                f"{draft_ref} and {target_ref} use different vocabularies: a draft must share the target's tokenizer"
            )
    report(0.1, f"loading {target_ref} (target)")
    target = _load_hf_model(target_ref)
    report(0.6, f"loading {draft_ref} (draft)")
    draft = _load_hf_model(draft_ref)
    return tokenizer, target, draft


def _load_hf_model(ref: str) -> nn.Module:
    """fp32 safetensors weights only; never remote code."""
    from transformers import AutoModelForCausalLM

    with _hf_errors(ref):
        model = AutoModelForCausalLM.from_pretrained(
            ref, dtype=torch.float32, use_safetensors=True, trust_remote_code=False
        )
    return model.eval()


@contextlib.contextmanager
def _hf_errors(ref: str) -> Iterator[None]:
    """Hub/file/format failures of a user-chosen model become one clear PairError line."""
    try:
        with _oom_as_pair_error(ref):
            yield
    except PairError:
        raise
    except Exception as e:  # any model a user names may fail in its own way; none may crash the app
        raise PairError(f"could not load {ref}: {type(e).__name__}: {_first_line(e)}") from e


#END
