"""Module-scoped disaggregated CPU engines for this folder's tests (each module that asks gets
its own; a module defining a fixture of the same name uses its own instead): `prefill` in a
child process, `decode` and the aggregated reference `agg` in the test's process, real NIXL
between, with `disagg_engines.TIMEOUTS`."""

import pytest
import pytest_asyncio

from components.engine.process.engine import CpuEngine
from harness.engine_proc import EngineProcess
from tests.unit.engine.disagg_engines import TIMEOUTS


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def prefill(tiny_model_path):
    proc = await EngineProcess.start(model_path=tiny_model_path, disaggregation_mode="prefill",
                                     disaggregation_bootstrap_port=0, **TIMEOUTS)
    yield proc
    await proc.close()


@pytest.fixture(scope="module")
def decode(tiny_model_path):
    eng = CpuEngine(model_path=tiny_model_path, disaggregation_mode="decode", **TIMEOUTS)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def agg(tiny_model_path):
    eng = CpuEngine(model_path=tiny_model_path)
    yield eng
    eng.shutdown()
