"""Command line -> one frozen `WorkerConfig`.

Flags come in two groups, as in Dynamo's own SGLang worker:
- Dynamo flags (`--endpoint`, `--prefill-endpoint`, `--discovery-backend`, ...);
- engine flags with SGLang's names. With `--engine sglang` the real `ServerArgs` parses them
  (see `components.backends.sglang_engine`); with the CPU engine the subset in
  `components.backends.cpu_flags` does, with the same spellings, so one launch line works for
  both engines. The engine backend (`components.backends.select`) and the worker's role
  (`components.worker.role`) are decided here, once.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from components.backends.base import EngineBackend
from components.backends.node import EngineNode
from components.backends.select import ENGINE_CHOICES, select_backend
from components.worker.flags import disagg_config, dynamo_flags
from components.worker.flags.dynamo_flags import LaunchArgs
from components.worker.hosts import bind_address, is_wildcard
from components.worker.metrics.kv_events import check_kv_events_config
from components.worker.flags.parser_flags import ParserFlags, add_parser_flags, parser_flags
from components.worker.role import Orchestrator, WorkerMode, WorkerRole
from handlers.decode import DecodeConfig

logger = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "dynamo"


@dataclass(frozen=True)
class DynamoArgs:
    endpoint: str  # "ns.component.endpoint", no dyn:// prefix
    prefill_endpoint: str
    migration_limit: int
    discovery_backend: str
    request_plane: str
    prefill_wait_timeout: float  # bound on waiting for the prefill's first stream item
    debug_routes: bool  # expose /engine/kv_pages on the system port (tests, ops)
    # Bound on waiting for a prefill instance at startup: a prefill appears only after its
    # model load and warm-up (Dynamo 1.6.1 bounds that warm-up alone at 1800 s).
    prefill_instance_timeout: float = 3600.0
    # Prefill: end a leg whose room no decode claimed within this (0: never)
    room_claim_timeout: float = 10.0
    # Prefill: the room watch's TCP port on --host (0: a free port picked at startup)
    room_watch_port: int = 0

    @property
    def namespace(self) -> str:
        return self.endpoint.split(".")[0]


@dataclass(frozen=True)
class WorkerConfig:
    role: WorkerRole
    backend: EngineBackend
    dynamo: DynamoArgs
    model_path: str
    served_model_name: str
    host: str
    bootstrap_port: int
    log_level: str
    # What `backend.build` takes: the CPU engine's read-only EngineConfig kwargs, or SGLang's
    # resolved ServerArgs.
    engine_args: Any
    # SGLang's --kv-events-config (JSON); components/worker/metrics/kv_events.py reads it.
    kv_events_config: str | None = None
    # After SIGTERM and the grace period: seconds in-flight requests get before they are ended
    # (Dynamo 1.6.1 bounds its drain at 30 s too).
    drain_timeout: float = 30.0
    # Tool-call and reasoning parsers: Dynamo's (registered) and SGLang's (Text mode).
    parsers: ParserFlags = ParserFlags()
    # Dynamo 1.6.1's worker flags that shape registration and the runtime (dynamo_flags.py).
    launch: LaunchArgs = LaunchArgs()
    # Where the engine sits when it spans several nodes (SGLang's --nnodes); one node otherwise.
    node: EngineNode = EngineNode()


def parse_endpoint(value: str, flag: str) -> str:
    """Validate `dyn://ns.comp.ep` (prefix optional) and return `ns.comp.ep`."""
    path = value[len("dyn://"):] if value.startswith("dyn://") else value
    parts = path.split(".")
    if len(parts) != 3 or not all(parts):
        raise SystemExit(f"{flag} must look like dyn://namespace.component.endpoint, got {value!r}")
    return path


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _port_or_zero(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port in [0, 65535] (0: any free port), "
                                         f"got {text}")
    return value


def _drain_timeout(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be in [0, 3600] seconds, got {text}")
    return value


def _add_dynamo_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Dynamo")
    g.add_argument("--engine", choices=ENGINE_CHOICES, default=os.environ.get("ENGINE", "auto"),
                   help="sglang needs CUDA, or SGLANG_USE_CPU_ENGINE=1 for SGLang's CPU path; "
                        "auto picks sglang when CUDA and sglang are present, else the embedded "
                        "CPU engine (env ENGINE)")
    g.add_argument("--endpoint", default=None,
                   help="dyn://ns.comp.ep to serve; default dyn://$DYN_NAMESPACE.backend.generate "
                        "(prefill: .prefill.generate)")
    g.add_argument("--prefill-endpoint", default=None,
                   help="decode: the prefill workers' endpoint (decode-orchestrated: called for "
                        "every request; frontend-orchestrated: its component's room_watch "
                        "endpoint says where each prefill watches its rooms; default "
                        "dyn://<ns>.prefill.generate)")
    g.add_argument("--migration-limit", type=int, default=0,
                   help="accepted for Dynamo compatibility; in 1.6.1 migration is set on the frontend")
    g.add_argument("--discovery-backend", default=os.environ.get("DYN_DISCOVERY_BACKEND", "file"),
                   choices=["file", "etcd", "kubernetes", "mem"])
    g.add_argument("--request-plane", default=os.environ.get("DYN_REQUEST_PLANE", "tcp"),
                   choices=["tcp", "nats"])
    g.add_argument("--prefill-wait-timeout", type=_positive_float,
                   default=DecodeConfig.bootstrap_timeout_s,
                   help="decode-orchestrated decode: seconds to wait for a prefill worker's "
                        "bootstrap info per request")
    g.add_argument("--prefill-instance-timeout", type=_positive_float,
                   default=DynamoArgs.prefill_instance_timeout,
                   help="decode-orchestrated decode: seconds to wait at startup for a prefill "
                        "instance to appear (it appears after its load and warm-up; the wait "
                        "is logged every 30 s)")
    g.add_argument("--disagg-orchestrator", choices=Orchestrator.choices(),
                   default=os.environ.get("DYN_DISAGG_ORCHESTRATOR"),
                   help="prefill/decode workers: who starts a request's prefill. frontend "
                        "(Dynamo 1.6.1's style; the default in Tokens mode): both workers "
                        "register and the frontend's prefill router sends both legs the same "
                        "bootstrap_info. decode (the default in Text mode, which the frontend "
                        "cannot orchestrate): only decode registers, and it calls the prefill "
                        "endpoint itself. Both legs must agree (env DYN_DISAGG_ORCHESTRATOR)")
    g.add_argument("--room-claim-timeout", type=float, default=DynamoArgs.room_claim_timeout,
                   help="prefill: seconds a leg's room may go unclaimed by its decode half "
                        "before the prefill stops it (the decode died or gave up before "
                        "claiming it); 0: wait for the engine's bootstrap timeout")
    g.add_argument("--room-watch-port", type=_port_or_zero, default=DynamoArgs.room_watch_port,
                   help="prefill: the TCP port on --host where the room watch listens for its "
                        "decode workers' claims (open it between nodes); 0: a free port picked "
                        "at startup")
    g.add_argument("--drain-timeout", type=_drain_timeout, default=WorkerConfig.drain_timeout,
                   help="seconds in-flight requests get to finish after SIGTERM and the grace "
                        "period (DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS, 5 s), as Dynamo "
                        "drains; then they are ended with a 503 and the worker exits")
    g.add_argument("--debug-routes", action="store_true",
                   default=os.environ.get("DYN_DEBUG_ROUTES", "") == "1",
                   help="serve /engine/kv_pages (KV pool occupancy) on DYN_SYSTEM_PORT")
    add_parser_flags(g)


def build_parser(backend: EngineBackend) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m components",
        description="Dynamo worker (agg, prefill or decode) on SGLang or the embedded CPU engine",
    )
    _add_dynamo_flags(parser)
    backend.add_flags(parser)
    dynamo_flags.add_dynamo_flags(parser)  # after the engine's: it yields to SGLang's spellings
    return parser


def reserve_free_port(host: str) -> int:
    """A port free right now (Dynamo does the same for an unset bootstrap port)."""
    family, address = bind_address("127.0.0.1" if is_wildcard(host) else host)
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _role(ns: argparse.Namespace) -> WorkerRole:
    skip = bool(ns.skip_tokenizer_init)
    # parse, not the parser's choices: a value from the environment is unchecked
    orchestrator = (Orchestrator.parse(ns.disagg_orchestrator)
                    if ns.disagg_orchestrator is not None else Orchestrator.default(skip))
    mode = WorkerMode.from_disaggregation_mode(ns.disaggregation_mode)
    # SGLang 0.5.21 has no such flag: there the attribute is absent.
    decode_cache = bool(getattr(ns, "disaggregation_decode_enable_radix_cache", False))
    return WorkerRole(mode, orchestrator, skip, decode_cache and mode is WorkerMode.DECODE)


def _dynamo_args(ns: argparse.Namespace, role: WorkerRole) -> DynamoArgs:
    namespace = dynamo_flags.worker_namespace(ns.namespace or DEFAULT_NAMESPACE)
    endpoint = parse_endpoint(ns.endpoint or f"{namespace}.{role.default_component}.generate",
                              "--endpoint")
    prefill = parse_endpoint(ns.prefill_endpoint or f"{endpoint.split('.')[0]}.prefill.generate",
                             "--prefill-endpoint")
    if ns.migration_limit < 0:
        raise SystemExit(f"--migration-limit must be >= 0, got {ns.migration_limit}")
    return DynamoArgs(
        endpoint=endpoint, prefill_endpoint=prefill, migration_limit=ns.migration_limit,
        discovery_backend=ns.discovery_backend, request_plane=ns.request_plane,
        prefill_wait_timeout=ns.prefill_wait_timeout,
        prefill_instance_timeout=ns.prefill_instance_timeout, debug_routes=ns.debug_routes,
        room_claim_timeout=_room_claim_timeout(ns), room_watch_port=ns.room_watch_port,
    )


def _room_claim_timeout(ns: argparse.Namespace) -> float:
    if not 0 <= ns.room_claim_timeout <= 3600:
        raise SystemExit("--room-claim-timeout must be in [0, 3600] seconds, got "
                         f"{ns.room_claim_timeout:g}")
    return ns.room_claim_timeout


def parse_args(argv: list[str]) -> WorkerConfig:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--engine", choices=ENGINE_CHOICES, default=os.environ.get("ENGINE", "auto"))
    known, _ = pre.parse_known_args(argv)
    backend = select_backend(known.engine)
    parser = build_parser(backend)
    router, argv = dynamo_flags.split_router_flags(argv)
    argv = disagg_config.expand(argv, lambda args: backend.expand_argv(parser, args))
    ns, unknown = parser.parse_known_args(argv)
    dynamo_flags.refuse_unknown(unknown, backend.name)
    ns.served_model_name, aliases = dynamo_flags.served_names(ns.served_model_name, ns.model_path)
    dynamo_flags.apply_gateway_workers(ns)
    if not any(a.startswith("--disaggregation-bootstrap-port") for a in argv):
        ns.disaggregation_bootstrap_port = reserve_free_port(ns.host)
    role = _role(ns)
    check_kv_events_config(getattr(ns, "kv_events_config", None), backend.kv_events_over_zmq,
                           role)
    engine_args = backend.engine_args(ns)
    return WorkerConfig(
        role=role, backend=backend, dynamo=_dynamo_args(ns, role), model_path=ns.model_path,
        served_model_name=ns.served_model_name, host=ns.host,
        bootstrap_port=int(ns.disaggregation_bootstrap_port), log_level=ns.log_level,
        engine_args=engine_args, node=backend.node(engine_args),
        kv_events_config=getattr(ns, "kv_events_config", None), drain_timeout=ns.drain_timeout,
        parsers=parser_flags(ns, role.text_mode),
        launch=dynamo_flags.launch_args(ns, role.text_mode, aliases, router),
    )
