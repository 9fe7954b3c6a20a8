"""Builds that run at once: several versions of one model, one work folder held by one build."""

from __future__ import annotations

import pytest

from pipeline.errors import OutputDirError

# Several versions of one model built at once, each its own process, into one --build-dir:
# test_build_stops.py's test_two_versions_built_at_once_both_succeed (the next builds after a
# stopped parallel build of those versions, so their two fresh compiles serve both tests).


def test_a_work_folder_is_held_by_one_build(tmp_path):
    """Two builds of one model, version and target into other roots but one --build-dir."""
    from pipeline.build import hold_work_dir
    from pipeline.services.layout import WorkLayout

    work = WorkLayout(tmp_path / "build").work_dir("tiny", "0.2", "cpu")
    with hold_work_dir(work):
        with pytest.raises(OutputDirError, match="another build is using the work folder") as info:
            with hold_work_dir(work):
                pass
        assert "--build-dir" in info.value.hint
    with hold_work_dir(work):  # released: the next build takes it
        pass
