"""bebop/__init__.py: the module names from before the stages became folders still import, for one release, as the
very module now at the new name, with a DeprecationWarning saying where it went."""

import importlib
import sys

import pytest

import bebop


@pytest.mark.parametrize("old, new", sorted(bebop.MOVED_MODULES.items()))
def test_an_old_module_name_imports_the_moved_module_with_a_warning(old, new):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_a_name_never_moved_is_not_made_up():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("bebop.no_such_module")
