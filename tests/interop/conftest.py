import pytest

# Interop tests drive the real producers; each module imports its producer with importorskip so a
# plain `pip install -e .[test]` still runs the rest. CI installs the interop extra, so they run there.
pytestmark = pytest.mark.interop
