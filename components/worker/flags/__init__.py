"""The worker's command line -> one frozen `WorkerConfig` (`config.py`): Dynamo 1.6.1's own worker
flags, accepted or refused naming the flag (`dynamo_flags.py`, `dynamo_flag_table.py`), the
tool-call and reasoning parser flags, `--disagg-config`, and `--dump-config-to`."""
