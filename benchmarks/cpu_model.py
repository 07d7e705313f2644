"""CPU benchmark: the kernel model on one 32k-token request, and `swa-repro run --mode model`.

    python -m benchmarks.cpu_model                 # kernel model only
    python -m benchmarks.cpu_model --repro         # also time the whole model-mode run

Writes ``benchmarks/results/cpu_model.json`` with provenance. Targets (in ``report.py``): the
kernel model on 32k tokens <= 1 s; the model-mode run <= 3 min on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import CPU_RESULTS, command_line, cpu_provenance, write_json_atomic  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SEQ_LEN = 32768


def model_cases(seq_len: int = SEQ_LEN):
    """One request of ``seq_len`` tokens the sglang way (page_size 1, GQA 32:4, head_dim 128):
    fa2 planned without / with the window, and fa3 without it; the buggy fa2 one is the target."""
    from swa_repro.core.case import Case
    base = Case(prefix_lens=(0,), extend_lens=(seq_len,), num_qo_heads=32, num_kv_heads=4, head_dim=128,
                page_size=1, window_left=4096, plan_window_left=-1, backend="fa2")
    return [
        ("fa2-buggy-W4096", base, False),
        ("fa2-fixed-W4096", base.with_(plan_window_left=4096), False),
        ("fa2-buggy-W128", base.with_(window_left=128), False),
        ("fa3-buggy-W4096", base.with_(backend="fa3"), False),
        ("fa2-buggy-W4096-tiles", base, True),
    ]


def time_call(fn, repeats: int) -> dict:
    fn()  # warm-up: imports, caches
    walls = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t)
    return {"median_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls), "repeats": repeats}


def time_simulate(case, tiles: bool, repeats: int = 3):
    """``(ModelResult, timing)``: one model run and the median of ``repeats`` more (:func:`time_call`)."""
    from swa_repro.kernel.model import simulate
    return simulate(case, tiles=tiles), time_call(lambda: simulate(case, tiles=tiles), repeats)


def bench_kernel_model(seq_len: int, repeats: int) -> list[dict]:
    from swa_repro.kernel.model import simulate
    out = []
    for name, case, tiles in model_cases(seq_len):
        res = simulate(case, tiles=tiles)
        t = time_call(lambda c=case, tl=tiles: simulate(c, tiles=tl), repeats)
        out.append({"name": name, "seq_len": seq_len, "tiles": tiles, "case": case.to_dict(),
                    "status": res.statuses, **t,
                    "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
        print(f"{name:24s} median {t['median_s'] * 1e3:8.1f} ms  status {res.statuses}", flush=True)
    return out


def repro_command(output: str) -> list[str]:
    """What `make repro MODE=model` runs, writing into a scratch directory instead of artifacts/."""
    exe = Path(sys.executable).with_name("swa-repro")
    return [str(exe) if exe.exists() else (shutil.which("swa-repro") or "swa-repro"), "run", "--mode", "model",
            "--output", output]


def bench_repro(cmd: list[str], timeout_s: float) -> dict:
    """Wall time of the whole model-mode run (every notebook), as a user would start it."""
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
        rc, tail = p.returncode, (p.stdout + p.stderr)[-2000:]
    except subprocess.TimeoutExpired as e:
        rc, tail = "timeout", str(e)[-2000:]
    except OSError as e:
        return {"command": shlex.join(cmd), "error": f"{type(e).__name__}: {e}"}
    wall = time.perf_counter() - t
    res = {"command": shlex.join(cmd), "wall_s": wall, "returncode": rc, "output_tail": tail}
    if rc != 0:
        res["error"] = f"exit status {rc}"
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-len", type=int, default=SEQ_LEN)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--repro", action="store_true", help="also time `swa-repro run --mode model`")
    p.add_argument("--repro-timeout-s", type=float, default=1800)
    p.add_argument("--out", type=Path, default=CPU_RESULTS)
    args = p.parse_args(argv)
    doc = {"provenance": cpu_provenance(command_line()), "kernel_model": bench_kernel_model(args.seq_len, args.repeats)}
    write_json_atomic(args.out, doc)
    if args.repro:
        with tempfile.TemporaryDirectory(prefix="swa-repro-bench-") as tmp:
            doc["repro_model_mode"] = bench_repro(repro_command(tmp), args.repro_timeout_s)
            summary = Path(tmp) / "summary.json"
            if summary.exists():  # which notebooks ran, and how long each took
                doc["repro_model_mode"]["notebooks"] = [
                    {k: n.get(k) for k in ("notebook", "status", "mode", "seconds")}
                    for n in json.loads(summary.read_text()).get("notebooks", [])]
        r = doc["repro_model_mode"]
        print(f"{r['command']}: {r.get('wall_s', float('nan')):.1f} s, {r.get('error', 'ok')}")
        write_json_atomic(args.out, doc)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
