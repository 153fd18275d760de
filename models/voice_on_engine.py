"""A voice whose synthesis runs on an engine built from its model (shape buckets, CUDA graphs,
compiled stages), served through the same TTSModel calls as the voice: the front end and the
parts stay the voice's. A family's engine voice subclasses it and adds ``synthesize``.

    class EngineVoice(VoiceOnEngine):
        def synthesize(self, request): return self.engine.synthesize(request)
"""
from __future__ import annotations


class VoiceOnEngine:
    def __init__(self, voice, engine):
        self.voice, self.engine = voice, engine
        self.sample_rate_hz, self.hop_length = voice.sample_rate_hz, voice.hop_length
        self.device = engine.device

    def parts(self):
        return self.voice.parts()

    def replace_part(self, role: str, module) -> None:
        # The engine copied (and may have captured or compiled) the parts when it was built.
        raise ValueError("parts of a voice on an engine are fixed when the engine is built: replace them on the "
                         "voice first, then build the engine")

    def text_to_utterances(self, text: str):
        return self.voice.text_to_utterances(text)
