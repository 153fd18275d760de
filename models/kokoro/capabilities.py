"""What a Kokoro voice can take and do, read by stages and the server through the registry."""
from __future__ import annotations

from models.interface import Capabilities

FAMILY_NAME = "kokoro"
# A Kokoro voice is a named style pack chosen when the model is loaded (load_teacher(voice)); the
# 256-d style row is picked from it by phoneme count, not passed per request. So no speaker table,
# zero-shot clip or prompt is taken (a raw style vector would be VoiceCondition.style, which the
# interface only grants together with text prompts, which Kokoro cannot read).
CAPABILITIES = Capabilities(streaming_unit="sentence", durations=True)
PART_ROLES = ("bert", "bert_encoder", "predictor", "text_encoder", "decoder")  # the official sub-modules
