"""The results table carries a family's own columns after the stable ones, and the note that says
when its quality means nothing (Family.measure_variant, Family.weights_note)."""
from compress.pipeline import results_markdown, results_text


def test_family_columns_follow_the_stable_ones_and_the_note_leads():
    rows = {"teacher": {"rtf_cpu_b1": 0.5, "t2s_tokens_per_s": 20.0},
            "lite": {"rtf_cpu_b1": 0.2, "t2s_tokens_per_s": 60.0, "t2s_token_agreement": 0.25}}
    table = results_markdown(rows, ("t2s_tokens_per_s", "t2s_token_agreement"), "random weights: quality means nothing")
    lines = table.splitlines()
    assert lines[0] == "> random weights: quality means nothing"
    assert lines[2] == "| variant | rtf_cpu_b1 | t2s_tokens_per_s | t2s_token_agreement |"
    assert lines[4] == "| teacher | 0.5 | 20 | - |"
    assert lines[5] == "| lite | 0.2 | 60 | 0.25 |"
    assert "t2s_token_agreement" not in results_markdown(rows)  # no family columns asked: the stable table
    text = results_text(rows, family_columns=("t2s_token_agreement",))
    assert "t2s_token_agreement" in text and "t2s_tokens_per_s" not in text
