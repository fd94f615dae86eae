"""One entry point for `--model`: a preset name or a config.json path."""

from __future__ import annotations

import os

from models.config import ModelConfig
from models.hf_config import from_hf_config
from models.maxtext import model_by_name
from models.presets import PRESETS


def load_model(name: str) -> ModelConfig:
  if name.endswith(".json"):
    return from_hf_config(name)
  if os.path.isdir(name) and os.path.isfile(os.path.join(name,
                                                        "config.json")):
    return from_hf_config(os.path.join(name, "config.json"))  # a checkout
  scaled = model_by_name(name)
  if scaled is not None:
    return scaled
  if name not in PRESETS:
    raise ValueError(f"unknown model {name!r}; valid: {', '.join(PRESETS)}, "
                     f"maxtext-<N>b / maxtext2023-<N>b (MaxText's "
                     f"global_parameter_scale N) or a path to a Hugging Face "
                     f"config.json (or the folder holding it)")
  return PRESETS[name]

