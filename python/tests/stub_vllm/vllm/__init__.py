"""A fake `vllm` for the plugin tests (python/tests/test_plugin.py): the few names
wload/vllm_plugin.py imports from vLLM 0.33, each behaving as vLLM's does for the plugin (the
file:line of the original is given where the behaviour matters). Tests set the worker's parallel
state and the current config through `vllm.distributed.parallel_state.set_layout` and
`vllm.config.set_current_vllm_config`.
"""
