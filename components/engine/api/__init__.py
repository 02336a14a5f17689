"""The Engine API's parts that `process/`'s engines share: a call -> its `Sequence`
(`requests.py`), streams, read-outs and totals, `generate()`, `engine.tokenizer_manager`. Above
`disagg/`, below `process/`."""
