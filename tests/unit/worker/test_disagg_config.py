"""1.6.1's `--disagg-config FILE --disagg-config-key KEY`: the section is SGLang's `--config` on
`--engine sglang` (the command line wins); everything else about it stops the worker, named."""

import pytest

from components.backends import select as backend_select
from components.worker.flags.config import parse_args

pytestmark = pytest.mark.timeout(120)

YAML = """
prefill:
  disaggregation-mode: prefill
  page-size: 32
  max-running-requests: 4
decode:
  disaggregation-mode: decode
"""


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    monkeypatch.setattr(backend_select, "cuda_available", lambda: False)
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    path = tmp_path / "disagg.yaml"
    path.write_text(YAML)
    return str(path)


def test_the_section_is_sglangs_config_and_the_command_line_wins(config_file, tiny_model_path):
    config = parse_args(["--engine", "sglang", "--model-path", tiny_model_path,
                         "--skip-tokenizer-init", "--disagg-config", config_file,
                         "--disagg-config-key", "prefill", "--page-size", "16"])
    assert config.role.prefill
    assert config.engine_args.page_size == 16 and config.engine_args.max_running_requests == 4


@pytest.mark.parametrize("args, words", [
    (["--disagg-config-key", "prefill"], "must be given together"),
    (["--disagg-config", "{file}", "--disagg-config-key", "encode"],
     "--disagg-config-key 'encode': no such section"),
    (["--disagg-config", "/no/such.yaml", "--disagg-config-key", "prefill"],
     "--disagg-config /no/such.yaml"),
])
def test_a_bad_section_stops_the_worker_naming_the_flag(config_file, tiny_model_path, args,
                                                         words):
    args = [a.replace("{file}", config_file) for a in args]
    with pytest.raises(SystemExit, match=words):
        parse_args(["--engine", "sglang", "--model-path", tiny_model_path, *args])


def test_the_cpu_engine_refuses_it(config_file, tiny_model_path):
    with pytest.raises(SystemExit, match="--disagg-config needs --engine sglang"):
        parse_args(["--engine", "cpu", "--model-path", tiny_model_path, "--disagg-config",
                    config_file, "--disagg-config-key", "decode"])
