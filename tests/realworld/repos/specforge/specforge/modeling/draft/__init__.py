# copied from sgl-project/SpecForge@a6b6b0230009d15ec2a97a57384e6f53f0f96946: specforge/modeling/draft/__init__.py
from .base import Eagle3DraftModel
from .dflash import (
    DFlashDraftModel,
    build_target_layer_ids,
    extract_context_feature,
    sample,
)
from .domino import DominoDraftModel
from .dspark import DSparkDraftModel
from .llama3_eagle import LlamaForCausalLMEagle3
from .peagle import PEagleDraftModel
from .registry import DRAFT_REGISTRY, available_drafts, register_draft, resolve_draft

__all__ = [
    "Eagle3DraftModel",
    "DFlashDraftModel",
    "DominoDraftModel",
    "DSparkDraftModel",
    "LlamaForCausalLMEagle3",
    "PEagleDraftModel",
    "build_target_layer_ids",
    "extract_context_feature",
    "sample",
    "DRAFT_REGISTRY",
    "register_draft",
    "resolve_draft",
    "available_drafts",
]
