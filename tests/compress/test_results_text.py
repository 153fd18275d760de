"""The main job's printed results stay readable in an 80-column terminal and in a log file."""
from compress.pipeline import TABLE_COLUMNS, results_text

VARIANTS = ("teacher", "original_onnx", "fp16", "bf16", "int8_ort", "int8_modelopt", "pruned", "lite", "lite_int8")


def test_every_name_and_value_fits_80_columns():
    rows = {name: {column: 1234.5678 + index for column in TABLE_COLUMNS} for index, name in enumerate(VARIANTS)}
    text = results_text(rows)
    assert max(len(line) for line in text.splitlines()) <= 80
    header_words = [word for line in text.splitlines() if line.startswith("variant") for word in line.split()[1:]]
    assert header_words == list(VARIANTS)  # every variant in full, in run order
    blocks = sum(line.startswith("variant") for line in text.splitlines())
    assert blocks > 1  # nine variants do not fit one block of 80 columns
    for column in TABLE_COLUMNS:
        assert sum(line.split()[:1] == [column] for line in text.splitlines()) == blocks  # once per block
    assert "1235" in text and "1242" in text  # 4 significant digits


def test_a_metric_no_variant_has_is_left_out_and_a_missing_value_is_a_dash():
    text = results_text({"teacher": {"rtf_cpu_b1": 0.05}, "fp16": {"dnsmos_p808": 3.9}})
    lines = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.strip()}
    assert set(lines) == {"variant", "rtf_cpu_b1", "dnsmos_p808"}
    assert lines["rtf_cpu_b1"] == ["0.05", "-"] and lines["dnsmos_p808"] == ["-", "3.9"]
