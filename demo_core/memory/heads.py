"""What a config builds: the head on the last hidden state (from its `architectures`), the Auto class that builds
it, its head dimension and its list of decoder layers. The memory estimate, the probe and the work model read these."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)
from transformers.models.auto import modeling_auto


def head_dim(config: Any) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


@dataclasses.dataclass(frozen=True)
class ModelHead:
    """What sits on the model's last hidden state, as the config's `architectures` names it."""

    kind: str  # causal-lm | masked-lm | sequence-classification | token-classification | question-answering
    auto_class: type
    per_token: bool  # one output row per token (language models, token classification, spans) or per sequence

    def output_width(self, config: Any) -> int:
        if self.kind in ("causal-lm", "masked-lm"):
            return int(config.vocab_size)
        if self.kind == "question-answering":
            return 2  # start and end logits
        return int(getattr(config, "num_labels", 2))


# transformers' own Auto-class mappings decide which head an architecture name is (BertForSequenceClassification
# is a classifier with num_labels outputs, BertForMaskedLM a vocabulary head, LlamaForCausalLM a causal LM).
_HEADS = (
    (ModelHead("causal-lm", AutoModelForCausalLM, True), modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
    (ModelHead("masked-lm", AutoModelForMaskedLM, True), modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES),
    (ModelHead("sequence-classification", AutoModelForSequenceClassification, False),
     modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES),
    (ModelHead("token-classification", AutoModelForTokenClassification, True),
     modeling_auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES),
    (ModelHead("question-answering", AutoModelForQuestionAnswering, True),
     modeling_auto.MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES),
)


def model_head(config: Any) -> ModelHead:
    """The head the config's `architectures` names; a causal LM when it names none this planner trains (presets,
    bare configs, base `...Model` checkpoints)."""
    for name in getattr(config, "architectures", None) or []:
        for head, mapping in _HEADS:
            if name in mapping.values():
                return head
    return _HEADS[0][0]


def model_class_for(config: Any) -> type:
    """The Auto class that builds the model with the head the config's architectures name."""
    return model_head(config).auto_class


def decoder_layers(model: torch.nn.Module, count: int) -> torch.nn.ModuleList:
    """The model's list of `count` decoder (or encoder) layers."""
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return module
    raise ValueError(f"{type(model).__name__} has no list of {count} layers to attribute saved tensors to")
