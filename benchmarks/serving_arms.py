"""The serving benchmark's arms: topologies started as processes, and the in-process engine."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

logger = logging.getLogger("bench_serving")


class Arms:
    """The started arms; `send[name]` is each arm's request function."""

    def __init__(self, args: argparse.Namespace, tokenizer) -> None:
        self.args, self.tokenizer = args, tokenizer
        self.send: dict = {}
        self.topologies: list = []
        self.clients: list = []
        self.engine = None

    def start(self) -> None:
        from benchmarks.topology import Topology, TopologySpec

        served = Path(self.args.model_path).name
        specs = [
            TopologySpec(
                name,
                self.args.model_path,
                served_model_name=served,
                skip_tokenizer_init=not self.args.text_mode,
            )
            for name in ("agg", "disagg")
            if name in self.args.arms
        ]
        # Spawn every topology first so their start-ups overlap, then wait for each.
        self.topologies = [Topology(spec) for spec in specs]
        for topo in self.topologies:
            topo.start_processes()
        for topo in self.topologies:
            topo.wait_ready()
            logger.info("%s ready at %s (logs %s)", topo.spec.name, topo.base_url, topo.run_dir)
        if "engine" in self.args.arms:
            from benchmarks.engine_client import EngineArm, start_engine

            self.engine = start_engine(self.args.model_path)
            self.send["engine"] = EngineArm(self.engine, self.args.output_len).send

    def connect(self, concurrency: int) -> None:
        from benchmarks.http_client import ChatClient

        for topo in self.topologies:
            client = ChatClient(
                topo.base_url, topo.spec.served_model_name, self.args.output_len, concurrency
            )
            self.clients.append(client)
            self.send[topo.spec.name] = client.send

    async def close_clients(self) -> None:
        for client in self.clients:
            await client.close()
        self.clients.clear()

    def stop(self) -> None:
        for topo in self.topologies:
            topo.stop()
        if self.engine is not None:
            self.engine.shutdown()
