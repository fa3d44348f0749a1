"""As vllm/envs.py: variables read from the environment when asked for (envs.py:893)."""

import os


def __getattr__(name):
    if name == "VLLM_PP_LAYER_PARTITION":
        return os.getenv("VLLM_PP_LAYER_PARTITION", None)
    raise AttributeError(name)
