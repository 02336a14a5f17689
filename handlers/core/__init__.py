"""What every request goes through, whichever handler serves it: the Protocols handlers depend
on, error types, one engine request's lifetime (abort by rid, bounded waits), live requests,
request -> sampling, guided decoding and routing params, fields refused, logprobs, finish
reasons, Tokens-mode streaming and health payloads."""
