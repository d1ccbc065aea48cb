"""The transformers sparse path (``integrations.transformers_sparse``) against the Re-Prefill runner, through a real daemon.

From one prefix the runner stored, ``SparseReprefill.generate`` (transformers' own model, loaded
from the same GGUF or checkpoint) and ``ModelRunner.generate`` (the project's decoder) run the
same ``ReprefillConfig``: every Period chooses the same chunks, the same rows are loaded (and
stand in), the first-token logits agree to float32 rounding and the greedy tokens are equal.
"""

import argparse
import warnings

import pytest
import torch

from engine_client.client import KVStoreClient

transformers = pytest.importorskip("transformers", reason="needs the test extra: pip install -e '.[test]' (transformers)")
pytest.importorskip("accelerate", reason="transformers loads GGUF files only with accelerate: pip install -e '.[test]'")

from pretrained import hf_smollm2, needs_smollm2  # noqa: E402

from engine_client.integrations.transformers_cache import KVStorePrefixCache  # noqa: E402
from engine_client.integrations.transformers_sparse import SparseReprefill  # noqa: E402
from engine_client.model import zoo  # noqa: E402
from engine_client.reprefill import Budget, ModelRunner, ReprefillConfig, parse_system  # noqa: E402
from kvstore.contract import InvalidArgument, NotFound  # noqa: E402
from kvstore_tools.tasks import text  # noqa: E402

NEW_TOKENS = 8
LOGITS_ATOL = 1e-3  # float32 on both sides; measured about 4e-5 on SmolLM2
SYSTEMS = {
    "every layer, 4-bit probes": ReprefillConfig().replace(standin_layers=()),
    "stand-ins at layer 19": ReprefillConfig().replace(standin_layers=(19,)),
    "8-layer Periods, key summaries": parse_system("summary", budget=Budget.fraction(0.1)),
    "whole KV": ReprefillConfig().replace(budget=Budget.fraction(1.0), standin_layers=()),
}


def assert_same_as_runner(runner, sparse, prefix_id, suffix, cfg, layers: int):
    ours = runner.generate(prefix_id, suffix, cfg, NEW_TOKENS, eos_token_ids=())
    theirs = sparse.generate(prefix_id, suffix, cfg, NEW_TOKENS, eos_token_ids=())
    a, b = ours.reprefill, theirs.reprefill
    assert len(b.selected) == len(a.selected) and all(torch.equal(x, y) for x, y in zip(a.selected, b.selected))
    assert (b.tokens_loaded, b.standin_rows, b.standin_layers) == (a.tokens_loaded, a.standin_rows, a.standin_layers)
    assert b.kv_fraction == pytest.approx(a.kv_fraction)
    diff = (a.logits.float() - theirs.logits).abs().max().item()
    assert diff < LOGITS_ATOL
    assert theirs.tokens == ours.tokens and len(theirs.tokens) == NEW_TOKENS and theirs.stop == "length"
    return diff, b


@pytest.fixture(scope="module")
def smollm2():
    torch.set_num_threads(min(2, torch.get_num_threads()))
    model, tok = hf_smollm2("float32")
    return model, tok, zoo.load("smollm2-135m", dtype=torch.float32)


@needs_smollm2
def test_smollm2_sparse_path_is_the_runners(daemon, smollm2):
    model, tok, pm = smollm2
    ex = text.examples("niah", pm.tokenizer, 1, 512)[0]
    with KVStoreClient(daemon.target) as client:
        runner = ModelRunner(pm.decoder, client, standin_layers=None)
        sparse = SparseReprefill(KVStorePrefixCache(client, model, tok))
        prefix = runner.store_prefix(ex.prefix_tokens)
        for name, cfg in SYSTEMS.items():
            diff, res = assert_same_as_runner(runner, sparse, prefix.prefix_id, ex.suffix_tokens, cfg, 30)
            print(
                f"{name}: {len(res.selected)} Periods equal, {res.tokens_loaded} rows, {res.standin_rows} stand-in rows, logits {diff:.2g}"
            )
            assert (res.standin_rows > 0) == name.startswith("stand-ins")
            if name == "whole KV":
                assert res.kv_fraction == pytest.approx(1.0)
            else:
                assert res.kv_fraction < 0.2 and res.tokens_loaded < 30 * len(ex.prefix_tokens)

        # the whole KV through the sparse path answers as transformers does over the whole prompt
        whole = sparse.generate(prefix.prefix_id, ex.suffix_tokens, SYSTEMS["whole KV"], 12)
        ids = torch.tensor([[*ex.prefix_tokens.tolist(), *ex.suffix_tokens.tolist()]])
        with torch.no_grad():
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)[0, ids.shape[1] :]
        assert whole.tokens == ref.tolist()[: len(whole.tokens)] and ex.is_correct(whole.text)


def test_qwen2_sparse_path_is_the_runners(daemon, tmp_path):
    from engine_client.model.loader import load_checkpoint
    from kvstore_tools.make_checkpoint import make_checkpoint

    path = make_checkpoint(tmp_path / "small", "small", 0, "float32", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    prefix = torch.randint(0, 4096, (300,), generator=torch.Generator().manual_seed(3))
    suffix = torch.randint(0, 4096, (9,), generator=torch.Generator().manual_seed(4))
    with KVStoreClient(daemon.target) as client:
        runner = ModelRunner(load_checkpoint(str(path), dtype=torch.float32), client, standin_layers=None)
        sparse = SparseReprefill(KVStorePrefixCache(client, model))
        pid = runner.store_prefix(prefix).prefix_id
        for cfg in (
            ReprefillConfig().replace(budget=Budget.chunks(4), standin_layers=(2,)),
            parse_system("ckv+int4-probes+period=2+follow=0+query=last:4", budget=Budget.fraction(0.2)),
        ):
            assert_same_as_runner(runner, sparse, pid, suffix, cfg, 4)


def test_requests_it_does_not_run_are_refused_in_one_line(daemon, tmp_path):
    from kvstore_tools.make_checkpoint import make_checkpoint

    path = make_checkpoint(tmp_path / "tiny", "tiny", 0, "float32", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        other = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).eval()
    with KVStoreClient(daemon.target) as client:
        sparse = SparseReprefill(KVStorePrefixCache(client, model))
        pid = KVStorePrefixCache(client, other).generate(list(range(1, 40)), max_new_tokens=1).prefix_id  # another dtype's entry
        cases = [
            ("reselect_every", dict(cfg=ReprefillConfig().replace(reselect_every=4))),
            ("per_head", dict(cfg=parse_system("lserve+per-head", budget=Budget.fraction(0.2)))),
            ("prefix_id", dict()),  # stored for the bfloat16 model: another geometry
            ("suffix_tokens", dict(suffix=[])),
            ("suffix_tokens", dict(suffix=[600])),  # outside the vocabulary of 512
            ("cfg", dict(cfg="exact")),
        ]
        for field, kw in cases:
            with pytest.raises(InvalidArgument) as e:
                sparse.generate(pid, kw.get("suffix", [5, 6]), kw.get("cfg", ReprefillConfig()), 2)
            assert e.value.field == field and "\n" not in str(e.value), str(e.value)
        with pytest.raises(NotFound):
            sparse.generate("0" * 16, [5, 6], ReprefillConfig(), 2)


@needs_smollm2
def test_accuracy_tool_smoke(daemon, smollm2):
    """``python -m kvstore_tools.hf_sparse_accuracy`` on one short example: its report and summary."""
    from kvstore_tools.hf_sparse_accuracy import main, run, summary

    args = argparse.Namespace(task=["passkey"], tokens=320, examples=1, start=0, budgets=[0.1], system="ckv+int4-probes")
    with KVStoreClient(daemon.target) as client:
        report = run(args, client, models=smollm2)
    (row,) = report["tasks"]["passkey"]
    cell = row["0.1"]
    assert row["full"] and cell["periods_equal"] == cell["periods"] == 30 and cell["tokens_equal"] and cell["logit_diff"] < LOGITS_ATOL
    assert cell["runner"] == cell["transformers"] and 0 < cell["kv_fraction"] < 0.5
    text_out = summary(report)
    assert "passkey   full KV (transformers)   1/1" in text_out and "transformers @10%" in text_out and "30/30" in text_out
    with pytest.raises(SystemExit):
        main(["--budgets", "x"])  # argparse's own one-line refusal
