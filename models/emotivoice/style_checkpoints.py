"""Loaders for EmotiVoice's released style encoder, and its full-size random weights.

``checkpoint_163431`` is ``{'model': state_dict}``: every key prefixed ``module.``
(DistributedDataParallel), with the ``bert.embeddings.position_ids`` buffer that transformers
>= 4.31 no longer stores; it is checked to be 0..N-1 and dropped, everything else loads strictly.
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import BertConfig

from models.emotivoice.checkpoints import DATA_DIR, DDP_PREFIX, load_strict, random_state, read_checkpoint, read_manifest
from models.emotivoice.style_encoder import StyleEncoder, StyleHeads

STYLE_ENCODER_MANIFEST = DATA_DIR / "manifest_official_style_encoder.json"
POSITION_IDS_KEY = "bert.embeddings.position_ids"


def normalize_style_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The released style encoder's keys without ``module.`` and without the constant position ids."""
    normalized = {key.removeprefix(DDP_PREFIX): tensor for key, tensor in state.items()}
    position_ids = normalized.pop(POSITION_IDS_KEY, None)
    if position_ids is not None:
        expected = torch.arange(position_ids.shape[-1]).expand_as(position_ids)
        if not torch.equal(position_ids.long(), expected):
            raise ValueError(f"{POSITION_IDS_KEY} is not 0..{position_ids.shape[-1] - 1}: this BERT "
                             "numbers positions in a way transformers' BertModel does not")
    return normalized


def style_encoder_from_state(state: dict[str, torch.Tensor], bert_config: BertConfig) -> StyleEncoder:
    state = normalize_style_state(state)
    model = StyleEncoder(bert_config, StyleHeads.from_state_dict(state))
    load_strict(model, state, "style encoder")
    return model.eval()


def load_style_encoder(checkpoint_path: Path, bert_config: BertConfig) -> StyleEncoder:
    """``checkpoint_163431`` (``{'model': {'module.<key>': ...}}``) on a BERT of ``bert_config``."""
    return style_encoder_from_state(read_checkpoint(checkpoint_path, "model", "style encoder checkpoint"), bert_config)


def manifest_bert_config(manifest: dict) -> BertConfig:
    """The SimBERT-base-Chinese configuration the style encoder manifest was built with."""
    fields = {key: value for key, value in manifest["bert_config_assumed"].items() if key != "source"}
    return BertConfig(**fields)


def random_style_encoder(seed: int = 0, manifest_path: Path = STYLE_ENCODER_MANIFEST) -> StyleEncoder:
    """The full-size released style encoder layout (SimBERT base + heads, 96.7 M) with random weights."""
    manifest = read_manifest(manifest_path)
    return style_encoder_from_state(random_state(manifest["state_dict"], seed), manifest_bert_config(manifest))
