"""Where the runner computes: the model's device, with host crossings only at the RPCs, through a real daemon."""

import pytest
import torch
from helpers import calibrated_layers
from torch.overrides import TorchFunctionMode

import engine_client.reprefill.pipeline as pipeline
import engine_client.selection.budget as budget
from engine_client.reprefill import ModelRunner, ReprefillConfig
from kvstore.contract.errors import InvalidArgument

PREFIX = torch.arange(5, 305)  # 19 chunks: 2 per layer at 5%, sink and local
SUFFIX = [3, 4, 5]
RUNNER_FILES = ("reprefill/period.py", "reprefill/pipeline.py", "standin.py", "stream_tail.py")
DECODER_FILES = ("model/decoder.py", "model/kernels.py")  # keep nothing on the host: a sync there on any tensor is a device read
SYNCS = {"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__", "nonzero"}


def test_a_runner_on_the_cpu_by_name_is_the_default_one(daemon, tiny_model):
    from engine_client.client import KVStoreClient

    with KVStoreClient(daemon.target) as client:
        named, default = ModelRunner(tiny_model, client, device="cpu"), ModelRunner(tiny_model, client)
        assert named.device == default.device == torch.device("cpu")
        handle = named.store_prefix(PREFIX)
        a, b = named.reprefill(handle.prefix_id, SUFFIX), default.reprefill(handle.prefix_id, SUFFIX)
    assert torch.equal(a.logits, b.logits) and [s.tolist() for s in a.selected] == [s.tolist() for s in b.selected]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_a_cuda_runner_without_cuda_is_one_clear_refusal(tiny_model):
    with pytest.raises(InvalidArgument) as err:
        ModelRunner(tiny_model, None, device="cuda")
    assert err.value.field == "device" and "no CUDA device" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(InvalidArgument, match="^device: must name a torch device"):
        ModelRunner(tiny_model, None, device="gpu0")


class _Syncs(TorchFunctionMode):
    """Records calls that would wait on a device, made from the runner's own files on floating-point data
    (the row positions, chunk ids and masks it keeps on the host are integers and booleans), or from the
    decoder's on any tensor (its positions live on the device)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in SYNCS and args and isinstance(args[0], torch.Tensor):
            import traceback

            caller = traceback.extract_stack(limit=2)[0]  # the frame that made the call
            where = caller.filename.replace("\\", "/")
            if where.endswith(DECODER_FILES) or (where.endswith(RUNNER_FILES) and args[0].is_floating_point()):
                self.seen.append(f"{name} at {caller.filename}:{caller.lineno}")
        return func(*args, **(kwargs or {}))


def test_the_host_is_reached_only_at_the_rpcs_never_per_layer(tiny_runner, monkeypatch):
    """The set each Period sends, the ranking it comes from, and the masses reported: nothing while a layer computes."""
    calls, computing = [], [False]

    def counted(name, fn):
        def wrapper(*args):
            calls.append((name, computing[0]))
            return fn(*args)

        return wrapper

    def compute(*args, **kwargs):
        computing[0] = True
        with _Syncs() as syncs:
            try:
                return run_period(*args, **kwargs)
            finally:
                computing[0] = False
                assert syncs.seen == []

    run_period = pipeline.run_period
    monkeypatch.setattr(pipeline, "to_host", counted("to_host", pipeline.to_host))
    monkeypatch.setattr(budget, "_scores_on_host", counted("ranking", budget._scores_on_host))
    monkeypatch.setattr(pipeline, "run_period", compute)
    handle = tiny_runner.store_prefix(PREFIX)
    with calibrated_layers(tiny_runner, (1,)):  # stand-in rows at layer 1: the default system's every stage
        res = tiny_runner.reprefill(handle.prefix_id, SUFFIX, ReprefillConfig())
    assert res.standin_layers == (1,) and res.standin_rows > 0
    periods = len(res.selected)  # 2: one per layer
    assert not any(during for _, during in calls)  # none while a layer computes
    # per Period: its ranking and its set (sent); after the first token: its chunks' masses (reported)
    assert sorted(name for name, _ in calls) == ["ranking"] * periods + ["to_host"] * 2 * periods


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a CUDA device")
def test_a_cuda_runner_selects_and_answers_as_the_cpu_one(daemon, tmp_path):
    from engine_client.client import KVStoreClient
    from engine_client.model.loader import load_checkpoint
    from kvstore_tools.make_checkpoint import make_checkpoint

    make_checkpoint(str(tmp_path / "tiny"), "tiny", 0, "float32", 1)
    cpu = load_checkpoint(str(tmp_path / "tiny"), dtype=torch.float32)
    gpu = load_checkpoint(str(tmp_path / "tiny"), dtype=torch.float32, device="cuda")
    with KVStoreClient(daemon.target) as client:
        on_cpu, on_gpu = ModelRunner(cpu, client), ModelRunner(gpu, client, device="cuda")
        handle = on_cpu.store_prefix(PREFIX)
        for cfg in (ReprefillConfig(), ReprefillConfig().replace(selector="summary", probe_bits=0, period_layers=2)):
            a, b = on_cpu.generate(handle.prefix_id, SUFFIX, cfg, 4), on_gpu.generate(handle.prefix_id, SUFFIX, cfg, 4)
            assert b.first_logits.device.type == "cuda" and a.tokens == b.tokens
            assert [s.tolist() for s in a.reprefill.selected] == [s.tolist() for s in b.reprefill.selected]
            torch.testing.assert_close(b.first_logits.cpu(), a.first_logits, atol=1e-4, rtol=1e-4)
        assert on_gpu.state.nbytes == on_cpu.state.nbytes > 0
