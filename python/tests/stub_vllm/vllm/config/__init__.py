"""vLLM's current config: only `parallel_config.enable_expert_parallel` is read by the plugin."""

import contextlib
from types import SimpleNamespace

_current = None


def get_current_vllm_config():
    if _current is None:
        raise RuntimeError("the fake vLLM has no current config: use set_current_vllm_config")
    return _current


@contextlib.contextmanager
def set_current_vllm_config(config):
    global _current
    old, _current = _current, config
    try:
        yield
    finally:
        _current = old


def vllm_config(enable_expert_parallel=False):
    """The part of a VllmConfig the plugin reads."""
    return SimpleNamespace(
        parallel_config=SimpleNamespace(enable_expert_parallel=enable_expert_parallel)
    )
