"""Where an EmotiVoice voice's files are, and loading a voice from them.

The released files are the user's (not committed): from the official repository and its release,

* ``model.checkpoint``: ``outputs/prompt_tts_open_source_joint/ckpt/g_00140000``; its
  ``config/joint/config.yaml`` is read from ``model.config`` or a ``config.yaml`` beside the
  checkpoint, else the official values (models/emotivoice/data/manifest_official_generator.json);
* ``model.style_encoder``: ``outputs/style_encoder/ckpt/checkpoint_163431``, with SimBERT's
  ``config.json`` and ``vocab.txt`` (``WangZeJun/simbert-base-chinese``) in ``model.bert_dir`` or
  beside the checkpoint;
* ``model.data_dir``: ``data/youdao/text/`` with ``tokenlist`` and ``speaker2``, and optionally
  ``librispeech-lexicon.txt`` (the repository's ``lexicon/``; without it English words come from
  the CMU dictionary).

conf/model/emotivoice.yaml folds these into one voice string that ``EmotiVoiceFiles.parse`` reads;
with none of them set (``random``) the voice is the full-size layout with random weights.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import yaml
from transformers import BertConfig

from models.emotivoice.checkpoints import (
    GENERATOR_MANIFEST,
    load_generator,
    random_generator,
    read_manifest,
)
from models.emotivoice.english import read_lexicon
from models.emotivoice.frontend import EmotiVoiceFrontend, read_tokenlist
from models.emotivoice.prompts import PromptEncoder, placeholder_vocab, read_bert_vocab
from models.emotivoice.style_checkpoints import load_style_encoder, random_style_encoder
from models.emotivoice.symbols import synthetic_tokenlist
from models.emotivoice.voice import EmotiVoiceVoice
from models.voice_spec import is_random, parse_paths

LEXICON_NAME = "librispeech-lexicon.txt"


@dataclass(frozen=True)
class EmotiVoiceFiles:
    checkpoint: Path | None = None
    style_encoder: Path | None = None
    data_dir: Path | None = None
    bert_dir: Path | None = None
    config: Path | None = None

    @classmethod
    def parse(cls, voice: str) -> "EmotiVoiceFiles":
        """``random``, or ``checkpoint=PATH;style_encoder=PATH;data_dir=PATH[;bert_dir=PATH][;config=PATH]``."""
        if is_random(voice):
            return cls()
        files = cls(**parse_paths(voice, (field.name for field in fields(cls))))
        needed = ("checkpoint", "style_encoder", "data_dir")
        given = [name for name in needed if getattr(files, name) is not None]
        if given and len(given) < len(needed):
            raise ValueError(f"voice {voice!r}: the released files go together; set {sorted(set(needed) - set(given))} "
                             f"as well as {given}, or none of them for random weights")
        return files

    @property
    def is_random(self) -> bool:
        return self.checkpoint is None


def _generator_config(files: EmotiVoiceFiles) -> dict:
    path = files.config or files.checkpoint.parent / "config.yaml"
    if path.is_file():
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    if files.config is not None:
        raise FileNotFoundError(f"generator config {files.config} not found")
    return read_manifest(GENERATOR_MANIFEST)["config_used"]


def _bert_files(files: EmotiVoiceFiles) -> tuple[BertConfig, dict[str, int]]:
    folder = files.bert_dir or files.style_encoder.parent
    config_path, vocab_path = folder / "config.json", folder / "vocab.txt"
    for path in (config_path, vocab_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: the style encoder needs SimBERT's config.json and vocab.txt "
                                    "(WangZeJun/simbert-base-chinese) in model.bert_dir or beside model.style_encoder")
    return BertConfig.from_json_file(str(config_path)), read_bert_vocab(vocab_path)


def load_voice(files: EmotiVoiceFiles, seed: int = 0) -> EmotiVoiceVoice:
    """The user's released files, or (``files.is_random``) full-size random weights from the
    manifests with a stand-in tokenlist, numbered speakers and a placeholder BERT vocabulary."""
    if files.is_random:
        generator = random_generator(seed)
        style_encoder = random_style_encoder(seed)
        vocab = placeholder_vocab(style_encoder.bert.config.vocab_size)
        tokens = synthetic_tokenlist(generator.config.n_vocab)
        speakers = [str(index) for index in range(generator.config.n_speaker)]
        lexicon: dict = {}
    else:
        generator = load_generator(files.checkpoint, _generator_config(files))
        bert_config, vocab = _bert_files(files)
        style_encoder = load_style_encoder(files.style_encoder, bert_config)
        tokens = read_tokenlist(files.data_dir / "tokenlist")
        speakers = read_tokenlist(files.data_dir / "speaker2")
        lexicon_path = files.data_dir / LEXICON_NAME
        lexicon = read_lexicon(lexicon_path) if lexicon_path.is_file() else {}
    return EmotiVoiceVoice(generator, PromptEncoder(style_encoder, vocab), EmotiVoiceFrontend(tokens, lexicon), speakers)
