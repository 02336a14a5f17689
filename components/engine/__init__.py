"""The embedded CPU engine: SGLang's offline Engine API on transformers + torch (CPU), with
prefill/decode disaggregation over NIXL. Entry point: ``components.engine.process.engine.CpuEngine``.

Nothing is imported here, so that light modules (kv_pool, the transport) load without
transformers.
"""
