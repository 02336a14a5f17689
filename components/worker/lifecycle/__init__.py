"""A worker's life around its handler: startup (the engine or the attachment to it, the prefill
client, the warm-up), Dynamo's runtime at the handler's edges (prefill client with its retry
backoff, error translation), registration with the frontend, the nodes after the first of a
multi-node engine, `--tokenizer-worker-num`'s processes, and stopping (signals, grace, drain)."""
