"""A fixture for the modules that test softmax_kernels' row kernels (imported there: autouse in each).

Since session 21 long rows take softmax_cluster by default ("1"); these modules' cases are about the row kernels, so
the fixture turns the cluster route off for each test.  softmax_kernels' plans are keyed on the setting; the
primitive's seen calls are not, so they are emptied before and after."""
import pytest


@pytest.fixture(autouse=True)
def _row_kernels_only(monkeypatch):
    from minidnn.backend import softmax as primitive
    from minidnn.backend.cuda import softmax_cluster
    monkeypatch.setattr(softmax_cluster, "CLUSTER", "0")
    primitive._SEEN.clear()
    yield
    primitive._SEEN.clear()
