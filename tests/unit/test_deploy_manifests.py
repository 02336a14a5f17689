"""deploy/: the DynamoGraphDeployment manifests are valid against the operator's CRD (kept in
deploy/crd/), their frontend and worker args are ones the real parsers accept (parse only,
nothing starts), and their images follow deploy/Dockerfile's name, tag and base."""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.metadata
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft4Validator

from components.backends import select as backend_select
from components.worker.flags.config import WorkerConfig, parse_args
from components.worker.hosts import is_wildcard
from components.worker.metrics.kv_events import kv_events_enabled, role_publishes
from tests.support.crd_schema import load_crd, version_schema

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CRD = DEPLOY / "crd" / "nvidia.com_dynamographdeployments.yaml"
# The git blob id of the upstream file as deploy/README.md records it: the copy is unedited.
CRD_BLOB = "247ce4504714a81729106be2a572bbf29ee49dc3"
MANIFESTS = sorted(p.name for p in DEPLOY.glob("*.yaml"))
FRONTEND_COMMAND = ["python3", "-m", "dynamo.frontend"]
WORKER_COMMAND = ["python3", "-m", "components"]
# a worker component's type -> the mode its args must start the worker in
MODES = {"worker": "agg", "prefill": "prefill", "decode": "decode"}
DYNAMO_VERSION = importlib.metadata.version("ai-dynamo")


def _load(name: str) -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / name).read_text())


def _main(component: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in component["podTemplate"]["spec"]["containers"] if c["name"] == "main")


def _workers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in doc["spec"]["components"] if c["type"] in MODES]


def _frontend(doc: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in doc["spec"]["components"] if c["type"] == "frontend")


WORKERS = [(name, c["name"]) for name in MANIFESTS for c in _workers(_load(name))]


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return load_crd(CRD)


@pytest.fixture(scope="module")
def validators(crd) -> dict[str, Draft4Validator]:
    """apiVersion -> a validator of that served version's schema."""
    group = crd["spec"]["group"]
    return {f"{group}/{v['name']}": Draft4Validator(version_schema(crd, v["name"]))
            for v in crd["spec"]["versions"] if v.get("served")}


def _errors(validators, doc: dict[str, Any]) -> list[str]:
    validator = validators[doc["apiVersion"]]
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(doc)]


def test_the_crd_is_the_upstream_file_unedited(crd):
    data = CRD.read_bytes()
    assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == CRD_BLOB
    assert crd["spec"]["names"]["kind"] == "DynamoGraphDeployment"
    # v1beta1 stores DGDs since Dynamo 1.5.0, and Dynamo 1.6.1's own DGDs are v1beta1
    assert [v["name"] for v in crd["spec"]["versions"] if v.get("storage")] == ["v1beta1"]


def test_the_three_topologies_are_there():
    assert MANIFESTS == ["agg.yaml", "disagg.yaml", "disagg_router.yaml"]


@pytest.mark.parametrize("name", MANIFESTS)
def test_a_manifest_is_valid_against_the_crd(validators, crd, name):
    doc = _load(name)
    assert doc["kind"] == crd["spec"]["names"]["kind"]
    assert _errors(validators, doc) == []
    # What the CRD's CEL rules and the admission webhook add: unique component names, and a
    # container named main with an image in every component.
    names = [c["name"].lower() for c in doc["spec"]["components"]]
    assert len(names) == len(set(names))
    assert all(_main(c)["image"] for c in doc["spec"]["components"])


def test_dynamo_1_6_1s_own_sglang_deployments_are_valid_against_the_crd(validators):
    """The same CRD accepts what the ai-dynamo 1.6.1 wheel ships as its SGLang deployments."""
    import dynamo.profiler

    templates = sorted((Path(dynamo.profiler.__file__).parent / "templates/dgd/sglang")
                       .glob("*.yaml"))
    assert [t.name for t in templates] == ["agg.yaml", "disagg.yaml"]
    for template in templates:
        assert _errors(validators, yaml.safe_load(template.read_text())) == [], template


def _rename(mapping: dict, old: str, new: str) -> None:
    mapping[new] = mapping.pop(old)


MISTAKES = {
    "required field misspelled": (lambda d: _rename(d["spec"]["components"][1], "name", "nmae"),
                                  "'name' is a required property"),
    "optional field misspelled": (lambda d: _rename(d["spec"]["components"][1], "replicas",
                                                    "replica"), "'replica' was unexpected"),
    "list misspelled": (lambda d: _rename(d["spec"], "components", "component"),
                        "'component' was unexpected"),
    "unknown component type": (lambda d: d["spec"]["components"][2].update(type="prefil"),
                               "'prefil' is not one of"),
    "replicas as text": (lambda d: d["spec"]["components"][2].update(replicas="two"),
                         "'two' is not of type 'integer'"),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_the_validation_rejects_a_broken_manifest(validators, mistake):
    break_it, message = MISTAKES[mistake]
    doc = copy.deepcopy(_load("disagg.yaml"))
    break_it(doc)
    errors = _errors(validators, doc)
    assert any(message in e for e in errors), errors


@pytest.fixture(autouse=True)
def _parse_only(monkeypatch):
    """SGLang's own parser on a machine without CUDA (parse only); flags that export variables
    for Dynamo's runtime export them into a copy of the environment."""
    monkeypatch.setattr(backend_select, "cuda_available", lambda: False)
    monkeypatch.setattr(os, "environ", dict(os.environ))
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"


def _parse_worker(args: list[str], model_path: str) -> WorkerConfig:
    """The worker's own parser on a manifest's args, the model path (a Hugging Face name there)
    replaced by the local test model so that nothing is downloaded."""
    argv = list(args)
    argv[argv.index("--model-path") + 1] = model_path
    return parse_args(argv)


def _worker(name: str, component: str) -> dict[str, Any]:
    return next(c for c in _load(name)["spec"]["components"] if c["name"] == component)


@pytest.mark.parametrize("name, component", WORKERS)
def test_a_workers_args_are_ones_the_worker_takes(tiny_model_path, name, component):
    spec = _worker(name, component)
    container = _main(spec)
    assert container["command"] == WORKER_COMMAND
    config = _parse_worker(container["args"], tiny_model_path)
    assert config.backend.name == "sglang"
    assert config.role.mode.value == MODES[spec["type"]]
    # Reachable from the frontend's pod and the kubelet's probes, not only on loopback.
    assert is_wildcard(config.host)
    if not config.role.aggregated:
        assert config.role.frontend_orchestrated  # as Dynamo 1.6.1 deploys SGLang
    # What Dynamo's frontend needs to tokenize (Tokens mode) and to list the model by name.
    assert config.role.skip_tokenizer_init and config.served_model_name == "Qwen/Qwen3-0.6B"


def test_a_flag_the_worker_does_not_take_is_caught(tiny_model_path, capsys):
    args = _main(_worker("disagg.yaml", "prefill"))["args"]
    with pytest.raises(SystemExit):
        _parse_worker([*args, "--disaggregation-mode", "prefil"], tiny_model_path)
    assert "prefil" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--no-such-flag"):
        _parse_worker([*args, "--no-such-flag"], tiny_model_path)


@pytest.mark.parametrize("name", ["disagg.yaml", "disagg_router.yaml"])
def test_prefill_and_decode_agree_on_what_the_kv_handoff_needs(tiny_model_path, name):
    def facts(component: str) -> tuple:
        args = _main(_worker(name, component))["args"]
        config = _parse_worker(args, tiny_model_path)
        return (args[args.index("--model-path") + 1], config.served_model_name,
                config.engine_args.page_size, config.role.skip_tokenizer_init,
                config.role.orchestrator, config.engine_args.disaggregation_transfer_backend)
    assert facts("prefill") == facts("decode")


def _frontend_config(doc: dict[str, Any]):
    """Dynamo 1.6.1's frontend parser, as `python -m dynamo.frontend` runs it."""
    from dynamo.frontend.frontend_args import FrontendArgGroup, FrontendConfig

    container = _main(_frontend(doc))
    assert container["command"] == FRONTEND_COMMAND
    parser = argparse.ArgumentParser()
    FrontendArgGroup().add_arguments(parser)
    config = FrontendConfig.from_cli_args(parser.parse_args(container.get("args", [])))
    config.validate()
    return config


@pytest.mark.parametrize("name", MANIFESTS)
def test_kv_routing_has_publishers_and_every_publisher_is_read(tiny_model_path, name):
    doc = _load(name)
    kv_router = _frontend_config(doc).router_mode == "kv"
    publishers = []
    for spec in _workers(doc):
        config = _parse_worker(_main(spec)["args"], tiny_model_path)
        if kv_events_enabled(config.kv_events_config):
            assert role_publishes(config.role), f"{spec['name']}: the flag would do nothing"
            publishers.append(spec["name"])
    assert bool(publishers) == kv_router, publishers
    assert kv_router == (name == "disagg_router.yaml")


def _dockerfile() -> tuple[str, dict[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text()
    base = re.search(r"^FROM\s+(\S+)", text, re.M).group(1)
    labels = dict(re.findall(r'org\.opencontainers\.image\.(\w+)="([^"]*)"', text))
    return base, labels


def test_the_images_follow_the_container_recipe():
    base, labels = _dockerfile()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # Dynamo's published SGLang runtime of the release this project is tested against.
    assert base == f"nvcr.io/nvidia/ai-dynamo/sglang-runtime:{DYNAMO_VERSION}"
    assert (labels["title"], labels["version"]) == (project["name"], project["version"])
    image = f"{project['name']}:{project['version']}"
    for name in MANIFESTS:
        doc = _load(name)
        assert _main(_frontend(doc))["image"] == base, name
        for spec in _workers(doc):
            assert _main(spec)["image"] == image, (name, spec["name"])
            # The tag is the project's version, so the operator is told Dynamo's.
            assert spec["runtimeVersionOverride"] == DYNAMO_VERSION, (name, spec["name"])


# The options the project's pip line may take: none that adds packages (-r, extras, indexes).
PIP_OPTIONS = {"--no-cache-dir", "--break-system-packages", "--no-deps"}
# The image's own CUDA stack (Dynamo 1.6.1's SGLang): a pip line naming any of these would
# replace what NVIDIA built and tested together.
IMAGE_STACK = re.compile(r"^(sglang|torch|nixl|flashinfer|sgl[-_]kernel|cupy|cuda|nvidia|"
                         r"transformers|ai[-_]dynamo)", re.I)


def _pip_installs() -> list[list[str]]:
    """The arguments of every `pip install` in the Dockerfile's RUN lines (continuations joined)."""
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    commands = [c for run in re.findall(r"^RUN\s+(.*)$", text, re.M) for c in run.split("&&")]
    return [c.split("pip install", 1)[1].split() for c in commands if "pip install" in c]


def test_the_image_keeps_dynamos_sglang_stack():
    """The project goes into the image without its dependencies and without extras: the base
    image's sglang, torch, NIXL and kernels stay as shipped (deploy/README.md, "The image")."""
    installs = _pip_installs()
    assert len(installs) == 1, installs
    options = [a for a in installs[0] if a.startswith("-")]
    targets = [a for a in installs[0] if not a.startswith("-")]
    assert "--no-deps" in options and set(options) <= PIP_OPTIONS, options
    assert not [t for t in targets if IMAGE_STACK.match(Path(t).name)], targets
    assert targets == ["/tmp/dynamo-sglang-pd"], targets  # the project alone, no [extra]
