"""Fixtures of the autocast tests."""
import pytest

from minidnn import _amp_state
from minidnn.amp import autocast_mode


@pytest.fixture
def set_direct_weights():
    """``set_direct_weights(on)``: autocast's direct weights (``_amp_state.DIRECT_WEIGHTS``) on or off for this test;
    the setting is restored after it."""
    old = _amp_state.DIRECT_WEIGHTS[0]

    def set_(on):
        _amp_state.DIRECT_WEIGHTS[0] = bool(on)
    yield set_
    _amp_state.DIRECT_WEIGHTS[0] = old


@pytest.fixture
def set_keep_low_copy():
    """``set_keep_low_copy(on)``: autocast's kept flat low-precision copy (``autocast_mode.KEEP_LOW_COPY``) on or off
    for this test; restored after it."""
    old = autocast_mode.KEEP_LOW_COPY[0]

    def set_(on):
        autocast_mode.KEEP_LOW_COPY[0] = bool(on)
    yield set_
    autocast_mode.KEEP_LOW_COPY[0] = old
