"""swa-repro transport STUB of ``sgl_kernel``: the sglang-kernel wheel does not travel (0.4.4: 586.6 MiB).

sglang imports names from sgl_kernel at import time on CUDA (e.g. srt/layers/quantization/fp8_kernel.py:58;
all sites measured for 0.5.15.post1: swa_repro/evidence/stubs/__init__.py), in modules that
FlashInferAttnBackend's imports pull in; its paged-prefill path calls none of them. So every attribute
lookup and every ``sgl_kernel.<sub>`` import is recorded and gives a placeholder, and calling a
placeholder is recorded and raises. ``provenance()`` reports both: ``swa-repro sglang-check`` puts it in
its JSON and fails the run if anything was called. The names in :data:`ANSWERED` are the exception: a
question the attention backends ask at construction, answered as sglang-kernel answers it (Triton's
backend: ``from sgl_kernel.utils import is_arch_support_pdl``, triton_backend.py:70-71, called at
:340 in 0.5.23); their calls are recorded apart (``answered``) and never fail a run. Standard library only; ``swa-repro bundle --sglang``
copies this file into the bundle as the package ``sgl_kernel``, with ``_stub.json`` (what it replaces).
"""

import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types

__swa_repro_stub__ = True
LOOKED_UP: list = []  # names relative to sgl_kernel, e.g. "fast_topk", "scalar_type.ScalarType"
CALLED: list = []


def _read_info() -> dict:
    try:
        with open(os.path.join(os.path.dirname(__file__), "_stub.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


_INFO = _read_info()
__version__ = _INFO.get("version", "0+swa-repro-stub")


class _Placeholder:
    """Stands for any sgl_kernel name: attributes give more placeholders, a call raises."""

    def __init__(self, name: str):
        self._stub_name = name
        self.__name__ = self.__qualname__ = name.rpartition(".")[2]
        self.__module__ = "sgl_kernel"

    def __call__(self, *args, **kwargs):
        CALLED.append(self._stub_name)
        raise RuntimeError(f"sgl_kernel stub: {self._stub_name} called; the attention path must not call it")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _lookup(f"{self._stub_name}.{attr}")

    def __repr__(self):
        return f"<sgl_kernel stub {self._stub_name}>"


ANSWERED_CALLS: list = []


def _is_arch_support_pdl() -> bool:
    """As sglang-kernel's ``sgl_kernel/utils.py`` (sgl-project/sglang, sgl-kernel/python/sgl_kernel/utils.py
    at 4b5835f, lines 46-51): cached once, the current CUDA device's compute capability major >= 9
    (Hopper's programmatic dependent launch). Pure torch: nothing compiled is needed to answer it."""
    import torch

    ANSWERED_CALLS.append("utils.is_arch_support_pdl")
    device = torch.cuda.current_device()
    major, _minor = torch.cuda.get_device_capability(device)
    return major >= 9


# name relative to sgl_kernel -> the function that answers it as the real package does
ANSWERED = {"utils.is_arch_support_pdl": functools.lru_cache(maxsize=1)(_is_arch_support_pdl)}


def _lookup(name: str):
    LOOKED_UP.append(name)
    return ANSWERED.get(name) or _Placeholder(name)


def _module_getattr(prefix: str):
    def __getattr__(attr):
        if attr.startswith("__"):  # the import machinery's probes, not sglang's names
            raise AttributeError(attr)
        return _lookup(prefix + attr)
    return __getattr__


__getattr__ = _module_getattr("")


def provenance() -> dict:
    return {"stubbed": "sgl_kernel", "replaces": _INFO.get("replaces", "sglang-kernel (version not recorded)"),
            "looked_up": sorted(set(LOOKED_UP)), "called": sorted(set(CALLED)),
            "answered": sorted(set(ANSWERED_CALLS))}


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import sgl_kernel.<sub>`` (e.g. sgl_kernel.scalar_type): an empty stub module, recorded."""

    swa_repro_stub_of = __name__

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        rel = spec.name[len(__name__) + 1:]
        LOOKED_UP.append(rel)
        m = types.ModuleType(spec.name, "swa-repro stub submodule of sgl_kernel")
        m.__path__ = []
        m.__swa_repro_stub__ = True
        m.__getattr__ = _module_getattr(rel + ".")
        return m

    def exec_module(self, module):
        pass


_FINDER = _SubmoduleFinder()
sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "swa_repro_stub_of", None) != __name__]
sys.meta_path.insert(0, _FINDER)
