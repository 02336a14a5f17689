"""Exists only to run SGLang on CPU in tests: an import hook for SGLang's disaggregation on CPU.

Python imports `sitecustomize` at start-up from the path, so a process gets this hook only when
`tests/sglang_cpu` is on its PYTHONPATH (the tests set that for SGLang-on-CPU workers only; SGLang's
spawned scheduler processes inherit it). The installed package is never edited: two SGLang
modules are adjusted right after they load.

- `disaggregation.nixl.conn`: the KV buffers are host memory, but SGLang names them VRAM (the
  default list, the decode's explicit list and a peer's empty packed list), and UCX then refuses
  the registration ("VRAM memory is detected as host").
- `disaggregation.prefill`: when it early-sends a prefix already in its radix cache under the
  overlap scheduler, the prefill creates a `torch.cuda.Event`, which CPU torch cannot build. CPU
  ops are synchronous and NIXL ignores the event, so torch.cpu's event and stream stand in.
- `nixl_cu13._api` (what `nixl._api` is at run time): NIXL's Python API starts its progress
  thread with no delay (`pthrDelay = 0`), so UCX's shared progress thread spins a core in every
  prefill and decode scheduler, idle or not; on the tests' 2 cores a disaggregated pair then
  took most of the machine. With TEST_NIXL_PROGRESS_DELAY_US set (the test suite sets it; the
  benchmarks do not, so they measure NIXL as SGLang configures it), the thread waits that long.
- `configs.deepseek_ocr` and `multimodal.internvl_utils` (imported by the config package) import
  `torchvision.transforms` at module level; the registry's torchvision links CUDA. A stand-in
  is importable only while those modules execute and is
  dropped from `sys.modules` afterwards, so transformers keeps seeing no torchvision.
- `configs.utils` (SGLang 0.5.21, under its pin transformers 5.12.1): that transformers files
  `AutoImageProcessor` under torchvision, so without torchvision `from transformers import
  AutoImageProcessor` gives a placeholder that raises when the config package registers its
  image processors at load time. The module's name is bound to the real class (transformers'
  own `models.auto.image_processing_auto`, which needs only PIL); a transformers that gives the
  real class (5.24, SGLang 0.5.23's) is left as it is.
- `entrypoints.engine` (with TEST_SGLANG_FORK set): SGLang's subprocesses are forked from the
  engine's process (`sglang_cpu_fork.py`).
- `managers.scheduler` (with TEST_SGLANG_SLOW_LOAD_S set): the scheduler waits that long before
  it builds its model, a stand-in for a large model's load, so a test's signal surely lands
  while the engine loads (the tiny model loads in about a second).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
import time
import types
from collections.abc import Iterator
from typing import Any, Callable

import sglang_cpu_fork

_CONN = "sglang.srt.disaggregation.nixl.conn"
_PREFILL = "sglang.srt.disaggregation.prefill"
_NIXL_API = "nixl_cu13._api"
_CONFIG_UTILS = "sglang.srt.configs.utils"
_SCHEDULER = "sglang.srt.managers.scheduler"
_NIXL_DELAY_ENV = "TEST_NIXL_PROGRESS_DELAY_US"
_SLOW_LOAD_ENV = "TEST_SGLANG_SLOW_LOAD_S"
_NEEDS_TORCHVISION = frozenset({"sglang.srt.configs.deepseek_ocr",
                                "sglang.srt.multimodal.internvl_utils"})
_TORCHVISION_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "torchvision_only_for_sglang")
_torchvision_users = 0  # > 0 while a module in _NEEDS_TORCHVISION executes


def _host_kinds(kinds: list[str]) -> list[str]:
    return ["DRAM" if kind == "VRAM" else kind for kind in kinds]


def _patch_conn(module: types.ModuleType) -> None:
    normalize = module._normalize_kv_mem_kinds
    unpack = module._unpack_kv_mem_kinds

    def normalize_to_host(kinds: Any, expected_len: int) -> list[str]:
        return _host_kinds(normalize(kinds, expected_len))

    def unpack_to_host(buf: bytes, expected_len: int) -> list[str]:
        return _host_kinds(unpack(buf, expected_len))

    module._normalize_kv_mem_kinds = normalize_to_host
    module._unpack_kv_mem_kinds = unpack_to_host


class _TorchWithCpuEvents(types.ModuleType):
    """`torch`, except that `torch.cuda.Event` / `current_stream` are torch.cpu's."""

    def __init__(self, torch: types.ModuleType) -> None:
        super().__init__("torch")
        self._torch = torch
        self.cuda = types.SimpleNamespace(Event=torch.cpu.Event,
                                          current_stream=torch.cpu.current_stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)


def _patch_prefill(module: types.ModuleType) -> None:
    module.torch = _TorchWithCpuEvents(module.torch)


class _BindingsWithProgressDelay:
    """NIXL's bindings, except that an agent's progress thread waits between its rounds."""

    def __init__(self, bindings: Any, delay_us: int) -> None:
        self._bindings = bindings
        self._delay_us = delay_us

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bindings, name)

    def nixlAgent(self, name: str, config: Any) -> Any:  # noqa: N802 (NIXL's own name)
        config.pthrDelay = self._delay_us
        return self._bindings.nixlAgent(name, config)


def _patch_nixl_api(module: types.ModuleType) -> None:
    module.nixlBind = _BindingsWithProgressDelay(module.nixlBind, int(os.environ[_NIXL_DELAY_ENV]))


def _patch_config_utils(module: types.ModuleType) -> None:
    from transformers.models.auto import image_processing_auto

    real = image_processing_auto.AutoImageProcessor
    if module.AutoImageProcessor is not real:
        module.AutoImageProcessor = real


def _patch_scheduler(module: types.ModuleType) -> None:
    real_init = module.Scheduler.__init__
    seconds = float(os.environ[_SLOW_LOAD_ENV])

    def slow_init(self: Any, *args: Any, **kwargs: Any) -> None:
        time.sleep(seconds)  # the load itself: nothing to wait for
        real_init(self, *args, **kwargs)

    module.Scheduler.__init__ = slow_init


def _no_patch(module: types.ModuleType) -> None:
    del module


_PATCHES: dict[str, Callable[[types.ModuleType], None]] = {
    _CONN: _patch_conn, _PREFILL: _patch_prefill, _CONFIG_UTILS: _patch_config_utils,
    **dict.fromkeys(_NEEDS_TORCHVISION, _no_patch),
    **({_NIXL_API: _patch_nixl_api} if os.environ.get(_NIXL_DELAY_ENV) else {}),
    **({_SCHEDULER: _patch_scheduler} if os.environ.get(_SLOW_LOAD_ENV) else {}),
    **({sglang_cpu_fork.ENGINE_MODULE: sglang_cpu_fork.patch_engine}
       if os.environ.get(sglang_cpu_fork.ENABLE_ENV) == "1" else {})}


@contextlib.contextmanager
def _torchvision_stand_in(name: str) -> Iterator[None]:
    global _torchvision_users
    if name not in _NEEDS_TORCHVISION:
        yield
        return
    _torchvision_users += 1
    try:
        yield
    finally:
        _torchvision_users -= 1
        for key in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[key]


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, patch: Callable[[types.ModuleType], None]):
        self._inner = inner
        self._patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        with _torchvision_stand_in(module.__name__):
            self._inner.exec_module(module)
        self._patch(module)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name == "torchvision":
            if _torchvision_users == 0:
                return None
            return importlib.machinery.PathFinder.find_spec(name, [_TORCHVISION_DIR])
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


sys.meta_path.insert(0, _PatchingFinder())
