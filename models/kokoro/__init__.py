"""Kokoro-82M (StyleTTS2 text side + iSTFTNet decoder, AdaIN style conditioning, 24 kHz) in PyTorch.

    python -m models.kokoro.check_fixtures ../shared/fixtures/kokoro/tiny   # parity with the official code
    python -m models.kokoro.parity --voice jf_alpha                         # parity with the shipped int8 graph
    python -m models.kokoro.release --out-dir .device/kokoro16              # float16 shards for a GPU machine

model.py (KokoroModel) is built from layers.py, prosody.py, decoder.py, stft.py and lstm.py; it runs
a padded batch as each item alone (lengths and masks). checkpoint.py loads the official
kokoro-v1_0.pth layout, onnx_import.py recovers that layout from the int8 graph, release.py caches
it; frontend.py, voice.py, sampling.py, tiny.py and family.py put it behind the common TTSModel
interface, and onnx_contract.py states its exported ``synthesizer`` graph.
"""
