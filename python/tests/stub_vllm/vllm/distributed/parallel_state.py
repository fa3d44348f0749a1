"""This worker's place in the TP and PP groups, as vllm/distributed/parallel_state.py answers it;
set by the test with `set_layout`."""

from types import SimpleNamespace

_layout = None


def set_layout(tp=1, tp_rank=0, pp=1, pp_rank=0):
    global _layout
    _layout = (tp, tp_rank, pp, pp_rank)


def _get():
    if _layout is None:
        raise RuntimeError("the fake vLLM has no parallel state: use set_layout")
    return _layout


def get_tensor_model_parallel_world_size():
    return _get()[0]


def get_tensor_model_parallel_rank():
    return _get()[1]


def get_pp_group():
    return SimpleNamespace(world_size=_get()[2], rank_in_group=_get()[3])
