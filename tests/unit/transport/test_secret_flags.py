"""The side channel's shared secret reaches the engine config from a flag or the environment,
and is never shown."""

from __future__ import annotations

from components.worker.flags.config import parse_args
from components.backends.cpu_flags import SIDE_CHANNEL_SECRET_ENV
from components.engine.config import EngineConfig

MODEL = ["--model-path", "/models/tiny"]
SECRET = "a-secret-of-enough-length"


def test_secret_comes_from_the_environment_by_default(monkeypatch):
    monkeypatch.setenv(SIDE_CHANNEL_SECRET_ENV, SECRET)
    kwargs = dict(parse_args(MODEL).engine_args)
    assert kwargs["kv_side_channel_secret"] == SECRET
    cfg = EngineConfig.from_kwargs(**kwargs)
    assert cfg.kv_side_channel_secret == SECRET and SECRET not in repr(cfg)


def test_secret_flag_overrides_and_is_off_by_default(monkeypatch):
    monkeypatch.delenv(SIDE_CHANNEL_SECRET_ENV, raising=False)
    assert "kv_side_channel_secret" not in dict(parse_args(MODEL).engine_args)
    args = parse_args(MODEL + ["--cpu-kv-side-channel-secret", SECRET])
    assert dict(args.engine_args)["kv_side_channel_secret"] == SECRET
