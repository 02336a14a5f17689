"""A hostile side-channel peer for the KV transport's tests: a raw ZMQ DEALER, optionally with
its own NIXL agent (so its Hello is one a prefill can load). Holds no tests."""

from __future__ import annotations

import time

import torch
import zmq

from protocol.kv_side_channel import Hello, encode, to_decode_decoder

HOST = "127.0.0.1"


class Rogue:
    def __init__(self, port: int, identity: bytes | None = None) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if identity is not None:
            self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.connect(f"tcp://{HOST}:{port}")
        self.replies: list = []

    def send(self, msg) -> None:
        self.sock.send(msg if isinstance(msg, bytes) else encode(msg))

    def drain(self) -> list:
        while self.sock.poll(0):
            self.replies.append(to_decode_decoder.decode(self.sock.recv()))
        return self.replies

    def wait_reply(self, pump, pred, timeout: float = 5.0):
        """First reply matching ``pred``, calling ``pump()`` (the prefill's poll) meanwhile."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pump()
            for reply in self.drain():
                if pred(reply):
                    self.replies.remove(reply)
                    return reply
        raise TimeoutError(f"no matching reply within {timeout} s; got {self.replies}")

    def close(self) -> None:
        self.sock.close()


class RogueAgent:
    """A real NIXL agent with its own small pool: what a hostile process can make."""

    def __init__(self, name: str) -> None:
        from nixl._api import nixl_agent, nixl_agent_config

        config = nixl_agent_config(enable_prog_thread=False, enable_listen_thread=False,
                                   backends=[])
        self.agent = nixl_agent(name, config)
        # The engine's UCX error handling: UCX cannot connect endpoints of different modes.
        self.agent.create_backend("UCX", {"ucx_error_handling_mode": "none"})
        self.pool = torch.zeros(4096)
        self.reg = self.agent.register_memory(self.pool)
        self.name = name

    def hello(self, name: str | None = None) -> Hello:
        fields = {"agent_name": name or self.name,
                  "agent_metadata": self.agent.get_agent_metadata(),
                  "pool_base": self.pool.data_ptr(), "pool_bytes": self.pool.numel() * 4,
                  "ucx_error_handling": "none"}
        # The same tests run against the protocol before Hello declared a pool (to show they
        # fail there): only the fields this Hello has.
        known = set(Hello.__struct_fields__)
        return Hello(**{k: v for k, v in fields.items() if k in known})

    def pump(self) -> None:
        """Progress UCX (the agent has no progress thread): sends need it too."""
        self.agent.get_new_notifs()

    def close(self) -> None:
        self.agent.deregister_memory(self.reg)
