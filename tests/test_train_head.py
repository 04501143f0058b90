"""`train-head` end to end on the tiny pair (seconds), the shipped head's checks, and a training run that resumes exactly."""

import dataclasses
import json

import pytest
import torch

from specviz import models
from specviz.cli import main
from specviz.core.draft_vocab import most_frequent
from specviz.core.files import sha256_file
from specviz.core.drafters.eagle import EagleDrafter, EagleTreeDrafter
from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.head import EagleHead
from specviz.core.progress import drain
from specviz.core.trace import GenerationConfig
from specviz.models import heads
from specviz.train.data import RecordConfig, read_pieces, text_pieces
from specviz.train.head import Sequences, TrainConfig, TrainState, train
from specviz.train.run import HeadRecipe, data_folder, leave_out_held, load_rows, start_head
from specviz.train.store import load_tree, save_tree

TINY_ARGS = ["train-head", "--pair", "tiny-random", "--prompts", "80", "--new-tokens", "24", "--steps", "40",
             "--batch", "4", "--window", "32", "--vocab", "192", "--mlp", "64", "--record-precision", "fp32", "--quiet"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny head trained by the command line into its own folder (its recorded data in its own cache)."""
    root = tmp_path_factory.mktemp("train-head")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECVIZ_CACHE", str(root / "cache"))
        assert main(TINY_ARGS + ["--out", str(root / "heads")]) == 0
    return root / "heads", models.load_pair("tiny-random")


def test_the_command_writes_a_head_its_manifest_describes(trained, capsys):
    folder, pair = trained
    man = heads.manifest("tiny-random", folder)
    assert man["sha256"] == sha256_file(folder / "tiny-random.safetensors")
    assert man["target"] == heads.target_fingerprint(pair.target)
    assert man["recipe"]["train"]["steps"] == 40 and man["recipe"]["vocab"] == 192
    assert len(man["loss_every_10_steps"]) == 4 and man["counts"]["recorded_tokens"] > 2000
    before, after = man["held_out"]["sampled_acceptance"]
    assert after > before  # 40 steps already teach it something about the held-out chunk


@pytest.mark.parametrize("make", [EagleDrafter, EagleTreeDrafter], ids=["chain", "tree"])
def test_the_shipped_head_loads_checked_and_drafts_exactly(trained, make):
    folder, pair = trained
    head = heads.load("tiny-random", pair.target, folder)
    assert head.vocab.n == 192 and not head.training
    ids = pair.tokenizer("def add(a, b):")["input_ids"]
    cfg = GenerationConfig(max_new_tokens=24, gamma=3, stop_at_eos=False)
    spec = drain(speculative_generate(pair.target, make(head), pair.tokenizer, ids, cfg))
    assert spec.tokens == drain(autoregressive_generate(pair.target, pair.tokenizer, ids, cfg)).tokens
    assert sum(len(r.draft_ids) for r in spec.rounds) > 0


def test_a_damaged_or_foreign_head_is_refused_with_the_reason(trained, tmp_path):
    folder, pair = trained
    for name in ("tiny-random.safetensors", "tiny-random.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    blob = bytearray((tmp_path / "tiny-random.safetensors").read_bytes())
    blob[-1] ^= 1
    (tmp_path / "tiny-random.safetensors").write_bytes(bytes(blob))
    with pytest.raises(heads.HeadError, match="does not match its manifest"):
        heads.load("tiny-random", pair.target, tmp_path)
    (tmp_path / "tiny-random.safetensors").write_bytes((folder / "tiny-random.safetensors").read_bytes())
    man = json.loads((tmp_path / "tiny-random.json").read_text())
    man["target"]["hidden_size"] = 128
    (tmp_path / "tiny-random.json").write_text(json.dumps(man))
    with pytest.raises(heads.HeadError, match="trained for another target.*hidden_size 128 vs 64"):
        heads.load("tiny-random", pair.target, tmp_path)
    with pytest.raises(heads.HeadError, match="train-head"):
        heads.load("smollm2-135m", pair.target, tmp_path)


def test_a_stopped_training_resumes_to_the_same_weights(trained, tmp_path):
    _, pair = trained
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 257, (40,), generator=gen) for _ in range(6)]
    with torch.inference_mode():
        feats = [pair.target(input_ids=s[None], output_hidden_states=True).hidden_states[-1][0, :-1].clone() for s in seqs]
    data = Sequences(tuple(seqs), tuple(feats))
    vocab = most_frequent(torch.bincount(torch.cat(seqs), minlength=257), 128)
    cfg = TrainConfig(steps=12, batch=2, window=16, seed=3)

    def fresh() -> EagleHead:
        torch.manual_seed(0)
        return EagleHead(pair.target, vocab, intermediate_size=32)

    whole = fresh()
    losses = train(whole, data, cfg)
    saved: list[TrainState] = []
    stopped = fresh()
    train(stopped, data, TrainConfig(**{**cfg.__dict__}), checkpoint=saved.append, every=5)
    path = tmp_path / "checkpoint.safetensors"
    save_tree(path, dataclasses.asdict(saved[0]))  # through the file format, as a stopped run would
    resumed = fresh()  # a new process: fresh weights, then the step-5 checkpoint read back
    again = train(resumed, data, cfg, resume=TrainState(**load_tree(path)))
    assert saved[0].step == 5 and again == losses
    for k, v in whole.weights().items():
        assert torch.equal(v, resumed.weights()[k]), k


def test_the_same_recipe_makes_the_same_file(trained, tmp_path, monkeypatch):
    """Seeded from prompts to windows: a second run from nothing (its own cache) writes the very same bytes here."""
    folder, _ = trained
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    assert main(TINY_ARGS + ["--out", str(tmp_path / "heads")]) == 0
    assert sha256_file(tmp_path / "heads" / "tiny-random.safetensors") == heads.manifest("tiny-random", folder)["sha256"]


def test_the_tiny_pair_ships_a_checked_head():
    pair = models.load_pair("tiny-random")
    assert pair.head is not None and pair.head_problem == ""
    assert heads.manifest("tiny-random")["sha256"] == sha256_file(heads.paths("tiny-random")[0])


def test_bad_arguments_are_one_line_errors(capsys):
    assert main(["train-head", "--pair", "tiny-random", "--prompts", "10"]) == 2
    assert "--prompts must be at least 80" in capsys.readouterr().err
    assert main(["train-head", "--pair", "tiny-random", "--steps", "0"]) == 2
    assert "--steps must be at least 1" in capsys.readouterr().err
    for bad, says in (("40", "PROMPTS:SEED"), ("40:x", "PROMPTS:SEED"), ("0:3", "at least 1 prompt"),
                      ("40:0", "seed 0 is used by another recording")):
        assert main(["train-head", "--pair", "tiny-random", "--also-record", bad]) == 2
        assert says in capsys.readouterr().err


def test_beside_an_fp16w_target_the_head_holds_fp16_matrices_and_drafts_the_same_guesses():
    """The shipped head's values are fp16 already (its file, the target's rows), so fp16 storage loses nothing: the
    greedy runs stay the target's, and the head's guesses match its fp32 twin's on the same target."""
    from specviz.models.half import HalfLinear

    pair = models.load_pair("tiny-random", target_precision="fp16w")
    head = pair.head
    assert isinstance(head.lm_head, HalfLinear) and isinstance(head.fc, HalfLinear)
    wide = heads.load("tiny-random", pair.target)
    for module in wide.modules():  # the fp32 twin: every matrix back in plain fp32
        for name, child in list(module.named_children()):
            if isinstance(child, HalfLinear):
                setattr(module, name, child.to_linear())
    prompt = pair.tokenizer("def add(a, b):")["input_ids"]
    config = GenerationConfig(max_new_tokens=16, gamma=3)
    plain = drain(autoregressive_generate(pair.target, pair.tokenizer, prompt, config))
    runs = []
    for h in (head, wide):
        drafter = EagleDrafter(h)
        runs.append(drain(speculative_generate(pair.target, drafter, pair.tokenizer, prompt, config)))
    for run in runs:
        assert run.tokens == plain.tokens
    assert [r.draft_ids for r in runs[0].rounds] == [r.draft_ids for r in runs[1].rounds]


def test_a_run_goes_on_from_a_checked_head_with_the_training_time_test(trained, tmp_path, monkeypatch, capsys):
    """--start-from puts a shipped head's tensors in, checked by its sha256; the manifest names it and scores each
    guess of a chain before and after (the start head's scores are the `before`)."""
    folder, _ = trained
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    args = TINY_ARGS + ["--unroll", "3", "--start-from", str(folder), "--out", str(tmp_path / "heads")]
    assert main(args) == 0
    start, man = heads.manifest("tiny-random", folder), heads.manifest("tiny-random", tmp_path / "heads")
    assert man["recipe"]["start_sha256"] == start["sha256"] and man["recipe"]["train"]["unroll"] == 3
    assert man["started_from"]["recipe"] == start["recipe"]
    by_guess = man["held_out"]["by_guess"]["sampled_acceptance"]
    assert len(by_guess) == 3
    # the start head's first guess, scored on the same held-out chunk by both runs
    assert by_guess[0][0] == pytest.approx(start["held_out"]["sampled_acceptance"][1], abs=1e-4)

    assert main(TINY_ARGS + ["--start-from", str(tmp_path)]) == 2  # no head there
    assert "--start-from" in capsys.readouterr().err


def test_a_start_head_that_is_not_the_recipes_is_refused(trained):
    folder, pair = trained
    man = heads.manifest("tiny-random", folder)
    recipe = HeadRecipe(pair="tiny-random", record=RecordConfig(), train=TrainConfig(), start_sha256="0" * 64)
    with pytest.raises(RuntimeError, match="the recipe names 000000000000"):
        start_head(pair.target, recipe, folder)
    with pytest.raises(RuntimeError, match="--start-from"):
        start_head(pair.target, recipe, None)
    tensors, vocab, found = start_head(pair.target, dataclasses.replace(recipe, start_sha256=man["sha256"]), folder)
    head = heads.load("tiny-random", pair.target, folder)
    assert found["sha256"] == man["sha256"] and torch.equal(vocab.ids, head.vocab.ids)
    assert all(torch.equal(v.half().float(), head.weights()[k].float()) for k, v in tensors.items())


def test_pieces_of_code_are_read_as_the_head_hears_the_target():
    """A prefill pass of whole datastore pieces gives each piece's features as a run hands them to a drafter (the
    last layer after the final norm), in the recorded sequences' shape: T ids, T-1 feature rows."""
    pair = models.load_pair("tiny-random")
    docs = [list(range(30, 30 + n)) for n in (10, 40, 70)]
    pieces = text_pieces(docs, 60, seed=1, piece=16)
    assert len(pieces) == 4 and all(len(p) == 16 for p in pieces)  # 2 + 4 whole pieces, shuffled, 4 kept
    assert text_pieces(docs, 60, seed=1, piece=16) == pieces
    rows = read_pieces(pair.target, pieces)
    for piece, row in zip(pieces, rows):
        with torch.inference_mode():
            full = pair.target(input_ids=torch.tensor([piece]), output_hidden_states=True).hidden_states[-1][0]
        assert row["ids"].tolist() == piece and row["feats"].shape == (15, full.shape[-1])
        assert torch.allclose(row["feats"].float(), full[:-1].half().float(), atol=1e-3)


def test_a_recipe_with_code_to_read_trains_on_it_too(tmp_path, monkeypatch):
    """--text-tokens reads whole datastore pieces through the target (6 pieces of 512 hold 3000 tokens) and trains on them."""
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    assert main(TINY_ARGS + ["--text-tokens", "3000", "--out", str(tmp_path / "heads")]) == 0
    man = heads.manifest("tiny-random", tmp_path / "heads")
    assert man["recipe"]["text_tokens"] == 3000 and man["counts"]["text_tokens"] == 6 * 512
    assert len(list((tmp_path / "cache").rglob("text-*.safetensors"))) == 1


def test_a_further_recording_leaves_out_prompts_that_open_held_out_text():
    held = Sequences((torch.tensor([5, 6, 7, 8, 9]), torch.tensor([1, 2, 3])), (torch.zeros(4, 2), torch.zeros(2, 2)))
    rows = [{"ids": torch.tensor([5, 6, 7, 1, 1]), "prompt": 3},  # the held-out opening 5 6 7, another continuation
            {"ids": torch.tensor([5, 6, 1, 1]), "prompt": 2},  # a shorter opening of the same held-out text
            {"ids": torch.tensor([5, 1, 7, 8]), "prompt": 3},
            {"ids": torch.tensor([1, 2, 3, 4]), "prompt": 4}]  # longer than the held-out sequence it starts like
    kept, left_out = leave_out_held(rows, held)
    assert left_out == 2 and kept == rows[2:]
    with pytest.raises(RuntimeError, match="record it again"):
        leave_out_held([{"ids": torch.tensor([1, 2])}], held)


def test_a_recipe_goes_on_with_a_further_recording(trained, tmp_path, monkeypatch):
    """--also-record records more prompts with another seed (prompt lengths kept) and trains on them beside the first
    recording, whose cached chunks are found again and whose last chunk stays the held-out one: a head goes on with
    more data."""
    folder, _ = trained
    monkeypatch.setenv("SPECVIZ_CACHE", str(folder.parent / "cache"))  # the first recording is there already
    recipe = HeadRecipe(pair="tiny-random", record=RecordConfig(prompts=80, new_tokens=24, seed=0), train=TrainConfig(),
                        record_precision="fp32")
    recorded = {p: p.stat().st_mtime_ns for p in data_folder(recipe).glob("chunk-*.safetensors")}
    assert len(recorded) == 2
    assert main(TINY_ARGS + ["--also-record", "40:1", "--start-from", str(folder), "--out", str(tmp_path / "heads")]) == 0
    man, first = heads.manifest("tiny-random", tmp_path / "heads"), heads.manifest("tiny-random", folder)
    assert [(r["prompts"], r["seed"]) for r in man["recipe"]["also_record"]] == [(40, 1)]
    assert {p: p.stat().st_mtime_ns for p in data_folder(recipe).glob("chunk-*.safetensors")} == recorded  # not again
    more = dataclasses.replace(recipe.record, prompts=40, seed=1)
    rows = load_rows(sorted(data_folder(recipe, more).glob("chunk-*.safetensors")))
    assert len(rows) == 40 and all(0 < r["prompt"] < len(r["ids"]) for r in rows)
    main_rows = load_rows(sorted(data_folder(recipe).glob("chunk-*.safetensors")))
    held = Sequences(tuple(r["ids"] for r in main_rows[40:]), tuple(r["feats"] for r in main_rows[40:]))
    kept, left_out = leave_out_held(rows, held)
    assert man["counts"]["left_out_sequences"] == left_out
    assert man["counts"]["recorded_tokens"] == first["counts"]["recorded_tokens"] + sum(len(r["ids"]) for r in kept)
    # the start head scored on the same held-out chunk by both runs
    assert man["held_out"]["sampled_acceptance"][0] == pytest.approx(first["held_out"]["sampled_acceptance"][1], abs=1e-4)
    assert man["started_from"]["sha256"] == first["sha256"]
