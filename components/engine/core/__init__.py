"""The engine thread (`loop.py`) and what it drives: commands, the scheduler over sequences and
batches, request checks, the model runner, the output processor, `n > 1` forks, the parts'
assembly (`build.py`) and the contract with disaggregation (`actions.py`). Above `kv/`, `model/`
and `output/`; below `disagg/`, whose coordinator it knows only as `actions.Coordinator`."""
