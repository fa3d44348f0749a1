"""vllm/model_executor/model_loader/base_loader.py:27-47: the loader interface."""

from abc import ABC, abstractmethod


class BaseModelLoader(ABC):
    def __init__(self, load_config):
        self.load_config = load_config

    @abstractmethod
    def download_model(self, model_config):
        raise NotImplementedError

    @abstractmethod
    def load_weights(self, model, model_config):
        raise NotImplementedError
