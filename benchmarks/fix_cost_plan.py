"""What ``benchmarks/fix_cost.py`` measures (issue #40, "the cost of the fix"): the models' layer
mixes, the cases, the FlashInfer modules they need, how sglang 0.5.23 plans its wrappers ("shipped")
and how the fix plans them ("fixed"), and the goals computed from a results file.

Pure, no torch: ``--dry-run``, the report and the tests run anywhere.

Where each plan comes from (sglang 0.5.23 ``srt/layers/attention/flashinfer_backend.py``; the fix's
edits in ``swa_repro/sglang/fix/``):

* prefill (extend, no prefix, ragged: sglang's default when nothing turns ragged off, :1058-1062):
  shipped, one ragged wrapper, ``backend="auto"`` (:501, :523-525; fa3 on sm90), planned in
  ``call_begin_forward`` with neither window nor cap (:2297-2304), twice per batch, once per wrapper
  id of ``update_sliding_window`` (:2077), and every layer's ``forward(causal=True, sm_scale,
  logits_soft_cap)`` with no window (:1464-1471). Fixed: a second ragged wrapper for the
  sliding-window layers, planned with ``window_left`` (fixes.py:100-157), whose forward passes the
  layer's window (fixes.py:174-182); both ragged plans carry the model's cap (soft_cap.py:96-97).
* decode: two paged decode wrappers, ``backend="fa2"`` (:336, :549-554), without tensor cores for a
  GQA group under 4 (``should_use_tensor_core``, :2709-2713); the sliding one planned over each
  request's last ``window + 1`` keys (:1684-1696), neither with window nor cap (:1859-1873). The fix
  only plans the cap (soft_cap.py:111-122).
* EAGLE verify (a draft tree under a custom mask): two paged prefill wrappers, fa2 (:335), in
  CUDA-graph mode on one packed-mask buffer (:1134-1138, :1184); shipped, the sliding one planned over
  each request's first ``min(seq, window)`` keys plus the draft (the gate ``spec_info is None``,
  :2095-2099; eagle_info.py:90-155 takes no ``kv_start_idx``), no window, no cap; the forward passes
  ``layer.sliding_window_size`` (:1416-1439). Fixed (spec_verify.py:237-288): the whole sequence, the
  tree mask cut to the window on tree positions (:106-155), plan and forward window widened by
  ``draft_token_num - 1`` (:94-103), one mask buffer per wrapper (:177-211), the cap planned.

The layers' window is ``config.sliding_window - 1`` (gemma2.py:52-53, gemma3_causal.py:64-65), their
cap ``config.attn_logit_softcapping`` (gemma2.py:161; gemma3_causal.py:232 passes 0), their scale
``query_pre_attn_scalar ** -0.5`` (gemma2.py:131).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

SGLANG = "sglang 0.5.23 srt/layers/attention/flashinfer_backend.py"
FULL_GOAL = 0.02  # the "full layers within 2% of shipped"
SLIDING_GOAL = 0.0  # "sliding layers no slower"

# The published checkpoints' sizes (google/gemma-2-9b config.json; google/gemma-3-12b-it's text_config);
# every other value (window, cap, layer pattern, scale) is the transformers config class's own.
CHECKPOINTS = {
    "gemma-2-9b": ("Gemma2Config", {"num_hidden_layers": 42, "hidden_size": 3584, "intermediate_size": 14336,
                                    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256}),
    "gemma-3-12b": ("Gemma3TextConfig", {"num_hidden_layers": 48, "hidden_size": 3840, "intermediate_size": 15360,
                                         "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
                                         "sliding_window": 1024}),
}
# What the configs give (transformers 5.12.1: configuration_gemma2.py:87-97, configuration_gemma3.py:96-115),
# used only where transformers is not installed; a test holds it to the configs.
FROZEN = {
    "gemma-2-9b": {"layers": 42, "sliding": 21, "full": 21, "window_left": 4095, "cap": 50.0, "num_qo_heads": 16,
                   "num_kv_heads": 8, "head_dim": 256, "sm_scale": 256 ** -0.5},
    "gemma-3-12b": {"layers": 48, "sliding": 40, "full": 8, "window_left": 1023, "cap": 0.0, "num_qo_heads": 16,
                    "num_kv_heads": 8, "head_dim": 256, "sm_scale": 256 ** -0.5},
}


def model_shapes() -> tuple[dict, str]:
    """``{model: shape}`` from transformers' config classes, and where it came from."""
    try:
        import transformers
    except ImportError:
        return {k: dict(v) for k, v in FROZEN.items()}, "frozen copy (transformers not installed)"
    out = {}
    for name, (cls, sizes) in CHECKPOINTS.items():
        c = getattr(transformers, cls)(**sizes)
        kinds = list(c.layer_types)
        out[name] = {"layers": c.num_hidden_layers, "sliding": kinds.count("sliding_attention"),
                         "full": kinds.count("full_attention"), "window_left": c.sliding_window - 1,
                         "cap": float(c.attn_logit_softcapping or 0.0), "num_qo_heads": c.num_attention_heads,
                         "num_kv_heads": c.num_key_value_heads, "head_dim": c.head_dim,
                         "sm_scale": c.query_pre_attn_scalar ** -0.5}
    return out, f"transformers {transformers.__version__} config classes"


@dataclass(frozen=True)
class Case:
    """One timed situation of one model: ``phase`` prefill (one request of ``tokens`` new tokens),
    decode (``batch`` requests of ``tokens`` context) or verify (``batch`` requests of ``tokens``
    committed, a ``draft``-token tree of ``topk``)."""
    model: str
    phase: str
    tokens: int
    batch: int = 1
    draft: int = 0
    topk: int = 0

    @property
    def key(self) -> str:
        tail = f"/n{self.draft}k{self.topk}" if self.phase == "verify" else ""
        return f"{self.model}/{self.phase}/{self.tokens}x{self.batch}{tail}"


PREFILL = (4096, 8192, 16384, 32768)
DECODE = (4096, 8192, 16384, 32768)
VERIFY = (8192, 32768)


def cases(models=tuple(CHECKPOINTS), quick: bool = False) -> list[Case]:
    """Every case, cheapest phase first so a budget cut keeps whole phases; ``quick``: the shortest
    and the longest of each."""
    pick = (lambda xs: (xs[0], xs[-1])) if quick else (lambda xs: xs)
    out = []
    for m in models:
        out += [Case(m, "decode", n, 32) for n in pick(DECODE)]
    for m in models:
        out += [Case(m, "prefill", n) for n in pick(PREFILL)]
    for m in models:
        out += [Case(m, "verify", n, 8, 8, k) for n in (VERIFY[:1] if quick else VERIFY) for k in (1, 2)]
    return out


# ----------------------------------------------------------------------------- plans
@dataclass(frozen=True)
class Plan:
    """One wrapper as planned: ``kind`` ragged (prefill), decode or verify; ``window`` the planned
    ``window_left`` (-1: none), ``cap`` the planned soft cap, ``run_window`` what forward() passes;
    ``keys`` which keys the sliding wrapper lists (all, last ``window + 1``, first ``window``)."""
    kind: str
    backend: str
    window: int
    cap: float
    run_window: int
    keys: str = "all"

    @property
    def module(self) -> str:
        """The FlashInfer module this plan selects (bf16, head_dim 256: the models')."""
        return module_name(self.kind, self.backend, self.window >= 0, self.cap > 0)


def module_name(kind: str, backend: str, window: bool, cap: bool) -> str:
    family = {"ragged": "prefill", "verify": "prefill", "decode": "decode"}[kind]
    return f"{family}/{backend}/d256/bf16/{'swa' if window else 'noswa'}/{'cap' if cap else 'nocap'}"


BACKEND = {"prefill": "auto", "decode": "fa2", "verify": "fa2"}  # :501, :336, :335
KIND = {"prefill": "ragged", "decode": "decode", "verify": "verify"}


VARIANTS = ("shipped", "fixed", "window")  # window: the fix without the cap (PR series (a) and (d) alone)


def plans(shape: dict, case: Case) -> dict:
    """``{(variant, layer): Plan}``: each variant's plan of a sliding and a full layer. ``window``
    (the window fixes without the cap) only where the model has a cap and the phase a window fix."""
    w, cap, kind, be = shape["window_left"], shape["cap"], KIND[case.phase], BACKEND[case.phase]
    if case.phase == "decode":
        return {(v, layer): Plan(kind, be, -1, cap if v == "fixed" else 0.0, -1,
                                 "last" if layer == "sliding" else "all")
                for v in ("shipped", "fixed") for layer in ("sliding", "full")}
    if case.phase == "prefill":
        out = {("shipped", "sliding"): Plan(kind, be, -1, 0.0, -1), ("shipped", "full"): Plan(kind, be, -1, 0.0, -1)}
        fixed = lambda c: {"sliding": Plan(kind, be, w, c, w), "full": Plan(kind, be, -1, c, -1)}
    else:
        wide = w + max(case.draft - 1, 0)  # spec_verify.py:101-103
        out = {("shipped", "sliding"): Plan(kind, be, -1, 0.0, w, "first"), ("shipped", "full"): Plan(kind, be, -1, 0.0, -1)}
        fixed = lambda c: {"sliding": Plan(kind, be, wide, c, wide), "full": Plan(kind, be, -1, c, -1)}
    out.update({("fixed", layer): p for layer, p in fixed(cap).items()})
    if cap > 0:
        out.update({("window", layer): p for layer, p in fixed(0.0).items()})
    return out


def modules(shapes: dict, case_list) -> list[str]:
    """The distinct FlashInfer modules the cases select, in first-use order."""
    seen = {}
    for c in case_list:
        for p in plans(shapes[c.model], c).values():
            seen.setdefault(p.module, None)
    return list(seen)


def waves(mods) -> list[list[str]]:
    """Build order: one wave, every module at once, the quick builds named first. Measured cold on an
    H100 (``fix_cost_jit``): all ten at once, decode is built in 14 s, fa2 in 98 s (every verify case
    can run), fa3 in 245 s (prefill); in two waves (the modules without the cap first, for a whole
    Gemma-3) the first wave's fa3 modules were still building at 174 s and fa2 was done at 93 s: the
    builds are CPU-bound, a wave of fewer modules ends no sooner."""
    cost = {"decode": 0, "fa2": 1, "auto": 2}
    return [sorted(mods, key=lambda m: cost[m.split("/")[1]] if m.startswith("prefill/") else cost["decode"])]


def module_spec(name: str) -> dict:
    """``module_name``'s inverse: what a warm-up plan needs to select the module."""
    family, backend, _, _, swa, cap = name.split("/")
    return {"kind": "decode" if family == "decode" else ("ragged" if backend == "auto" else "verify"),
            "backend": backend, "window": swa == "swa", "cap": cap == "cap"}


def dry_run(case_list, shapes: dict, source: str) -> list[str]:
    lines = [f"models ({source}):"]
    lines += [f"  {m}: {s['sliding']} sliding (window_left {s['window_left']}) + {s['full']} full layers, "
              f"{s['num_qo_heads']}:{s['num_kv_heads']} heads, head_dim {s['head_dim']}, cap {s['cap']:g}"
              for m, s in shapes.items()]
    lines.append(f"cases ({len(case_list)}):")
    for c in case_list:
        ps = plans(shapes[c.model], c)
        lines.append(f"  {c.key}: " + "; ".join(f"{v} {layer} {p.module} window {p.window} run {p.run_window}"
                                               for (v, layer), p in ps.items()))
    mods = modules(shapes, case_list)
    lines.append(f"modules ({len(mods)}), built first, each wave's at once:")  # one wave: ``waves``
    lines += [f"  wave {i + 1}: {m}" for i, wave in enumerate(waves(mods)) for m in wave]
    return lines


# ----------------------------------------------------------------------------- goals
def ratio(a, b):
    return a / b if a and b else None


def step_ms(shape: dict, rec: dict, variant: str):
    """One step's attention time (a decode step, a prefill, a verify): every layer's kernel plus
    the step's plans."""
    s, f, p = (rec.get(f"{variant}_{k}_ms") for k in ("sliding", "full", "plan"))
    if s is None or f is None:
        return None
    return shape["sliding"] * s + shape["full"] * f + (p or 0.0)


BASE = ("plan", "step", "full", "sliding")


def spread(xs) -> float:
    """The rounds' own scatter, (max - min) / median: 0 for one round."""
    xs = [x for x in xs or [] if x]
    return (max(xs) - min(xs)) / sorted(xs)[len(xs) // 2] if len(xs) > 1 else 0.0


def goals(doc: dict) -> dict:
    """Per case and over all: fixed / shipped of full layers (goal <= 1 + FULL_GOAL), of sliding
    layers (goal <= 1 + SLIDING_GOAL), of plans and of the whole step. A ratio is held to its goal
    plus the measurement's own noise (``tol``: the larger ``spread`` of the two variants' rounds);
    a goal is met when every measured case meets it, ``None`` (not measured) when no case was."""
    shapes = doc.get("models", {})
    per = []
    for rec in doc.get("records", []):
        if rec.get("error"):
            continue
        shape = shapes.get(rec["model"])
        r = {"key": rec["key"], "phase": rec.get("phase"), "model": rec["model"]}
        for v in ("fixed", "window"):
            pre = "" if v == "fixed" else "window_"
            if v == "window" and f"{v}_full_ms" not in rec:  # no cap: the window fix is the whole fix
                r.update({f"window_{k}": x for k, x in list(r.items()) if k.split("_")[0] in BASE})
                continue
            r[f"{pre}plan"] = ratio(rec.get(f"{v}_plan_ms"), rec.get("shipped_plan_ms"))
            r[f"{pre}step"] = ratio(step_ms(shape, rec, v), step_ms(shape, rec, "shipped")) if shape else None
            for layer, goal in (("full", FULL_GOAL), ("sliding", SLIDING_GOAL)):
                k = f"{pre}{layer}"
                r[k] = ratio(rec.get(f"{v}_{layer}_ms"), rec.get(f"shipped_{layer}_ms"))
                r[f"{k}_tol"] = max(spread(rec.get(f"{x}_{layer}_rounds")) for x in ("shipped", v))
                r[f"{k}_met"] = None if r[k] is None else r[k] <= 1 + goal + r[f"{k}_tol"]
        per.append(r)

    def overall(k):
        vals = [r[f"{k}_met"] for r in per if r.get(f"{k}_met") is not None]
        return None if not vals else all(vals)

    def worst(k):
        return max((r for r in per if r.get(k)), key=lambda r: r[k], default=None)

    keys = ("full", "sliding", "window_full", "window_sliding")
    return {"cases": per, **{f"{k}_met": overall(k) for k in keys}, **{f"worst_{k}": worst(k) for k in keys}}


def case_dict(c: Case) -> dict:
    return {"key": c.key, **asdict(c)}
