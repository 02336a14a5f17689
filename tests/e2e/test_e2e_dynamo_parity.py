"""Registration parity with Dynamo 1.6.1's own SGLang worker: `python -m dynamo.sglang` and this
worker (`--engine sglang`) start on the same model with the same launch line (SGLang's CPU path,
the same stand-ins), aggregated with KV events and as frontend-orchestrated decode and prefill
workers; the model cards and runtime configs they register in the file-discovery directory are compared field
by field. Every difference kept is in KEPT, and docs/compatibility.md ("Registration") names it
with the reason; a difference that goes away fails the test too, so the list stays true.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import unquote

import pytest

from harness.topology import Stack, free_port, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
NAME = "parity"
READY_S = 300.0
# 1.6.1's launch flags, the same for both workers; the CPU settings are given explicitly so
# neither worker's defaults decide them.
COMMON = ("--served-model-name", f"{NAME} {NAME}-alias", "--skip-tokenizer-init",
          "--page-size", "16", "--max-total-tokens", "4096", "--context-length", "2048",
          "--max-running-requests", "8", "--host", "127.0.0.1", "--device", "cpu",
          "--attention-backend", "torch_native", "--disable-cuda-graph", "--dtype", "float32",
          "--router-mode", "kv", "--sleep-on-idle")
DISAGG = ("--disaggregation-transfer-backend", "nixl")
DECODE = ("--disaggregation-mode", "decode", *DISAGG,
          "--disaggregation-decode-retraction-backup", "none")
PREFILL = ("--disaggregation-mode", "prefill", *DISAGG)
ROLES = ("agg", "decode", "prefill")
BOOTSTRAP_PORTS: dict[str, int] = {}  # "oursprefill" -> the port that worker was given

# runtime_config field -> why this worker's registration differs (docs/compatibility.md).
KEPT = {
    # Prefill: both advertise it; the host is --host here (where SGLang's bootstrap server
    # listens), the machine's address in 1.6.1; the ports are each worker's own.
    "runtime_config.disaggregated_endpoint": "advertised only by prefill workers, where a "
                                             "bootstrap server listens",
    "runtime_config.runtime_data.sglang_generate": "SGLang's engine-native generate route is "
                                                   "not served",
    "runtime_config.runtime_data.token_budget": "the worker answers over-long prompts itself",
    "runtime_config.structural_tag": "structural-tag tool-call decoding is not implemented",
    "runtime_config.structural_tag_mode": "same",
    "runtime_config.structural_tag_scope": "same",
}


def _endpoint(component: str) -> tuple[str, str]:
    return ("--endpoint", f"dyn://{NAME}.{component}.generate")


def _kv_events(port: int) -> tuple[str, str]:
    return ("--kv-events-config",
            json.dumps({"publisher": "zmq", "topic": "kv-events", "endpoint": f"tcp://*:{port}"}))


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model_path) -> Iterator[Stack]:
    # 1.6.1's worker imports blake3 without declaring it; `make install` installs it.
    assert importlib.util.find_spec("blake3"), "blake3 missing: run make install"
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                        "<|assistant|>")
    common = (*COMMON, "--custom-jinja-template", str(template))
    stack = Stack(tmp_path_factory.mktemp("parity"), tiny_model_path)
    try:
        for who in ("dyn", "ours"):
            args = {"agg": ("--disaggregation-mode", "null", *_kv_events(free_port())),
                    "decode": DECODE, "prefill": PREFILL}
            for role in ROLES:
                port = BOOTSTRAP_PORTS[f"{who}{role}"] = free_port()
                flags = (*common, *_endpoint(f"{who}{role}"), *args[role],
                         "--disaggregation-bootstrap-port", str(port))
                if who == "dyn":
                    stack.start_dynamo_sglang(f"dyn-{role}", *flags)
                else:
                    mode = flags[flags.index("--disaggregation-mode") + 1]
                    stack.start_worker(f"ours-{role}", mode, NAME, *flags, engine="sglang")
        wait_until(lambda: _all_registered(stack), READY_S, "six model cards")
        yield stack
    finally:
        stack.stop()


def _all_registered(stack: Stack) -> bool:
    stack.check_alive()
    return len(_cards(stack)) == 2 * len(ROLES)


def _cards(stack: Stack) -> dict[str, dict[str, Any]]:
    """component -> the card it registered, as file discovery stores it."""
    mdc = stack.kv_dir / "v1" / "mdc"
    if not mdc.is_dir():
        return {}
    cards = {}
    for path in mdc.iterdir():
        try:
            entry = json.loads(path.read_text())
        except json.JSONDecodeError:  # file discovery writes a card in place: not complete yet
            continue
        cards[entry["component"]] = entry["card_json"]
    return cards


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> {"a.b.c": leaf}; a metadata URL -> its file name (host, port, namespace
    and component differ by construction; the checksums next to them must not)."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}.{key}" if prefix else key))
        return out
    if isinstance(value, str) and value.startswith("http://"):
        value = value.rsplit("/", 1)[-1]
    if isinstance(value, list):
        value = [_flat(v) if isinstance(v, dict) else v for v in value]
    return {prefix: value}


def _differences(ours: dict, theirs: dict) -> dict[str, tuple[Any, Any]]:
    a, b = _flat(ours), _flat(theirs)
    return {k: (a.get(k, "<absent>"), b.get(k, "<absent>"))
            for k in sorted(set(a) | set(b)) if a.get(k, "<absent>") != b.get(k, "<absent>")}


def _kept(field: str) -> bool:
    return any(field == k or field.startswith(k + ".") for k in KEPT)


@pytest.mark.parametrize("role", ROLES)
def test_registration_equals_dynamo_1_6_1s(stack, role):
    cards = _cards(stack)
    diffs = _differences(cards[f"ours{role}"], cards[f"dyn{role}"])
    unexpected = {k: v for k, v in diffs.items() if not _kept(k)}
    assert not unexpected, f"fields registered differently (ours, 1.6.1's): {unexpected}"
    # What the comparison covered: the launch line's aliases, template and routing are there.
    card = cards[f"ours{role}"]
    assert card["display_name"] == NAME and card["aliases"] == [f"{NAME}-alias"]
    assert card["chat_template_file"]["hf_chat_template"]["is_custom"] is True
    assert card["router_config"]["router_mode"] == "k_v"
    assert card["runtime_config"]["context_length"] == 2048
    if role == "prefill":  # both advertise where their bootstrap server listens
        assert card["runtime_config"]["disaggregated_endpoint"] == {
            "bootstrap_host": "127.0.0.1", "bootstrap_port": BOOTSTRAP_PORTS["oursprefill"]}
        theirs = cards["dynprefill"]["runtime_config"]["disaggregated_endpoint"]
        assert theirs["bootstrap_port"] == BOOTSTRAP_PORTS["dynprefill"]


def test_every_kept_difference_is_still_there_and_documented(stack):
    cards = _cards(stack)
    seen = {k for role in ROLES
            for k in _differences(cards[f"ours{role}"], cards[f"dyn{role}"])}
    gone = [k for k in KEPT if not any(f == k or f.startswith(k + ".") for f in seen)]
    assert not gone, f"no longer different: remove from KEPT and docs/compatibility.md: {gone}"
    doc = (REPO / "docs" / "compatibility.md").read_text()
    undocumented = [k for k in KEPT if f"`{k.split('.', 1)[1]}`" not in doc]
    assert not undocumented, f"kept differences missing from docs/compatibility.md: {undocumented}"


def test_decode_workers_advertise_no_local_indexer_and_agg_ones_serve_it(stack):
    """1.6.1: a decode card says enable_local_indexer false; an aggregated one says true, and its
    KV event publisher serves the worker-local indexer's query endpoint."""
    cards = _cards(stack)
    assert cards["oursdecode"]["runtime_config"]["enable_local_indexer"] is False
    assert cards["oursagg"]["runtime_config"]["enable_local_indexer"] is True
    instances = [unquote(p.name) for p in (stack.kv_dir / "v1" / "instances").iterdir()]
    for who in ("dyn", "ours"):
        assert any(i.startswith(f"{NAME}/{who}agg/worker_kv_query") for i in instances), \
            f"{who}: no worker-local KV indexer endpoint in {instances}"
