"""Fixtures of the autocast tests."""
import pytest

from minidnn import _amp_state


@pytest.fixture
def set_direct_weights():
    """``set_direct_weights(on)``: autocast's direct weights (``_amp_state.DIRECT_WEIGHTS``) on or off for this test;
    the setting is restored after it."""
    old = _amp_state.DIRECT_WEIGHTS[0]

    def set_(on):
        _amp_state.DIRECT_WEIGHTS[0] = bool(on)
    yield set_
    _amp_state.DIRECT_WEIGHTS[0] = old
