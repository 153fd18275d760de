"""GPT-SoVITS v2: the text-to-semantic transformer, the SoVITS synthesizer and their front end."""
