"""vLLM's EngineArgs, as far as the plugin wraps it: `create_engine_config` builds the VllmConfig
once, in the process that starts the engine (engine/arg_utils.py:2245). Here it returns the config
the test gave it and counts the calls."""


class EngineArgs:
    def __init__(self, config):
        self.config = config
        self.built = 0

    def create_engine_config(self, usage_context=None, headless=False):
        self.built += 1
        return self.config
