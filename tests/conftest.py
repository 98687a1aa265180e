"""Test session settings: no network, no telemetry, one thread per op to keep 2-core timings stable.

Set before anything imports huggingface_hub or gradio, which read these variables once at import.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
