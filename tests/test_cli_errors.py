"""Bad input to any subcommand is one line on stderr, exit 2, no traceback, nothing written.

``swa-repro mask``'s cases run as real ``python -m swa_repro.cli`` processes, one each. The table
of every subcommand's bad inputs (:data:`TABLE`) runs in one process through ``cli.main``, with
file descriptors 1 and 2 captured per invocation, so anything any layer prints (argparse, a logger,
a traceback) is seen; :func:`test_in_process_driver_matches_real_processes` holds it to real ones.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from conftest import REPO, run_cli
from swa_repro.cli import COMMANDS, build_parser

BASE = {"--prefix-lens": "0,8", "--extend-lens": "8,8", "--num-qo-heads": "4", "--num-kv-heads": "4",
        "--head-dim": "128", "--window-left": "4"}

BAD = {
    "window -2": ({"--window-left": "-2"}, "window_left"),
    "plan window -2": ({"--plan-window-left": "-2"}, "window_left"),
    "6 qo heads over 4 kv heads": ({"--num-qo-heads": "6", "--num-kv-heads": "4"}, "multiple"),
    "more kv heads than qo heads": ({"--num-qo-heads": "4", "--num-kv-heads": "8"}, "num_kv_heads"),
    "head_dim 96": ({"--head-dim": "96"}, "head_dim"),
    "empty --extend-lens": ({"--extend-lens": "", "--prefix-lens": ""}, "empty batch"),
    "mismatched lengths": ({"--prefix-lens": "0,8,16"}, "one prefix length per request"),
    "not integers": ({"--extend-lens": "8,x"}, "comma-separated integers"),
    "unknown backend": ({"--backend": "fa9"}, "backend"),
    # issue 12: numpy tried to allocate 8.88 PiB / accepted silently
    "extend 99999999: too large to model": ({"--prefix-lens": "0", "--extend-lens": "99999999"}, "2**24"),
    "1000000 qo heads over 1 kv head": ({"--num-qo-heads": "1000000", "--num-kv-heads": "1"}, "65535"),
    "keys past int32": ({"--prefix-lens": "3000000000,0"}, "2**31 - 1"),
    "16385 requests": ({"--prefix-lens": ",".join(["0"] * 16385), "--extend-lens": ",".join(["1"] * 16385)}, "16384"),
}


def _argv(overrides: dict, out) -> list[str]:
    args = ["mask", "--mode", "model", "--out", str(out)]
    for k, v in {**BASE, **overrides}.items():
        args += [k, v]
    return args


def _one_error_line(stderr: str, command: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith(f"swa-repro {command}: error:"), lines[0]
    return lines[0]


@pytest.mark.parametrize("name", list(BAD))
def test_bad_mask_input_is_one_line_exit_2(name, cli, tmp_path):
    overrides, must_mention = BAD[name]
    out = tmp_path / "m.npz"
    r = cli(*_argv(overrides, out))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert must_mention in _one_error_line(r.stderr, "mask")
    assert r.stdout == ""
    assert not out.exists()


@pytest.mark.parametrize("out, flags, must_mention", [
    ("/nonexistent/dir/x.npz", [], "folder /nonexistent/dir does not exist"),  # issue 12: FileNotFoundError
    ("m.txt", [], ".npz or .json"),
    ("m.json", ["--dense"], "--dense writes an .npz"),
    ("m.npz", ["--dense", "--prefix-lens", "0", "--extend-lens", "40000"], "drop --dense"),
], ids=["out folder missing", "out not npz or json", "dense to json", "dense over 1 GiB"])
def test_bad_mask_output_is_one_line_exit_2(out, flags, must_mention, cli, tmp_path):
    r = cli(*_argv({}, out), *flags, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert must_mention in _one_error_line(r.stderr, "mask")
    assert list(tmp_path.iterdir()) == []


def test_unknown_flag_is_one_line_exit_2(cli, tmp_path):
    r = cli(*_argv({}, tmp_path / "m.npz"), "--no-such-flag")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "--no-such-flag" in r.stderr


def test_good_input_still_works(cli, tmp_path):
    """The same base case is accepted: the failures above come from the bad values, not the harness."""
    out = tmp_path / "m.npz"
    r = cli(*_argv({}, out))
    assert r.returncode == 0, r.stderr
    assert out.exists()


# ----------------------------------------------------------------------------- every subcommand
# Placeholders: {FILE} an existing file, {MISSING} a path that does not exist, {HOSTNAME} a file
# holding a host name (issue 12: `audit --sglang-source /etc/hostname` ended in a NameError),
# {SYNTAX} a .py that does not parse, {EMPTY} an empty .py, {NB} a notebooks folder (NB_PARAMS).
# All lie outside the working folder.
# Each entry: (argv, a string the one line must contain). Every one must fail before any work.
HUGE = "9" * 20  # past int64: an OverflowError wherever it reaches numpy unchecked (issue 17)
# {NB}: 00_a and 01_b with these parameters cells, 02_c with none; `run` must check each selected one.
NB_PARAMS = {"00_a": 'seed = 0\nratio = 0.5\nflag = True\nsizes = [1, 2]\nanything = None\nname = "x"\n',
             "01_b": 'name = "y"\n', "02_c": None}


def _run_nb(*argv: str) -> list[str]:
    return ["run", "--notebooks-dir", "{NB}", *argv]


TABLE: dict[str, list[tuple[list[str], str]]] = {
    "run": [(["run", "no_such_notebook"], "unknown notebook"),
            (["run", "--parameters", "oops"], "name=value"),
            (["run", "--output", "{FILE}"], "is a file"),
            (["run", "--output", "{FILE}/sub"], "cannot be created"),
            (["run", "--notebooks-dir", "{MISSING}"], "no notebooks"),
            # issue 17: --parameters against each selected notebook's parameters cell
            (["run", "--parameters", "no_such_parameter=1"], "--parameters no_such_parameter: notebook 00_overview"),
            (_run_nb("00", "-p", "nope=1"), "--parameters nope: notebook 00_a has no such parameter"),
            (_run_nb("-p", "seed=1"), "--parameters seed: notebook 01_b has no such parameter"),
            (_run_nb("02", "-p", "name=z"), "--parameters: notebook 02_c has no cell tagged parameters"),
            (_run_nb("00", "-p", "sizes=[1,2"), "--parameters sizes=[1,2 does not parse"),
            (_run_nb("00", "-p", "seed=abc"), "--parameters seed: notebook 00_a expects int"),
            (_run_nb("00", "-p", "seed=true"), "--parameters seed: notebook 00_a expects int"),
            (_run_nb("00", "-p", "seed=1.5"), "--parameters seed: notebook 00_a expects int"),
            (_run_nb("00", "-p", "flag=1"), "--parameters flag: notebook 00_a expects bool"),
            (_run_nb("00", "-p", 'sizes=[1,"a"]'), "--parameters sizes: notebook 00_a expects a list of int"),
            (_run_nb("00", "-p", f"seed={HUGE}"), "--parameters seed: 99999999999999999999 is outside int64"),
            (_run_nb("00", "-p", f"anything=[1,{HUGE}]"), "--parameters anything: 99999999999999999999 is outside"),
            (["run", "--cell-timeout", "0"], "--cell-timeout must be in 1..86400"),
            (["run", "--jobs", HUGE], "--jobs must be in 1..64"),
            (_run_nb(""), "unknown notebook ''")],
    "doctor": [(["doctor", "--bogus"], "--bogus"), (["doctor", "extra"], "extra")],
    "mask": [(_argv({}, "{MISSING}/x.npz"), "does not exist"),
             (_argv({"--prefix-lens": "0", "--extend-lens": "99999999"}, "m.npz"), "2**24"),
             (_argv({"--num-qo-heads": "1000000", "--num-kv-heads": "1"}, "m.npz"), "65535"),
             (_argv({}, "m.npz") + ["--dense", "--prefix-lens", "0", "--extend-lens", "40000"], "drop --dense"),
             (_argv({}, "{FILE}/m.npz"), "is a file"),
             (_argv({"--window-left": HUGE}, "m.npz"), "--window-left must be in -1..2147483647"),
             (_argv({"--plan-window-left": HUGE}, "m.npz"), "--plan-window-left must be in -1..2147483647"),
             (_argv({"--page-size": HUGE}, "m.npz"), "--page-size must be in 1..4096"),
             (_argv({"--sm-count": HUGE}, "m.npz"), "--sm-count must be in 1..1024")],
    "record": [(["record", "--cases", "nope"], "unknown case"),
               (["record", "--repeats", "0"], "--repeats"),
               (["record", "--out", "{FILE}"], "is a file"),
               (["record", "--cases", ","], "--cases selects no case"),
               (["record", "--repeats", HUGE], "--repeats must be in 1..10"),
               (["record", "--random-runs", "-1"], "--random-runs must be in 0..10"),
               (["record", "--list", "--jit-workers", "0"], "--jit-workers must be in 1..64")],
    "bundle": [(["bundle", "--out", "b"], "--flashinfer VERSION or --notebooks"),
               (["bundle", "--flashinfer", "0.6.12", "--notebooks", "--out", "b"], "one bundle per folder"),
               (["bundle", "--flashinfer", "0.6.12", "--out", "{FILE}"], "is a file"),
               (["bundle", "--flashinfer", "0.6.12", "--wheel-dir", "{MISSING}", "--out", "b"], "--wheel-dir"),
               (["bundle", "--flashinfer", "0.6.12", "--python", "99999", "--out", "b"], "--python must be 3.9..3.14"),
               (["bundle", "--sglang", "--python", "3.99", "--out", "b"], "--python must be 3.9..3.14")],
    "patch": [(["patch", "frobnicate"], "invalid choice"),
              (["patch", "status", "--source", "{MISSING}"], "no such file"),
              (["patch", "apply", "--out", "x.py", "--in-place"], "choose one of"),
              (["patch", "diff", "--out", "x.py"], "go with `apply`")],
    "sglang-check": [(["sglang-check", "--cases", "nope"], "unknown case"),
                     (["sglang-check", "--mode", "model", "--trace-dir", "{FILE}"], "is a file"),
                     (["sglang-check", "--mode", "bogus"], "invalid choice"),
                     (["sglang-check", "--cases", ","], "--cases selects no case"),
                     (["sglang-check", "--cases", ""], "--cases selects no case"),
                     (["sglang-check", "--kit-only", "--sglang", "0.5.12"], "has no attention test kit"),
                     (["sglang-check", "--kit-only", "--sglang", "0.5"], "give a release number"),
                     (["sglang-check", "--kit-only", "--sglang", "0.5.23", "--fix", "nope"], "--fix: unknown nope"),
                     (["sglang-check", "--kit-only", "--sglang", "0.5.23", "--fix", ","], "--fix selects no fix"),
                     (["sglang-check", "--kit-only", "--fix", "all"], "give --sglang VERSION too"),
                     (["sglang-check", "--kit-only", "--peer"], "drop --cases/--peer/--trace-dir"),
                     (["sglang-check", "--sglang", "0.5.23"], "--sglang/--fix go with --kit-only")],
    "replay": [(["replay", "{MISSING}.pt"], "does not exist"),
               (["replay", "{FILE}"], "cannot read trace"),
               (["replay", "x.pt", "--out", "{MISSING}/r.json"], "does not exist"),
               (["replay", "x.pt", "--out", "r.txt"], ".json"),
               (["replay", "x.pt", "--atol", "nan"], "--atol must be in 0..10"),
               (["replay", "x.pt", "--atol", "1e9"], "--atol must be in 0..10")],
    "audit": [(["audit", "--paths", "nope"], "--paths"),
              (["audit", "--no-such-flag"], "--no-such-flag"),
              (["audit", "--sglang-source", "{HOSTNAME}"], "--sglang-source"),
              (["audit", "--sglang-source", "{SYNTAX}"], "--sglang-source"),
              (["audit", "--sglang-source", "{EMPTY}"], "--sglang-source"),
              (["audit", "--paths", ","], "--paths selects no path"),
              (["audit", "--paths", ""], "--paths selects no path"),
              (["audit", "--release-table", "--releases", ",", "--out", "t"], "--releases selects no release"),
              (["audit", "--release-table", "--jobs", HUGE], "--jobs must be in 1..32"),
              (["audit", "--live-budget", "nan"], "--live-budget must be in 1..3600")],
    "fuzz": [(["fuzz", "--backends", "fa9"], "--backends"),
             (["fuzz", "--repeats", "0"], "--repeats"),
             (["fuzz", "--cases", "99999999999999999999"], "--cases must be in 1..5000"),
             (["fuzz", "--seed", "-1"], "--seed must be in"),
             (["fuzz", "--max-tokens", "100000000"], "--max-tokens must be in"),
             (["fuzz", "--budget-s", "1e9"], "--budget-s must be in"),
             (["fuzz", "--plans", "fa3:maybe"], "--plans"),
             (["fuzz", "--plans", ","], "selects no plan variant"),
             (["fuzz", "--mode", "selftest", "--out", "{FILE}"], "is a file"),
             (["fuzz", "--mode", "selftest", "--report", "{FILE}/r.json"], "is a file"),
             (["fuzz", "--mode", "model", "--recordings", "{MISSING}"], "no fuzz recordings"),
             (["fuzz", "--backends", ""], "--backends"),
             (["fuzz", "--head-dims", ","], "--head-dims")],
}

# One process runs every invocation through cli.main; fds 1/2 go to a temp file per invocation.
DRIVER = r"""
import json, os, sys, tempfile, traceback
from swa_repro.cli import main

def tree(root):
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, ds, fs in os.walk(root) for n in ds + fs)

root, cases, report = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
results = []
for argv in cases:
    before = tree(root)
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        sys.stdout.flush(); sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(fo.fileno(), 1); os.dup2(fe.fileno(), 2)
        try:
            try:
                rc = main(argv)
            except SystemExit as e:
                rc = e.code
            except BaseException:
                traceback.print_exc()
                rc = "uncaught"
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os.dup2(saved[0], 1); os.dup2(saved[1], 2)
            os.close(saved[0]); os.close(saved[1])
        fe.seek(0)
        err = fe.read().decode(errors="replace")
    results.append({"argv": argv, "rc": rc, "stderr": err, "new": sorted(set(tree(root)) - set(before))})
with open(report, "w") as f:
    json.dump(results, f)
"""


def _fixtures(tmp_path):
    """``(cwd, placeholders)``: an empty working folder and the files the table names, beside it."""
    fx = tmp_path / "fixtures"
    fx.mkdir()
    (fx / "a_file").write_text("not a folder\n")
    (fx / "hostname").write_text("vm-4f2a\n")  # parses as Python (a name), executes to NameError
    (fx / "syntax.py").write_text("def f(:\n")
    (fx / "empty.py").write_text("")
    (fx / "nb").mkdir()
    for name, cell in NB_PARAMS.items():
        params = f'# %% tags=["parameters"]\nmode = "auto"\noutput_dir = "out"\n{cell}\n' if cell else ""
        (fx / "nb" / f"{name}.py").write_text(f"{params}# %%\nraise SystemExit('ran: nothing may run')\n")
    cwd = tmp_path / "work"
    cwd.mkdir()
    return cwd, {"{FILE}": str(fx / "a_file"), "{MISSING}": str(fx / "missing"), "{HOSTNAME}": str(fx / "hostname"),
                 "{SYNTAX}": str(fx / "syntax.py"), "{EMPTY}": str(fx / "empty.py"), "{NB}": str(fx / "nb")}


def _tree(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _fill(argv: list[str], ph: dict) -> list[str]:
    out = []
    for a in argv:
        for k, v in ph.items():
            a = a.replace(k, v)
        out.append(a)
    return out


def run_in_process(tmp_path, invocations: list[list[str]]) -> list[dict]:
    report = tmp_path / "report.json"
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path / "work"), json.dumps(invocations), str(report)],
                       cwd=tmp_path / "work", capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(report.read_text())
    report.unlink()
    return results


def test_table_covers_every_subcommand():
    """A new subcommand fails here until its bad inputs are in TABLE."""
    assert set(TABLE) == set(COMMANDS)
    short = {k: len(v) for k, v in TABLE.items() if len(v) < 2}
    assert not short, f"give every subcommand at least two bad inputs: {short}"
    assert all(argv[0] == cmd for cmd, rows in TABLE.items() for argv, _ in rows)


def test_every_subcommand_rejects_bad_input_in_one_line(tmp_path):
    cwd, ph = _fixtures(tmp_path)
    rows = [(cmd, _fill(argv, ph), must) for cmd, rs in TABLE.items() for argv, must in rs]
    fixtures = _tree(tmp_path / "fixtures")
    results = run_in_process(tmp_path, [argv for _, argv, _ in rows])
    bad = []
    for (cmd, argv, must), res in zip(rows, results):
        lines = res["stderr"].strip().splitlines()
        ok = (res["rc"] == 2 and len(lines) == 1 and "Traceback" not in res["stderr"]
              and lines[0].startswith("swa-repro") and must in lines[0] and not res["new"])
        if not ok:
            bad.append(f"{' '.join(argv)[:160]}\n    rc={res['rc']} new={res['new']} stderr={res['stderr'][-600:]!r}")
    assert not bad, f"{len(bad)} of {len(rows)} bad invocations misbehave:\n" + "\n".join(bad)
    assert list(cwd.iterdir()) == [] and _tree(tmp_path / "fixtures") == fixtures


# What each subcommand needs besides the number under test to reach its checks.
NEEDS = {"mask": _argv({}, "m.npz")[1:], "replay": ["x.pt"]}
# argparse reads "-1e30" as an option; "-1000...0.0" it takes for a negative number
EXTREMES = {int: ("-" + HUGE, HUGE), float: ("-1" + "0" * 30 + ".0", "1e30")}


def numeric_options() -> list[tuple[str, str, str, type]]:
    """(subcommand, flag, dest, type) of every option of every subcommand that takes a number."""
    out = []
    for cmd in COMMANDS:
        parser = build_parser([cmd])
        [subs] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        out += [(cmd, a.option_strings[0], a.dest, a.type) for a in subs.choices[cmd]._actions
                if a.option_strings and a.type in EXTREMES]
    return out


def test_every_number_of_every_subcommand_is_bounded_both_ways(tmp_path):
    """Issue 17: no number may go unbounded (a run of hours, an OverflowError). Each numeric option
    at -/+ 10**20 is one line naming it, exit 2, nothing written; a new option fails here until it
    has bounds."""
    options = numeric_options()
    assert {("mask", "--window-left"), ("run", "--jobs"), ("fuzz", "--cases"), ("replay", "--atol")} <= \
        {(c, f) for c, f, _, _ in options}
    cwd, _ = _fixtures(tmp_path)
    rows = [(cmd, flag, dest, [cmd, *NEEDS.get(cmd, []), flag, value])
            for cmd, flag, dest, kind in options for value in EXTREMES[kind]]
    results = run_in_process(tmp_path, [argv for *_, argv in rows])
    bad = []
    for (cmd, flag, dest, argv), res in zip(rows, results):
        lines = res["stderr"].strip().splitlines()
        ok = (res["rc"] == 2 and len(lines) == 1 and "Traceback" not in res["stderr"]
              and (flag in lines[0] or dest in lines[0]) and not res["new"])
        if not ok:
            bad.append(f"{' '.join(argv)[-120:]}\n    rc={res['rc']} new={res['new']} stderr={res['stderr'][-400:]!r}")
    assert not bad, f"{len(bad)} of {len(rows)} out-of-range numbers misbehave:\n" + "\n".join(bad)
    assert list(cwd.iterdir()) == []


def test_in_process_driver_matches_real_processes(tmp_path):
    """The driver is faithful: a sample of the table gives the same status and stderr as
    ``python -m swa_repro.cli`` in its own process."""
    cwd, ph = _fixtures(tmp_path)
    sample = [_fill(argv, ph) for argv, _ in (TABLE["mask"][0], TABLE["mask"][2], TABLE["doctor"][0])]
    inproc = run_in_process(tmp_path, sample)
    for argv, res in zip(sample, inproc):
        real = run_cli(*argv, cwd=cwd)
        assert (res["rc"], res["stderr"]) == (real.returncode, real.stderr), argv
