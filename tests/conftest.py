"""Shared test setup. Set before anything imports huggingface_hub/gradio, which read these at import."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the network
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
