"""What a Piper voice can take and do, read by stages and the server through the registry."""
from __future__ import annotations

from models.interface import Capabilities

FAMILY_NAME = "piper"
# Piper voices have a speaker table (multi-speaker voices) and no zero-shot clip or style prompt;
# the torch engine can hand out decoder windows before the whole sentence is decoded.
CAPABILITIES = Capabilities(speaker_ids=True, streaming_unit="decoder_frames", durations=True)
PART_ROLES = ("encoder", "duration", "flow", "decoder")
