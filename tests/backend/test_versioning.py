"""Version reporting and the deprecation policy."""
import pathlib
import re
import warnings

import pytest

import minidnn.backend as B
from minidnn.backend import versioning as V


def test_version_matches_pyproject():
    text = (pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    declared = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M).group(1)
    assert B.__version__ == declared, "pyproject.toml is the one place the version is written"
    assert B.version() == V.parse_version(B.__version__)
    assert all(isinstance(n, int) for n in B.version()) and len(B.version()) == 3


def test_policy_helpers():
    assert V.parse_version("1.2.3rc1+local") == (1, 2, 3)
    assert V.parse_version("2") == (2, 0, 0)
    assert V.removal_release("0.3") == "0.5.0"
    assert V.versioned_name("pooling_forward") == "pooling_forward_v2"
    assert V.versioned_name("pooling_forward_v2") == "pooling_forward_v3"


def test_deprecated_alias_warns_and_forwards():
    def scale_by(x, factor=2):
        """Multiply."""
        return x * factor

    namespace = {}
    old = V.deprecated_alias("scale_by_old", scale_by, since="0.1", namespace=namespace)
    assert namespace["scale_by_old"] is old and old.__name__ == "scale_by_old"
    with pytest.warns(DeprecationWarning, match=r"^scale_by_old is deprecated since minidnn 0\.1 and will be removed "
                                                r"in minidnn 0\.3\.0; use scale_by instead$") as record:
        assert old(3, factor=4) == 12
    assert record[0].filename == __file__, "the warning must point at the caller"
    assert V.DEPRECATIONS["scale_by_old"].removed_in == "0.3.0"
    assert "scale_by_old" in [d.old_name for d in V.overdue_deprecations("0.3.0")]
    assert "scale_by_old" not in [d.old_name for d in V.overdue_deprecations("0.2.9")]
    del V.DEPRECATIONS["scale_by_old"]   # test-only alias: keep the registry clean
    with pytest.raises(ValueError, match="sooner than the policy's two minor releases"):
        V.deprecated_alias("x_old", scale_by, since="0.1", removed_in="0.2")


def test_no_deprecated_alias_outlives_its_removal_release():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert V.overdue_deprecations() == [], "remove these aliases: the policy says their time is up"
