"""Developer tools run as `python -m torchtpu.tools.<name>`: probe (every aten overload on
tpu), conformance (OpInfo samples against CPU), collect_env (what this install runs on)."""
