"""Disaggregation's wire on the handlers' side: frontend-orchestrated (`bootstrap_info` in,
`disaggregated_params` out, the decode half's room claims) and decode-orchestrated (decode
asks a prefill worker for its room)."""
