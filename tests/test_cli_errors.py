"""Bad input to `swa-repro mask` is one line on stderr, exit 2, no traceback, nothing written."""

from __future__ import annotations

import pytest

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
}


def _argv(overrides: dict, out) -> list[str]:
    args = ["mask", "--mode", "model", "--out", str(out)]
    for k, v in {**BASE, **overrides}.items():
        args += [k, v]
    return args


@pytest.mark.parametrize("name", list(BAD))
def test_bad_mask_input_is_one_line_exit_2(name, cli, tmp_path):
    overrides, must_mention = BAD[name]
    out = tmp_path / "m.npz"
    r = cli(*_argv(overrides, out))
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert lines[0].startswith("swa-repro mask: error:"), lines[0]
    assert must_mention in lines[0], lines[0]
    assert r.stdout == ""
    assert not out.exists()


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
