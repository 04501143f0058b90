"""Why our text never drifts: one row alone and in a batch on the real default target's matrix, and llama.cpp's
batch case in words (model text escaped)."""

from __future__ import annotations

import pytest

from specviz.core.progress import drain
from specviz.labs import row_bits
from specviz.viz import predict as predict_view
from specviz.viz import same_answer as view


@pytest.mark.real
def test_on_the_real_target_our_kernels_keep_every_bit_and_the_page_says_what_torchs_did(qwen_pair) -> None:
    bits = drain(row_bits.measure_row_bits(qwen_pair.target))
    assert bits.matrix == "layer 0 mlp.gate_proj (1536 → 8960)"
    ours = [c for c in bits.checks if c.ours]
    assert {c.kernel.split()[0] for c in ours} >= {"blockgemm"} and all(c.equal for c in ours)
    assert {c.rows for c in bits.checks} == set(row_bits.ROW_COUNTS)
    theirs = [c for c in bits.checks if not c.ours]
    assert theirs and all((c.max_abs_diff == 0.0) == c.equal for c in theirs)  # whatever torch's did, said as it is
    answer = predict_view.reveal_row_bits(view.row_bits_verdicts(bits))
    assert answer.right == (predict_view.ROW_BITS.choices[0] if all(c.equal for c in theirs)
                            else predict_view.ROW_BITS.choices[1])


def test_llama_cpps_batch_case_says_where_its_texts_part_with_model_text_escaped() -> None:
    case = row_bits.BatchCase("llama.cpp@x", 64, "the function `fib` is *fast*", "the `fib` function is *fast*")
    assert case.parted_at == 4
    words = view.batch_case_words(case)
    assert "after **4 characters**" in words and "\\*fast\\*" in words and "\\`fib\\`" in words
    same = row_bits.BatchCase("llama.cpp@x", 64, "abc", "abc")
    assert same.parted_at is None and "both runs wrote the same 64 tokens" in view.batch_case_words(same)
