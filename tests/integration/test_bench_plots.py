"""``kvstore-bench ... --plot``: a figure from a real run, and a path that cannot be written refused
in one line before anything runs (the figures themselves are drawn in the benchmarks' smoke tests)."""

import json

import pytest
from helpers import assert_png

from kvstore_tools.bench.cli import main
from kvstore_tools.bench.plots import accuracy_paths


def test_accuracy_figure_of_a_toy_run(tmp_path, capsys):
    rc = main(
        [
            "accuracy",
            "--task",
            "kv",
            "--path",
            "summary@0.25",
            "--examples",
            "2",
            "--tokens",
            "256",
            "--threads",
            "1",
            "--data-dir",
            str(tmp_path),
            "--json",
            "--plot",
            str(tmp_path / "accuracy.png"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    report = json.loads(out)
    assert_png(tmp_path / "accuracy.png")
    ((name, point),) = accuracy_paths(report).items()  # the one path the toy harness runs, drawn at its budget
    assert name == "summary@0.25" and point["correct"] == report["correct"] and point["examples"] == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["io", "--size", "8m", "--runtime", "0.2", "--data-dir", "WORK"],
        ["reprefill", "--model", "tiny", "--prefix-tokens", "64", "--data-dir", "WORK"],
        ["reprefill", "--workload", "zipf", "--model", "tiny", "--prefix-tokens", "64", "--data-dir", "WORK"],
        ["accuracy", "--task", "kv", "--path", "full", "--data-dir", "WORK"],
        ["accuracy", "--model", "smollm2-135m", "--task", "passkey", "--path", "full", "--data-dir", "WORK"],
        ["recall", "--model", "smollm2-135m"],  # writes nothing but the figure
    ],
    ids=["io", "reprefill", "zipf", "accuracy", "accuracy-model", "recall"],
)
@pytest.mark.parametrize(
    ("plot", "says"),
    [("missing/fig.png", "does not exist"), (".", "is a directory"), ("fig.jpg", "must end in .png, .pdf or .svg")],
    ids=["no-directory", "directory", "extension"],
)
def test_unwritable_plot_path_is_one_line_before_any_work(tmp_path, capsys, argv, plot, says):
    work = str(tmp_path / "work")
    rc = main([work if a == "WORK" else a for a in argv] + ["--plot", str(tmp_path / plot)])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("kvstore-bench: error: --plot ") and says in err, err
    assert not (tmp_path / "work").exists()  # refused before the benchmark made anything
