"""Which FlashInfer prefill path a served sliding-window model takes, read from a release's source.

For each release and SWA family this answers, from the release's own files (AST, never imported):
is ``--attention-backend flashinfer`` kept or refused (a model block in ``server_args.py`` /
``arg_groups/`` asserting an allowed-backend list without flashinfer, e.g. GptOss, Exaone4), which
EXTEND path ``FlashInferAttnBackend.init_forward_metadata`` picks (``use_ragged = not deterministic
and not <in piecewise CUDA graph> and not use_paged``, forced False for ``is_multimodal`` / multi-item
scoring), whether piecewise (torch.compile) prefill CUDA graph is on by default (legacy
``disable_piecewise_cuda_graph = False`` up to 0.5.13, ``CudaGraphConfig.prefill`` = tc_piecewise in
0.5.14, breakable on CUDA from 0.5.15: breakable leaves ``is_in_tc_piecewise_cuda_graph()`` False), and
the default backend per GPU class. Every rule is located by structure and cited as file:line.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from swa_repro.core.errors import UsageError

FAMILIES = {"gemma2": ("Gemma2ForCausalLM",), "gemma3": ("Gemma3ForCausalLM",),
            "gemma3-mm": ("Gemma3ForConditionalGeneration",), "cohere2": ("Cohere2ForCausalLM",),
            "gpt-oss": ("GptOssForCausalLM",), "exaone4": ("Exaone4ForCausalLM",)}
GPUS = ("sm90", "sm100", "other")  # Hopper, Blackwell SM100, other CUDA GPUs (A100/L40: sm80/sm89)
FI = "sglang/srt/layers/attention/flashinfer_backend.py"

@dataclass(frozen=True)
class FamilyPath:
    release: str
    family: str
    architecture: str
    flashinfer_kept: bool | None
    refusal: str | None  # "file:line (when ...)" of the rule that refuses flashinfer
    default_prefill: str  # ragged | paged-only | refused | absent | unknown: <why>
    to_other: tuple = ()
    default_backend: dict = field(default_factory=dict)  # gpu class -> backend or "refused: ..."
    sources: dict = field(default_factory=dict)  # fact -> "sglang/srt/...py:LINE"
    notes: tuple = ()
    by_gpu: dict = field(default_factory=dict)  # gpu class -> kept, refusal, path, split (serving_server)

class _Src:
    """The parsed files of one release, cited relative to the package's parent."""
    def __init__(self, pkg: Path):
        self.pkg, self._t = pkg, {}

    def tree(self, rel: str):
        if rel not in self._t:
            p = self.pkg.parent / rel
            self._t[rel] = ast.parse(p.read_text()) if p.is_file() else None
        return self._t[rel]

    def rule_files(self):  # where model rules live: server_args.py, then arg_groups/ (>= 0.5.15)
        ag = [str(p.relative_to(self.pkg.parent)) for p in sorted((self.pkg / "srt/arg_groups").rglob("*.py"))]
        return [(r, self.tree(r)) for r in ["sglang/srt/server_args.py", *ag] if self.tree(r) is not None]

_u = ast.unparse

def _strs(n) -> list:  # the strings of a list/tuple literal
    return [e.value for e in getattr(n, "elts", []) if isinstance(getattr(e, "value", None), str)]

def _fn(tree, pred):
    return next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and pred(n.name)), None) if tree else None

def _list_at(tree, name):
    """Module-level ``name = [..]`` (model_config.py's arch lists), and its line."""
    for n in ast.walk(tree) if tree else ():
        if isinstance(n, ast.Assign) and any(_u(t) == name for t in n.targets) and hasattr(n.value, "elts"):
            return _strs(n.value), n.lineno
    return [], None

# Condition atoms on a default server (no flags, no speculative decoding, unquantized MHA checkpoint)
# of arch a on GPU class g; sm90/sm100/other are all CUDA with sm >= 80. Unmatched atoms: unknown.
_ATOMS = [(r"hopper|sm90", lambda g, a: g == "sm90"), (r"sm100|blackwell", lambda g, a: g == "sm100"),
          (r"sm120|is_hip|is_npu|is_cpu|is_mps|is_xpu|mlx|out_of_tree|amx|is_hpu|diffusion|modelopt|fp4|"
           r"quantization|eagle_topk is not None|speculative_algorithm is not None|forces_eagle_topk|asymmetric_kv|use_mla", lambda g, a: False),
          (r"device_sm|is_cuda|no_spec_infer_or_topk_one|speculative_algorithm is None|attention_backend_not_set|"
           r"attention_backend is None|flashinfer|hf_config is not None|sliding_window_pattern is not None",
           lambda g, a: True), ("attention_sinks", lambda g, a: a == "GptOssForCausalLM")]

def _ev(n, gpu, arch, env):
    """A condition on a default server of ``arch`` on ``gpu``; None when it depends on something else."""
    if isinstance(n, ast.BoolOp):
        vs, want = [_ev(v, gpu, arch, env) for v in n.values], isinstance(n.op, ast.Or)
        return want if want in vs else (None if None in vs else not want)
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
        return None if (v := _ev(n.operand, gpu, arch, env)) is None else not v
    if isinstance(n, ast.Name) and n.id in env:
        return _ev(env[n.id], gpu, arch, env)
    if isinstance(n, ast.Compare) and re.search("architectures|model_arch", _u(n)) and len(n.ops) == 1:
        c = n.comparators[0]
        return (arch in (_strs(c) or [getattr(c, "value", None)])) != isinstance(n.ops[0], (ast.NotEq, ast.NotIn))
    return next((f(gpu, arch) for k, f in _ATOMS if re.search(k, _u(n))), None)

def _val(n, gpu, arch, env):
    if isinstance(n, ast.IfExp):
        return None if (t := _ev(n.test, gpu, arch, env)) is None else _val(n.body if t else n.orelse, gpu, arch, env)
    return n.value if isinstance(n, ast.Constant) else _val(env[n.id], gpu, arch, env) if _u(n) in env else None

_SETS = r"(\.attention_backend|\[.attention_backend.\])"  # self./server_args./overrides[...] = backend

def _run(stmts, gpu, arch, env, ret=False):
    """(value, line) of the first ``attention_backend`` assignment (or ``return`` when ``ret``) a default
    server reaches; ``unknown: ...`` when the branch taken depends on something else."""
    for s in stmts:
        if isinstance(s, ast.Assign) and len(s.targets) == 1:
            env[_u(s.targets[0])] = s.value
            if re.search(_SETS + "$", _u(s.targets[0])):
                v = _val(s.value, gpu, arch, env)
                return (f"unknown: depends on `{_u(s.value)[:60]}`" if v is None else v), s.lineno
        elif ret and isinstance(s, ast.Return) and s.value is not None:
            return _val(s.value, gpu, arch, env), s.lineno
        elif isinstance(s, ast.If):
            if (t := _ev(s.test, gpu, arch, env)) is None:
                if re.search(_SETS + r"\s*=", _u(s)):
                    return f"unknown: depends on `{_u(s.test)[:60]}`", s.lineno
            elif r := _run(s.body if t else s.orelse, gpu, arch, env, ret):
                return r
    return None

def _arch_blocks(src: _Src, arch: str):
    """(file, body) of every model-specific rule for ``arch``: ``if model_arch in [...]`` / ``==``
    branches and ``@_register_for(...)`` override functions (candidates collected once per release)."""
    if not hasattr(src, "cands"):
        src.cands = [(rel, n) for rel, tree in src.rule_files() for n in ast.walk(tree)
                     if (isinstance(n, ast.If) and isinstance(n.test, ast.Compare)
                         and isinstance(n.test.ops[0], (ast.In, ast.Eq)) and "arch" in _u(n.test.left))
                     or (isinstance(n, ast.FunctionDef) and any(isinstance(d, ast.Call) and _u(
                         d.func).endswith("register_for") for d in n.decorator_list))]
    for rel, n in src.cands:
        if isinstance(n, ast.If) and _ev(n.test, "sm90", arch, {}) is True or isinstance(
                n, ast.FunctionDef) and any(arch in _strs(ast.Tuple(elts=d.args)) for d in n.decorator_list):
            yield rel, n.body

def _refusals(body, arch, env, conds=()):
    """Asserts in a model block that leave flashinfer out: (line, allowed list, config conditions)."""
    for s in body:
        if isinstance(s, ast.Assign) and len(s.targets) == 1:
            env[_u(s.targets[0])] = s.value
        if isinstance(s, ast.If):
            t = _ev(s.test, "sm90", arch, env)
            c = conds + ((_u(s.test),) if "hf_config" in _u(s.test) or t is None else ())
            yield from (_refusals(s.body, arch, env, c) if t is not False else ())
            yield from (_refusals(s.orelse, arch, env, conds) if t is not True else ())
        elif isinstance(s, ast.Assert) and "backend" in _u(s.test):
            for cmp in (x for x in ast.walk(s.test) if isinstance(x, ast.Compare)):
                op, rhs = cmp.ops[0], cmp.comparators[0]
                allowed = _strs(env.get(_u(rhs), rhs))
                if (isinstance(op, ast.In) and allowed and "flashinfer" not in allowed) or (
                        isinstance(op, ast.NotEq) and getattr(rhs, "value", None) == "flashinfer"):
                    yield s.lineno, allowed, conds
                    break

def _model_rules_first(src: _Src):
    """Whether model rules run before the generic default is picked (``__post_init__`` / the
    arg_groups pipeline call order); None when neither call is found."""
    for rel in ("sglang/srt/server_args.py", "sglang/srt/arg_groups/pipeline.py"):
        t = (src.pkg.parent / rel).read_text() if (src.pkg.parent / rel).is_file() else ""
        a, b = (re.search(rf"(self\._|run_hook\()\w*{k}\b", t) for k in ("model_specific_adjustments",
                                                                          "attention_backend_compatibility"))
        if a and b:
            return a.start() < b.start()
    return None

def _release_rules(src: _Src) -> dict:
    """Release-wide rules: the use_ragged decision, the prefill CUDA graph default, model lists."""
    r, fi, mc = {"src": {}}, src.tree(FI), "sglang/srt/configs/model_config.py"
    for n in ast.walk(_fn(fi, lambda x: x == "init_forward_metadata") or ast.Module(body=[])):
        if isinstance(n, ast.If) and "is_multimodal" in _u(n.test) and "use_ragged = False" in _u(n):
            r["force_paged"] = [_u(v) for v in getattr(n.test, "values", [n.test])]
            r["src"]["multimodal_or_mis_forces_paged"] = f"{FI}:{n.lineno}"
            for b in (b for b in n.orelse if isinstance(b, ast.Assign) and _u(b.targets[0]) == "use_ragged"):
                r["ragged_terms"] = [_u(x.operand) for x in getattr(b.value, "values", [b.value])
                                     if isinstance(x, ast.UnaryOp)]
                r["src"]["use_ragged"] = f"{FI}:{b.lineno}"
    for n in ast.walk(fi) if fi else ():
        if isinstance(n, ast.Assign) and _u(n.targets[0]) == "self.use_paged" and "envs." in _u(n.value):
            r["use_paged_env"], r["src"]["use_paged_env"] = _u(n.value).split(".")[1], f"{FI}:{n.lineno}"
    for key, name in (("mm_archs", "multimodal_model_archs"), ("mm_off", "mm_disabled_models"), (
            "pcg_off_archs", "piecewise_cuda_graph_disabled_model_archs"), (
            "mm_pcg_archs", "multimodal_piecewise_cuda_graph_supported_model_archs")):
        r[key], ln = _list_at(src.tree(mc), name)
        r["src"][name] = f"{mc}:{ln}"
    for rel, tree in src.rule_files():
        for n in ast.walk(tree):  # <= 0.5.13: `disable_piecewise_cuda_graph: bool = False` turns PCG on
            if isinstance(n, ast.AnnAssign) and _u(n.target) == "disable_piecewise_cuda_graph" and n.value:
                r["pcg"], r["legacy"] = ("disabled" if n.value.value else "tc_piecewise"), True
                r["src"]["pcg_default"] = f"{rel}:{n.lineno}"
            if isinstance(n, ast.If) and "multimodal_piecewise_cuda_graph_supported" in _u(n.test) and \
                    "TC_PIECEWISE" in _u(n):  # >= 0.5.16: allow-listed multimodal archs -> tc_piecewise
                r["src"]["mm_tc_piecewise_upgrade"] = f"{rel}:{n.lineno}"
        f = _fn(tree, lambda x: x == "_handle_piecewise_cuda_graph" or ("tc_piecewise" in x and "incompatible" in x))
        for n in (n for n in ast.walk(f) if isinstance(n, (ast.If, ast.Tuple))) if f else ():
            if "is_multimodal" in _u(n) and "mm_pcg_off" not in r["src"] and len(_u(n)) < 400:
                r["src"]["mm_pcg_off"] = f"{rel}:{n.lineno}"
                r["mm_pcg_exempt"] = "multimodal_piecewise_cuda_graph_supported" in _u(n)
        f = _fn(tree, lambda x: re.search(r"default_attn(ention)?_backend$", x))
        r["default_fn"] = r.get("default_fn") or (f and (rel, f))
    cg = "sglang/srt/model_executor/cuda_graph_config.py"
    for n in ast.walk(src.tree(cg)) if src.tree(cg) and "pcg" not in r else ():  # >= 0.5.14
        if isinstance(n, ast.AnnAssign) and _u(n.target) == "prefill" and n.value is not None:
            b = next(k.value for c in ast.walk(n.value) if isinstance(c, ast.Call) for k in c.keywords
                     if k.arg == "backend")
            if isinstance(b, ast.Call):  # default_prefill_backend(): `BREAKABLE if is_cuda() else ...`
                n = _fn(src.tree(cg), lambda x, nm=_u(b.func): x == nm)
                ret = next(x.value for x in ast.walk(n) if isinstance(x, ast.Return))
                b = (ret.body if _ev(ret.test, "sm90", "", {}) else ret.orelse) if isinstance(ret, ast.IfExp) else ret
            r["pcg"] = {"TC_PIECEWISE": "tc_piecewise", "BREAKABLE": "breakable"}.get(_u(b).split(".")[-1], "disabled")
            r["src"]["pcg_default"], r["legacy"] = f"{cg}:{n.lineno}", False
    r["default_fn"], r["model_first"] = r.get("default_fn") or (None, None), _model_rules_first(src)
    return r

def _registered(pkg: Path) -> dict:
    """Architectures a release serves (``EntryClass`` in srt/models) -> model file; DFlash SWA marked."""
    out = {}
    for p in sorted((pkg / "srt" / "models").glob("*.py")):
        t = p.read_text()
        m = re.search(r"^EntryClass\s*=\s*\[?([\w\s,]+)\]?", t, re.M)
        for a in re.findall(r"\w+", m.group(1)) if m else ():
            out[a] = (p.name, "set_dflash_layers_to_capture" in t and "sliding_window" in t)
    return out

def _family(release, fam, arch, src, R, reg) -> FamilyPath:
    """One family's answer; the why of each step is the release line cited in ``sources``."""
    S, notes, blocks = dict(R["src"]), [], list(_arch_blocks(src, arch))
    if arch not in reg:
        return FamilyPath(release, fam, arch, None, None, "absent", notes=(f"{arch} not in srt/models",))
    ref = [(f"{rel}:{ln}", al, c) for rel, body in blocks for ln, al, c in _refusals(body, arch, {})]
    refusal = ref and ref[0][0] + (f" (needs one of {', '.join(ref[0][1])})" if ref[0][1] else "") + (
        f" when {' and '.join(ref[0][2])}" if ref[0][2] else "") or None
    dflt, (rel_f, f) = {}, R["default_fn"]
    for g in GPUS:  # a model rule first (it runs before the generic chooser), then the chooser
        hit = next(((rel, x) for rel, body in blocks if (x := _run(body, g, arch, {})) and isinstance(x[0], str)), None)
        v = None if hit or (ref and R["model_first"]) or f is None else _run(f.body, g, arch, {}, True)
        dflt[g] = hit[1][0] if hit else f"refused: no default, {ref[0][0]} asserts before the generic " \
            "default is picked" if ref and R["model_first"] else v[0] if v else "unknown: no default chooser matched"
        if hit or v:
            S[f"default_backend_{g}"] = f"{hit[0]}:{hit[1][1]}" if hit else f"{rel_f}:{v[1]}"
    if refusal:
        S["refusal"] = ref[0][0]
        return FamilyPath(release, fam, arch, False, refusal, "refused", (), dflt, S,
                          ("--attention-backend flashinfer is refused: not affected by FlashInfer bugs",))
    if "ragged_terms" not in R:
        return FamilyPath(release, fam, arch, True, None, "unknown: use_ragged rule not found in "
                          "FlashInferAttnBackend.init_forward_metadata", (), dflt, S)
    in_mm, pcg, legacy = arch in R["mm_archs"], R.get("pcg"), R.get("legacy")
    mm = in_mm and arch not in R["mm_off"]
    if pcg == "tc_piecewise" and (arch in R["pcg_off_archs"] or (
            mm and "mm_pcg_off" in S and not (R.get("mm_pcg_exempt") and arch in R["mm_pcg_archs"]))):
        pcg = "disabled"
    if pcg == "breakable" and mm and "mm_tc_piecewise_upgrade" in S and arch in R["mm_pcg_archs"]:
        pcg = "tc_piecewise"
    pcg_term = any("piecewise" in t for t in R["ragged_terms"])
    flags = {"deterministic": "--enable-deterministic-inference", "use_paged": f"{R.get('use_paged_env')}=1",
             "enable_mis": "--enable-mis", "multi_item": "--multi-item-scoring-delimiter"}
    to_paged = [v for t in R["ragged_terms"] + R["force_paged"] for k, v in flags.items() if k in t]
    unknown = [t for t in R["ragged_terms"] if not any(k in t for k in [*flags, "piecewise"])]
    notes += [f"unknown use_ragged inputs: {unknown}"] if unknown else []
    if in_mm and not mm:
        to_paged.append("--enable-multimodal")
        notes.append(f"multimodal is off by default for {arch}: is_multimodal=False, ragged allowed")
    if mm:
        prefill, other = "paged-only", ()
        notes.append("is_multimodal forces the paged wrapper; no flag switches it to ragged")
    elif pcg_term and pcg == "tc_piecewise":
        prefill = "paged-only"
        other = ("--disable-piecewise-cuda-graph",) if legacy else ("--cuda-graph-backend-prefill=disabled",)
        notes.append("piecewise CUDA graph is on: EXTEND batches of <= piecewise max tokens (default "
                     "chunked_prefill_size) replay under it and take paged-only; larger ones run ragged; any "
                     "piecewise auto-disable (speculative decoding, torch.compile, DP attention...) gives ragged")
    elif pcg is None:
        prefill, other = "unknown: piecewise CUDA graph default not found", ()
    else:
        prefill = "ragged"
        on = "--enforce-piecewise-cuda-graph" if legacy else "--cuda-graph-backend-prefill=tc_piecewise"
        other = tuple(dict.fromkeys(to_paged + ([on] if pcg_term else [])))
    return FamilyPath(release, fam, arch, True, None, prefill, other, dflt, S, tuple(notes))

def analyze_release(sglang_pkg_dir: Path, release: str) -> list:
    """One :class:`FamilyPath` per family (gemma4 and DFlash SWA archs as the release ships them)."""
    pkg = Path(sglang_pkg_dir)
    if not (pkg / "srt" / "server_args.py").is_file():
        raise UsageError(f"{pkg} is not an sglang package directory: pass `provision(version)[0] / 'sglang'`")
    src, reg = _Src(pkg), _registered(pkg)
    R = _release_rules(src)
    fams = [(f, a) for f, archs in FAMILIES.items() for a in archs]
    fams += [("gemma4", a) for a in sorted(reg) if a.startswith("Gemma4") and "Assistant" not in a
             and a.endswith(("ForCausalLM", "ForConditionalGeneration"))] or [("gemma4", "Gemma4ForCausalLM")]
    known = {a for _, a in fams}
    fams += [("dflash-swa", a) for a, (_, d) in sorted(reg.items()) if d and a not in known
             and not re.search(r"MTP|Assistant|Eagle|DFlash|Draft", a)]
    return [_family(release, f, a, src, R, reg) for f, a in fams]

def release_table(versions, provision=None) -> dict:
    """``{release: [FamilyPath, ...]}``; ``provision(v) -> (root, info)`` as in ``provision.py``."""
    if provision is None:
        from swa_repro.sglang.provision import provision
    return {v: analyze_release(provision(v)[0] / "sglang", v) for v in versions}

def cell(fp: FamilyPath) -> str:
    """``ragged (paged-only: FLAGS)`` / ``refused (file:line)`` / ``absent``."""
    if fp.default_prefill == "refused":
        return f"refused ({fp.refusal.split(' (')[0].split(' when')[0].replace('sglang/srt/', '')})"
    if fp.to_other:
        alt = "ragged" if fp.default_prefill == "paged-only" else "paged-only"
        return f"{fp.default_prefill} ({alt}: {', '.join(fp.to_other)})"
    return fp.default_prefill

def _group(fps, key) -> dict:
    g = {}
    for fp in fps:
        g.setdefault(key(fp), []).append(fp.architecture)
    return g

def render_markdown(table: dict) -> str:
    """The release table: one row per release, one column per family, then the default backends."""
    cols = [*FAMILIES, "gemma4", "dflash-swa"]
    out = ["## Which prefill path a default `--attention-backend flashinfer` server takes", "",
           "| release | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for rel, fps in table.items():
        row = ["; ".join(k if c in FAMILIES else f"{'/'.join(v)}: {k}" for k, v in _group(
            [fp for fp in fps if fp.family == c and fp.default_prefill != "absent"], cell).items()) or "absent"
            for c in cols]
        out.append(f"| {rel} | " + " | ".join(row) + " |")
    out += ["", "How to read a cell: the first word is the path an EXTEND batch takes on a server started "
            "with only `--attention-backend flashinfer`; a FlashInfer bug of that path (e.g. the paged-only "
            "window bug, #31501) affects you on your default path. The parenthesis lists the flags or "
            "environment variables that switch to the other path: a bug of the other path affects you only "
            "with one of them. `refused` (file:line): sglang rejects flashinfer for this architecture, so "
            "FlashInfer bugs do not affect it. `absent`: the release does not ship the architecture.", "",
            "Default attention backend without `--attention-backend` (sm90 = Hopper, sm100 = Blackwell, "
            "other = A100/L40-class):", ""]
    for rel, fps in table.items():
        seen = _group([fp for fp in fps if fp.default_prefill != "absent"],
                      lambda fp: ", ".join(f"{g}={fp.default_backend.get(g)}" for g in GPUS))
        out.append(f"- {rel}: " + "; ".join(f"{'/'.join(v)}: {k}" for k, v in seen.items()))
    return "\n".join(out) + "\n"
