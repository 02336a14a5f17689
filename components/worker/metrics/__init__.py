"""What the worker reports about itself: its Prometheus metrics (`worker_metrics.py`, the event
loop's lag, SGLang's `sglang:*` names, Dynamo's standard engine gauges) and their place on
Dynamo's `/metrics` (`metrics_export.py`); the read-outs on the system port (`debug_routes.py`);
the engine's KV events and load for Dynamo's KV router and planner (`kv_events.py`,
`load_relay.py`)."""
