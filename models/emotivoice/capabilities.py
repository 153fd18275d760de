"""What an EmotiVoice voice can take and do, read by stages and the server through the registry."""
from __future__ import annotations

from models.emotivoice.prompts import EMOTION_PROMPTS
from models.interface import Capabilities

FAMILY_NAME = "emotivoice"
# A 2014-row speaker table, emotion / free-text style prompts through the style encoder, and
# integer durations per phoneme; audio comes out one sentence at a time. A named emotion is one of
# the released style encoder's seven (Chinese or English names); anything else goes in a prompt.
CAPABILITIES = Capabilities(speaker_ids=True, prompt_style=True, emotions=tuple(EMOTION_PROMPTS), durations=True)
PART_ROLES = ("style_encoder", "acoustic", "vocoder")  # pipeline order
