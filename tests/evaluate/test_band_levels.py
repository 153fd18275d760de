"""The band-level measure on signals whose answer is known: a gain, a low-pass, and bad input."""
import numpy as np
import pytest
import scipy.signal

from evaluate.band_levels import DEFAULT_BAND_EDGES_HZ, band_level_difference_db

SAMPLE_RATE_HZ = 24000


@pytest.fixture
def noise() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(2 * SAMPLE_RATE_HZ).astype(np.float32)


def test_a_gain_reads_as_the_same_level_in_every_band(noise):
    difference = band_level_difference_db(0.5 * noise, noise, SAMPLE_RATE_HZ)
    assert difference.shape == (len(DEFAULT_BAND_EDGES_HZ) - 1,)
    np.testing.assert_allclose(difference, 20 * np.log10(0.5), atol=1e-3)


def test_a_low_pass_reads_as_a_deficit_above_its_corner_only(noise):
    sos = scipy.signal.butter(8, 2000, "lowpass", fs=SAMPLE_RATE_HZ, output="sos")
    filtered = scipy.signal.sosfiltfilt(sos, noise).astype(np.float32)
    difference = band_level_difference_db(filtered, noise, SAMPLE_RATE_HZ)
    below, above = difference[:3], difference[5:]  # bands up to 1 kHz; bands from 3 kHz
    assert np.all(np.abs(below) < 0.5)
    assert np.all(above < -30)


def test_pauses_do_not_decide_the_level(noise):
    # The test is silent where the reference pauses (30 dB down); the loud frames decide.
    reference = noise.copy()
    reference[: SAMPLE_RATE_HZ // 2] *= 0.001
    audio = 0.5 * reference
    audio[: SAMPLE_RATE_HZ // 2] = 0.0
    np.testing.assert_allclose(band_level_difference_db(audio, reference, SAMPLE_RATE_HZ),
                               20 * np.log10(0.5), atol=1e-2)


def test_bad_input_is_refused_with_the_reason(noise):
    with pytest.raises(ValueError, match="time-aligned"):
        band_level_difference_db(noise[:-1], noise, SAMPLE_RATE_HZ)
    with pytest.raises(ValueError, match="increasing"):
        band_level_difference_db(noise, noise, SAMPLE_RATE_HZ, edges_hz=(0, 1000, 500))
    with pytest.raises(ValueError, match="Nyquist"):
        band_level_difference_db(noise, noise, SAMPLE_RATE_HZ, edges_hz=(0, 1000, 16000))
    with pytest.raises(ValueError, match="silent"):
        band_level_difference_db(noise, np.zeros_like(noise), SAMPLE_RATE_HZ)
